"""``tiletune serve`` as a real uvicorn process on a free loopback port (through the one process
harness, :mod:`server.bench.harness`), for the tests that talk HTTP to a running server."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from server.bench.harness import child_env, free_port, http_server, tiletune_command

__all__ = ["free_port", "tiletune_serve"]


@contextlib.contextmanager
def tiletune_serve(database_url: str, log: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """Start ``tiletune serve`` on ``database_url`` (output to ``log``), wait for /readyz, yield
    its base URL, and stop it afterwards."""
    environment = child_env({"TILETUNE_DATABASE_URL": database_url, **(env or {})})
    with http_server(
        "server",
        lambda port: tiletune_command("serve", "--port", str(port)),
        lambda client: client.get("/readyz").status_code == 200,
        env=environment,
        log=log,
    ) as server:
        yield server.base_url
