"""Crash runs of tiletune's processes: throw-away PostgreSQL databases to kill them on."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from server.store.db import normalize_url


@contextlib.contextmanager
def scratch_database(url: str, tag: str = "scratch") -> Iterator[str]:
    """A new, empty PostgreSQL database beside the one of ``url`` (named after it, ``tag`` and a
    random suffix), dropped on exit; its URL. Needs the CREATEDB privilege."""
    base = make_url(normalize_url(url))
    if base.get_backend_name() != "postgresql":
        raise ValueError(f"a scratch database needs PostgreSQL, got {base.get_backend_name()}")
    name = f"{(base.database or 'tiletune')[:40]}_{tag[:12]}_{secrets.token_hex(4)}"  # within 63 bytes
    admin = create_engine(base, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield base.set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()
