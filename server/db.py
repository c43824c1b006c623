"""Engine and sessions for SQLite (embedded default, WAL) and PostgreSQL (psycopg 3)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker
from starlette.requests import Request


def normalize_url(url: str) -> str:
    """``postgresql://`` means psycopg 3 here (SQLAlchemy would pick psycopg2)."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def configure_sqlite(engine: Engine, busy_timeout_ms: int, *, foreign_keys: bool = True) -> None:
    """Pragmas on every new connection of a SQLite engine: WAL (readers never block the
    writer), a busy timeout (writers wait for each other instead of failing with
    "database is locked"), and synchronous=NORMAL (no fsync per commit; WAL stays
    consistent, a power cut loses at most the last commits)."""
    memory = ":memory:" in str(engine.url)

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        if not memory:
            cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        if foreign_keys:
            cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()


def make_engine(url: str, *, busy_timeout_ms: int = 10000, **kwargs: Any) -> Engine:
    url = normalize_url(url)
    if url.startswith("sqlite"):
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": busy_timeout_ms / 1000}, **kwargs
        )
        configure_sqlite(engine, busy_timeout_ms)
        return engine
    # No pool_pre_ping: it costs a round trip per request. A connection broken by a
    # database restart fails one request (503, see server.app) and is discarded.
    return create_engine(url, pool_recycle=1800, pool_size=10, max_overflow=20, **kwargs)


def get_session(request: Request) -> Iterator[Session]:
    """FastAPI dependency: a session of the app's database, closed after the request."""
    db: Database = request.app.state.db
    with db.sessions() as session:
        yield session


def get_read_session(request: Request) -> Iterator[Session]:
    """FastAPI dependency of read-only routes: a session of ``Database.read_sessions`` (autocommit
    on PostgreSQL)."""
    db: Database = request.app.state.db
    with db.read_sessions() as session:
        yield session


class Database:
    """An engine and its session factories.

    ``sessions`` open a transaction per unit of work (writes). Reads go through
    ``reader()`` / ``read_sessions``. On PostgreSQL that is a second pool whose
    connections are in autocommit mode from the start: a transaction around one
    SELECT costs two more round trips (psycopg sends BEGIN before it and the pool
    a ROLLBACK when the connection returns) -- that was half the time of a lookup
    -- and switching a shared pool's connections per checkout cost CPU on every
    request. Each read statement still sees a consistent snapshot of its own. On
    SQLite reads use the one engine: pysqlite opens no transaction for a SELECT,
    and autocommit there made a lookup 30% slower (0.59 -> 0.78 ms in-process).
    """

    def __init__(self, url: str, *, busy_timeout_ms: int = 10000) -> None:
        self.url = normalize_url(url)
        self.engine = make_engine(self.url, busy_timeout_ms=busy_timeout_ms)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        if self.engine.dialect.name == "postgresql":
            self.read_engine = make_engine(self.url, isolation_level="AUTOCOMMIT")
        else:
            self.read_engine = self.engine
        self.read_sessions = sessionmaker(self.read_engine, expire_on_commit=False)

    def reader(self) -> Connection:
        """A connection for reads only (autocommit on PostgreSQL; use as a context manager)."""
        return self.read_engine.connect()

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def session(self) -> Iterator[Session]:
        with self.sessions() as session:
            yield session

    def dispose(self) -> None:
        self.engine.dispose()
        if self.read_engine is not self.engine:
            self.read_engine.dispose()

    def empty_tables(self) -> None:
        """Delete every row of tiletune's tables (benchmarks and tests own their database)."""
        from sqlalchemy import text

        from server.models import Base

        names = [t.name for t in reversed(Base.metadata.sorted_tables)]
        with self.engine.begin() as conn:
            if self.dialect == "postgresql":
                conn.execute(text(f"TRUNCATE {', '.join(names)} RESTART IDENTITY CASCADE"))
            else:
                for name in names:
                    conn.execute(text(f"DELETE FROM {name}"))
