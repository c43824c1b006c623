"""The job queue: tuning jobs, the leases of the workers that hold them, and the
reservation of each trial before it is measured.

A job is ``queued`` until a worker claims it; it is ``running`` while at least
one worker holds a live lease on it (up to ``parallelism`` workers share one
job, each with its own :class:`~server.models.JobLease`), and ends ``done``,
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
together they never exceed the job's budget. A running trial whose worker lost
its lease (it died) is recorded as ``crashed`` by the next claim.

Every function that writes commits its own unit of work.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable
from typing import Any, Literal, cast

from sqlalchemy import CursorResult, and_, delete, exists, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from server import models
from server.models import ACTIVE_JOB_STATUSES, utcnow
from server.store import dialect_insert, params_key

DEFAULT_LEASE_S = 60.0
_J, _L, _T, _W = models.Job, models.JobLease, models.Trial, models.Workload


def _rowcount(result: Any) -> int:
    """Rows an UPDATE or DELETE touched (Session.execute types its result without rowcount)."""
    return int(cast(CursorResult[Any], result).rowcount)


def _live(job_id: Any) -> ColumnElement[bool]:
    """A lease of ``job_id`` that has not ended (expired or not: only a claim ends an expired lease)."""
    return and_(_L.job_id == job_id, _L.ended_at.is_(None))


def _held(job_id: Any, worker: str) -> ColumnElement[bool]:
    """``worker`` holds a live lease on ``job_id``."""
    return exists().where(_live(job_id), _L.worker == worker)


def _live_count(now: dt.datetime) -> Any:
    """Correlated count of the job's unexpired live leases."""
    return select(func.count()).select_from(_L).where(_live(_J.id), _L.expires_at > now).correlate(_J).scalar_subquery()


# ---------------------------------------------------------------- queueing


def enqueue_job(
    session: Session,
    workload: models.Workload,
    *,
    budget: int,
    priority: int = 0,
    parallelism: int = 1,
    requested_by: str | None = None,
) -> tuple[models.Job, bool]:
    """Queue a tuning job unless one is queued or running: (job, created)."""
    existing = active_job(session, workload.id)
    if existing is not None:
        return existing, False
    job = models.Job(
        workload_id=workload.id,
        status="queued",
        budget=budget,
        priority=priority,
        parallelism=parallelism,
        requested_by=requested_by,
    )
    session.add(job)
    try:
        session.commit()
    except IntegrityError:  # another request queued one between our read and insert
        session.rollback()
        existing = active_job(session, workload.id)
        assert existing is not None
        return existing, False
    return job, True


def active_job(session: Session, workload_id: int) -> models.Job | None:
    return session.scalar(select(_J).where(_J.workload_id == workload_id, _J.status.in_(ACTIVE_JOB_STATUSES)))


def cancel_job(session: Session, job: models.Job) -> models.Job:
    """Cancel a queued or running job: every lease ends, so workers stop at their next heartbeat."""
    if job.status in ACTIVE_JOB_STATUSES:
        now = utcnow()
        session.execute(update(_L).where(_live(job.id)).values(ended_at=now, end_reason="cancelled"))
        job.status = "cancelled"
        job.finished_at = now
        session.commit()
    return job


# ---------------------------------------------------------------- claiming and leases


def _claimable(now: dt.datetime, worker: str) -> ColumnElement[bool]:
    """A job ``worker`` may take: queued with attempts left, or running with a free
    lease slot that ``worker`` does not hold already -- joining workers while
    others still hold it (and nobody re-times the finalists yet), or restarting it
    when every lease expired (a new attempt)."""
    live = _live_count(now)
    mine = _held(_J.id, worker)
    return or_(
        and_(_J.status == "queued", _J.attempts < _J.max_attempts),
        and_(
            _J.status == "running",
            live < _J.parallelism,
            ~mine,
            or_(and_(live > 0, _J.finalizer.is_(None)), and_(live == 0, _J.attempts < _J.max_attempts)),
        ),
    )


def fail_abandoned_jobs(session: Session) -> int:
    """Running jobs whose every lease expired and that have no attempts left become ``failed``."""
    now = utcnow()
    abandoned = select(_J.id).where(_J.status == "running", _live_count(now) == 0, _J.attempts >= _J.max_attempts)
    ids = list(session.scalars(abandoned))
    if not ids:
        session.rollback()
        return 0
    session.execute(
        update(_L).where(_L.job_id.in_(ids), _L.ended_at.is_(None)).values(ended_at=now, end_reason="expired")
    )
    failed = _rowcount(
        session.execute(
            update(_J)
            .where(_J.id.in_(ids), _J.status == "running")
            .values(
                status="failed",
                error="every attempt's worker lost its lease (crashed or killed); no attempts left",
                finished_at=now,
                updated_at=now,
            )
        )
    )
    session.commit()
    return failed


def _candidates(now: dt.datetime, worker: str, device_kind: str, backend: str) -> Any:
    return (
        select(_J.id)
        .join(_W, _W.id == _J.workload_id)
        .where(_W.device_kind == device_kind, _W.backend == backend, _claimable(now, worker))
        .order_by(_J.priority.desc(), _J.id)
        .limit(1)
    )


def has_claimable(session: Session, worker: str, *, device_kind: str, backend: str) -> bool:
    """Whether a job is there for ``worker`` to claim, locked by another claim right now or not
    (a claim that skipped a locked row found nothing, but the queue is not empty)."""
    found = session.scalar(_candidates(utcnow(), worker, device_kind, backend)) is not None
    session.rollback()
    return found


def claim_job(
    session: Session, worker: str, *, device_kind: str, backend: str, lease_s: float = DEFAULT_LEASE_S
) -> models.Job | None:
    """Atomically take a lease on the next job this worker can run, or None.

    Candidates are jobs of the worker's device kind and backend (see
    :func:`_claimable`), highest priority first, then oldest. A claim that finds
    no live lease starts a new attempt (``attempts`` + 1) and resumes the job;
    either way the job's expired leases end now and their in-flight trials are
    recorded as ``crashed``.
    """
    fail_abandoned_jobs(session)
    now = utcnow()
    candidates = _candidates(now, worker, device_kind, backend)
    postgres = session.get_bind().dialect.name == "postgresql"
    for _ in range(8):  # on SQLite another worker may win a candidate: try the next one
        if postgres:
            job_id = session.scalar(candidates.with_for_update(skip_locked=True, of=_J))
        else:
            job_id = session.scalar(candidates)
        if job_id is None:
            session.rollback()
            return None
        if postgres:
            # The row is locked, but a row that another claim changed while we waited for
            # it was re-checked against the leases of our statement's older snapshot:
            # check again in a new statement (a new snapshot under READ COMMITTED).
            still = session.scalar(select(exists().where(_J.id == job_id, _claimable(now, worker))))
        else:
            still = (
                _rowcount(
                    session.execute(update(_J).where(_J.id == job_id, _claimable(now, worker)).values(updated_at=now))
                )
                == 1
            )
        if not still or not _take(session, job_id, worker, now, lease_s):
            session.rollback()
            continue
        session.commit()
        return session.get(_J, job_id, populate_existing=True)
    return None


def _take(session: Session, job_id: int, worker: str, now: dt.datetime, lease_s: float) -> bool:
    """The claim itself, inside the transaction that holds the job row; False (roll back)
    when no lease slot is free after all (a stalled worker's heartbeat came back in time)."""
    session.execute(update(_L).where(_live(job_id), _L.expires_at <= now).values(ended_at=now, end_reason="expired"))
    live = session.scalar(select(func.count()).select_from(_L).where(_live(job_id))) or 0
    parallelism = session.scalar(select(_J.parallelism).where(_J.id == job_id)) or 1
    if live >= parallelism:
        return False
    values: dict[str, Any] = {"status": "running", "updated_at": now}
    if live == 0:  # a fresh start or a take-over: a new attempt, nobody re-timing yet
        values.update(attempts=_J.attempts + 1, finalizer=None)
    session.execute(update(_J).where(_J.id == job_id).values(**values))
    session.execute(
        insert(_L).values(job_id=job_id, worker=worker, claimed_at=now, expires_at=now + dt.timedelta(seconds=lease_s))
    )
    _reap(session, job_id, now)
    return True


def _reap(session: Session, job_id: int, now: dt.datetime) -> int:
    """Running trials of ``job_id`` whose worker holds no live lease: ``crashed``."""
    holders = select(_L.worker).where(_live(job_id))
    return _rowcount(
        session.execute(
            update(_T)
            .where(_T.job_id == job_id, _T.status == "running", _T.worker.not_in(holders))
            .values(
                status="crashed",
                error="the worker measuring this trial lost its lease (it died or stalled) before it finished",
                finished_at=now,
            )
        )
    )


def reap_lost_trials(session: Session, job_id: int) -> int:
    """Record the in-flight trials of workers that no longer hold the job as ``crashed``."""
    reaped = _reap(session, job_id, utcnow())
    session.commit()
    return reaped


def heartbeat(session: Session, job_id: int, worker: str, lease_s: float = DEFAULT_LEASE_S) -> bool:
    """Extend the worker's lease; False when it is no longer the worker's (the job was
    cancelled or finished, or another worker took it over): stop working on it."""
    now = utcnow()
    extended = _rowcount(
        session.execute(
            update(_L)
            .where(
                _live(job_id),
                _L.worker == worker,
                exists().where(_J.id == job_id, _J.status == "running"),
            )
            .values(expires_at=now + dt.timedelta(seconds=lease_s))
        )
    )
    session.commit()
    return extended == 1


def _end_lease(session: Session, job_id: int, worker: str, reason: str, now: dt.datetime) -> bool:
    return (
        _rowcount(
            session.execute(
                update(_L).where(_live(job_id), _L.worker == worker).values(ended_at=now, end_reason=reason)
            )
        )
        == 1
    )


def _others_live(session: Session, job_id: int, worker: str, now: dt.datetime) -> int:
    return (
        session.scalar(
            select(func.count()).select_from(_L).where(_live(job_id), _L.worker != worker, _L.expires_at > now)
        )
        or 0
    )


def _drop_unfinished(session: Session, job_id: int, worker: str) -> None:
    """Delete the worker's reserved, unfinished trials of the job (another worker measures them)."""
    session.execute(delete(_T).where(_T.job_id == job_id, _T.worker == worker, _T.status == "running"))


def leave_job(session: Session, job_id: int, worker: str) -> bool:
    """The worker's share of a job is done (its budget is spent and another worker
    re-times the finalists): end its lease, leave the job running."""
    ended = _end_lease(session, job_id, worker, "budget", utcnow())
    session.commit()
    return ended


def release_job(session: Session, job_id: int, worker: str) -> bool:
    """Give the job back (a worker stopping on SIGTERM): the worker's unfinished trials
    are dropped (another worker measures them), and if no other worker holds the job
    it is queued again without counting the attempt."""
    now = utcnow()
    if not _end_lease(session, job_id, worker, "released", now):
        session.rollback()
        return False
    _drop_unfinished(session, job_id, worker)
    if _others_live(session, job_id, worker, now) == 0:
        session.execute(
            update(_J)
            .where(_J.id == job_id, _J.status == "running")
            .values(status="queued", attempts=_J.attempts - 1, finalizer=None, updated_at=now)
        )
    session.commit()
    return True


def finish_job(session: Session, job_id: int, worker: str, status: str, error: str | None = None) -> bool:
    """End the worker's part of a job as ``done`` or ``failed``; False if the worker no
    longer holds it.

    ``done`` ends the job and every lease on it. ``failed`` ends this worker's
    lease; once no other worker holds the job it is queued again while it has
    attempts left (retried by the next claim), else it is ``failed`` with ``error``.
    """
    if status not in ("done", "failed"):
        raise ValueError("status must be 'done' or 'failed'")
    now = utcnow()
    job = session.get(_J, job_id, populate_existing=True)
    if job is None or job.status != "running" or not _end_lease(session, job_id, worker, status, now):
        session.rollback()
        return False
    job.error = error
    if status == "done":  # co-workers still on it learn at their next heartbeat or reservation
        session.execute(update(_L).where(_live(job_id)).values(ended_at=now, end_reason="job_done"))
        job.status = "done"
        job.finished_at = now
    elif _others_live(session, job_id, worker, now) == 0:
        _drop_unfinished(session, job_id, worker)
        if job.attempts < job.max_attempts:
            job.status = "queued"
            job.finalizer = None
        else:
            job.status = "failed"
            job.finished_at = now
    session.commit()
    return True


def begin_finalize(session: Session, job_id: int, worker: str) -> bool:
    """Become the one worker that re-times the job's finalists and publishes the winner."""
    won = _rowcount(
        session.execute(
            update(_J)
            .where(
                _J.id == job_id,
                _J.status == "running",
                or_(_J.finalizer.is_(None), _J.finalizer == worker),
                _held(job_id, worker),
            )
            .values(finalizer=worker, updated_at=utcnow())
        )
    )
    session.commit()
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
    trial: models.Trial | None = None


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
    first: a row lock on PostgreSQL, the write lock on SQLite)."""
    now = utcnow()
    touched = _rowcount(
        session.execute(update(_J).where(_J.id == job_id, _J.status == "running").values(updated_at=now))
    )
    job = session.get(_J, job_id, populate_existing=True)
    if touched != 1 or job is None or not session.scalar(select(_held(job_id, worker))):
        session.rollback()
        return Reservation("lost")
    key = params_key(params)
    existing = session.scalar(select(_T).where(_T.job_id == job_id, _T.params_key == key))
    if existing is not None:
        session.commit()
        return Reservation("busy" if existing.status == "running" else "known", existing.id, existing)
    spent = session.scalar(select(func.count()).select_from(_T).where(_T.job_id == job_id, _T.status != "invalid")) or 0
    if spent >= job.budget:
        session.commit()
        return Reservation("full")
    trial_id = session.scalar(
        insert(_T)
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
        .returning(_T.id)
    )
    session.commit()
    return Reservation("reserved", trial_id)


def complete_trial(session: Session, trial_id: int, worker: str, status: str, **fields: Any) -> bool:
    """Record the measured outcome of the worker's reserved trial; False when the trial
    is no longer the worker's (it lost the job and the trial was recorded ``crashed``)."""
    if status not in models.FINAL_TRIAL_STATUSES:
        raise ValueError(f"trial status must be one of {models.FINAL_TRIAL_STATUSES}, got {status!r}")
    done = _rowcount(
        session.execute(
            update(_T)
            .where(_T.id == trial_id, _T.worker == worker, _T.status == "running")
            .values(status=status, finished_at=utcnow(), **fields)
        )
    )
    session.commit()
    return done == 1


def abandon_trial(session: Session, trial_id: int, worker: str) -> None:
    """Drop the worker's reservation of a trial it will not finish (another worker measures it)."""
    session.execute(delete(_T).where(_T.id == trial_id, _T.worker == worker, _T.status == "running"))
    session.commit()


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
    stmt = dialect_insert(session, _T).values(**values)
    session.execute(
        stmt.on_conflict_do_nothing(index_elements=["job_id", "params_key"], index_where=_T.job_id.is_not(None))
    )
    session.commit()


def job_trials(session: Session, job_id: int, statuses: Iterable[str] | None = None) -> list[models.Trial]:
    query = select(_T).where(_T.job_id == job_id).order_by(_T.id)
    if statuses is not None:
        query = query.where(_T.status.in_(list(statuses)))
    return list(session.scalars(query))


def running_trials(session: Session, job_id: int) -> int:
    return session.scalar(select(func.count()).select_from(_T).where(_T.job_id == job_id, _T.status == "running")) or 0


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
            _T.job_id,
            func.count().filter(_T.status.not_in(("running", "invalid"))),
            func.count().filter(_T.status == "running"),
            func.count().filter(_T.status == "invalid"),
            func.min(_T.median_ms).filter(_T.status == "ok"),
        )
        .where(_T.job_id.in_(ids))
        .group_by(_T.job_id)
    ).all()
    for job_id, done, running, invalid, best in rows:
        assert job_id is not None  # filtered by the IN clause
        out[job_id] = JobProgress(done, running, invalid, best)
    for job_id, worker in session.execute(
        select(_L.job_id, _L.worker).where(_L.job_id.in_(ids), _L.ended_at.is_(None)).order_by(_L.id)
    ):
        p = out[job_id]
        p.workers = (*p.workers, worker)
    return out


def job_leases(session: Session, job_id: int) -> list[models.JobLease]:
    return list(session.scalars(select(_L).where(_L.job_id == job_id).order_by(_L.id)))
