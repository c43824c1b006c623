"""Engine and sessions for SQLite (embedded default, WAL) and PostgreSQL (psycopg 3).

:meth:`Database.transaction` is the one place tiletune commits or rolls back: a
unit of work is ``with db.transaction() as session: ...``, committed when the
block ends and rolled back when it raises (as Optuna's RDB storage does with its
scoped session). Store functions take that session and never commit themselves,
so a caller composes several of them into one atomic change.

:meth:`Database.transact` and :meth:`Database.read` run such a unit of work as a
function of its session and try it again, whole, through a database outage
(:func:`server.store.outage.ride_out`): what a worker or a tune must not lose to
a database restart goes through them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, Select, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from server.store.outage import Patience, ride_out

T = TypeVar("T")


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
    # database restart fails one request (503, see server.api.app) and is discarded.
    return create_engine(url, pool_recycle=1800, pool_size=10, max_overflow=20, **kwargs)


class Database:
    """An engine and its session factories.

    :meth:`transaction` opens a unit of work (writes, and reads that must see a
    consistent state with them). Reads go through ``reader()`` / ``read_sessions``:
    on PostgreSQL a second pool whose connections are in autocommit mode from the
    start, so one SELECT costs one round trip (a transaction around it adds a BEGIN
    and a ROLLBACK) and no connection is switched per checkout; each read statement
    still sees a consistent snapshot of its own. On SQLite reads use the one engine:
    pysqlite opens no transaction for a SELECT, and autocommit there costs more.
    """

    def __init__(self, url: str, *, busy_timeout_ms: int = 10000) -> None:
        self.url = normalize_url(url)
        self.engine = make_engine(self.url, busy_timeout_ms=busy_timeout_ms)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        if self.engine.dialect.name == "postgresql":
            self.read_engine = make_engine(self.url, isolation_level="AUTOCOMMIT")
        else:
            self.read_engine = self.engine
        self.read_sessions = sessionmaker(self.read_engine, expire_on_commit=False)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Session]:
        """A session whose work is committed when the block ends, rolled back if it raises."""
        with self._sessions() as session:
            try:
                yield session
                session.commit()
            except BaseException:
                session.rollback()
                raise

    def transact(self, work: Callable[[Session], T], *, what: str, patience: Patience | float) -> T:
        """``work(session)`` in one :meth:`transaction`, the whole transaction tried again while a
        database outage lasts, as long as ``patience`` says (:func:`~server.store.outage.ride_out`;
        ``what`` names the work in the log)."""

        def attempt() -> T:
            with self.transaction() as session:
                return work(session)

        return ride_out(attempt, what=what, patience=patience)

    def read(self, work: Callable[[Session], T], *, what: str, patience: Patience | float) -> T:
        """``work(session)`` on a read session, tried again while a database outage lasts, as
        :meth:`transact` does."""

        def attempt() -> T:
            with self.read_sessions() as session:
                return work(session)

        return ride_out(attempt, what=what, patience=patience)

    def reader(self) -> Connection:
        """A connection for reads only (autocommit on PostgreSQL; use as a context manager)."""
        return self.read_engine.connect()

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def dispose(self) -> None:
        self.engine.dispose()
        if self.read_engine is not self.engine:
            self.read_engine.dispose()

    def empty_tables(self) -> None:
        """Delete every row of tiletune's tables (benchmarks and tests own their database)."""
        from sqlalchemy import text

        from server.store.models import Base

        names = [t.name for t in reversed(Base.metadata.sorted_tables)]
        with self.engine.begin() as conn:
            if self.dialect == "postgresql":
                conn.execute(text(f"TRUNCATE {', '.join(names)} RESTART IDENTITY CASCADE"))
            else:
                for name in names:
                    conn.execute(text(f"DELETE FROM {name}"))


def page(
    session: Session, query: Select[Any], id_column: Any, limit: int, cursor: int | None, *, entities: bool = True
) -> tuple[Any, int | None]:
    """Keyset pagination, newest first: rows with id < cursor; returns (rows, next cursor).

    ``entities=True`` returns ORM objects (a select of one entity); False returns
    the plain rows of a select of columns (cheaper, for read-only listings).
    """
    if cursor is not None:
        query = query.where(id_column < cursor)
    query = query.order_by(id_column.desc()).limit(limit + 1)
    rows = session.scalars(query).all() if entities else session.execute(query).all()
    if len(rows) > limit:
        return rows[:limit], rows[limit - 1].id
    return rows, None
