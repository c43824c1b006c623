"""``/v1/jobs``: queue, list, show and cancel tuning jobs."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from sqlalchemy import select
from sqlalchemy.orm import Session

from kernel.workload import KEY_PATTERN
from server.api.auth import WRITE_ROLES, read_access, require_roles
from server.api.deps import DatabaseDep, PageDep, ReadSessionDep, SettingsDep, job_or_404, workload_or_404
from server.api.limits import check_workload
from server.api.schemas import MAX_ID, JobOut, JobPage, JobRequest
from server.store import models, queue, workloads
from server.store.db import page

router = APIRouter(prefix="/v1", tags=["jobs"])
WriterDep = Annotated[models.ApiToken, Depends(require_roles(*WRITE_ROLES))]


@router.post(
    "/jobs",
    response_model=JobOut,
    status_code=201,
    responses={200: {"model": JobOut, "description": "A job was already queued or running"}},
)
def create_job(token: WriterDep, body: JobRequest, db: DatabaseDep, settings: SettingsDep) -> Any:
    """Queue a tuning job (never two queued or running jobs for one workload).

    The token is checked before the body is validated; a workload over the deployment's
    limits (TILETUNE_MAX_TOKENS, _MAX_HEADS, _MAX_HEAD_CLASSES, _MAX_BATCH) gets a 422 naming the limit.
    """
    wl = body.workload.to_workload()
    check_workload(wl, settings, preset=body.workload.preset is not None)
    with db.transaction() as session:
        row = workloads.workload_row(session, wl)
        job, created = queue.enqueue_job(
            session,
            row,
            budget=body.budget,
            priority=body.priority,
            parallelism=body.parallelism,
            requested_by=token.name,
        )
        out = one_job_out(session, job)
    return out if created else JSONResponse(jsonable_encoder(out), 200)


@router.get("/jobs", response_model=JobPage, dependencies=[Depends(read_access)])
def list_jobs(
    session: ReadSessionDep,
    paging: PageDep,
    status: Annotated[str | None, Query(pattern="^(" + "|".join(models.JOB_STATUSES) + ")$")] = None,
    workload_key: Annotated[str | None, Query(pattern=KEY_PATTERN)] = None,
) -> JobPage:
    query = select(models.Job)
    if status is not None:
        query = query.where(models.Job.status == status)
    if workload_key is not None:
        query = query.where(models.Job.workload_id == workload_or_404(session, workload_key).id)
    rows, cursor = page(session, query, models.Job.id, *paging)
    keys = workloads.workload_keys(session, {j.workload_id for j in rows})
    progress = queue.job_progress(session, [j.id for j in rows])
    return JobPage(items=[job_out(j, keys[j.workload_id], progress[j.id]) for j in rows], next_cursor=cursor)


@router.get("/jobs/{job_id}", response_model=JobOut, dependencies=[Depends(read_access)])
def get_job(session: ReadSessionDep, job_id: Annotated[int, Path(ge=1, le=MAX_ID)]) -> JobOut:
    return one_job_out(session, job_or_404(session, job_id))


@router.post("/jobs/{job_id}/cancel", response_model=JobOut, dependencies=[Depends(require_roles(*WRITE_ROLES))])
def cancel_job(db: DatabaseDep, job_id: Annotated[int, Path(ge=1, le=MAX_ID)]) -> JobOut:
    """Cancel a queued or running job (a worker stops at its next check); finished jobs are unchanged."""
    with db.transaction() as session:
        job = queue.cancel_job(session, job_or_404(session, job_id))
        return one_job_out(session, job)


def one_job_out(session: Session, job: models.Job) -> JobOut:
    key = workloads.workload_keys(session, {job.workload_id})[job.workload_id]
    return job_out(job, key, queue.job_progress(session, [job.id])[job.id])


def job_out(job: models.Job, key: str, progress: queue.JobProgress) -> JobOut:
    return JobOut(
        id=job.id,
        workload_key=key,
        status=job.status,
        budget=job.budget,
        priority=job.priority,
        parallelism=job.parallelism,
        attempts=job.attempts,
        workers=list(progress.workers),
        error=job.error,
        requested_by=job.requested_by,
        created_at=job.created_at,
        updated_at=job.updated_at,
        finished_at=job.finished_at,
        trials=progress.trials_done,
        trials_running=progress.trials_running,
        best_ms=progress.best_ms,
    )
