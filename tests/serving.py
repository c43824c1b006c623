"""``tiletune serve`` as a real uvicorn process on a free loopback port, for the tests that
talk HTTP to a running server."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def tiletune_serve(database_url: str, log: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """Start ``tiletune serve`` on ``database_url`` (output to ``log``), wait for /readyz, yield
    its base URL, and stop it afterwards."""
    port = free_port()
    environment = {**os.environ, "TILETUNE_DATABASE_URL": database_url, **(env or {})}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "autotune.cli", "serve", "--port", str(port)],
            env=environment,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(base + "/readyz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"server did not start: {log.read_text(errors='replace')[-2000:]}")
                time.sleep(0.2)
            yield base
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
