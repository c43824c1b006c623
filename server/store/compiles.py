"""Compile verdicts: which TPU configs of a workload the compiler of given versions compiles or refuses.

A verdict is a trial of the workload (no job) with status ``compiled`` (with its compile
milliseconds and the executable's memory figures) or ``uncompilable`` (with the cause and
the compiler's first error line), and the jax / jaxlib / libtpu versions of the compiler
that gave it. ``compile_key`` (params and those versions) is unique per workload, so a
config is compiled at most once per compiler: a compile worker first inserts the verdict
``compiling`` (its reservation), and a reservation older than ``stale_after_s`` (its
worker died) may be taken over.

A compile that crashed or timed out is recorded ``uncompilable`` too (cause first in the
error): a config that takes the compiler down or past its deadline on a CPU host would
cost a TPU worker as much.

Functions take a session and never commit: the caller's transaction does.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from typing import Any

from sqlalchemy import delete, or_, select, update
from sqlalchemy.orm import Session

from kernel.config import params_key
from kernel.tpu_compile import CompileOutcome
from server.store.models import ACTIVE_JOB_STATUSES, COMPILE_STATUSES, Job, Trial, utcnow
from server.store.models import Workload as WorkloadRow
from server.store.workloads import dialect_insert

COMPILER = ("jax", "jaxlib", "libtpu")  # the versions a compile verdict holds for


def compiler_versions(versions: dict[str, Any]) -> dict[str, Any]:
    return {name: versions.get(name) for name in COMPILER}


def compile_key(params: dict[str, Any], versions: dict[str, Any]) -> str:
    """The key of one verdict: the params and the compiler's versions."""
    text = json.dumps({"params": params_key(params), "versions": compiler_versions(versions)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def reserve_compile(
    session: Session,
    workload_id: int,
    params: dict[str, Any],
    versions: dict[str, Any],
    *,
    worker: str,
    host: str | None = None,
    stale_after_s: float = 900.0,
) -> int | None:
    """Reserve the compile of ``params`` for these versions: the trial id, or None when a verdict
    exists or another live worker is compiling it. A reservation of ``worker``'s own is its
    id: a retry whose first try committed before an outage took the answer finds it there."""
    key = compile_key(params, versions)
    now = utcnow()
    stmt = (
        dialect_insert(session, Trial)
        .values(
            workload_id=workload_id,
            params=params,
            params_key=params_key(params),
            status="compiling",
            compile_key=key,
            versions=compiler_versions(versions),
            host=host,
            worker=worker,
            created_at=now,
        )
        .on_conflict_do_nothing(
            index_elements=["workload_id", "compile_key"], index_where=Trial.compile_key.is_not(None)
        )
        .returning(Trial.id)
    )
    trial_id = session.scalar(stmt)
    if trial_id is not None:
        return int(trial_id)
    stale = now - dt.timedelta(seconds=stale_after_s)
    taken = session.scalar(
        update(Trial)
        .where(
            Trial.workload_id == workload_id,
            Trial.compile_key == key,
            Trial.status == "compiling",
            or_(Trial.created_at < stale, Trial.worker == worker),
        )
        .values(worker=worker, host=host, created_at=now)
        .returning(Trial.id)
    )
    return None if taken is None else int(taken)


def record_compile(session: Session, trial_id: int, worker: str, outcome: CompileOutcome) -> bool:
    """Turn the worker's reservation into a verdict; False when it is no longer the worker's.

    The same verdict found already there is True: a retry whose first try committed but
    lost its answer with the connection (:func:`server.store.outage.ride_out`)."""
    fields: dict[str, Any] = {"compile_ms": outcome.compile_s * 1e3, "finished_at": utcnow()}
    if outcome.ok:
        fields.update(status="compiled", memory=dict(outcome.memory), error=None)
    else:
        fields.update(status="uncompilable", error=f"{outcome.cause}: {outcome.error or ''}".strip())
    result = session.execute(
        update(Trial).where(Trial.id == trial_id, Trial.worker == worker, Trial.status == "compiling").values(**fields)
    )
    if getattr(result, "rowcount", 0) == 1:
        return True
    row = session.get(Trial, trial_id)
    found = None if row is None else (row.worker, row.status, row.compile_ms)
    return found == (worker, fields["status"], fields["compile_ms"])


def release_compile(session: Session, trial_id: int, worker: str) -> None:
    """Drop a reservation the worker will not finish (it stops, or the job ended)."""
    session.execute(delete(Trial).where(Trial.id == trial_id, Trial.worker == worker, Trial.status == "compiling"))


def compile_verdicts(session: Session, workload_id: int, versions: dict[str, Any]) -> dict[str, Trial]:
    """The final verdicts of a workload's configs for these compiler versions, by params key."""
    wanted = compiler_versions(versions)
    rows = session.scalars(
        select(Trial).where(Trial.workload_id == workload_id, Trial.status.in_(COMPILE_STATUSES)).order_by(Trial.id)
    )
    return {row.params_key: row for row in rows if compiler_versions(row.versions or {}) == wanted}


def compile_verdict(
    session: Session, workload_id: int, params: dict[str, Any], versions: dict[str, Any]
) -> Trial | None:
    """The final verdict on ``params`` for these compiler versions, or None."""
    return session.scalar(
        select(Trial).where(
            Trial.workload_id == workload_id,
            Trial.compile_key == compile_key(params, versions),
            Trial.status.in_(COMPILE_STATUSES),
        )
    )


def refusal(session: Session, workload_id: int, params: dict[str, Any], versions: dict[str, Any]) -> str | None:
    """Why ``params`` must not be timed by a worker of these versions: the compiler refused it
    (the verdict's error, with the compile worker that found it); None when it compiled or has
    no verdict yet."""
    verdict = compile_verdict(session, workload_id, params, versions)
    if verdict is None or verdict.status != "uncompilable":
        return None
    return f"does not compile (libtpu {versions.get('libtpu')}, compile worker {verdict.worker}): {verdict.error}"


def tpu_jobs(session: Session) -> list[tuple[int, WorkloadRow]]:
    """Queued and running jobs of TPU workloads, highest priority first, oldest first: the work of
    compile workers."""
    rows = session.execute(
        select(Job.id, WorkloadRow)
        .join(WorkloadRow, WorkloadRow.id == Job.workload_id)
        .where(Job.status.in_(ACTIVE_JOB_STATUSES), WorkloadRow.backend == "tpu")
        .order_by(Job.priority.desc(), Job.id)
    ).all()
    return [(int(job_id), row) for job_id, row in rows]


def job_active(session: Session, job_id: int) -> bool:
    status = session.scalar(select(Job.status).where(Job.id == job_id))
    return status in ACTIVE_JOB_STATUSES
