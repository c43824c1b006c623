"""``POST /v1/lookup``: a workload in, its tuned config out (tuned -> stale -> nearest -> heuristic)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException
from fastapi.responses import JSONResponse

from server.api.auth import WRITE_ROLES, CallerDep
from server.api.deps import DatabaseDep, SettingsDep
from server.api.limits import check_workload
from server.api.schemas import LookupRequest, LookupResponse
from server.store import queue, workloads

router = APIRouter(prefix="/v1", tags=["configs"])


# The hot read path: an async handler that runs its few indexed queries inline and builds
# the JSON itself (a thread-pool hop per sync dependency and a second validation of the
# response cost more than the work).
@router.post("/lookup", response_model=LookupResponse)
async def lookup(token: CallerDep, body: LookupRequest, settings: SettingsDep, db: DatabaseDep) -> JSONResponse:
    """The tuned config of a workload: tuned -> stale -> nearest -> heuristic.

    With ``enqueue=true`` a miss (anything but ``tuned``) queues one tuning job;
    that is a write and needs a writer token. ``snapshot`` in the answer is the
    highest tuned-config id when it was read; send it back as ``snapshot`` to get
    the answer as of then (every host of a multi-host run pins the same one).

    The caller's token is checked before the body is validated; a workload over the
    deployment's limits (TILETUNE_MAX_TOKENS, _MAX_HEADS, _MAX_HEAD_CLASSES, _MAX_BATCH)
    gets a 422 naming the limit.
    """
    wl = body.workload.to_workload()
    check_workload(wl, settings, preset=body.workload.preset is not None)
    versions = body.versions.model_dump()
    job_id = None
    if body.enqueue:
        if token is None:
            raise HTTPException(
                401, "authorization: a bearer token is required to queue a job", {"WWW-Authenticate": "Bearer"}
            )
        if token.role not in WRITE_ROLES:
            raise HTTPException(403, f"authorization: role {token.role!r} may not queue jobs")
        with db.transaction() as session:
            result = workloads.lookup(
                session, wl, versions, candidates=settings.nearest_candidates, snapshot=body.snapshot
            )
            if result.source != "tuned":
                row = workloads.workload_row(session, wl)
                job, _ = queue.enqueue_job(session, row, budget=settings.job_budget_default, requested_by=token.name)
                job_id = job.id
    else:
        # A read: a plain connection, no ORM session.
        with db.reader() as conn:
            result = workloads.lookup(
                conn, wl, versions, candidates=settings.nearest_candidates, snapshot=body.snapshot
            )
    t = result.tuned
    return JSONResponse(
        {
            "workload_key": result.workload_key,
            "source": result.source,
            "config": result.config,
            "config_id": t["id"] if t else None,
            "timing": timing_json(t) if t else None,
            "versions": {"jax": t["jax_version"], "jaxlib": t["jaxlib_version"], "libtpu": t["libtpu_version"]}
            if t
            else None,
            "distance": result.distance,
            "neighbour_key": result.neighbour_key,
            "job_id": job_id,
            "snapshot": result.snapshot,
        }
    )


def timing_json(t: dict[str, Any]) -> dict[str, Any]:
    """The TimingOut JSON of a tuned config's columns."""

    def over(anchor: float | None) -> float | None:
        return anchor / t["median_ms"] if anchor and t["median_ms"] else None

    return {
        "median_ms": t["median_ms"],
        "p10_ms": t["p10_ms"],
        "p90_ms": t["p90_ms"],
        "dense_ms": t["dense_ms"],
        "speedup": over(t["dense_ms"]),
        "tiled_dense_ms": t["tiled_dense_ms"],
        "speedup_vs_tiled_dense": over(t["tiled_dense_ms"]),
        "others_cores": t["others_cores"],
        "speedup_p10_p90": t["speedup_p10_p90"],
    }
