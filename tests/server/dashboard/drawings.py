"""Drawing targets for :class:`server.dashboard.renderer.FigureRenderer` in tests (run in its child
processes, imported by name): a drawing that waits for the test, one that never ends, one that
needs more memory than its cap. ``TILETUNE_TEST_GATE`` (inherited by the child) is a directory:
a gated drawing creates ``NAME.started`` there and returns once ``NAME.release`` exists."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

GATED = "history"


def gated(_record: Any, name: str, _max_tiles: int) -> bytes:
    if name == GATED:
        gate = Path(os.environ["TILETUNE_TEST_GATE"])
        (gate / f"{name}.started").write_text(str(os.getpid()))
        while not (gate / f"{name}.release").exists():
            time.sleep(0.01)
    return name.encode()


def endless(_record: Any, name: str, _max_tiles: int) -> bytes:
    if name == GATED:
        while True:
            time.sleep(1)
    return name.encode()


def greedy(_record: Any, name: str, _max_tiles: int) -> bytes:
    if name == GATED:
        hoard = bytearray(4 << 30)  # over any cap the tests set
        return bytes(hoard[:1])
    return name.encode()
