"""``GET /v1/configs`` and ``GET /v1/configs/{key}``: current best configs, and one workload's history."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query
from sqlalchemy import select

from kernel.workload import KEY_PATTERN
from server.api.auth import read_access
from server.api.deps import PageDep, ReadSessionDep, workload_or_404
from server.api.schemas import NO_NUL, ConfigPage, TimingOut, TunedConfigOut, Versions, WorkloadConfigs
from server.store import models, workloads
from server.store.db import page

router = APIRouter(prefix="/v1", tags=["configs"], dependencies=[Depends(read_access)])


@router.get("/configs", response_model=ConfigPage)
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
    rows, cursor = page(session, query, models.TunedConfig.id, *paging)
    keys = workloads.workload_keys(session, {r.workload_id for r in rows})
    return ConfigPage(items=[tuned_out(r, keys[r.workload_id]) for r in rows], next_cursor=cursor)


@router.get("/configs/{key}", response_model=WorkloadConfigs)
def workload_configs(session: ReadSessionDep, key: Annotated[str, Path(pattern=KEY_PATTERN)]) -> WorkloadConfigs:
    """A workload's current best config and every config it superseded."""
    row = workload_or_404(session, key)
    history = session.scalars(
        select(models.TunedConfig)
        .where(models.TunedConfig.workload_id == row.id)
        .order_by(models.TunedConfig.id.desc())
    ).all()
    current = next((t for t in history if t.is_current), None)
    return WorkloadConfigs(
        workload_key=key,
        workload=row.spec,
        current=tuned_out(current, key) if current else None,
        history=[tuned_out(t, key) for t in history],
    )


def tuned_out(t: models.TunedConfig, key: str) -> TunedConfigOut:
    return TunedConfigOut(
        id=t.id,
        workload_key=key,
        config=t.config,
        timing=TimingOut(
            median_ms=t.median_ms,
            p10_ms=t.p10_ms,
            p90_ms=t.p90_ms,
            dense_ms=t.dense_ms,
            speedup=t.speedup,
            tiled_dense_ms=t.tiled_dense_ms,
            speedup_vs_tiled_dense=t.speedup_vs_tiled_dense,
            others_cores=t.others_cores,
            speedup_p10_p90=t.speedup_p10_p90,
        ),
        versions=Versions(jax=t.jax_version, jaxlib=t.jaxlib_version, libtpu=t.libtpu_version),
        is_current=t.is_current,
        created_at=t.created_at,
        superseded_at=t.superseded_at,
    )
