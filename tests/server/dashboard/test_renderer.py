"""Figures are drawn in child processes: one slow figure holds neither the other figures nor the API,
a figure past its deadline or its memory cap is stopped (a 503 or a 422 naming the setting), waiting
is bounded, and the children go away with the app.

The drawings are stand-ins (tests/server/dashboard/drawings.py) run in the renderer's real child
processes; nothing here asserts a duration: order is shown with files the drawings wait for.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from server.app import create_app
from server.dashboard.renderer import FigureRenderer
from server.settings import Settings
from server.store.db import Database
from tests.seeding import Seeded, seed_tuned_workload
from tests.server.conftest import workload_body
from tests.server.dashboard.drawings import GATED

GUARD_S = 120.0  # only so a broken build fails instead of hanging; never a measured expectation


@pytest.fixture
def seeded(db: Database) -> Seeded:
    return seed_tuned_workload(db)


@pytest.fixture
def gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TILETUNE_TEST_GATE", str(tmp_path))  # inherited by the drawing children
    return tmp_path


def _app(settings: Settings, db: Database, target: str, **renderer: Any) -> FastAPI:
    app = create_app(settings, db)
    options: dict[str, Any] = {"workers": 2, "queue": 4, "timeout_s": GUARD_S, "memory_mb": 2048, "max_tiles": 1 << 20}
    options.update(renderer)
    app.state.ui_renderer = FigureRenderer(target=f"tests.server.dashboard.drawings:{target}", **options)
    return app


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + GUARD_S
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.01)


class _Background:
    """One request on a thread, its answer once it comes."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.answer: Any = None
        self.thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self.thread.start()

    def _run(self, call: Callable[[], Any]) -> None:
        self.answer = call()

    def done(self) -> bool:
        return not self.thread.is_alive()


def _figure(key: str, name: str) -> str:
    return f"/ui/workloads/{key}/figures/{name}.png"


def test_a_slow_figure_holds_up_neither_other_figures_nor_the_api(
    settings: Settings, db: Database, seeded: Seeded, gate: Path
) -> None:
    """While one figure is being drawn (and held there), another figure, the pages, the probes and
    lookups are all answered: no lock or thread is shared between a drawing and other requests."""
    with TestClient(_app(settings, db, "gated")) as client:
        slow = _Background(lambda: client.get(_figure(seeded.key, GATED)))
        _until((gate / f"{GATED}.started").exists, "the slow figure started")
        other = client.get(_figure(seeded.key, "blockmap"))
        assert other.status_code == 200 and other.content == b"blockmap"
        assert client.get("/healthz").status_code == 200
        assert client.post("/v1/lookup", json={"workload": workload_body()}).status_code == 200
        assert client.get(f"/ui/workloads/{seeded.key}").status_code == 200
        assert not slow.done()  # all of the above while the slow figure was still being drawn
        (gate / f"{GATED}.release").touch()
        _until(slow.done, "the slow figure answered")
        assert slow.answer.status_code == 200 and slow.answer.content == GATED.encode()


def test_waiting_is_bounded(settings: Settings, db: Database, seeded: Seeded, gate: Path) -> None:
    """One child and no queue: a second figure while the first is drawn gets a 503 at once."""
    with TestClient(_app(settings, db, "gated", workers=1, queue=0)) as client:
        slow = _Background(lambda: client.get(_figure(seeded.key, GATED)))
        _until((gate / f"{GATED}.started").exists, "the slow figure started")
        busy = client.get(_figure(seeded.key, "heatmap"))
        assert busy.status_code == 503 and busy.headers["retry-after"]
        assert "TILETUNE_FIGURE_QUEUE=0" in busy.json()["message"]
        (gate / f"{GATED}.release").touch()
        _until(slow.done, "the slow figure answered")
        assert slow.answer.status_code == 200
        assert client.get(_figure(seeded.key, "heatmap")).status_code == 200  # the child is free again


def test_a_figure_past_its_deadline_is_stopped(settings: Settings, db: Database, seeded: Seeded) -> None:
    app = _app(settings, db, "endless", workers=1, timeout_s=2.0)
    renderer: FigureRenderer = app.state.ui_renderer
    with TestClient(app) as client:
        assert client.get(_figure(seeded.key, "speedup")).status_code == 200  # a child is up
        (drawing,) = renderer.pids()
        stuck = client.get(_figure(seeded.key, GATED))
        assert stuck.status_code == 503 and stuck.headers["retry-after"]
        assert "not drawn within 2 s (TILETUNE_FIGURE_TIMEOUT_S)" in stuck.json()["message"]
        assert not _alive(drawing)  # killed, not left drawing
        assert client.get(_figure(seeded.key, "heatmap")).status_code == 200  # by a fresh child
        assert renderer.pids() and drawing not in renderer.pids()


def test_a_figure_over_the_memory_cap_is_stopped(settings: Settings, db: Database, seeded: Seeded) -> None:
    """The cap is the child's address space: the server's own memory never holds the drawing."""
    with TestClient(_app(settings, db, "greedy", workers=1, memory_mb=1024)) as client:
        refused = client.get(_figure(seeded.key, GATED))
        assert refused.status_code == 422
        assert refused.json()["message"] == (
            f"figure: drawing {GATED} of this workload needs more than TILETUNE_FIGURE_MEMORY_MB=1024 MiB"
        )
        assert client.get(_figure(seeded.key, "speedup")).status_code == 200


def test_children_leave_with_the_app_or_when_idle(settings: Settings, db: Database, seeded: Seeded) -> None:
    app = _app(settings, db, "gated", idle_s=0.2)
    renderer: FigureRenderer = app.state.ui_renderer
    with TestClient(app) as client:
        assert client.get(_figure(seeded.key, "speedup")).status_code == 200
        (first,) = renderer.pids()
        _until(lambda: not _alive(first), "the idle child exited")
        assert client.get(_figure(seeded.key, "heatmap")).status_code == 200  # (speedup is cached)
        (second,) = renderer.pids()
    assert not _alive(second) and renderer.pids() == []


def test_the_real_figures_are_drawn_by_a_child(client: TestClient, seeded: Seeded) -> None:
    """The default drawing, end to end: real PNGs, and the drawing process is not the server."""
    png = client.get(_figure(seeded.key, "blockmap"))
    assert png.status_code == 200 and png.content.startswith(b"\x89PNG")
    pids = client.app.state.ui_renderer.pids()  # type: ignore[attr-defined]
    assert pids and os.getpid() not in pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) counts as gone
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_the_server_process_never_imports_the_drawing(tmp_path: Path) -> None:
    """Pages and figures are served without matplotlib or Optuna in the server process (they would
    add memory to every uvicorn worker and seconds of import to the first page): only the drawing
    children load them. (JAX is loaded by the store, through kernel.heuristic.)"""
    import subprocess
    import sys

    code = f"""
import sys
from fastapi.testclient import TestClient
from server.app import create_app
from server.settings import Settings
from server.store.db import Database
from server.store.migrate import upgrade
from tests.seeding import seed_tuned_workload
url = "sqlite:///{tmp_path / "ui.db"}"
upgrade(url)
seeded = seed_tuned_workload(Database(url))
with TestClient(create_app(Settings(database_url=url))) as client:
    assert client.get("/ui").status_code == 200
    assert client.get("/ui/workloads/" + seeded.key).status_code == 200
    for name in ("history", "heatmap", "blockmap", "speedup"):
        png = client.get("/ui/workloads/" + seeded.key + "/figures/" + name + ".png")
        assert png.status_code == 200 and png.content.startswith(b"\\x89PNG"), png.text
loaded = sorted(m for m in ("matplotlib", "optuna") if m in sys.modules)
sys.exit(f"the server process imported {{loaded}}" if loaded else 0)
"""
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
