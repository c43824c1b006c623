"""The record of a workload's tuning: its trials and its tuned configs (history kept).

A new best supersedes the current tuned config (``superseded_at`` set,
``is_current`` cleared); nothing is deleted. :class:`TuningRecord` is the plain
data of one workload's tuning, loaded once, that the pictures are drawn from.

Functions take a session and never commit: the caller's
:meth:`~server.store.db.Database.transaction` does.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from kernel.config import TileConfig, params_key
from kernel.heuristic import heuristic_config
from kernel.workload import Workload
from server.store.models import TRIAL_STATUSES, Trial, TunedConfig, utcnow
from server.store.models import Workload as WorkloadRow
from server.store.workloads import workload_of

PUBLISH_LOCK = 0x7474_0001  # PostgreSQL advisory lock key serializing publish_tuned_config ("tt" 1)


def record_trial(session: Session, workload: WorkloadRow, params: dict[str, Any], status: str, **fields: Any) -> Trial:
    if status not in TRIAL_STATUSES:
        raise ValueError(f"trial status must be one of {TRIAL_STATUSES}, got {status!r}")
    trial = Trial(workload_id=workload.id, params=params, params_key=params_key(params), status=status, **fields)
    session.add(trial)
    session.flush()  # the id, for the caller's references
    return trial


def workload_trials(session: Session, workload_id: int) -> Sequence[Trial]:
    """Every trial of a workload, oldest first."""
    return session.scalars(select(Trial).where(Trial.workload_id == workload_id).order_by(Trial.id)).all()


FAMILY_TRIALS = 5000  # newest ok trials of a family a search's prior is fitted on
FAMILY_WORKLOADS = 16  # ... of at most this many workloads (the prior enumerates each one's space)


def family_trials(
    session: Session, wl: Workload, limit: int = FAMILY_TRIALS, workloads: int = FAMILY_WORKLOADS
) -> list[tuple[Workload, TileConfig, float]]:
    """``(workload, config, median_ms)`` of the newest ``limit`` ok trials of the *other* workloads of
    ``wl``'s device kind, backend, kernel version and family, from the ``workloads`` most recently
    measured of them: what the family's model (:func:`autotune.surrogate.fit_prior`) learns from.
    Trials whose workload or params no longer parse (written by an older release) are left out."""
    rows = session.execute(
        select(WorkloadRow.key, WorkloadRow.spec, Trial.params, Trial.median_ms)
        .join(WorkloadRow, WorkloadRow.id == Trial.workload_id)
        .where(
            WorkloadRow.device_kind == wl.device_kind,
            WorkloadRow.backend == wl.backend,
            WorkloadRow.kernel_version == wl.kernel_version,
            WorkloadRow.family == wl.family,
            WorkloadRow.key != wl.key,
            Trial.status == "ok",
            Trial.median_ms.is_not(None),
        )
        .order_by(Trial.id.desc())
        .limit(limit)
    ).all()
    out: list[tuple[Workload, TileConfig, float]] = []
    specs: dict[str, Workload | None] = {}
    for key, spec, params, median_ms in rows:
        if key not in specs:
            if len(specs) >= workloads:
                continue
            try:
                specs[key] = Workload.from_dict(spec)
            except ValueError:
                specs[key] = None
        workload = specs[key]
        try:
            config = TileConfig.from_dict(params)
        except (ValueError, TypeError):
            continue
        if workload is not None:
            out.append((workload, config, float(median_ms)))
    return out


def publish_tuned_config(
    session: Session,
    workload: WorkloadRow,
    config: dict[str, Any],
    *,
    median_ms: float,
    versions: dict[str, str | None],
    p10_ms: float | None = None,
    p90_ms: float | None = None,
    dense_ms: float | None = None,
    tiled_dense_ms: float | None = None,
    others_cores: float | None = None,
    speedup_p10_p90: dict[str, list[float]] | None = None,
    trial: Trial | None = None,
) -> TunedConfig:
    """Make ``config`` the workload's current best; the previous one is kept, superseded.

    Publishes are serialized so tuned-config ids are committed in increasing order:
    a lookup snapshot S (see :func:`lookup`) must never gain a row with id <= S
    later. PostgreSQL takes ids from a sequence at insert time, so two overlapping
    publishes could commit out of order; a transaction-level advisory lock prevents
    that. SQLite has one writer at a time anyway.
    """
    if session.get_bind().dialect.name == "postgresql":
        session.execute(select(func.pg_advisory_xact_lock(PUBLISH_LOCK)))
    now = utcnow()
    session.execute(
        update(TunedConfig)
        .where(TunedConfig.workload_id == workload.id, TunedConfig.is_current == True)  # noqa: E712
        .values(is_current=False, superseded_at=now)
    )
    row = TunedConfig(
        workload_id=workload.id,
        trial_id=trial.id if trial else None,
        config=config,
        median_ms=median_ms,
        p10_ms=p10_ms,
        p90_ms=p90_ms,
        dense_ms=dense_ms,
        tiled_dense_ms=tiled_dense_ms,
        others_cores=others_cores,
        speedup_p10_p90=speedup_p10_p90 or None,
        jax_version=versions.get("jax") or "unknown",
        jaxlib_version=versions.get("jaxlib") or "unknown",
        libtpu_version=versions.get("libtpu"),
        is_current=True,
        created_at=now,
    )
    session.add(row)
    session.flush()  # the id is the snapshot of lookups; the caller's transaction commits it
    return row


def current_config(session: Session, workload_id: int) -> TunedConfig | None:
    return session.scalar(
        select(TunedConfig).where(
            TunedConfig.workload_id == workload_id,
            TunedConfig.is_current == True,  # noqa: E712
        )
    )


# ---------------------------------------------------------------- what the pictures are drawn from


@dataclasses.dataclass(frozen=True)
class TrialPoint:
    id: int
    number: int | None
    params: dict[str, Any]
    status: str
    median_ms: float | None
    p10_ms: float | None
    p90_ms: float | None
    compile_ms: float | None
    error: str | None
    created_at: Any


@dataclasses.dataclass(frozen=True)
class TunedPoint:
    id: int
    config: dict[str, Any]
    median_ms: float
    p10_ms: float | None
    p90_ms: float | None
    dense_ms: float | None
    created_at: Any
    tiled_dense_ms: float | None = None
    # The speedups' p10-p90 over pairs of runs taken side by side, by anchor ("dense", "tiled_dense");
    # None for a config stored before migration 0007 or published without its anchors' runs.
    speedup_p10_p90: dict[str, list[float]] | None = None

    @property
    def speedup(self) -> float | None:
        return self.dense_ms / self.median_ms if self.dense_ms and self.median_ms else None

    @property
    def speedup_vs_tiled_dense(self) -> float | None:
        return self.tiled_dense_ms / self.median_ms if self.tiled_dense_ms and self.median_ms else None

    def speedup_spread(self, anchor: str) -> tuple[float, float] | None:
        """The stored p10-p90 of the speedup over ``anchor`` ("dense" or "tiled_dense"), if kept."""
        kept = (self.speedup_p10_p90 or {}).get(anchor)
        return (float(kept[0]), float(kept[1])) if kept is not None and len(kept) == 2 else None


@dataclasses.dataclass(frozen=True)
class TuningRecord:
    """What the figures of one workload are drawn from: its spec, trials (oldest first), current tuned config."""

    key: str
    workload: Workload
    trials: tuple[TrialPoint, ...]
    tuned: TunedPoint | None

    @property
    def version(self) -> tuple[int | None, int | None]:
        """(latest trial id, current tuned config id): figures change only when this does."""
        return (self.trials[-1].id if self.trials else None, self.tuned.id if self.tuned else None)

    @classmethod
    def load(cls, session: Session, row: WorkloadRow) -> TuningRecord:
        trials = tuple(
            TrialPoint(
                t.id,
                t.number,
                t.params or {},
                t.status,
                t.median_ms,
                t.p10_ms,
                t.p90_ms,
                t.compile_ms,
                t.error,
                t.created_at,
            )
            for t in workload_trials(session, row.id)
        )
        current = current_config(session, row.id)
        tuned = (
            TunedPoint(
                current.id,
                current.config,
                current.median_ms,
                current.p10_ms,
                current.p90_ms,
                current.dense_ms,
                current.created_at,
                current.tiled_dense_ms,
                current.speedup_p10_p90,
            )
            if current is not None
            else None
        )
        return cls(row.key, workload_of(row), trials, tuned)

    def ok_trials(self) -> list[TrialPoint]:
        return [t for t in self.trials if t.status == "ok" and t.median_ms is not None]

    def winner(self) -> tuple[TileConfig, str]:
        """The config the block map shows and where it came from."""
        sources: list[tuple[dict[str, Any], str]] = []
        if self.tuned is not None:
            sources.append((self.tuned.config, "tuned config"))
        ok = self.ok_trials()
        if ok:
            sources.append((min(ok, key=lambda t: t.median_ms or math.inf).params, "best ok trial"))
        for config, source in sources:
            try:
                return TileConfig.from_dict(config), source
            except (TypeError, ValueError):
                continue  # a config of another kernel version: try the next source
        wl = self.workload
        return heuristic_config(wl.pattern, wl.backend, wl.dtype), "heuristic (nothing tuned yet)"
