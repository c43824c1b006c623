"""Migrations round-trip on SQLite and PostgreSQL and leave room for Optuna's tables."""

from __future__ import annotations

import optuna
from sqlalchemy import inspect
from typer.testing import CliRunner

from autotune.cli import app as cli
from server.db import make_engine
from server.migrate import current_revision, downgrade, head_revision, upgrade
from server.models import Base


def tiletune_tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return {t for t in inspect(engine).get_table_names() if t.startswith("tt_")}
    finally:
        engine.dispose()


def test_upgrade_downgrade_round_trip_then_optuna(database_url: str) -> None:
    expected = {t.name for t in Base.metadata.sorted_tables}
    assert current_revision(database_url) == head_revision()
    assert tiletune_tables(database_url) == expected
    downgrade(database_url, "base")
    assert current_revision(database_url) is None
    assert tiletune_tables(database_url) == set()
    upgrade(database_url)
    assert current_revision(database_url) == head_revision()
    assert tiletune_tables(database_url) == expected

    # Optuna keeps its own tables and its own alembic_version in the same database.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(database_url)
    study = optuna.create_study(storage=storage, study_name="tiletune-migration-check", load_if_exists=True)
    study.optimize(lambda trial: (trial.suggest_int("block_q", 8, 512) - 128) ** 2, n_trials=3)
    assert len(study.trials) >= 3
    storage.remove_session()
    storage.engine.dispose()
    assert current_revision(database_url) == head_revision()
    assert tiletune_tables(database_url) == expected
    engine = make_engine(database_url)
    try:
        names = set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert {"studies", "trials", "alembic_version", "tiletune_alembic_version"} <= names
    optuna.delete_study(study_name="tiletune-migration-check", storage=database_url)


def test_db_cli_upgrade_and_current(tmp_path) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    runner = CliRunner()
    assert runner.invoke(cli, ["db", "current", "--database-url", url]).stdout.startswith("none")
    result = runner.invoke(cli, ["db", "upgrade", "--database-url", url])
    assert result.exit_code == 0, result.output
    assert runner.invoke(cli, ["db", "current", "--database-url", url]).stdout.strip() == f"{head_revision()} (head)"
    assert runner.invoke(cli, ["db", "downgrade", "base", "--database-url", url]).exit_code == 0
    assert current_revision(url) is None
