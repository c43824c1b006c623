"""Migrations round-trip on SQLite and PostgreSQL and leave room for Optuna's tables."""

from __future__ import annotations

import optuna
from sqlalchemy import inspect
from typer.testing import CliRunner

from server.cli import app as cli
from server.store.db import make_engine
from server.store.migrate import current_revision, downgrade, head_revision, include_object, upgrade
from server.store.models import Base


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


def test_migrations_match_the_models(database_url: str) -> None:
    """Autogenerate finds nothing to do: the revisions build exactly the tables, columns and
    indexes of server.store.models (a model change without its migration fails here)."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"include_object": include_object, "compare_type": True, "target_metadata": Base.metadata}
            )
            diff = compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()
    assert diff == []


def test_0003_moves_held_leases_to_the_lease_table(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A job running under 0002 (lease columns on tt_job) keeps its holder in tt_job_lease."""
    from sqlalchemy import text

    url = f"sqlite:///{tmp_path / 'leases.db'}"
    upgrade(url, "0002")
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO tt_workload (id, key, device_kind, backend, dtype, family, pattern_hash, kernel_version,"
                " batch, heads, head_dim, seq_len, spec, created_at) VALUES (1, 'k', 'cpu', 'xla', 'float32', 'f',"
                " 'h', '1', 1, 1, 64, 256, '{}', '2026-01-01')"
            )
        )
        for job_id, status, owner in ((1, "running", "w1"), (2, "done", None)):
            conn.execute(
                text(
                    "INSERT INTO tt_job (id, workload_id, status, budget, priority, attempts, max_attempts,"
                    " lease_owner, lease_expires_at, created_at, updated_at) VALUES (:id, 1, :status, 8, 0, 1, 3,"
                    " :owner, :expires, '2026-01-01', '2026-01-01')"
                ),
                {"id": job_id, "status": status, "owner": owner, "expires": "2026-01-02" if owner else None},
            )
    upgrade(url)
    with engine.connect() as conn:
        leases = conn.execute(text("SELECT job_id, worker, ended_at FROM tt_job_lease")).all()
        jobs = conn.execute(text("SELECT id, parallelism FROM tt_job ORDER BY id")).all()
    engine.dispose()
    assert [tuple(r) for r in leases] == [(1, "w1", None)]
    assert [tuple(r) for r in jobs] == [(1, 1), (2, 1)]
    downgrade(url, "0002")
    engine = make_engine(url)
    with engine.connect() as conn:
        back = conn.execute(text("SELECT id, lease_owner FROM tt_job ORDER BY id")).all()
    engine.dispose()
    assert [tuple(r) for r in back] == [(1, "w1"), (2, None)]


def test_upgrades_from_0001_keep_every_row(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """SQLite batch migrations rebuild tables (copy, DROP, rename): with foreign keys on, the
    DROP of tt_workload would cascade to its trials, jobs and configs. Nothing may be lost."""
    from sqlalchemy import text

    url = f"sqlite:///{tmp_path / 'keep.db'}"
    upgrade(url, "0001")
    engine = make_engine(url)
    spec = '{"pattern": {"layout": {"frames": 4, "tokens_per_frame": 64}, "heads": [{"kind": "dense"}]}}'
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO tt_workload (id, key, device_kind, backend, dtype, family, pattern_hash, kernel_version,"
                " batch, heads, head_dim, seq_len, spec, created_at) VALUES (1, 'k', 'cpu', 'xla', 'float32', 'f',"
                " 'h', '1', 1, 1, 64, 256, :spec, '2026-01-01 00:00:00')"
            ),
            {"spec": spec},
        )
        conn.execute(
            text(
                "INSERT INTO tt_job (id, workload_id, status, budget, priority, attempts, max_attempts, created_at,"
                " updated_at) VALUES (1, 1, 'done', 8, 0, 1, 3, '2026-01-01 00:00:00', '2026-01-01 00:00:00')"
            )
        )
        conn.execute(
            text(
                "INSERT INTO tt_trial (id, workload_id, job_id, params, params_key, status, median_ms, versions,"
                " created_at) VALUES (1, 1, 1, '{}', 'p', 'ok', 1.5, '{}', '2026-01-01 00:00:00')"
            )
        )
        conn.execute(
            text(
                "INSERT INTO tt_tuned_config (id, workload_id, trial_id, config, median_ms, jax_version,"
                " jaxlib_version, is_current, created_at) VALUES (1, 1, 1, '{}', 1.5, 'j', 'j', 1,"
                " '2026-01-01 00:00:00')"
            )
        )
    upgrade(url)
    with engine.connect() as conn:
        counts = {t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in ("tt_workload", "tt_job")}
        counts |= {
            t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in ("tt_trial", "tt_tuned_config")
        }
        links = conn.execute(text("SELECT t.job_id, c.trial_id FROM tt_trial t, tt_tuned_config c")).one()
    engine.dispose()
    assert counts == {"tt_workload": 1, "tt_job": 1, "tt_trial": 1, "tt_tuned_config": 1}
    assert tuple(links) == (1, 1)  # ON DELETE SET NULL would have cut them
