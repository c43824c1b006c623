"""Alembic environment for tiletune's tables.

Our version table is ``tiletune_alembic_version`` so Optuna's RDB storage can
keep its own ``alembic_version`` in the same database. SQLite needs
``render_as_batch`` to alter tables. Only ``tt_*`` tables are ours: Optuna's
tables are ignored by autogenerate.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from server.settings import get_settings
from server.store.db import make_engine
from server.store.migrate import include_object
from server.store.models import Base

VERSION_TABLE = "tiletune_alembic_version"
config = context.config


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        render_as_batch=connection.dialect.name == "sqlite",
        include_object=include_object,
        compare_type=True,
    )


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = config.attributes.get("database_url") or get_settings().database_url
    engine = make_engine(url)
    with engine.connect() as conn:
        sqlite = conn.dialect.name == "sqlite"
        if sqlite:
            # Batch mode rebuilds a table as copy, DROP, rename; with foreign keys on,
            # the DROP deletes the rows of every ON DELETE CASCADE child (a workload's
            # trials, jobs and configs). The pragma only takes outside a transaction.
            conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
            conn.commit()
        _configure(conn)
        with context.begin_transaction():
            context.run_migrations()
        if sqlite:
            broken = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
            if broken:
                raise RuntimeError(f"migrations left rows that break foreign keys: {broken[:5]}")
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run against a database")
run_migrations_online()
