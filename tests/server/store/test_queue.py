"""The job queue on SQLite and PostgreSQL: claims, leases, take-over, trial reservations."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections import Counter

import pytest
from sqlalchemy import func, select, text, update

from server.api.schemas import WorkloadSpec
from server.store import models, queue, workloads
from server.store.db import Database
from tests.server.conftest import workload_body


def queue_jobs(
    db: Database,
    n: int,
    device_kind: str = "cpu",
    priority: int = 0,
    first_batch: int = 1,
    budget: int = 4,
    parallelism: int = 1,
) -> list[int]:
    """``n`` queued jobs on distinct workloads (batch sizes from ``first_batch``)."""
    ids = []
    with db.transaction() as session:
        for i in range(n):
            wl = WorkloadSpec.model_validate(
                workload_body(device_kind=device_kind, batch=first_batch + i)
            ).to_workload()
            job, created = queue.enqueue_job(
                session, workloads.workload_row(session, wl), budget=budget, priority=priority, parallelism=parallelism
            )
            assert created
            ids.append(job.id)
    return ids


def expire(db: Database, job_id: int, worker: str) -> None:
    """The worker died a while ago: its lease ran out."""
    with db.transaction() as session:
        session.execute(
            update(models.JobLease)
            .where(models.JobLease.job_id == job_id, models.JobLease.worker == worker)
            .values(expires_at=models.utcnow() - dt.timedelta(seconds=1))
        )
        session.commit()


def params(i: int) -> dict[str, int]:
    return {"variant": "compact", "block_q": 32 * (i + 1)}  # any distinct params will do


def test_claims_match_device_and_backend_and_priority(db: Database) -> None:
    low = queue_jobs(db, 2)
    high = queue_jobs(db, 1, priority=5, first_batch=10)
    other = queue_jobs(db, 1, device_kind="TPU v6 lite")
    with db.transaction() as session:
        first = queue.claim_job(session, "w1", device_kind="cpu", backend="xla")
        assert first is not None and first.id == high[0] and first.status == "running" and first.attempts == 1
        second = queue.claim_job(session, "w1", device_kind="cpu", backend="xla")
        assert second is not None and second.id == low[0]
        assert queue.claim_job(session, "w1", device_kind="cpu", backend="tpu") is None
        tpu = queue.claim_job(session, "w2", device_kind="TPU v6 lite", backend="xla")
        assert tpu is not None and tpu.id == other[0]


def test_a_worker_claims_only_jobs_of_the_kernel_versions_it_runs(db: Database) -> None:
    """A job queued for another kernel version (an older client library) waits for a worker that runs it:
    measured on this worker's kernel, its times would be stored under the other version's key."""
    with db.transaction() as session:
        jobs = {}
        for version in ("1", "2"):
            wl = WorkloadSpec.model_validate(workload_body(kernel_version=version)).to_workload()
            jobs[version] = queue.enqueue_job(session, workloads.workload_row(session, wl), budget=4)[0].id
    with db.transaction() as session:
        assert not queue.has_claimable(session, "w", device_kind="cpu", backend="xla", kernel_versions=("3",))
        assert queue.claim_job(session, "w", device_kind="cpu", backend="xla", kernel_versions=("3",)) is None
        two = queue.claim_job(session, "w", device_kind="cpu", backend="xla", kernel_versions=("2",))
        assert two is not None and two.id == jobs["2"]
        assert not queue.has_claimable(session, "w2", device_kind="cpu", backend="xla", kernel_versions=("2",))
        one = queue.claim_job(session, "w2", device_kind="cpu", backend="xla", kernel_versions=("1", "2"))
        assert one is not None and one.id == jobs["1"]


def test_has_claimable_sees_the_queue_of_its_device_and_backend(db: Database) -> None:
    with db.transaction() as session:
        assert not queue.has_claimable(session, "w", device_kind="cpu", backend="xla")
    queue_jobs(db, 1)
    with db.transaction() as session:
        assert queue.has_claimable(session, "w", device_kind="cpu", backend="xla")
        assert not queue.has_claimable(session, "w", device_kind="cpu", backend="tpu")
        assert queue.claim_job(session, "w", device_kind="cpu", backend="xla") is not None
        assert not queue.has_claimable(session, "w2", device_kind="cpu", backend="xla")  # held, parallelism 1


def test_concurrent_workers_never_share_a_job(db: Database) -> None:
    ids = set(queue_jobs(db, 40))
    claims: list[tuple[str, int]] = []
    lock = threading.Lock()

    def worker(name: str) -> None:
        with db.transaction() as session:
            while (job := queue.claim_job(session, name, device_kind="cpu", backend="xla")) is not None:
                with lock:
                    claims.append((name, job.id))

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    counts = Counter(job_id for _, job_id in claims)
    assert set(counts) == ids and set(counts.values()) == {1}
    with db.transaction() as session:
        rows = session.query(models.Job).all()
        assert all(j.status == "running" and j.attempts == 1 for j in rows)
        holders = {lease.job_id: lease.worker for lease in session.query(models.JobLease).all()}
        assert holders == {job_id: name for name, job_id in claims}


def test_expired_lease_is_taken_over_and_the_old_worker_is_told(db: Database) -> None:
    (job_id,) = queue_jobs(db, 1)
    with db.transaction() as session:
        assert queue.claim_job(session, "dead", device_kind="cpu", backend="xla", lease_s=60) is not None
        assert queue.claim_job(session, "other", device_kind="cpu", backend="xla") is None  # lease still valid
        assert queue.heartbeat(session, job_id, "dead", lease_s=60)
        in_flight = queue.reserve_trial(session, job_id, "dead", params(0))
        assert in_flight.verdict == "reserved"
    expire(db, job_id, "dead")
    with db.transaction() as session:
        taken = queue.claim_job(session, "other", device_kind="cpu", backend="xla")
        assert taken is not None and taken.id == job_id and taken.attempts == 2
        assert not queue.heartbeat(session, job_id, "dead")  # the old worker learns it lost the job
        assert not queue.complete_trial(session, in_flight.trial_id or 0, "dead", "ok", median_ms=1.0)
        crashed = session.get(models.Trial, in_flight.trial_id, populate_existing=True)
        assert crashed is not None and crashed.status == "crashed" and "lost its lease" in (crashed.error or "")
        assert not queue.finish_job(session, job_id, "dead", "done")
        assert queue.finish_job(session, job_id, "other", "done")
        assert session.get(models.Job, job_id, populate_existing=True).status == "done"  # type: ignore[union-attr]
        leases = queue.job_leases(session, job_id)
    assert [(lease.worker, lease.end_reason) for lease in leases] == [("dead", "expired"), ("other", "done")]
    assert leases[0].ended_at is not None and leases[0].ended_at <= leases[1].claimed_at  # never held by two


def test_cancel_failures_retries_and_release(db: Database) -> None:
    first, second = queue_jobs(db, 2)
    with db.transaction() as session:
        job = queue.claim_job(session, "w", device_kind="cpu", backend="xla")
        assert job is not None and job.id == first
        queue.cancel_job(session, job)
        assert not queue.heartbeat(session, first, "w")  # cancelled: the worker stops
        assert queue.reserve_trial(session, first, "w", params(0)).verdict == "lost"
        job = queue.claim_job(session, "w", device_kind="cpu", backend="xla")
        assert job is not None and job.id == second
        for attempt in range(1, 4):
            assert job.attempts == attempt
            assert queue.finish_job(session, second, "w", "failed", error=f"boom {attempt}")
            job = queue.claim_job(session, "w", device_kind="cpu", backend="xla")
            if attempt < 3:
                assert job is not None and job.id == second
        assert job is None  # three attempts used up
        final = session.get(models.Job, second, populate_existing=True)
        assert final is not None and final.status == "failed" and final.error == "boom 3"
    (third,) = queue_jobs(db, 1, priority=9, first_batch=10)
    with db.transaction() as session:
        job = queue.claim_job(session, "w", device_kind="cpu", backend="xla")
        assert job is not None and job.id == third
        reserved = queue.reserve_trial(session, third, "w", params(0))
        assert queue.release_job(session, third, "w")
        assert session.get(models.Trial, reserved.trial_id) is None  # unfinished: measured by the next worker
        again = queue.claim_job(session, "w2", device_kind="cpu", backend="xla")
        assert again is not None and again.id == third and again.attempts == 1


def test_dead_worker_with_no_attempts_left_fails_the_job(db: Database) -> None:
    (job_id,) = queue_jobs(db, 1)
    with db.transaction() as session:
        session.execute(update(models.Job).where(models.Job.id == job_id).values(max_attempts=1))
        session.commit()
        assert queue.claim_job(session, "dead", device_kind="cpu", backend="xla") is not None
    expire(db, job_id, "dead")
    with db.transaction() as session:
        assert queue.claim_job(session, "other", device_kind="cpu", backend="xla") is None
        job = session.get(models.Job, job_id, populate_existing=True)
        assert job is not None and job.status == "failed" and "lost its lease" in (job.error or "")


def test_reservations_never_repeat_params_and_respect_the_budget(db: Database) -> None:
    (job_id,) = queue_jobs(db, 1, budget=5, parallelism=2)
    with db.transaction() as session:
        assert queue.claim_job(session, "a", device_kind="cpu", backend="xla") is not None
        joined = queue.claim_job(session, "b", device_kind="cpu", backend="xla")
        assert joined is not None and joined.id == job_id and joined.attempts == 1  # joining is not an attempt
        assert queue.claim_job(session, "c", device_kind="cpu", backend="xla") is None  # parallelism 2
        first = queue.reserve_trial(session, job_id, "a", params(0))
        assert first.verdict == "reserved"
        assert queue.reserve_trial(session, job_id, "b", params(0)).verdict == "busy"
        assert queue.complete_trial(session, first.trial_id or 0, "a", "ok", median_ms=2.0)
        known = queue.reserve_trial(session, job_id, "b", params(0))
        assert known.verdict == "known" and known.trial is not None and known.trial.median_ms == 2.0
        queue.record_invalid(session, job_id, known.trial.workload_id, params(99), "too big")
        queue.record_invalid(session, job_id, known.trial.workload_id, params(99), "too big")  # once only
    verdicts: list[str] = []
    lock = threading.Lock()

    def reserve(worker: str, start: int) -> None:
        with db.transaction() as session:
            for i in range(start, start + 10):
                verdict = queue.reserve_trial(session, job_id, worker, params(i)).verdict
                with lock:
                    verdicts.append(verdict)

    threads = [threading.Thread(target=reserve, args=(w, s)) for w, s in (("a", 1), ("b", 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    with db.transaction() as session:
        trials = queue.job_trials(session, job_id)
        progress = queue.job_progress(session, [job_id])[job_id]
    measured = [t for t in trials if t.status != "invalid"]
    assert len(measured) == 5  # the budget, shared by both workers
    assert len({t.params_key for t in trials}) == len(trials)
    assert verdicts.count("reserved") == 4 and "full" in verdicts
    assert progress.trials_done == 1 and progress.trials_running == 4 and progress.invalid == 1
    assert progress.best_ms == 2.0 and set(progress.workers) == {"a", "b"}


def test_one_finalizer_and_the_others_leave(db: Database) -> None:
    (job_id,) = queue_jobs(db, 1, parallelism=2)
    with db.transaction() as session:
        assert queue.claim_job(session, "a", device_kind="cpu", backend="xla") is not None
        assert queue.claim_job(session, "b", device_kind="cpu", backend="xla") is not None
        assert queue.begin_finalize(session, job_id, "b")
        assert not queue.begin_finalize(session, job_id, "a")
        assert queue.leave_job(session, job_id, "a")
        assert queue.claim_job(session, "c", device_kind="cpu", backend="xla") is None  # being finalized
        assert queue.finish_job(session, job_id, "b", "done")
        leases = queue.job_leases(session, job_id)
    assert {(lease.worker, lease.end_reason) for lease in leases} == {("a", "budget"), ("b", "done")}


def test_finalizer_that_dies_is_replaced(db: Database) -> None:
    (job_id,) = queue_jobs(db, 1)
    with db.transaction() as session:
        assert queue.claim_job(session, "a", device_kind="cpu", backend="xla") is not None
        assert queue.begin_finalize(session, job_id, "a")
    expire(db, job_id, "a")
    with db.transaction() as session:
        assert queue.claim_job(session, "b", device_kind="cpu", backend="xla") is not None
        assert queue.begin_finalize(session, job_id, "b")


def running_trials_of(db: Database, job_id: int) -> list[models.Trial]:
    with db.read_sessions() as session:
        return queue.job_trials(session, job_id, ("running",))


def test_a_co_workers_heartbeat_settles_a_dead_co_worker(db: Database) -> None:
    """A co-worker that died mid-trial: once its lease expires, the next heartbeat of a worker
    still on the job ends that lease and records its trial ``crashed``; a dead finalizer stops
    being the finalizer, so the survivor can finalize."""
    (job_id,) = queue_jobs(db, 1, budget=8, parallelism=2)
    with db.transaction() as session:
        assert queue.claim_job(session, "alive", device_kind="cpu", backend="xla") is not None
        assert queue.claim_job(session, "dead", device_kind="cpu", backend="xla") is not None
        in_flight = queue.reserve_trial(session, job_id, "dead", params(0)).trial_id
        mine = queue.reserve_trial(session, job_id, "alive", params(1)).trial_id
        assert queue.begin_finalize(session, job_id, "dead")
    with db.transaction() as session:
        assert queue.heartbeat(session, job_id, "alive")
    assert len(running_trials_of(db, job_id)) == 2  # nobody is dead yet
    expire(db, job_id, "dead")
    with db.transaction() as session:
        assert queue.heartbeat(session, job_id, "alive")
    with db.read_sessions() as session:
        crashed = session.get(models.Trial, in_flight)
        assert crashed is not None and crashed.status == "crashed" and crashed.error == queue.LOST_LEASE_ERROR
        assert [t.id for t in queue.job_trials(session, job_id, ("running",))] == [mine]  # the live one's goes on
        ends = {lease.worker: lease.end_reason for lease in queue.job_leases(session, job_id)}
        assert ends == {"alive": None, "dead": "expired"}
        assert queue.job_progress(session, [job_id])[job_id].trials_running == 1
    with db.transaction() as session:
        assert not queue.heartbeat(session, job_id, "dead")  # if it was only stalled, it learns it lost the job
        assert queue.begin_finalize(session, job_id, "alive")


def _end_done_with_an_expired_co_worker(db: Database, job_id: int) -> None:
    expire(db, job_id, "b")
    with db.transaction() as session:
        assert queue.finish_job(session, job_id, "a", "done")


def _end_done_with_a_live_co_worker(db: Database, job_id: int) -> None:
    with db.transaction() as session:
        assert queue.finish_job(session, job_id, "a", "done")


def _end_failed_with_an_expired_co_worker(db: Database, job_id: int) -> None:
    with db.transaction() as session:
        session.execute(update(models.Job).where(models.Job.id == job_id).values(max_attempts=1))
    expire(db, job_id, "b")
    with db.transaction() as session:
        assert queue.finish_job(session, job_id, "a", "failed", "boom")


def _end_cancelled(db: Database, job_id: int) -> None:
    with db.transaction() as session:
        job = session.get(models.Job, job_id)
        assert job is not None
        assert queue.cancel_job(session, job).status == "cancelled"


def _end_abandoned(db: Database, job_id: int) -> None:
    with db.transaction() as session:
        session.execute(update(models.Job).where(models.Job.id == job_id).values(max_attempts=1))
    expire(db, job_id, "a")
    expire(db, job_id, "b")
    with db.transaction() as session:
        assert queue.claim_job(session, "c", device_kind="cpu", backend="xla") is None


JOB_ENDS = {
    "done, expired co-worker": (_end_done_with_an_expired_co_worker, "done"),
    "done, live co-worker": (_end_done_with_a_live_co_worker, "done"),
    "failed, expired co-worker": (_end_failed_with_an_expired_co_worker, "failed"),
    "cancelled": (_end_cancelled, "cancelled"),
    "abandoned": (_end_abandoned, "failed"),
}


@pytest.mark.parametrize("end", list(JOB_ENDS))
def test_a_job_that_ends_keeps_no_running_trial(db: Database, end: str) -> None:
    """However a job ends, no trial of it stays ``running`` (they would count forever in its
    progress and budget): each way of ending it, with two workers' trials in flight."""
    ending, status = JOB_ENDS[end]
    (job_id,) = queue_jobs(db, 1, budget=8, parallelism=2)
    with db.transaction() as session:
        for i, worker in enumerate(("a", "b")):
            assert queue.claim_job(session, worker, device_kind="cpu", backend="xla") is not None
            assert queue.reserve_trial(session, job_id, worker, params(i)).verdict == "reserved"
    ending(db, job_id)
    with db.read_sessions() as session:
        job = session.get(models.Job, job_id)
        assert job is not None and job.status == status
        assert queue.job_progress(session, [job_id])[job_id].trials_running == 0
        assert all(lease.ended_at is not None for lease in queue.job_leases(session, job_id))
    assert running_trials_of(db, job_id) == []


def lock_waiters(db: Database) -> int:
    """Backends of this database waiting for a lock another transaction holds (PostgreSQL)."""
    with db.reader() as conn:
        waiting = select(func.count()).select_from(text("pg_stat_activity"))
        waiting = waiting.where(text("datname = current_database() AND wait_event_type = 'Lock'"))
        return int(conn.execute(waiting).scalar_one())


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)  # SQLite: the claim waits for the commit
def test_a_claim_racing_the_finish_of_a_stalled_worker_neither_deadlocks_nor_reopens_the_job(db: Database) -> None:
    """A worker whose lease ran out finishes its job while another worker claims it. The finish
    locks the job row before any lease, as a claim does: the claim skips the job (or waits and
    then finds it done) instead of deadlocking with it or taking the done job back to running."""
    assert db.dialect == "postgresql"
    (job_id,) = queue_jobs(db, 1)
    with db.transaction() as session:
        assert queue.claim_job(session, "stalled", device_kind="cpu", backend="xla") is not None
    expire(db, job_id, "stalled")
    outcome: dict[str, object] = {}

    def claim() -> None:
        try:
            with db.transaction() as session:
                job = queue.claim_job(session, "other", device_kind="cpu", backend="xla")
                outcome["claimed"] = None if job is None else job.id
        except Exception as exc:  # the test's verdict, below
            outcome["error"] = exc

    thread = threading.Thread(target=claim)
    with db.transaction() as session:
        assert queue.finish_job(session, job_id, "stalled", "done")
        thread.start()
        while thread.is_alive() and lock_waiters(db) == 0:  # the claim is done, or blocked by this finish
            time.sleep(0.01)
    thread.join(60)
    assert "error" not in outcome, outcome
    assert outcome.get("claimed") is None  # the job was being finished: not claimable
    with db.transaction() as session:
        assert queue.claim_job(session, "other", device_kind="cpu", backend="xla") is None
        job = session.get(models.Job, job_id)
        assert job is not None and job.status == "done" and job.attempts == 1
        assert [(lease.worker, lease.end_reason) for lease in queue.job_leases(session, job_id)] == [
            ("stalled", "done")
        ]


def test_a_worker_whose_own_lease_expired_restarts_the_job_and_its_trial_in_flight_is_crashed(db: Database) -> None:
    """A worker gave the job up in a database outage that outlasted its lease; it claims the job again."""
    (job_id,) = queue_jobs(db, 1)
    with db.transaction() as session:
        assert queue.claim_job(session, "w", device_kind="cpu", backend="xla", lease_s=60) is not None
        assert queue.claim_job(session, "w", device_kind="cpu", backend="xla") is None  # its lease is live
        in_flight = queue.reserve_trial(session, job_id, "w", params(0))
        assert in_flight.verdict == "reserved"
    expire(db, job_id, "w")
    with db.transaction() as session:
        again = queue.claim_job(session, "w", device_kind="cpu", backend="xla")
        assert again is not None and again.id == job_id and again.attempts == 2
        crashed = session.get(models.Trial, in_flight.trial_id, populate_existing=True)
        # Left running, the trial would hold up the job's finish until its deadline.
        assert crashed is not None and crashed.status == "crashed" and "lost its lease" in (crashed.error or "")
        assert queue.reserve_trial(session, job_id, "w", params(1)).verdict == "reserved"
        leases = queue.job_leases(session, job_id)
    assert [(lease.worker, lease.end_reason) for lease in leases] == [("w", "expired"), ("w", None)]


def test_recording_the_same_outcome_twice_is_kept_and_another_is_not(db: Database) -> None:
    """A retry after an outage took the answer of a commit that landed finds its own record."""
    (job_id,) = queue_jobs(db, 1)
    with db.transaction() as session:
        assert queue.claim_job(session, "w", device_kind="cpu", backend="xla") is not None
        trial_id = queue.reserve_trial(session, job_id, "w", params(0)).trial_id or 0
        assert queue.complete_trial(session, trial_id, "w", "ok", median_ms=2.123456789012345, p10_ms=0.1, error=None)
        assert queue.complete_trial(session, trial_id, "w", "ok", median_ms=2.123456789012345, p10_ms=0.1, error=None)
        assert not queue.complete_trial(
            session, trial_id, "w", "ok", median_ms=2.123456789012346, p10_ms=0.1, error=None
        )
        assert not queue.complete_trial(
            session, trial_id, "w", "crashed", median_ms=2.123456789012345, p10_ms=0.1, error=None
        )
        assert not queue.complete_trial(
            session, trial_id, "other", "ok", median_ms=2.123456789012345, p10_ms=0.1, error=None
        )
