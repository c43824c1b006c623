"""Job claiming with leases, on SQLite and PostgreSQL: no job is ever held by two workers."""

from __future__ import annotations

import datetime as dt
import threading
from collections import Counter

from server import models, store
from server.db import Database
from server.schemas import WorkloadSpec
from tests.server.conftest import workload_body


def queue_jobs(db: Database, n: int, device_kind: str = "cpu", priority: int = 0, first_batch: int = 1) -> list[int]:
    """``n`` queued jobs on distinct workloads (batch sizes from ``first_batch``)."""
    ids = []
    with db.sessions() as session:
        for i in range(n):
            wl = WorkloadSpec.model_validate(
                workload_body(device_kind=device_kind, batch=first_batch + i)
            ).to_workload()
            job, created = store.enqueue_job(session, store.workload_row(session, wl), budget=4, priority=priority)
            assert created
            ids.append(job.id)
    return ids


def test_claims_match_device_and_backend_and_priority(db: Database) -> None:
    low = queue_jobs(db, 2)
    high = queue_jobs(db, 1, priority=5, first_batch=10)
    other = queue_jobs(db, 1, device_kind="TPU v6 lite")
    with db.sessions() as session:
        first = store.claim_job(session, "w1", device_kind="cpu", backend="xla")
        assert first is not None and first.id == high[0] and first.status == "running" and first.attempts == 1
        second = store.claim_job(session, "w1", device_kind="cpu", backend="xla")
        assert second is not None and second.id == low[0]
        assert store.claim_job(session, "w1", device_kind="cpu", backend="tpu") is None
        tpu = store.claim_job(session, "w2", device_kind="TPU v6 lite", backend="xla")
        assert tpu is not None and tpu.id == other[0]


def test_concurrent_workers_never_share_a_job(db: Database) -> None:
    ids = set(queue_jobs(db, 40))
    claims: list[tuple[str, int]] = []
    lock = threading.Lock()

    def worker(name: str) -> None:
        with db.sessions() as session:
            while (job := store.claim_job(session, name, device_kind="cpu", backend="xla")) is not None:
                with lock:
                    claims.append((name, job.id))

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    counts = Counter(job_id for _, job_id in claims)
    assert set(counts) == ids and set(counts.values()) == {1}
    with db.sessions() as session:
        jobs = session.query(models.Job).all()
        assert all(j.status == "running" and j.attempts == 1 for j in jobs)
        assert {j.id: j.lease_owner for j in jobs} == {job_id: name for name, job_id in claims}


def test_expired_lease_is_taken_over_and_the_old_worker_is_told(db: Database) -> None:
    (job_id,) = queue_jobs(db, 1)
    with db.sessions() as session:
        assert store.claim_job(session, "dead", device_kind="cpu", backend="xla", lease_s=60) is not None
        assert store.claim_job(session, "other", device_kind="cpu", backend="xla") is None  # lease still valid
        assert store.heartbeat(session, job_id, "dead", lease_s=60)
        job = session.get(models.Job, job_id)
        assert job is not None
        job.lease_expires_at = models.utcnow() - dt.timedelta(seconds=1)  # the worker died an hour ago
        session.commit()
        taken = store.claim_job(session, "other", device_kind="cpu", backend="xla")
        assert taken is not None and taken.id == job_id and taken.lease_owner == "other" and taken.attempts == 2
        assert not store.heartbeat(session, job_id, "dead")  # the old worker learns it lost the job
        assert not store.finish_job(session, job_id, "dead", "done")
        assert store.finish_job(session, job_id, "other", "done")
        assert session.get(models.Job, job_id, populate_existing=True).status == "done"  # type: ignore[union-attr]


def test_cancel_failures_retries_and_release(db: Database) -> None:
    first, second = queue_jobs(db, 2)
    with db.sessions() as session:
        job = store.claim_job(session, "w", device_kind="cpu", backend="xla")
        assert job is not None and job.id == first
        store.cancel_job(session, job)
        assert not store.heartbeat(session, first, "w")  # cancelled: the worker stops
        job = store.claim_job(session, "w", device_kind="cpu", backend="xla")
        assert job is not None and job.id == second
        for attempt in range(1, 4):
            assert job.attempts == attempt
            assert store.finish_job(session, second, "w", "failed", error=f"boom {attempt}")
            job = store.claim_job(session, "w", device_kind="cpu", backend="xla")
            if attempt < 3:
                assert job is not None and job.id == second
        assert job is None  # three attempts used up
        final = session.get(models.Job, second, populate_existing=True)
        assert final is not None and final.status == "failed" and final.error == "boom 3"
    (third,) = queue_jobs(db, 1, priority=9, first_batch=10)
    with db.sessions() as session:
        job = store.claim_job(session, "w", device_kind="cpu", backend="xla")
        assert job is not None and job.id == third
        assert store.release_job(session, third, "w")
        again = store.claim_job(session, "w2", device_kind="cpu", backend="xla")
        assert again is not None and again.id == third and again.attempts == 1
