"""Alembic environment for tiletune's tables.

Our version table is ``tiletune_alembic_version`` so Optuna's RDB storage can
keep its own ``alembic_version`` in the same database. SQLite needs
``render_as_batch`` to alter tables. Only ``tt_*`` tables are ours: Optuna's
tables are ignored by autogenerate.

Every run holds the database's schema lock (concurrent starters wait, then find
the migrations done) and runs each migration in one transaction with its
version-table update, on SQLite too (see :mod:`server.store.migrate`): a process
killed mid-upgrade leaves the previous revision, which the next upgrade resumes.
"""

from __future__ import annotations

from typing import Any

from alembic import context
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection

from server.settings import get_settings
from server.store.migrate import VERSION_TABLE, include_object, migration_engine, schema_lock
from server.store.models import Base

config = context.config


def _check_foreign_keys(*, ctx: MigrationContext, **_info: Any) -> None:
    """After each SQLite migration, inside its transaction: a migration that left rows
    breaking a foreign key (foreign keys are off while batch mode rebuilds tables)
    raises, and is rolled back."""
    assert ctx.connection is not None
    broken = ctx.connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
    if broken:
        raise RuntimeError(f"migrations left rows that break foreign keys: {broken[:5]}")


def _configure(connection: Connection) -> None:
    # No statement may run on ``connection`` before this: Alembic would take the transaction
    # it opened for one run by the caller, and never commit it.
    sqlite = connection.dialect.name == "sqlite"
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        render_as_batch=sqlite,
        include_object=include_object,
        compare_type=True,
        transactional_ddl=True,
        transaction_per_migration=True,
        on_version_apply=[_check_foreign_keys] if sqlite else [],
    )


def run_migrations_online() -> None:
    url = config.attributes.get("database_url") or get_settings().database_url
    with schema_lock(url):
        engine = migration_engine(url)
        try:
            with engine.connect() as conn:
                _configure(conn)
                with context.begin_transaction():
                    context.run_migrations()
        finally:
            engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run against a database")
run_migrations_online()
