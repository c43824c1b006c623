"""``GET /v1/workloads/{key}/history`` and ``GET /v1/trials``: trial history, newest first, paginated."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Request
from fastapi.responses import JSONResponse
from sqlalchemy import select

from kernel.workload import KEY_PATTERN
from server.api.auth import authenticate
from server.api.deps import DatabaseDep, PageDep, SettingsDep
from server.api.schemas import MAX_ID, TrialPage
from server.store import models
from server.store.db import page

router = APIRouter(prefix="/v1", tags=["history"])

TRIAL_COLUMNS = tuple(c for c in models.Trial.__table__.columns if c.name != "params_key")
STATUS_PATTERN = "^(" + "|".join(models.TRIAL_STATUSES) + ")$"


# Hot read paths: async handlers with their queries inline and the JSON built directly
# (see server.api.lookup).
@router.get("/workloads/{key}/history", response_model=TrialPage)
async def workload_history(
    request: Request,
    settings: SettingsDep,
    db: DatabaseDep,
    paging: PageDep,
    key: Annotated[str, Path(pattern=KEY_PATTERN)],
    status: Annotated[str | None, Query(pattern=STATUS_PATTERN)] = None,
) -> JSONResponse:
    """Trials of one workload, newest first."""
    with db.read_sessions() as session:
        authenticate(request, session, required=settings.require_read_token)
        workload_id = session.scalar(select(models.Workload.id).where(models.Workload.key == key))
        if workload_id is None:
            raise HTTPException(404, f"workload_key: no workload with key {key!r}")
        query = select(*TRIAL_COLUMNS).where(models.Trial.workload_id == workload_id)
        if status is not None:
            query = query.where(models.Trial.status == status)
        rows, cursor = page(session, query, models.Trial.id, *paging, entities=False)
        return JSONResponse({"items": [trial_json(r, key) for r in rows], "next_cursor": cursor})


@router.get("/trials", response_model=TrialPage)
async def list_trials(
    request: Request,
    settings: SettingsDep,
    db: DatabaseDep,
    paging: PageDep,
    workload_key: Annotated[str | None, Query(pattern=KEY_PATTERN)] = None,
    job_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
    status: Annotated[str | None, Query(pattern=STATUS_PATTERN)] = None,
) -> JSONResponse:
    """Trials across workloads, newest first, filterable."""
    with db.read_sessions() as session:
        authenticate(request, session, required=settings.require_read_token)
        query = select(*TRIAL_COLUMNS, models.Workload.key).join(
            models.Workload, models.Workload.id == models.Trial.workload_id
        )
        if workload_key is not None:
            if session.scalar(select(models.Workload.id).where(models.Workload.key == workload_key)) is None:
                raise HTTPException(404, f"workload_key: no workload with key {workload_key!r}")
            query = query.where(models.Workload.key == workload_key)
        if job_id is not None:
            query = query.where(models.Trial.job_id == job_id)
        if status is not None:
            query = query.where(models.Trial.status == status)
        rows, cursor = page(session, query, models.Trial.id, *paging, entities=False)
        return JSONResponse({"items": [trial_json(r, r.key) for r in rows], "next_cursor": cursor})


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def trial_json(r: Any, key: str) -> dict[str, Any]:
    """A trial row as the TrialOut JSON (built directly: rows are read-only here)."""
    return {
        "id": r.id,
        "workload_key": key,
        "job_id": r.job_id,
        "number": r.number,
        "params": r.params,
        "status": r.status,
        "compile_ms": r.compile_ms,
        "median_ms": r.median_ms,
        "p10_ms": r.p10_ms,
        "p90_ms": r.p90_ms,
        "max_error": r.max_error,
        "error": r.error,
        "versions": r.versions,
        "host": r.host,
        "worker": r.worker,
        "created_at": _iso(r.created_at),
        "finished_at": _iso(r.finished_at),
    }
