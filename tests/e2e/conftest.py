"""Browser-test fixtures: Debian's Chromium driven by Selenium, and a real tiletune server on loopback."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.store import tokens
from server.store.db import Database
from server.store.migrate import upgrade
from tests.e2e.browser import CHROMEDRIVER, CHROMIUM, ensure_chromium
from tests.seeding import Seeded, seed_tuned_workload
from tests.serving import tiletune_serve

# Screenshots also land here (gitignored), so a reviewer finds them after a test run.
RESULTS = Path(__file__).resolve().parents[2] / "bench-results"

# Root runs Chromium without its sandbox; the rest keeps it off the network (closed here) and quiet.
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
)


@pytest.fixture(scope="session")
def chromium() -> Path:
    """Debian's chromium and chromium-driver, installed with apt when missing (CI starts without them)."""
    reason = ensure_chromium()
    if reason is not None:
        pytest.skip(reason)
    return CHROMIUM


@pytest.fixture
def browser(chromium: Path) -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(chromium)
    profile = tempfile.mkdtemp(prefix="tiletune-chromium-")
    for arg in (*CHROMIUM_ARGS, f"--user-data-dir={profile}"):
        options.add_argument(arg)
    # Both paths given: Selenium never runs Selenium Manager (which would try to download a driver).
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


class Served:
    def __init__(self, base: str, token: str, seeded: Seeded) -> None:
        self.base = base
        self.token = token
        self.seeded = seeded


@pytest.fixture
def served_ui(tmp_path: Path) -> Iterator[Served]:
    """`tiletune serve` on a free loopback port, reads behind a token, on a SQLite file with a tuned workload."""
    url = f"sqlite:///{tmp_path / 'ui.db'}"
    upgrade(url)
    db = Database(url)
    seeded = seed_tuned_workload(db)
    with db.transaction() as session:
        token = tokens.create_token(session, "browser", "writer")
    db.dispose()
    with tiletune_serve(url, tmp_path / "server.log", {"TILETUNE_REQUIRE_READ_TOKEN": "true"}) as base:
        yield Served(base, token, seeded)
