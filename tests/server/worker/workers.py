"""Helpers of the worker tests: replay jobs, worker processes, and the invariants
checked from the lease and trial records."""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from autotune.replay import RecordedTable, bundled_table
from server.bench.harness import Child, tiletune_command
from server.store import models, queue, workloads
from server.store.db import Database

TABLE = bundled_table("small-mixed.xla.json")


def queue_replay_jobs(
    db: Database, n: int, *, budget: int, parallelism: int = 1, table: Path = TABLE, first_batch: int = 1
) -> list[int]:
    """``n`` queued jobs of the table's workload, told apart by their batch size."""
    recorded = RecordedTable.load(table)
    ids = []
    with db.transaction() as session:
        for i in range(n):
            wl = dataclasses.replace(recorded.workload, batch=first_batch + i)
            job, created = queue.enqueue_job(
                session, workloads.workload_row(session, wl), budget=budget, parallelism=parallelism
            )
            assert created
            ids.append(job.id)
    return ids


def start_worker(url: str, *args: str, table: Path = TABLE) -> Child:
    """A ``tiletune worker`` process on the replay backend."""
    argv = ["worker", "--database-url", url, "--backend", "replay", "--replay-table", str(table), "--quiet", *args]
    return Child("worker", tiletune_command(*argv))


def start_workers(url: str, n: int, *args: str) -> list[Child]:
    """``n`` replay worker processes, returned once every one of them is claiming (so jobs
    queued afterwards are shared from the start, however slowly the processes started)."""
    procs = [start_worker(url, *args) for _ in range(n)]
    for p in procs:
        p.wait_for_output("claiming", 120)
    return procs


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.1) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def statuses(db: Database, job_ids: list[int]) -> dict[int, str]:
    with db.read_sessions() as session:
        return {j.id: j.status for j in session.query(models.Job).filter(models.Job.id.in_(job_ids))}


def finished_trials(db: Database, job_id: int) -> list[models.Trial]:
    with db.read_sessions() as session:
        return [t for t in queue.job_trials(session, job_id) if t.status not in ("running", "invalid")]


def check_job_records(db: Database, job_id: int, budget: int) -> dict[str, int]:
    """The invariants of a finished job, from its lease and trial rows; returns trials per worker.

    - exactly ``budget`` trials measured, no params twice;
    - for a job of parallelism 1, no two leases overlap in time (never held by two workers);
    - every trial was started and finished while its worker held a lease on the job;
    - exactly one lease ended the job (``done``) and one tuned config came of it.
    """
    with db.read_sessions() as session:
        job = session.get(models.Job, job_id)
        assert job is not None and job.status == "done", (job_id, job and job.status, job and job.error)
        trials = queue.job_trials(session, job_id)
        leases = queue.job_leases(session, job_id)
        tuned = session.query(models.TunedConfig).filter(models.TunedConfig.workload_id == job.workload_id).all()
        parallelism = job.parallelism
    measured = [t for t in trials if t.status != "invalid"]
    assert len(measured) == budget, (job_id, len(measured), budget)
    assert all(t.status != "running" for t in trials)
    assert len({t.params_key for t in trials}) == len(trials), f"job {job_id}: params measured twice"
    assert all(lease.ended_at is not None for lease in leases)
    assert [lease.end_reason for lease in leases].count("done") == 1
    assert len(tuned) == 1 and tuned[0].trial_id in {t.id for t in measured if t.status == "ok"}
    if parallelism == 1:
        spans = sorted((lease.claimed_at, lease.ended_at) for lease in leases)
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end is not None and end <= start, f"job {job_id} was held by two workers at once: {spans}"
    held: dict[str, list[tuple[object, object]]] = defaultdict(list)
    for lease in leases:
        held[lease.worker].append((lease.claimed_at, lease.ended_at))
    per_worker: dict[str, int] = defaultdict(int)
    for t in measured:
        if t.status == "crashed" and t.error and "lost its lease" in t.error:
            continue  # the trial in flight of a worker that died: recorded by the next claim
        assert t.worker is not None and t.finished_at is not None
        assert any(start <= t.created_at and t.finished_at <= end for start, end in held[t.worker]), (  # type: ignore[operator]
            f"trial {t.id} of job {job_id} ran outside its worker's lease"
        )
        per_worker[t.worker] += 1
    return dict(per_worker)
