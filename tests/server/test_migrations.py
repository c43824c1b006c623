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


def test_feature_columns_are_backfilled(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """0002 fills the nearest-neighbour feature columns of workloads stored under 0001."""
    import json

    from sqlalchemy import text

    from kernel.presets import get_preset
    from kernel.workload import Workload

    url = f"sqlite:///{tmp_path / 'backfill.db'}"
    upgrade(url, "0001")
    wl = Workload("cpu", "xla", "float32", 2, 64, get_preset("cogvideox-5b").pattern())
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO tt_workload (key, device_kind, backend, dtype, family, pattern_hash, kernel_version,"
                " batch, heads, head_dim, seq_len, spec, created_at) VALUES (:key, 'cpu', 'xla', 'float32', :family,"
                " :hash, '1', 2, :heads, 64, :seq, :spec, '2026-01-01')"
            ),
            {
                "key": wl.key,
                "family": wl.family,
                "hash": wl.pattern.pattern_hash,
                "heads": wl.heads,
                "seq": wl.pattern.seq_len,
                "spec": json.dumps(wl.canonical()),
            },
        )
    upgrade(url)
    with engine.connect() as conn:
        row = conn.execute(text("SELECT frames, tokens_per_frame, text_tokens, mean_window FROM tt_workload")).one()
    engine.dispose()
    features = wl.features()
    assert tuple(row) == (
        features["frames"],
        features["tokens_per_frame"],
        features["text_tokens"],
        features["mean_window"],
    )
