"""``tiletune db``: the service's migrations (Alembic, versioned in ``tiletune_alembic_version``)."""

from __future__ import annotations

import typer

from server.cli.common import DatabaseOpt, err
from server.cli.common import database_url as database_url_of

db_app = typer.Typer(help="Database migrations.", no_args_is_help=True)


@db_app.command("upgrade")
def db_upgrade(database_url: DatabaseOpt = None, revision: str = "head") -> None:
    """Apply migrations up to REVISION (default: head)."""
    from server.store.migrate import current_revision, upgrade

    url = database_url_of(database_url)
    upgrade(url, revision)
    err.print(f"database at revision {current_revision(url)}")


@db_app.command("downgrade")
def db_downgrade(revision: str, database_url: DatabaseOpt = None) -> None:
    """Revert migrations down to REVISION ('base' removes tiletune's tables)."""
    from server.store.migrate import current_revision, downgrade

    url = database_url_of(database_url)
    downgrade(url, revision)
    err.print(f"database at revision {current_revision(url)}")


@db_app.command("current")
def db_current(database_url: DatabaseOpt = None) -> None:
    """Print the database's revision and whether it is the head."""
    from server.store.migrate import current_revision, head_revision

    current = current_revision(database_url_of(database_url))
    head = head_revision()
    print(f"{current or 'none'}{' (head)' if current == head else f' (head is {head})'}")
