"""Run tiletune's Alembic migrations (used by the CLI, ``serve``, ``worker``, ``tune`` and the tests).

Two guarantees, on SQLite and PostgreSQL alike:

- **Each migration is atomic**: it runs in one transaction together with its
  update of the version table, so a process killed mid-upgrade leaves the
  database at the previous revision and the next upgrade simply runs the
  migration again. PostgreSQL has transactional DDL. Python's sqlite3 module
  (3.11, legacy transaction mode) opens no transaction before DDL, so each
  ``CREATE TABLE`` or batch-mode table rebuild would commit on its own;
  :func:`migration_engine` therefore takes BEGIN over itself (SQLAlchemy's
  documented pysqlite recipe).
- **Concurrent starts are serialised** by :func:`schema_lock`, held around the
  whole upgrade (and around the creation of Optuna's tables, see
  :func:`server.worker.coordinator.optuna_storage`): the first starter runs the
  migrations, the others wait and then find nothing left to do.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

import migrations
from server.store.db import configure_sqlite, make_engine, normalize_url

VERSION_TABLE = "tiletune_alembic_version"
SCHEMA_LOCK = 0x7474_0002  # PostgreSQL advisory lock key serialising schema changes ("tt" 2)
SCHEMA_LOCK_SUFFIX = "-schema.lock"  # SQLite: the lock file beside the database file
MIGRATION_BUSY_TIMEOUT_MS = 60_000  # a migration waits this long for a running server's write to end


def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """Autogenerate looks at tiletune's ``tt_*`` tables only (Optuna's live beside them)."""
    if type_ == "table":
        return bool(name and name.startswith("tt_"))
    return True


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    cfg.set_main_option("version_table", VERSION_TABLE)
    cfg.attributes["database_url"] = normalize_url(url)
    return cfg


def sqlite_file(url: str) -> Path | None:
    """The database file of a SQLite URL; None for an in-memory database or another dialect."""
    parsed = make_url(normalize_url(url))
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


@contextlib.contextmanager
def schema_lock(url: str) -> Iterator[None]:
    """Hold the database's schema lock (blocking until it is free) for the block.

    PostgreSQL: the session advisory lock :data:`SCHEMA_LOCK` on a connection of
    its own. SQLite: an exclusive ``flock`` on ``<database file>-schema.lock``
    (a SQLite write transaction cannot be the lock: each migration commits, and
    another starter would slip in between two of them). Either lock dies with
    its process, so a starter killed while holding it blocks nobody. The lock
    file is left in place: deleting it would let two starters lock two files.
    """
    url = normalize_url(url)
    if make_url(url).get_backend_name() == "postgresql":
        engine = create_engine(url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.execute(select(func.pg_advisory_lock(SCHEMA_LOCK)))
                try:
                    yield
                finally:
                    conn.execute(select(func.pg_advisory_unlock(SCHEMA_LOCK)))
        finally:
            engine.dispose()
        return
    path = sqlite_file(url)
    if path is None:  # in memory: one process, nobody to race
        yield
        return
    with open(f"{path}{SCHEMA_LOCK_SUFFIX}", "ab") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def migration_engine(url: str) -> Engine:
    """The engine migrations run on.

    On SQLite every transaction is one we began (``BEGIN IMMEDIATE``: the write
    lock from its first statement, waiting up to
    :data:`MIGRATION_BUSY_TIMEOUT_MS` for other writers), so DDL is
    transactional; and foreign keys are off: batch mode rebuilds a table as copy,
    DROP, rename, and with foreign keys on the DROP would delete the rows of every
    ``ON DELETE CASCADE`` child (a workload's trials, jobs and configs). The
    pragma only takes outside a transaction, hence on connect (and is checked
    there); env.py checks the keys after each migration instead, before it commits.
    """
    url = normalize_url(url)
    if make_url(url).get_backend_name() != "sqlite":
        return make_engine(url)  # PostgreSQL: transactional DDL as it is
    engine = create_engine(url, poolclass=NullPool, connect_args={"timeout": MIGRATION_BUSY_TIMEOUT_MS / 1000})
    configure_sqlite(engine, MIGRATION_BUSY_TIMEOUT_MS, foreign_keys=False)

    @event.listens_for(engine, "connect")
    def _own_transactions(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # sqlite3 emits no BEGIN (nor COMMIT around DDL) of its own
        dbapi_conn.execute("PRAGMA foreign_keys=OFF")
        if dbapi_conn.execute("PRAGMA foreign_keys").fetchone()[0]:
            raise RuntimeError("foreign keys must be off while SQLite migrations rebuild tables")

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate up to ``revision`` (atomic per migration; concurrent callers serialised)."""
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


def head_revision() -> str:
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    head = script.get_current_head()
    assert head is not None
    return head


def current_revision(url: str | None = None, engine: Engine | None = None) -> str | None:
    eng = engine or make_engine(url or "sqlite://")
    try:
        with eng.connect() as conn:
            return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()
    finally:
        if engine is None:
            eng.dispose()
