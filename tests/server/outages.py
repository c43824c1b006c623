"""Database outages made on purpose, for the tests of riding them out (PostgreSQL only).

- :func:`cut_connections` ends every session on a database, as a PostgreSQL restart, a
  failover or a proxy's idle timeout does to the connections a process holds;
- :func:`refused` also turns new connections away while it lasts (``ALLOW_CONNECTIONS
  false``), as a server that is down or still starting does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from sqlalchemy import Engine, create_engine, make_url, text
from sqlalchemy.pool import NullPool

from server.store.db import normalize_url


def _admin(url: str) -> tuple[Engine, str | None]:
    """An autocommit engine on the server's ``postgres`` database, and the name of ``url``'s database."""
    target = make_url(normalize_url(url))
    engine = create_engine(target.set(database="postgres"), poolclass=NullPool, isolation_level="AUTOCOMMIT")
    return engine, target.database


def _count(url: str, what: str) -> int:
    engine, name = _admin(url)
    try:
        with engine.connect() as conn:
            query = f"SELECT count({what}) FROM pg_stat_activity WHERE datname = :name AND pid <> pg_backend_pid()"
            return int(conn.execute(text(query), {"name": name}).scalar_one())
    finally:
        engine.dispose()


def connections(url: str) -> int:
    """How many sessions are open on ``url``'s database."""
    return _count(url, "*")


def cut_connections(url: str) -> int:
    """End every session on ``url``'s database; how many were ended."""
    return _count(url, "pg_terminate_backend(pid)")


@contextlib.contextmanager
def refused(url: str) -> Iterator[None]:
    """While inside, ``url``'s database has no sessions and accepts none."""
    engine, name = _admin(url)
    try:
        with engine.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
        cut_connections(url)
        try:
            yield
        finally:
            with engine.connect() as conn:
                conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
    finally:
        engine.dispose()
