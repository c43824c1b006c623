"""Migrations that survive a kill and concurrent starters, on SQLite and PostgreSQL.

- A SQLite upgrade killed between any two of its statements leaves a database the
  next upgrade completes: the on-disk state at each statement boundary (the database
  file and its WAL, copied as a SIGKILL would leave them) is upgraded again.
  (PostgreSQL has transactional DDL; the real SIGKILL runs of ``tiletune bench crash``
  cover both databases.)
- Processes starting together on a fresh database (each runs the migrations and
  creates Optuna's tables, as ``serve``, ``worker`` and ``tune`` do) all succeed.
"""

from __future__ import annotations

import multiprocessing
import shutil
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, event, inspect, text

from server.bench.crash import scratch_database
from server.store.db import make_engine
from server.store.migrate import current_revision, head_revision, include_object, upgrade
from server.store.models import Base

STARTERS = 3

POPULATE = [  # rows under revision 0001, linked by foreign keys
    "INSERT INTO tt_workload (id, key, device_kind, backend, dtype, family, pattern_hash, kernel_version, batch,"
    " heads, head_dim, seq_len, spec, created_at) VALUES (1, 'k', 'cpu', 'xla', 'float32', 'f', 'h', '1', 1, 1, 64,"
    """ 256, '{"pattern": {"layout": {"frames": 4, "tokens_per_frame": 64}, "heads": [{"kind": "dense"}]}}',"""
    " '2026-01-01 00:00:00')",
    "INSERT INTO tt_job (id, workload_id, status, budget, priority, attempts, max_attempts, lease_owner,"
    " lease_expires_at, created_at, updated_at) VALUES (1, 1, 'running', 8, 0, 1, 3, 'w1', '2026-01-02 00:00:00',"
    " '2026-01-01 00:00:00', '2026-01-01 00:00:00')",
    "INSERT INTO tt_trial (id, workload_id, job_id, params, params_key, status, median_ms, versions, created_at)"
    " VALUES (1, 1, 1, '{}', 'p', 'ok', 1.5, '{}', '2026-01-01 00:00:00')",
    "INSERT INTO tt_tuned_config (id, workload_id, trial_id, config, median_ms, jax_version, jaxlib_version,"
    " is_current, created_at) VALUES (1, 1, 1, '{}', 1.5, 'j', 'j', 1, '2026-01-01 00:00:00')",
    "INSERT INTO tt_api_token (id, name, role, token_hash, created_at) VALUES (1, 't', 'writer', 'x',"
    " '2026-01-01 00:00:00')",
]
KEPT = {"tt_workload": 1, "tt_job": 1, "tt_trial": 1, "tt_tuned_config": 1, "tt_api_token": 1}


def schema_diff(url: str) -> list[Any]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"include_object": include_object, "compare_type": True, "target_metadata": Base.metadata}
            )
            return list(compare_metadata(context, Base.metadata))
    finally:
        engine.dispose()


def row_counts(url: str) -> dict[str, int]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return {t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in KEPT}
    finally:
        engine.dispose()


def upgrade_with_images(url: str, db_file: Path, out: Path) -> list[Path]:
    """Upgrade ``url`` to head, copying its files after every statement; the copies, in order."""
    images: list[Path] = []

    def copy(*_args: Any) -> None:
        image = out / f"after-{len(images) + 1:03d}"
        image.mkdir()
        for suffix in ("", "-wal", "-shm"):
            src = Path(f"{db_file}{suffix}")
            if src.exists():
                shutil.copyfile(src, image / f"{db_file.name}{suffix}")
        images.append(image)

    event.listen(Engine, "after_cursor_execute", copy)
    try:
        upgrade(url)
    finally:
        event.remove(Engine, "after_cursor_execute", copy)
    return images


@pytest.mark.parametrize("start", ["fresh", "populated"])
def test_an_upgrade_killed_after_any_statement_is_completed_by_the_next(tmp_path: Path, start: str) -> None:
    db_file = tmp_path / "tiletune.db"
    url = f"sqlite:///{db_file}"
    if start == "populated":
        upgrade(url, "0001")
        engine = make_engine(url)
        with engine.begin() as conn:
            for statement in POPULATE:
                conn.execute(text(statement))
        engine.dispose()
    images = upgrade_with_images(url, db_file, tmp_path)
    assert len(images) > 20  # every statement of the upgrade is a kill point
    failures = []
    for image in images:
        copy = f"sqlite:///{image / db_file.name}"
        try:
            upgrade(copy)
        except Exception as exc:  # collected: every kill point is reported
            failures.append(f"{image.name}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
            continue
        if current_revision(copy) != head_revision() or schema_diff(copy):
            failures.append(f"{image.name}: at {current_revision(copy)}, schema differs: {schema_diff(copy)[:3]}")
        elif start == "populated" and row_counts(copy) != KEPT:
            failures.append(f"{image.name}: rows {row_counts(copy)}")
    assert not failures, (
        f"{len(failures)} of {len(images)} kill points left a database the next upgrade fails on:\n"
        + "\n".join(failures[:10])
    )


def _start(url: str, barrier: Any, results: Any) -> None:
    """One starter process: what ``serve``, ``worker`` and ``tune`` do first, all at once."""
    from server.worker.coordinator import optuna_storage

    barrier.wait()
    try:
        upgrade(url)
        storage = optuna_storage(url)
        storage.engine.dispose()
        results.put("ok")
    except Exception as exc:  # reported to the test
        results.put(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")


def start_together(url: str, n: int = STARTERS) -> list[str]:
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that holds connections and threads
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_start, args=(url, barrier, results)) for _ in range(n)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(60)
    return outcomes


def check_started(url: str, outcomes: list[str]) -> None:
    assert outcomes == ["ok"] * STARTERS, outcomes
    assert current_revision(url) == head_revision()
    assert schema_diff(url) == []
    engine = make_engine(url)
    try:
        assert {"studies", "trials", "alembic_version"} <= set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


@pytest.mark.slow
def test_starters_on_a_fresh_sqlite_file_all_succeed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    check_started(url, start_together(url))


@pytest.mark.slow
@pytest.mark.postgres
def test_starters_on_a_fresh_postgresql_database_all_succeed(postgres_url: str) -> None:
    with scratch_database(postgres_url, "starts") as url:
        check_started(url, start_together(url))
