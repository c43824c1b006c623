"""The job queue: tuning jobs, the leases of the workers that hold them, and the
reservation of each trial before it is measured.

A job is ``queued`` until a worker claims it; it is ``running`` while at least
one worker holds a live lease on it (up to ``parallelism`` workers share one
job, each with its own :class:`~server.JobLease`), and ends ``done``,
``failed`` or ``cancelled``. A heartbeat extends a lease; a lease that is not
extended expires, and the next claim ends it and takes the job over (the job
resumes: its finished trials are kept). Lease rows are never deleted, so who
held a job when stays on record.

Claiming is atomic on both databases: PostgreSQL selects the candidate with
``FOR UPDATE SKIP LOCKED`` (concurrent workers neither wait for nor take the
same row); SQLite, which has one writer at a time, takes the candidate with a
conditional UPDATE that re-checks claimability, so only one writer can win.

Each trial of a job is inserted as ``running`` before it is measured
(:func:`reserve_trial`), under a lock on the job row and a unique
(job_id, params_key) index: two workers never measure the same params, and
together they never exceed the job's budget. A lease that expired is ended, and
the trial its worker had in flight recorded ``crashed``, by the next claim, by
the heartbeat of a co-worker still on the job, by its finalizer while it waits,
or when the job ends: no trial of a finished job stays ``running``.

A job leaves ``running`` once (to ``done``, ``failed``, ``cancelled`` or back
to ``queued``), in a transaction that checked its status under the job row's
lock; a claim never reopens a finished job. Transactions that change a job's
leases or trials lock in one order -- the job row, then leases, then trials --
so on PostgreSQL two of them never deadlock (SQLite has one writer at a time).

Functions take a session and never commit: the caller's
:meth:`~server.store.db.Database.transaction` does (a claim, a reservation or a
heartbeat is one transaction each).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Collection, Iterable
from typing import Any, Literal, cast

from sqlalchemy import CursorResult, and_, delete, exists, func, insert, or_, select, text, update
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from kernel.config import params_key
from server.store.models import (
    ACTIVE_JOB_STATUSES,
    ACTIVE_JOB_WHERE,
    FINAL_TRIAL_STATUSES,
    Job,
    JobLease,
    Trial,
    utcnow,
)
from server.store.models import Workload as WorkloadRow
from server.store.workloads import dialect_insert

DEFAULT_LEASE_S = 60.0
# ON CONFLICT names the partial unique index "one active job per workload" by its predicate.
ACTIVE_JOB_PREDICATE = text(ACTIVE_JOB_WHERE)


def _rowcount(result: Any) -> int:
    """Rows an UPDATE or DELETE touched (Session.execute types its result without rowcount)."""
    return int(cast(CursorResult[Any], result).rowcount)


def _live(job_id: Any) -> ColumnElement[bool]:
    """A lease of ``job_id`` that has not ended (expired or not: only a claim ends an expired lease)."""
    return and_(JobLease.job_id == job_id, JobLease.ended_at.is_(None))


def _held(job_id: Any, worker: str) -> ColumnElement[bool]:
    """``worker`` holds a live lease on ``job_id``."""
    return exists().where(_live(job_id), JobLease.worker == worker)


def _live_count(now: dt.datetime) -> Any:
    """Correlated count of the job's unexpired live leases."""
    return (
        select(func.count())
        .select_from(JobLease)
        .where(_live(Job.id), JobLease.expires_at > now)
        .correlate(Job)
        .scalar_subquery()
    )


# ---------------------------------------------------------------- queueing


def enqueue_job(
    session: Session,
    workload: WorkloadRow,
    *,
    budget: int,
    priority: int = 0,
    parallelism: int = 1,
    requested_by: str | None = None,
) -> tuple[Job, bool]:
    """Queue a tuning job unless one is queued or running: (job, created)."""
    existing = active_job(session, workload.id)
    if existing is not None:
        return existing, False
    now = utcnow()
    # At most one active job per workload (a partial unique index): a job queued by
    # another request between our read and this insert wins, and we return it.
    job_id = session.scalar(
        dialect_insert(session, Job)
        .values(
            workload_id=workload.id,
            status="queued",
            budget=budget,
            priority=priority,
            parallelism=parallelism,
            requested_by=requested_by,
            created_at=now,
            updated_at=now,
        )
        .on_conflict_do_nothing(index_elements=["workload_id"], index_where=ACTIVE_JOB_PREDICATE)
        .returning(Job.id)
    )
    if job_id is None:
        existing = active_job(session, workload.id)
        assert existing is not None
        return existing, False
    job = session.get(Job, job_id)
    assert job is not None
    return job, True


def active_job(session: Session, workload_id: int) -> Job | None:
    return session.scalar(select(Job).where(Job.workload_id == workload_id, Job.status.in_(ACTIVE_JOB_STATUSES)))


def cancel_job(session: Session, job: Job) -> Job:
    """Cancel a queued or running job: every lease ends, so workers stop at their next heartbeat,
    and the trials in flight are dropped (nobody will finish them). A job that ended meanwhile
    (its status is checked under the row's lock) is left as it is."""
    now = utcnow()
    cancelled = session.execute(
        update(Job)
        .where(Job.id == job.id, Job.status.in_(ACTIVE_JOB_STATUSES))
        .values(status="cancelled", finished_at=now, updated_at=now)
    )
    if _rowcount(cancelled) == 1:
        session.execute(update(JobLease).where(_live(job.id)).values(ended_at=now, end_reason="cancelled"))
        session.execute(delete(Trial).where(Trial.job_id == job.id, Trial.status == "running"))
    session.refresh(job)
    return job


# ---------------------------------------------------------------- claiming and leases


def _claimable(now: dt.datetime, worker: str) -> ColumnElement[bool]:
    """A job ``worker`` may take: queued with attempts left, or running with a free
    lease slot that ``worker`` does not hold already -- joining workers while
    others still hold it (and nobody re-times the finalists yet), or restarting it
    when every lease expired (a new attempt). A worker whose own lease expired may
    restart the job too: it claims only between jobs, so it no longer works on it
    (it gave the job up during a database outage that outlasted its lease)."""
    live = _live_count(now)
    mine = exists().where(_live(Job.id), JobLease.worker == worker, JobLease.expires_at > now)
    return or_(
        and_(Job.status == "queued", Job.attempts < Job.max_attempts),
        and_(
            Job.status == "running",
            live < Job.parallelism,
            ~mine,
            or_(and_(live > 0, Job.finalizer.is_(None)), and_(live == 0, Job.attempts < Job.max_attempts)),
        ),
    )


def fail_abandoned_jobs(session: Session) -> int:
    """Running jobs whose every lease expired and that have no attempts left become ``failed``."""
    now = utcnow()
    abandoned = select(Job.id).where(Job.status == "running", _live_count(now) == 0, Job.attempts >= Job.max_attempts)
    ids = list(session.scalars(abandoned.with_for_update(skip_locked=True, of=Job)))  # job rows first
    if not ids:
        return 0
    session.execute(
        update(JobLease)
        .where(JobLease.job_id.in_(ids), JobLease.ended_at.is_(None))
        .values(ended_at=now, end_reason="expired")
    )
    for job_id in ids:
        _reap(session, job_id, now)
    failed = _rowcount(
        session.execute(
            update(Job)
            .where(Job.id.in_(ids), Job.status == "running")
            .values(
                status="failed",
                error="every attempt's worker lost its lease (crashed or killed); no attempts left",
                finished_at=now,
                updated_at=now,
            )
        )
    )
    return failed


def _candidates(
    now: dt.datetime, worker: str, device_kind: str, backend: str, kernel_versions: Collection[str] | None
) -> Any:
    where = [WorkloadRow.device_kind == device_kind, WorkloadRow.backend == backend, _claimable(now, worker)]
    if kernel_versions is not None:
        where.append(WorkloadRow.kernel_version.in_(sorted(kernel_versions)))
    return (
        select(Job.id)
        .join(WorkloadRow, WorkloadRow.id == Job.workload_id)
        .where(*where)
        .order_by(Job.priority.desc(), Job.id)
        .limit(1)
    )


def has_claimable(
    session: Session,
    worker: str,
    *,
    device_kind: str,
    backend: str,
    kernel_versions: Collection[str] | None = None,
) -> bool:
    """Whether a job is there for ``worker`` to claim, locked by another claim right now or not
    (a claim that skipped a locked row found nothing, but the queue is not empty)."""
    return session.scalar(_candidates(utcnow(), worker, device_kind, backend, kernel_versions)) is not None


def claim_job(
    session: Session,
    worker: str,
    *,
    device_kind: str,
    backend: str,
    kernel_versions: Collection[str] | None = None,
    lease_s: float = DEFAULT_LEASE_S,
) -> Job | None:
    """Atomically take a lease on the next job this worker can run, or None.

    Candidates are jobs of the worker's device kind and backend, and of one of
    ``kernel_versions`` when given (the kernel the worker runs: a job of another
    version is left for a worker that runs it, never measured on the wrong code;
    see :func:`_claimable`), highest priority first, then oldest. A claim that finds
    no live lease starts a new attempt (``attempts`` + 1) and resumes the job;
    either way the job's expired leases end now and their in-flight trials are
    recorded as ``crashed``.
    """
    fail_abandoned_jobs(session)
    now = utcnow()
    candidates = _candidates(now, worker, device_kind, backend, kernel_versions)
    postgres = session.get_bind().dialect.name == "postgresql"
    # A candidate that turns out not to be claimable after all (another worker won it)
    # changed nothing but the expiry of leases that had expired anyway: try the next one
    # in the same transaction, whose next statement sees the other claim.
    for _ in range(8):
        if postgres:
            job_id = session.scalar(candidates.with_for_update(skip_locked=True, of=Job))
        else:
            job_id = session.scalar(candidates)
        if job_id is None:
            return None
        if postgres:
            # The row is locked, but a row that another claim changed while we waited for
            # it was re-checked against the leases of our statement's older snapshot:
            # check again in a new statement (a new snapshot under READ COMMITTED).
            still = session.scalar(select(exists().where(Job.id == job_id, _claimable(now, worker))))
        else:
            still = (
                _rowcount(
                    session.execute(update(Job).where(Job.id == job_id, _claimable(now, worker)).values(updated_at=now))
                )
                == 1
            )
        if still and _take(session, job_id, worker, now, lease_s):
            return session.get(Job, job_id, populate_existing=True)
    return None


def _take(session: Session, job_id: int, worker: str, now: dt.datetime, lease_s: float) -> bool:
    """The claim itself, inside the transaction that holds the job row; False when no lease
    slot is free after all (a stalled worker's heartbeat came back in time)."""
    _end_expired(session, job_id, now)
    live = session.scalar(select(func.count()).select_from(JobLease).where(_live(job_id))) or 0
    parallelism = session.scalar(select(Job.parallelism).where(Job.id == job_id)) or 1
    if live >= parallelism:
        return False
    values: dict[str, Any] = {"status": "running", "updated_at": now}
    if live == 0:  # a fresh start or a take-over: a new attempt, nobody re-timing yet
        values.update(attempts=Job.attempts + 1, finalizer=None)
    taken = session.execute(update(Job).where(Job.id == job_id, Job.status.in_(ACTIVE_JOB_STATUSES)).values(**values))
    if _rowcount(taken) != 1:  # it ended meanwhile: a claim never reopens a finished job
        return False
    # Before the new lease: trials in flight that this worker left on the job when its lease
    # expired (it gave the job up during a database outage) are crashed too.
    _reap(session, job_id, now)
    session.execute(
        insert(JobLease).values(
            job_id=job_id, worker=worker, claimed_at=now, expires_at=now + dt.timedelta(seconds=lease_s)
        )
    )
    return True


def _end_expired(session: Session, job_id: int, now: dt.datetime) -> int:
    """End the job's expired leases (their workers died or stalled); a finalizer among them
    is no longer the finalizer, so a co-worker still on the job can take its place."""
    ended = _rowcount(
        session.execute(
            update(JobLease).where(_live(job_id), JobLease.expires_at <= now).values(ended_at=now, end_reason="expired")
        )
    )
    if ended:
        holders = select(JobLease.worker).where(_live(job_id))
        session.execute(
            update(Job).where(Job.id == job_id, Job.finalizer.is_not(None), Job.finalizer.not_in(holders))
            .values(finalizer=None)
        )  # fmt: skip
    return ended


LOST_LEASE_ERROR = "the worker measuring this trial lost its lease (it died or stalled) before it finished"


def _reap(session: Session, job_id: int, now: dt.datetime, error: str = LOST_LEASE_ERROR) -> int:
    """Running trials of ``job_id`` whose worker holds no live lease: ``crashed``."""
    holders = select(JobLease.worker).where(_live(job_id))
    return _rowcount(
        session.execute(
            update(Trial)
            .where(Trial.job_id == job_id, Trial.status == "running", Trial.worker.not_in(holders))
            .values(status="crashed", error=error, finished_at=now)
        )
    )


def _lock_job(session: Session, job_id: int) -> None:
    """Lock the job row first (PostgreSQL), for the one lock order of the module docstring.

    SQLite ignores FOR UPDATE: its first write takes the database's write lock, and
    every change here is a conditional statement evaluated under that lock."""
    session.execute(select(Job.id).where(Job.id == job_id).with_for_update())


def reap_lost_trials(session: Session, job_id: int) -> int:
    """End the job's expired leases and record their workers' trials in flight as ``crashed``
    (the number of trials)."""
    now = utcnow()
    _lock_job(session, job_id)
    _end_expired(session, job_id, now)
    return _reap(session, job_id, now)


def heartbeat(session: Session, job_id: int, worker: str, lease_s: float = DEFAULT_LEASE_S) -> bool:
    """Extend the worker's lease; False when it is no longer the worker's (the job was
    cancelled or finished, or another worker took it over): stop working on it.

    A co-worker's lease that expired meanwhile is ended here and its trial in flight
    recorded ``crashed``: a dead co-worker costs its lease's time, not the job's end."""
    now = utcnow()
    _lock_job(session, job_id)
    extended = _rowcount(
        session.execute(
            update(JobLease)
            .where(
                _live(job_id),
                JobLease.worker == worker,
                exists().where(Job.id == job_id, Job.status == "running"),
            )
            .values(expires_at=now + dt.timedelta(seconds=lease_s))
        )
    )
    if extended != 1:
        return False
    if _end_expired(session, job_id, now):
        _reap(session, job_id, now)
    return True


def _end_lease(session: Session, job_id: int, worker: str, reason: str, now: dt.datetime) -> bool:
    return (
        _rowcount(
            session.execute(
                update(JobLease).where(_live(job_id), JobLease.worker == worker).values(ended_at=now, end_reason=reason)
            )
        )
        == 1
    )


def _others_live(session: Session, job_id: int, worker: str, now: dt.datetime) -> int:
    return (
        session.scalar(
            select(func.count())
            .select_from(JobLease)
            .where(_live(job_id), JobLease.worker != worker, JobLease.expires_at > now)
        )
        or 0
    )


def co_workers(session: Session, job_id: int, worker: str) -> int:
    """How many other workers hold a live lease on the job (expired or not: see :func:`reap_lost_trials`)."""
    return (
        session.scalar(select(func.count()).select_from(JobLease).where(_live(job_id), JobLease.worker != worker)) or 0
    )


def _drop_unfinished(session: Session, job_id: int, worker: str) -> None:
    """Delete the worker's reserved, unfinished trials of the job (another worker measures them)."""
    session.execute(delete(Trial).where(Trial.job_id == job_id, Trial.worker == worker, Trial.status == "running"))


def leave_job(session: Session, job_id: int, worker: str) -> bool:
    """The worker's share of a job is done (its budget is spent and another worker
    re-times the finalists): end its lease, leave the job running."""
    return _end_lease(session, job_id, worker, "budget", utcnow())


def release_job(session: Session, job_id: int, worker: str) -> bool:
    """Give the job back (a worker stopping on SIGTERM): the worker's unfinished trials
    are dropped (another worker measures them), and if no other worker holds the job
    it is queued again without counting the attempt."""
    now = utcnow()
    _lock_job(session, job_id)
    if not _end_lease(session, job_id, worker, "released", now):
        return False
    _drop_unfinished(session, job_id, worker)
    if _others_live(session, job_id, worker, now) == 0:
        session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == "running")
            .values(status="queued", attempts=Job.attempts - 1, finalizer=None, updated_at=now)
        )
    return True


def finish_job(session: Session, job_id: int, worker: str, status: str, error: str | None = None) -> bool:
    """End the worker's part of a job as ``done`` or ``failed``; False when the job is no
    longer running or the worker no longer holds it (the job and its leases are left as
    they are).

    ``done`` ends the job and every lease on it. ``failed`` ends this worker's
    lease; once no other worker holds the job it is queued again while it has
    attempts left (retried by the next claim), else it is ``failed`` with ``error``.
    The job's status is checked under its row's lock (the first statement writes
    it), so of two workers finishing one job at once only one can: a caller that
    publishes the job's result in the same transaction, after this returned True,
    publishes it once. A job that ends keeps no ``running`` trial: expired
    co-workers' are ``crashed`` with the lost lease, any other with the job's end.
    """
    if status not in ("done", "failed"):
        raise ValueError("status must be 'done' or 'failed'")
    now = utcnow()
    locked = session.execute(update(Job).where(Job.id == job_id, Job.status == "running").values(updated_at=now))
    if _rowcount(locked) != 1:
        return False
    job = session.get(Job, job_id, populate_existing=True)  # a new statement: every commit before our lock
    if job is None or job.status != "running" or not _end_lease(session, job_id, worker, status, now):
        return False
    _drop_unfinished(session, job_id, worker)  # reservations it will not measure (another worker may)
    _end_expired(session, job_id, now)
    _reap(session, job_id, now)
    job.error = error
    if status == "done":  # co-workers still on it learn at their next heartbeat or reservation
        session.execute(update(JobLease).where(_live(job_id)).values(ended_at=now, end_reason="job_done"))
        job.status = "done"
        job.finished_at = now
    elif _others_live(session, job_id, worker, now) == 0:
        if job.attempts < job.max_attempts:
            job.status = "queued"
            job.finalizer = None
        else:
            job.status = "failed"
            job.finished_at = now
    if job.status in ("done", "failed"):
        _reap(session, job_id, now, error="the job ended before this trial finished")
    return True


def finished_by(session: Session, job_id: int, worker: str) -> bool:
    """Whether ``worker`` itself ended the job ``done`` (its lease ended so): what a retried finish
    finds when its first try committed but an outage took the answer."""
    job = session.get(Job, job_id, populate_existing=True)
    if job is None or job.status != "done":
        return False
    reason = session.scalar(
        select(JobLease.end_reason)
        .where(JobLease.job_id == job_id, JobLease.worker == worker)
        .order_by(JobLease.id.desc())
        .limit(1)
    )
    return reason == "done"


def begin_finalize(session: Session, job_id: int, worker: str) -> bool:
    """Become the one worker that re-times the job's finalists and publishes the winner."""
    won = _rowcount(
        session.execute(
            update(Job)
            .where(
                Job.id == job_id,
                Job.status == "running",
                or_(Job.finalizer.is_(None), Job.finalizer == worker),
                _held(job_id, worker),
            )
            .values(finalizer=worker, updated_at=utcnow())
        )
    )
    return won == 1


# ---------------------------------------------------------------- trials of a job

Verdict = Literal["reserved", "known", "busy", "full", "lost"]


@dataclasses.dataclass
class Reservation:
    """The answer to "may I measure these params?": ``reserved`` (yes: ``trial_id`` is
    the running row), ``known`` (measured already: ``trial`` is the finished row),
    ``busy`` (another worker is measuring them), ``full`` (the budget is spent) or
    ``lost`` (the worker no longer holds the job)."""

    verdict: Verdict
    trial_id: int | None = None
    trial: Trial | None = None


def reserve_trial(
    session: Session,
    job_id: int,
    worker: str,
    params: dict[str, Any],
    *,
    number: int | None = None,
    host: str | None = None,
    versions: dict[str, Any] | None = None,
) -> Reservation:
    """Insert the trial as ``running`` if the worker holds the job, nobody measured the
    params and the budget has room; all under the job row's lock (an UPDATE of it
    first, which only matches while the worker holds the running job: a row lock on
    PostgreSQL, the write lock on SQLite)."""
    now = utcnow()
    touched = _rowcount(
        session.execute(
            update(Job).where(Job.id == job_id, Job.status == "running", _held(job_id, worker)).values(updated_at=now)
        )
    )
    job = session.get(Job, job_id, populate_existing=True)
    if touched != 1 or job is None:
        return Reservation("lost")
    key = params_key(params)
    existing = session.scalar(select(Trial).where(Trial.job_id == job_id, Trial.params_key == key))
    if existing is not None:
        return Reservation("busy" if existing.status == "running" else "known", existing.id, existing)
    spent = (
        session.scalar(select(func.count()).select_from(Trial).where(Trial.job_id == job_id, Trial.status != "invalid"))
        or 0
    )
    if spent >= job.budget:
        return Reservation("full")
    trial_id = session.scalar(
        insert(Trial)
        .values(
            workload_id=job.workload_id,
            job_id=job_id,
            number=number,
            params=params,
            params_key=key,
            status="running",
            versions=versions or {},
            host=host,
            worker=worker,
            created_at=now,
        )
        .returning(Trial.id)
    )
    return Reservation("reserved", trial_id)


def complete_trial(session: Session, trial_id: int, worker: str, status: str, **fields: Any) -> bool:
    """Record the measured outcome of the worker's reserved trial; False when the trial
    is no longer the worker's (it lost the job and the trial was recorded ``crashed``).

    Recording the same outcome again is True: a retry whose first try committed but lost
    its answer with the connection (:func:`server.store.outage.ride_out`) finds it there."""
    if status not in FINAL_TRIAL_STATUSES:
        raise ValueError(f"trial status must be one of {FINAL_TRIAL_STATUSES}, got {status!r}")
    done = _rowcount(
        session.execute(
            update(Trial)
            .where(Trial.id == trial_id, Trial.worker == worker, Trial.status == "running")
            .values(status=status, finished_at=utcnow(), **fields)
        )
    )
    if done == 1:
        return True
    row = session.get(Trial, trial_id)
    return (
        row is not None
        and row.worker == worker
        and row.status == status
        and all(getattr(row, name) == value for name, value in fields.items())
    )


def abandon_trial(session: Session, trial_id: int, worker: str) -> None:
    """Drop the worker's reservation of a trial it will not finish (another worker measures it)."""
    session.execute(delete(Trial).where(Trial.id == trial_id, Trial.worker == worker, Trial.status == "running"))


def record_invalid(
    session: Session, job_id: int, workload_id: int, params: dict[str, Any], reason: str, **fields: Any
) -> None:
    """An invalid proposal of a job, recorded once however many workers propose it."""
    values = {
        "workload_id": workload_id,
        "job_id": job_id,
        "params": params,
        "params_key": params_key(params),
        "status": "invalid",
        "error": reason,
        "created_at": utcnow(),
        "finished_at": utcnow(),
        "versions": {},
        **fields,
    }
    stmt = dialect_insert(session, Trial).values(**values)
    session.execute(
        stmt.on_conflict_do_nothing(index_elements=["job_id", "params_key"], index_where=Trial.job_id.is_not(None))
    )


def job_trials(session: Session, job_id: int, statuses: Iterable[str] | None = None) -> list[Trial]:
    query = select(Trial).where(Trial.job_id == job_id).order_by(Trial.id)
    if statuses is not None:
        query = query.where(Trial.status.in_(list(statuses)))
    return list(session.scalars(query))


def running_trials(session: Session, job_id: int) -> int:
    return (
        session.scalar(select(func.count()).select_from(Trial).where(Trial.job_id == job_id, Trial.status == "running"))
        or 0
    )


# ---------------------------------------------------------------- progress


@dataclasses.dataclass
class JobProgress:
    trials_done: int = 0  # measured trials (every final status but invalid)
    trials_running: int = 0
    invalid: int = 0
    best_ms: float | None = None  # best median of an ok trial so far
    workers: tuple[str, ...] = ()  # workers holding a live lease


def job_progress(session: Session, job_ids: Iterable[int]) -> dict[int, JobProgress]:
    """Progress of each job in two grouped queries (trials, live leases)."""
    ids = list(job_ids)
    out = {i: JobProgress() for i in ids}
    if not ids:
        return out
    rows = session.execute(
        select(
            Trial.job_id,
            func.count().filter(Trial.status.not_in(("running", "invalid"))),
            func.count().filter(Trial.status == "running"),
            func.count().filter(Trial.status == "invalid"),
            func.min(Trial.median_ms).filter(Trial.status == "ok"),
        )
        .where(Trial.job_id.in_(ids))
        .group_by(Trial.job_id)
    ).all()
    for job_id, done, running, invalid, best in rows:
        assert job_id is not None  # filtered by the IN clause
        out[job_id] = JobProgress(done, running, invalid, best)
    for job_id, worker in session.execute(
        select(JobLease.job_id, JobLease.worker)
        .where(JobLease.job_id.in_(ids), JobLease.ended_at.is_(None))
        .order_by(JobLease.id)
    ):
        p = out[job_id]
        p.workers = (*p.workers, worker)
    return out


def job_leases(session: Session, job_id: int) -> list[JobLease]:
    return list(session.scalars(select(JobLease).where(JobLease.job_id == job_id).order_by(JobLease.id)))
