"""``tiletune serve``: the API server and the /ui dashboard under uvicorn."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from server.cli.common import DatabaseOpt, err
from server.cli.common import settings as settings_of


def serve(
    host: Annotated[str, typer.Option(help="Bind address")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8000,
    workers: Annotated[int, typer.Option(min=1, help="uvicorn worker processes")] = 1,
    database_url: DatabaseOpt = None,
    migrate: Annotated[bool, typer.Option(help="Apply migrations before serving")] = True,
) -> None:
    """Run the API server (uvicorn)."""
    import uvicorn

    from server.store.migrate import upgrade

    settings = settings_of(database_url)
    os.environ["TILETUNE_DATABASE_URL"] = settings.database_url
    if migrate:
        upgrade(settings.database_url)
    err.print(f"serving on http://{host}:{port} (database {settings.database_url.split('@')[-1]})")
    uvicorn.run("server.app:create_app", factory=True, host=host, port=port, workers=workers, log_level="warning")
