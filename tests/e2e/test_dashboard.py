"""The /ui dashboard in headless Chromium against a real server: sign-in, tables, figures, screenshots.

Screenshots are written to the test's tmp dir and copied to ``bench-results/``
(``ui-dashboard.png``, ``ui-workload.png``) at the repository root.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from server.dashboard.catalog import SPEEDUP_SIZE
from tests.e2e.conftest import RESULTS, Served

pytestmark = pytest.mark.slow


def _screenshot(driver: Any, path: Path) -> Path:
    """The whole page: the window is stretched to the document's height first."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, min(max(int(height) + 40, 600), 12000))
    driver.save_screenshot(str(path))
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    RESULTS.mkdir(exist_ok=True)
    shutil.copy(path, RESULTS / path.name)
    return path


def _wait(driver: Any, condition: Any, timeout: float = 60) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(condition)


def test_dashboard_in_a_browser(browser: Any, served_ui: Served, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    key = served_ui.seeded.key
    # Reads need a token: the page asks for one and shows no data.
    browser.get(served_ui.base + "/ui")
    assert "token" in browser.find_element(By.ID, "message").text
    assert key not in browser.page_source

    # Sign in with the form; the cookie carries the token from here on.
    browser.find_element(By.NAME, "token").send_keys(served_ui.token)
    browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    _wait(browser, lambda d: d.find_elements(By.ID, "configs"))
    rows = browser.find_elements(By.CSS_SELECTOR, "#configs tbody tr")
    assert len(rows) == 1 and key[:12] in rows[0].text and "cpu-demo" in rows[0].text
    jobs = browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")
    assert len(jobs) == 2
    assert any("done" in j.text and f"{served_ui.seeded.trials - 1} / 48" in j.text for j in jobs)
    assert any("running" in j.text and "1 / 32" in j.text and "seed-worker" in j.text for j in jobs)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#jobs progress")) == 2
    _screenshot(browser, tmp_path / "ui-dashboard.png")

    # The workload page: four figures rendered by the server, actually loaded, and the trial table.
    rows[0].find_element(By.TAG_NAME, "a").click()
    _wait(browser, lambda d: d.find_elements(By.ID, "trials"))
    images = browser.find_elements(By.CSS_SELECTOR, "figure img")
    assert len(images) == 4
    _wait(browser, lambda d: all(d.execute_script("return arguments[0].complete", img) for img in images))
    for img in images:
        natural = browser.execute_script("return [arguments[0].naturalWidth, arguments[0].naturalHeight]", img)
        assert natural[0] > 0 and natural[1] > 0, img.get_attribute("src")
        assert natural == [int(img.get_attribute("width")), int(img.get_attribute("height"))]
    speedup = browser.find_element(By.CSS_SELECTOR, "#figure-speedup img")
    assert browser.execute_script("return arguments[0].naturalWidth", speedup) == SPEEDUP_SIZE[0]
    trials = browser.find_elements(By.CSS_SELECTOR, "#trials tbody tr")
    assert len(trials) == served_ui.seeded.trials
    statuses = {t.find_elements(By.TAG_NAME, "td")[1].text for t in trials}
    assert {"ok", "failed", "crashed", "timeout", "wrong", "pruned", "invalid"} <= statuses
    _screenshot(browser, tmp_path / "ui-workload.png")

    # Signing out is the nav's button (a same-origin form post); the pages then ask for a token again.
    browser.find_element(By.CSS_SELECTOR, "nav form.signout button").click()
    _wait(browser, lambda d: d.find_elements(By.ID, "message"))
    assert "token" in browser.find_element(By.ID, "message").text
    assert key not in browser.page_source
