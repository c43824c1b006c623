"""``tiletune token``: API tokens (only their SHA-256 is stored; a token is shown once)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from server.cli.common import DatabaseOpt, err, out
from server.cli.common import database_url as database_url_of

token_app = typer.Typer(help="API tokens (stored hashed; shown once).", no_args_is_help=True)


@token_app.command("create")
def token_create(
    name: Annotated[str, typer.Option(help="Who or what uses the token")],
    role: Annotated[str, typer.Option(help="writer | worker | admin")] = "writer",
    database_url: DatabaseOpt = None,
) -> None:
    """Create a token and print it once (only its hash is stored)."""
    from server.store import tokens
    from server.store.db import Database

    db = Database(database_url_of(database_url))
    try:
        with db.transaction() as session:
            token = tokens.create_token(session, name, role)
    except ValueError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    finally:
        db.dispose()
    err.print(f"token {name!r} ({role}) created; it is shown once:")
    print(token)


@token_app.command("revoke")
def token_revoke(name: str, database_url: DatabaseOpt = None) -> None:
    """Revoke the token called NAME."""
    from server.store import tokens
    from server.store.db import Database

    db = Database(database_url_of(database_url))
    with db.transaction() as session:
        ok = tokens.revoke_token(session, name)
    db.dispose()
    if not ok:
        err.print(f"[red]error:[/red] no active token named {name!r}")
        raise typer.Exit(2)
    err.print(f"token {name!r} revoked")


@token_app.command("list")
def token_list(database_url: DatabaseOpt = None) -> None:
    """List tokens (names, roles, state; never the tokens)."""
    from server.store import tokens
    from server.store.db import Database

    db = Database(database_url_of(database_url))
    with db.transaction() as session:
        rows = tokens.list_tokens(session)
    db.dispose()
    table = Table("name", "role", "created", "revoked")
    for row in rows:
        table.add_row(row.name, row.role, str(row.created_at)[:19], str(row.revoked_at)[:19] if row.revoked_at else "")
    out().print(table)
