"""Compile verdicts on SQLite and PostgreSQL: one per params and compiler versions, reservations
that die with their worker, refusals a TPU worker reads, and the TPU jobs compile workers serve."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import update

from kernel.tpu_compile import CompileOutcome
from server.api.schemas import WorkloadSpec
from server.store import compiles, models, queue, workloads
from server.store.db import Database
from tests.server.conftest import workload_body

V42 = {"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": "0.0.42"}
V43 = {**V42, "libtpu": "0.0.43"}
PARAMS = {"variant": "compact", "block_q": 128, "block_kv": 128}
OK = CompileOutcome("TPU v6 lite", True, 1.5, 2, {"temp_size_in_bytes": 4096})
SMEM = CompileOutcome("TPU v6 lite", False, 0.7, 0, cause="smem", error="Ran out of memory in memory space smem")


def tpu_workload(db: Database, backend: str = "tpu", batch: int = 1, queue_it: bool = True) -> int:
    with db.transaction() as session:
        wl = WorkloadSpec.model_validate(
            workload_body(device_kind="TPU v6 lite", backend=backend, dtype="bfloat16", batch=batch)
        ).to_workload()
        row = workloads.workload_row(session, wl)
        if queue_it:
            queue.enqueue_job(session, row, budget=4)
        return row.id


def test_one_verdict_per_params_and_compiler(db: Database) -> None:
    wid = tpu_workload(db)
    with db.transaction() as session:
        first = compiles.reserve_compile(session, wid, PARAMS, V42, worker="a")
        assert first is not None
        assert compiles.reserve_compile(session, wid, PARAMS, V42, worker="b") is None  # a is compiling it
        # a's reservation again (a retry whose first try committed, its answer lost): the same one
        assert compiles.reserve_compile(session, wid, PARAMS, V42, worker="a") == first
        assert compiles.refusal(session, wid, PARAMS, V42) is None  # no verdict yet
    with db.transaction() as session:
        assert not compiles.record_compile(session, first, "b", SMEM)  # not b's reservation
        assert compiles.record_compile(session, first, "a", SMEM)
        assert not compiles.record_compile(session, first, "a", OK)  # a verdict is final
    with db.transaction() as session:
        assert compiles.reserve_compile(session, wid, PARAMS, V42, worker="b") is None  # decided for 0.0.42
        reason = compiles.refusal(session, wid, PARAMS, V42)
        assert reason is not None and "smem" in reason and "worker a" in reason
        # Another libtpu is another compiler: its verdict is still open, and 0.0.42's does not bind it.
        assert compiles.refusal(session, wid, PARAMS, V43) is None
        second = compiles.reserve_compile(session, wid, PARAMS, V43, worker="b")
        assert second is not None
    with db.transaction() as session:
        assert compiles.record_compile(session, second, "b", OK)
    with db.read_sessions() as session:
        row = compiles.compile_verdict(session, wid, PARAMS, V43)
        assert row is not None and row.status == "compiled" and row.memory == OK.memory
        assert row.compile_ms == 1500.0 and row.job_id is None
        assert set(compiles.compile_verdicts(session, wid, V42)) == {row.params_key}
        assert compiles.compile_verdicts(session, wid, V42)[row.params_key].status == "uncompilable"


def test_a_dead_workers_reservation_is_taken_over_only_when_stale(db: Database) -> None:
    wid = tpu_workload(db)
    with db.transaction() as session:
        dead = compiles.reserve_compile(session, wid, PARAMS, V42, worker="dead")
        assert dead is not None
        assert compiles.reserve_compile(session, wid, PARAMS, V42, worker="b", stale_after_s=60) is None
        session.execute(
            update(models.Trial)
            .where(models.Trial.id == dead)
            .values(created_at=models.utcnow() - dt.timedelta(seconds=120))
        )
    with db.transaction() as session:
        taken = compiles.reserve_compile(session, wid, PARAMS, V42, worker="b", stale_after_s=60)
        assert taken == dead
        assert not compiles.record_compile(session, dead, "dead", OK)  # the dead worker's late verdict is dropped
        assert compiles.record_compile(session, taken, "b", OK)


def test_a_released_reservation_can_be_taken_again(db: Database) -> None:
    wid = tpu_workload(db)
    with db.transaction() as session:
        tid = compiles.reserve_compile(session, wid, PARAMS, V42, worker="a")
        assert tid is not None
        compiles.release_compile(session, tid, "a")
        assert compiles.reserve_compile(session, wid, PARAMS, V42, worker="b") is not None


def test_compile_workers_serve_active_tpu_jobs_only(db: Database) -> None:
    tpu = tpu_workload(db, batch=1)
    tpu_workload(db, backend="xla", batch=2)  # a CPU job: not theirs
    tpu_workload(db, batch=3, queue_it=False)  # no job: nothing to compile for
    with db.read_sessions() as session:
        jobs = compiles.tpu_jobs(session)
        assert [row.id for _, row in jobs] == [tpu]
        job_id = jobs[0][0]
        assert compiles.job_active(session, job_id)
    with db.transaction() as session:
        job = session.get(models.Job, job_id)
        assert job is not None
        queue.cancel_job(session, job)
    with db.read_sessions() as session:
        assert compiles.tpu_jobs(session) == []
        assert not compiles.job_active(session, job_id)
