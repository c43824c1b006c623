"""The FastAPI application of the API: settings, database, error handlers and middleware around
the routers.

Routes live on module-level routers, one module per concern (:mod:`~server.api.lookup`,
:mod:`~server.api.configs`, :mod:`~server.api.history`, :mod:`~server.api.jobs`,
:mod:`~server.api.health`, :mod:`~server.api.docs`); they take settings and the database through
:mod:`server.api.deps`. Other routers (the ``/ui`` dashboard) are mounted by the
service's composition root, :func:`server.app.create_app`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from server.api import configs, docs, health, history, jobs, lookup
from server.api.limits import BodyLimits, limits_description, max_json_structure, validation_report
from server.api.metrics import Metrics, MetricsMiddleware
from server.api.schemas import ErrorOut
from server.settings import Settings
from server.store.db import Database
from server.store.workloads import SnapshotAheadError

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut, "description": "Missing, malformed, unknown or revoked bearer token"},
    403: {"model": ErrorOut, "description": "The token's role may not do this"},
    404: {"model": ErrorOut, "description": "No such workload or job"},
    413: {"model": ErrorOut, "description": "Request body too large (bytes, or JSON values: see the limits)"},
    422: {"model": ErrorOut, "description": "Invalid input; the message names the field and the rule"},
}


def create_app(
    settings: Settings | None = None, database: Database | None = None, *, routers: Sequence[APIRouter] = ()
) -> FastAPI:
    """The API on ``settings`` (default: the ``TILETUNE_*`` variables) and ``database`` (default: a
    new one at ``settings.database_url``), with ``routers`` mounted beside its own."""
    settings = settings or Settings()
    db = database or Database(settings.database_url, busy_timeout_ms=settings.sqlite_busy_timeout_ms)
    app = FastAPI(
        title="tiletune",
        version="0.1.0",
        description="Tuned tile configs for block-sparse video attention, keyed by hardware, shape and pattern."
        + limits_description(settings),
        responses=ERRORS,
        # Served by server.api.docs behind the read gate instead.
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.db = db
    app.state.metrics = Metrics()
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(OperationalError, _database_down)
    app.add_exception_handler(SnapshotAheadError, _snapshot_ahead)
    for router in (health.router, docs.router, lookup.router, configs.router, history.router, jobs.router, *routers):
        app.include_router(router)
    app.add_middleware(
        BodyLimits,
        max_bytes=settings.max_body_bytes,
        max_structure=max_json_structure(settings),
        max_heads=settings.max_heads,
    )
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    return app


async def _validation(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    # "input" is not echoed: it may hold NaN/Infinity or lone surrogates (unrenderable) or a 1 MiB body.
    return validation_report(exc.errors())


async def _http(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return JSONResponse({"detail": exc.detail, "message": str(exc.detail)}, exc.status_code, headers=exc.headers)


async def _database_down(_request: Request, _exc: Exception) -> JSONResponse:
    # The database, not the request, is at fault: say so and let clients retry.
    return JSONResponse({"detail": "database unavailable", "message": "database: unavailable, retry later"}, 503)


async def _snapshot_ahead(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, SnapshotAheadError)
    return JSONResponse({"detail": {"snapshot": exc.snapshot, "latest": exc.latest}, "message": str(exc)}, 422)
