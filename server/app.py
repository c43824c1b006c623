"""The FastAPI application: lookup, configs, history, jobs, health and metrics."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy import select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session
from starlette.exceptions import HTTPException as StarletteHTTPException

from server import jobs, models, store
from server.auth import WRITE_ROLES, authenticate, require_roles
from server.db import Database, get_read_session, get_session
from server.metrics import CONTENT_TYPE_LATEST, Metrics, MetricsMiddleware
from server.schemas import (
    ConfigPage,
    ErrorOut,
    JobOut,
    JobPage,
    JobRequest,
    LookupRequest,
    LookupResponse,
    TimingOut,
    TrialPage,
    TunedConfigOut,
    Versions,
    WorkloadConfigs,
)
from server.settings import Settings

KEY_PATTERN = r"^[0-9a-f]{32}$"
MAX_ID = 2**31 - 1  # INTEGER primary keys: int4 on PostgreSQL
NO_NUL = r"^[^\x00]*$"  # PostgreSQL text cannot hold NUL
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut, "description": "Missing, malformed, unknown or revoked bearer token"},
    403: {"model": ErrorOut, "description": "The token's role may not do this"},
    404: {"model": ErrorOut, "description": "No such workload or job"},
    413: {"model": ErrorOut, "description": "Request body too large"},
    422: {"model": ErrorOut, "description": "Invalid input; the message names the field and the rule"},
}


SessionDep = Annotated[Session, Depends(get_session)]
ReadSessionDep = Annotated[Session, Depends(get_read_session)]  # read-only routes (autocommit on PostgreSQL)


def read_access(request: Request, session: ReadSessionDep) -> None:
    """Reads are open unless TILETUNE_REQUIRE_READ_TOKEN is set."""
    settings: Settings = request.app.state.settings
    authenticate(request, session, required=settings.require_read_token)


async def page_params(
    request: Request,
    limit: Annotated[int | None, Query(ge=1, description="Page size (bounded by the server)")] = None,
    cursor: Annotated[int | None, Query(ge=1, le=MAX_ID, description="next_cursor of the previous page")] = None,
) -> tuple[int, int | None]:
    settings: Settings = request.app.state.settings
    if limit is not None and limit > settings.max_page_size:
        raise HTTPException(422, f"limit: must be <= {settings.max_page_size}")
    return limit or settings.default_page_size, cursor


PageDep = Annotated[tuple[int, int | None], Depends(page_params)]


class BodySizeLimit:
    """Answer 413 for bodies over the limit, declared or streamed."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await _too_large(send, self.max_bytes)
            return
        if declared is not None:
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.max_bytes:
                await _too_large(send, self.max_bytes)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _too_large(send: Any, limit: int) -> None:
    body = JSONResponse(
        {"detail": "request body too large", "message": f"body: larger than the {limit}-byte limit"}, 413
    )
    await body({"type": "http"}, _no_receive, send)


async def _no_receive() -> dict[str, Any]:
    return {"type": "http.disconnect"}


def create_app(settings: Settings | None = None, database: Database | None = None) -> FastAPI:
    settings = settings or Settings()
    db = database or Database(settings.database_url, busy_timeout_ms=settings.sqlite_busy_timeout_ms)
    app = FastAPI(
        title="tiletune",
        version="0.1.0",
        description="Tuned tile configs for block-sparse video attention, keyed by hardware, shape and pattern.",
        responses=ERRORS,
    )
    app.state.settings = settings
    app.state.db = db
    metrics = Metrics()
    app.state.metrics = metrics

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # "input" is not echoed: it may hold NaN/Infinity or lone surrogates (unrenderable) or a 1 MiB body.
        raw = [{k: v for k, v in err.items() if k != "input"} for err in exc.errors()]
        errors = jsonable_encoder(raw, custom_encoder={Exception: str})
        parts = []
        for err in errors:
            if err.get("type") == "json_invalid":  # loc is ("body", <character offset>)
                offset = err.get("loc", ("body", "?"))[-1]
                parts.append(f"body: invalid JSON at character {offset}: {err.get('ctx', {}).get('error', '')}")
                continue
            loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "body"
            parts.append(f"{loc}: {err.get('msg', 'invalid')}")
        return JSONResponse({"detail": errors, "message": "; ".join(parts)}, 422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"detail": exc.detail, "message": str(exc.detail)}, exc.status_code, headers=exc.headers)

    @app.exception_handler(OperationalError)
    async def _database_down(_request: Request, exc: OperationalError) -> JSONResponse:
        # The database, not the request, is at fault: say so and let clients retry.
        return JSONResponse({"detail": "database unavailable", "message": "database: unavailable, retry later"}, 503)

    @app.exception_handler(store.SnapshotAheadError)
    async def _snapshot_ahead(_request: Request, exc: store.SnapshotAheadError) -> JSONResponse:
        return JSONResponse({"detail": {"snapshot": exc.snapshot, "latest": exc.latest}, "message": str(exc)}, 422)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """Liveness: the process answers (no dependencies)."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"], responses={503: {"model": ErrorOut}})
    def readyz(request: Request) -> JSONResponse:
        """Readiness: the database answers."""
        try:
            with request.app.state.db.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except Exception as exc:  # any driver error means not ready
            return JSONResponse({"status": "unavailable", "message": f"database: {type(exc).__name__}"}, 503)
        return JSONResponse({"status": "ok", "database": request.app.state.db.dialect})

    @app.get("/metrics", tags=["health"], response_class=Response)
    def metrics_route() -> Response:
        """Prometheus metrics: request counts and latency histograms per route."""
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    v1 = APIRouter(prefix="/v1")

    # The hot read paths (lookup, history, trials) are async handlers that run their
    # few indexed queries inline and build the JSON themselves: a thread-pool hop per
    # sync dependency and a second validation of the response cost more than the work.

    @v1.post("/lookup", response_model=LookupResponse, tags=["configs"])
    async def lookup(body: LookupRequest, request: Request) -> JSONResponse:
        """The tuned config of a workload: tuned -> stale -> nearest -> heuristic.

        With ``enqueue=true`` a miss (anything but ``tuned``) queues one tuning job;
        that is a write and needs a writer token. ``snapshot`` in the answer is the
        highest tuned-config id when it was read; send it back as ``snapshot`` to get
        the answer as of then (every host of a multi-host run pins the same one).
        """
        wl = body.workload.to_workload()
        versions = body.versions.model_dump()
        job_id = None
        if not body.enqueue and not settings.require_read_token and "authorization" not in request.headers:
            # The common anonymous read: a plain connection, no ORM session.
            with db.reader() as conn:
                result = store.lookup(
                    conn, wl, versions, candidates=settings.nearest_candidates, snapshot=body.snapshot
                )
        else:
            with db.sessions() as session:
                token = authenticate(request, session, required=body.enqueue or settings.require_read_token)
                if body.enqueue and token is not None and token.role not in WRITE_ROLES:
                    raise HTTPException(403, f"authorization: role {token.role!r} may not queue jobs")
                result = store.lookup(
                    session, wl, versions, candidates=settings.nearest_candidates, snapshot=body.snapshot
                )
                if body.enqueue and result.source != "tuned":
                    row = store.workload_row(session, wl)
                    job, _ = jobs.enqueue_job(
                        session, row, budget=settings.job_budget_default, requested_by=token.name if token else None
                    )
                    job_id = job.id
        t = result.tuned
        return JSONResponse(
            {
                "workload_key": result.workload_key,
                "source": result.source,
                "config": result.config,
                "config_id": t["id"] if t else None,
                "timing": _timing_json(t) if t else None,
                "versions": {"jax": t["jax_version"], "jaxlib": t["jaxlib_version"], "libtpu": t["libtpu_version"]}
                if t
                else None,
                "distance": result.distance,
                "neighbour_key": result.neighbour_key,
                "job_id": job_id,
                "snapshot": result.snapshot,
            }
        )

    @v1.get("/configs", response_model=ConfigPage, tags=["configs"], dependencies=[Depends(read_access)])
    def list_configs(
        session: ReadSessionDep,
        paging: PageDep,
        device_kind: Annotated[str | None, Query(max_length=64, pattern=NO_NUL)] = None,
        backend: Annotated[str | None, Query(max_length=16, pattern=NO_NUL)] = None,
        dtype: Annotated[str | None, Query(max_length=16, pattern=NO_NUL)] = None,
        pattern_hash: Annotated[str | None, Query(max_length=64, pattern=NO_NUL)] = None,
    ) -> ConfigPage:
        """Current best configs, newest first, filterable."""
        query = (
            select(models.TunedConfig)
            .join(models.Workload, models.Workload.id == models.TunedConfig.workload_id)
            .where(models.TunedConfig.is_current == True)  # noqa: E712
        )
        for column, value in (
            (models.Workload.device_kind, device_kind),
            (models.Workload.backend, backend),
            (models.Workload.dtype, dtype),
            (models.Workload.pattern_hash, pattern_hash),
        ):
            if value is not None:
                query = query.where(column == value)
        rows, cursor = store.page(session, query, models.TunedConfig.id, *paging)
        keys = _workload_keys(session, {r.workload_id for r in rows})
        return ConfigPage(items=[_tuned_out(r, keys[r.workload_id]) for r in rows], next_cursor=cursor)

    @v1.get("/configs/{key}", response_model=WorkloadConfigs, tags=["configs"], dependencies=[Depends(read_access)])
    def workload_configs(session: ReadSessionDep, key: Annotated[str, Path(pattern=KEY_PATTERN)]) -> WorkloadConfigs:
        """A workload's current best config and every config it superseded."""
        row = _workload_or_404(session, key)
        history = session.scalars(
            select(models.TunedConfig)
            .where(models.TunedConfig.workload_id == row.id)
            .order_by(models.TunedConfig.id.desc())
        ).all()
        current = next((t for t in history if t.is_current), None)
        return WorkloadConfigs(
            workload_key=key,
            workload=row.spec,
            current=_tuned_out(current, key) if current else None,
            history=[_tuned_out(t, key) for t in history],
        )

    @v1.get("/workloads/{key}/history", response_model=TrialPage, tags=["history"])
    async def workload_history(
        request: Request,
        paging: PageDep,
        key: Annotated[str, Path(pattern=KEY_PATTERN)],
        status: Annotated[str | None, Query(pattern="^(" + "|".join(models.TRIAL_STATUSES) + ")$")] = None,
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
            rows, cursor = store.page(session, query, models.Trial.id, *paging, entities=False)
            return JSONResponse({"items": [_trial_json(r, key) for r in rows], "next_cursor": cursor})

    @v1.get("/trials", response_model=TrialPage, tags=["history"])
    async def list_trials(
        request: Request,
        paging: PageDep,
        workload_key: Annotated[str | None, Query(pattern=KEY_PATTERN)] = None,
        job_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
        status: Annotated[str | None, Query(pattern="^(" + "|".join(models.TRIAL_STATUSES) + ")$")] = None,
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
            rows, cursor = store.page(session, query, models.Trial.id, *paging, entities=False)
            return JSONResponse({"items": [_trial_json(r, r.key) for r in rows], "next_cursor": cursor})

    @v1.post(
        "/jobs",
        response_model=JobOut,
        status_code=201,
        tags=["jobs"],
        responses={200: {"model": JobOut, "description": "A job was already queued or running"}},
    )
    def create_job(
        body: JobRequest, session: SessionDep, token: Annotated[models.ApiToken, Depends(require_roles(*WRITE_ROLES))]
    ) -> Any:
        """Queue a tuning job (never two queued or running jobs for one workload)."""
        row = store.workload_row(session, body.workload.to_workload())
        job, created = jobs.enqueue_job(
            session,
            row,
            budget=body.budget,
            priority=body.priority,
            parallelism=body.parallelism,
            requested_by=token.name,
        )
        out = _one_job_out(session, job, row.key)
        return out if created else JSONResponse(jsonable_encoder(out), 200)

    @v1.get("/jobs", response_model=JobPage, tags=["jobs"], dependencies=[Depends(read_access)])
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
            query = query.where(models.Job.workload_id == _workload_or_404(session, workload_key).id)
        rows, cursor = store.page(session, query, models.Job.id, *paging)
        keys = _workload_keys(session, {j.workload_id for j in rows})
        progress = jobs.job_progress(session, [j.id for j in rows])
        return JobPage(items=[_job_out(j, keys[j.workload_id], progress[j.id]) for j in rows], next_cursor=cursor)

    @v1.get("/jobs/{job_id}", response_model=JobOut, tags=["jobs"], dependencies=[Depends(read_access)])
    def get_job(session: ReadSessionDep, job_id: Annotated[int, Path(ge=1, le=MAX_ID)]) -> JobOut:
        job = _job_or_404(session, job_id)
        return _one_job_out(session, job, _workload_keys(session, {job.workload_id})[job.workload_id])

    @v1.post(
        "/jobs/{job_id}/cancel",
        response_model=JobOut,
        tags=["jobs"],
        dependencies=[Depends(require_roles(*WRITE_ROLES))],
    )
    def cancel_job(session: SessionDep, job_id: Annotated[int, Path(ge=1, le=MAX_ID)]) -> JobOut:
        """Cancel a queued or running job (a worker stops at its next check); finished jobs are unchanged."""
        job = jobs.cancel_job(session, _job_or_404(session, job_id))
        return _one_job_out(session, job, _workload_keys(session, {job.workload_id})[job.workload_id])

    app.include_router(v1)
    from server.ui import router as ui_router  # the /ui dashboard (HTML, outside the OpenAPI document)

    app.include_router(ui_router)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    return app


TRIAL_COLUMNS = tuple(c for c in models.Trial.__table__.columns if c.name != "params_key")


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def _trial_json(r: Any, key: str) -> dict[str, Any]:
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


def _timing_json(t: dict[str, Any]) -> dict[str, Any]:
    speedup = t["dense_ms"] / t["median_ms"] if t["dense_ms"] and t["median_ms"] else None
    return {
        "median_ms": t["median_ms"],
        "p10_ms": t["p10_ms"],
        "p90_ms": t["p90_ms"],
        "dense_ms": t["dense_ms"],
        "speedup": speedup,
    }


def _workload_or_404(session: Session, key: str) -> models.Workload:
    row = store.find_workload(session, key)
    if row is None:
        raise HTTPException(404, f"workload_key: no workload with key {key!r}")
    return row


def _job_or_404(session: Session, job_id: int) -> models.Job:
    job = session.get(models.Job, job_id)
    if job is None:
        raise HTTPException(404, f"job_id: no job {job_id}")
    return job


def _workload_keys(session: Session, ids: set[int]) -> dict[int, str]:
    if not ids:
        return {}
    return dict(
        session.execute(select(models.Workload.id, models.Workload.key).where(models.Workload.id.in_(ids))).all()
    )


def _timing(t: models.TunedConfig) -> TimingOut:
    return TimingOut(median_ms=t.median_ms, p10_ms=t.p10_ms, p90_ms=t.p90_ms, dense_ms=t.dense_ms, speedup=t.speedup)


def _versions(t: models.TunedConfig) -> Versions:
    return Versions(jax=t.jax_version, jaxlib=t.jaxlib_version, libtpu=t.libtpu_version)


def _tuned_out(t: models.TunedConfig, key: str) -> TunedConfigOut:
    return TunedConfigOut(
        id=t.id,
        workload_key=key,
        config=t.config,
        timing=_timing(t),
        versions=_versions(t),
        is_current=t.is_current,
        created_at=t.created_at,
        superseded_at=t.superseded_at,
    )


def _one_job_out(session: Session, job: models.Job, key: str) -> JobOut:
    return _job_out(job, key, jobs.job_progress(session, [job.id])[job.id])


def _job_out(job: models.Job, key: str, progress: jobs.JobProgress) -> JobOut:
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
