"""Migrations that survive a kill and concurrent starters, on SQLite and PostgreSQL.

- A SQLite upgrade killed between any two of its statements leaves a database the
  next upgrade completes: the on-disk state at each statement boundary (the database
  file and its WAL, copied as a SIGKILL would leave them; identical states once) is
  upgraded again.
  (PostgreSQL has transactional DDL; the real SIGKILL runs of ``tiletune bench crash``
  cover both databases.)
- Processes starting together on a fresh database (each runs the migrations and
  creates Optuna's tables, as ``serve``, ``worker`` and ``tune`` do) all succeed.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import shutil
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, event, inspect, text

from server.bench.crash import POPULATED_0001, POPULATED_ROWS, scratch_database
from server.store.db import make_engine
from server.store.migrate import current_revision, head_revision, include_object, upgrade
from server.store.models import Base

STARTERS = 3


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
            return {t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in POPULATED_ROWS}
    finally:
        engine.dispose()


def upgrade_with_images(url: str, db_file: Path, out: Path) -> tuple[int, list[Path]]:
    """Upgrade ``url`` to head, copying its files after every statement: (statements, the distinct
    copies in order). Statements that left the files as they were give one copy: the same bytes
    on disk recover the same way."""
    statements = 0
    seen: set[str] = set()
    images: list[Path] = []

    def copy(*_args: Any) -> None:
        nonlocal statements
        statements += 1
        files = [Path(f"{db_file}{suffix}") for suffix in ("", "-wal", "-shm")]
        state = hashlib.sha256(b"".join(f.read_bytes() for f in files[:2] if f.exists())).hexdigest()
        if state in seen:
            return
        seen.add(state)
        image = out / f"after-statement-{statements:03d}"
        image.mkdir()
        for f in files:
            if f.exists():
                shutil.copyfile(f, image / f.name)
        images.append(image)

    event.listen(Engine, "after_cursor_execute", copy)
    try:
        upgrade(url)
    finally:
        event.remove(Engine, "after_cursor_execute", copy)
    return statements, images


@pytest.mark.parametrize("start", ["fresh", "populated"])
def test_an_upgrade_killed_after_any_statement_is_completed_by_the_next(tmp_path: Path, start: str) -> None:
    db_file = tmp_path / "tiletune.db"
    url = f"sqlite:///{db_file}"
    if start == "populated":
        upgrade(url, "0001")
        engine = make_engine(url)
        with engine.begin() as conn:
            for statement in POPULATED_0001:
                conn.execute(text(statement))
        engine.dispose()
    statements, images = upgrade_with_images(url, db_file, tmp_path)
    assert statements > 20 and len(images) > 1  # every statement of the upgrade is a kill point
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
        elif start == "populated" and row_counts(copy) != POPULATED_ROWS:
            failures.append(f"{image.name}: rows {row_counts(copy)}")
    assert not failures, (
        f"{len(failures)} of {len(images)} distinct kill points ({statements} statements) left a database "
        "the next upgrade fails on:\n" + "\n".join(failures[:10])
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
