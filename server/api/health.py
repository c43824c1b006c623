"""``/healthz`` (liveness, no dependencies), ``/readyz`` (the database answers), ``/metrics`` (Prometheus).

The probes stay open; ``/metrics`` is a read and needs a token when reads do.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from sqlalchemy import text

from server.api.auth import read_access
from server.api.deps import DatabaseDep
from server.api.metrics import CONTENT_TYPE_LATEST
from server.api.schemas import ErrorOut

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: the process answers (no dependencies; on the event loop, so it answers while the
    thread pool is busy)."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"model": ErrorOut}})
def readyz(db: DatabaseDep) -> JSONResponse:
    """Readiness: the database answers."""
    try:
        with db.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # any driver error means not ready
        return JSONResponse({"status": "unavailable", "message": f"database: {type(exc).__name__}"}, 503)
    return JSONResponse({"status": "ok", "database": db.dialect})


@router.get("/metrics", response_class=Response, dependencies=[Depends(read_access)])
def metrics(request: Request) -> Response:
    """Prometheus metrics: request counts and latency histograms per route."""
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
