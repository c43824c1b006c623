"""Workload rows and the lookup of a workload's config.

- :func:`workload_row` inserts a workload on first sight (a race-free per-dialect
  upsert) with the numeric features the nearest-neighbour lookup compares;
- :func:`lookup` answers ``POST /v1/lookup``: tuned (same versions) -> stale
  (other versions) -> nearest (same device kind, backend and family) -> the
  kernel's heuristic, optionally as of a snapshot.

Functions take a session (or, for the lookup, a plain connection) and never
commit: the caller's :meth:`~server.store.db.Database.transaction` does.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sqlalchemy import Connection, bindparam, exists, func, select, union_all
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, aliased

from kernel.heuristic import heuristic_config
from kernel.presets import get_preset
from kernel.workload import FEATURES, Workload, feature_distance
from server.store.models import Base, TunedConfig, utcnow
from server.store.models import Workload as WorkloadRow


def dialect_insert(session: Session, model: type[Base]) -> Any:
    """The session's dialect's INSERT of ``model`` (PostgreSQL and SQLite both have ON CONFLICT)."""
    dialect = session.get_bind().dialect.name
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(model)


def workload_row(session: Session, wl: Workload) -> WorkloadRow:
    """The workload's row, inserted on first sight (race-free per-dialect upsert)."""
    row = session.scalar(select(WorkloadRow).where(WorkloadRow.key == wl.key))
    if row is not None:
        return row
    values = {**workload_columns(wl), "created_at": utcnow()}
    session.execute(
        dialect_insert(session, WorkloadRow).values(**values).on_conflict_do_nothing(index_elements=["key"])
    )
    row = session.scalar(select(WorkloadRow).where(WorkloadRow.key == wl.key))
    assert row is not None
    return row


def workload_columns(wl: Workload) -> dict[str, Any]:
    """Column values of a workload's row (without id and created_at)."""
    features = wl.features()
    return {
        "key": wl.key,
        "device_kind": wl.device_kind,
        "backend": wl.backend,
        "dtype": wl.dtype,
        "family": wl.family,
        "pattern_hash": wl.pattern.pattern_hash,
        "kernel_version": wl.kernel_version,
        "batch": wl.batch,
        "heads": wl.heads,
        "head_dim": wl.head_dim,
        "seq_len": wl.pattern.seq_len,
        "frames": features["frames"],
        "tokens_per_frame": features["tokens_per_frame"],
        "text_tokens": features["text_tokens"],
        "mean_window": features["mean_window"],
        "spec": wl.canonical(),
    }


def find_workload(session: Session, key: str) -> WorkloadRow | None:
    return session.scalar(select(WorkloadRow).where(WorkloadRow.key == key))


def workload_of(row: WorkloadRow) -> Workload:
    return Workload.from_dict(row.spec)


def preset_workloads(session: Session, preset: str, device_kind: str | None = None) -> list[WorkloadRow]:
    """Workloads whose pattern is the preset's (any head count, as the API's ``preset`` builds it), newest first."""
    p = get_preset(preset)
    lay = p.layout
    query = select(WorkloadRow).where(
        WorkloadRow.frames == lay.frames,
        WorkloadRow.tokens_per_frame == lay.tokens_per_frame,
        WorkloadRow.text_tokens == lay.text_tokens,
    )
    if device_kind is not None:
        query = query.where(WorkloadRow.device_kind == device_kind)
    rows = session.scalars(query.order_by(WorkloadRow.id.desc())).all()
    return [r for r in rows if r.pattern_hash == p.pattern(r.heads).pattern_hash]


def workload_keys(session: Session, ids: set[int]) -> dict[int, str]:
    """Workload id -> key for ``ids`` (one query)."""
    if not ids:
        return {}
    return dict(session.execute(select(WorkloadRow.id, WorkloadRow.key).where(WorkloadRow.id.in_(ids))).all())


# ---------------------------------------------------------------- lookup

TUNED_COLUMNS = (
    TunedConfig.id,
    TunedConfig.config,
    TunedConfig.median_ms,
    TunedConfig.p10_ms,
    TunedConfig.p90_ms,
    TunedConfig.dense_ms,
    TunedConfig.tiled_dense_ms,
    TunedConfig.others_cores,
    TunedConfig.speedup_p10_p90,
    TunedConfig.jax_version,
    TunedConfig.jaxlib_version,
    TunedConfig.libtpu_version,
)


@dataclasses.dataclass
class LookupResult:
    workload_key: str
    source: str  # tuned | stale | nearest | heuristic
    config: dict[str, Any]
    tuned: dict[str, Any] | None = None  # the TUNED_COLUMNS of the config served
    distance: float | None = None
    neighbour_key: str | None = None
    snapshot: int = 0  # see lookup(): the tuned-config id this answer is current at


class SnapshotAheadError(ValueError):
    """A lookup pinned to a snapshot this database has not reached (another database's, or a typo)."""

    def __init__(self, snapshot: int, latest: int) -> None:
        super().__init__(f"snapshot: {snapshot} is newer than this server's latest snapshot {latest}")
        self.snapshot = snapshot
        self.latest = latest


def versions_match(tuned: dict[str, Any], versions: dict[str, str | None]) -> bool:
    return (
        tuned["jax_version"] == (versions.get("jax") or "unknown")
        and tuned["jaxlib_version"] == (versions.get("jaxlib") or "unknown")
        and (tuned["libtpu_version"] or None) == (versions.get("libtpu") or None)
    )


# Statements of the hot read path, built once: constructing a select per request
# (coercions, cache keys) cost more than running it.
_Latest = aliased(TunedConfig)  # an alias, so the subquery is never correlated with TunedConfig
_Newer = aliased(TunedConfig)
# The snapshot: the highest tuned-config id. Ids only grow and no row is deleted, so
# the rows with id <= S are exactly the rows that existed at S.
_SNAPSHOT_COLUMN = select(func.coalesce(func.max(_Latest.id), 0)).scalar_subquery().label("snapshot")
_LATEST_SNAPSHOT = select(func.coalesce(func.max(_Latest.id), 0))
_CURRENT_BY_KEY = (
    select(*TUNED_COLUMNS, _SNAPSHOT_COLUMN)
    .join(WorkloadRow, WorkloadRow.id == TunedConfig.workload_id)
    .where(WorkloadRow.key == bindparam("key"), TunedConfig.is_current == True)  # noqa: E712
)
_TUNED_BY_ID = select(*TUNED_COLUMNS).where(TunedConfig.id == bindparam("tuned_id"))
# Pinned to snapshot S: a workload's config current at S is its newest row with id <= S
# (a publish supersedes the previous row in the same transaction that inserts the new one).
_CURRENT_AT_SNAPSHOT = (TunedConfig.id <= bindparam("snapshot")) & ~exists().where(
    _Newer.workload_id == TunedConfig.workload_id, _Newer.id > TunedConfig.id, _Newer.id <= bindparam("snapshot")
)
_CURRENT_BY_KEY_AT = (
    select(*TUNED_COLUMNS)
    .join(WorkloadRow, WorkloadRow.id == TunedConfig.workload_id)
    .where(WorkloadRow.key == bindparam("key"), TunedConfig.id <= bindparam("snapshot"))
    .order_by(TunedConfig.id.desc())
    .limit(1)
)


def _neighbours_both(current: Any, *extra: Any) -> Any:
    """Tuned workloads that may be neighbours (``current`` selects each one's config), nearest by
    sequence length on both sides, in one round trip."""
    neighbours = (
        select(
            WorkloadRow.key,
            WorkloadRow.frames,
            WorkloadRow.tokens_per_frame,
            WorkloadRow.text_tokens,
            WorkloadRow.heads,
            WorkloadRow.head_dim,
            WorkloadRow.batch,
            WorkloadRow.mean_window,
            TunedConfig.id,
            *extra,
        )
        .join(TunedConfig, TunedConfig.workload_id == WorkloadRow.id)
        .where(
            WorkloadRow.device_kind == bindparam("device_kind"),
            WorkloadRow.backend == bindparam("backend"),
            WorkloadRow.kernel_version == bindparam("kernel_version"),
            WorkloadRow.family == bindparam("family"),
            WorkloadRow.key != bindparam("key"),
            WorkloadRow.frames.is_not(None),
            current,
        )
    )
    return union_all(
        neighbours.where(WorkloadRow.seq_len >= bindparam("seq"))
        .order_by(WorkloadRow.seq_len)
        .limit(bindparam("n"))
        .subquery()
        .select(),
        neighbours.where(WorkloadRow.seq_len < bindparam("seq"))
        .order_by(WorkloadRow.seq_len.desc())
        .limit(bindparam("n"))
        .subquery()
        .select(),
    )


# is_current == True matches the partial index predicate.
_NEIGHBOURS_BOTH = _neighbours_both(TunedConfig.is_current == True, _SNAPSHOT_COLUMN)  # noqa: E712
_NEIGHBOURS_BOTH_AT = _neighbours_both(_CURRENT_AT_SNAPSHOT)


def lookup(
    db: Session | Connection,
    wl: Workload,
    versions: dict[str, str | None],
    *,
    candidates: int = 64,
    snapshot: int | None = None,
) -> LookupResult:
    """tuned (same versions) -> stale (other versions) -> nearest (same device kind,
    backend and family) -> the kernel's heuristic. Reads only: a miss writes nothing.

    ``db`` is a Session or a plain Connection (the API uses the lighter Connection).

    Snapshots: ``result.snapshot`` is the highest tuned-config id when the answer was
    read (0 on an empty database), read in the same statement as a hit. With
    ``snapshot=S`` the answer is the one the database gave at S: only tuned configs
    with id <= S count, and per workload the newest of those (the one current at S).
    A snapshot above the latest raises :class:`SnapshotAheadError`.
    """
    if snapshot is not None:
        return _lookup_at(db, wl, versions, candidates, snapshot)
    row = db.execute(_CURRENT_BY_KEY, {"key": wl.key}).first()
    if row is not None:
        tuned = row._asdict()
        latest = tuned.pop("snapshot")
        source = "tuned" if versions_match(tuned, versions) else "stale"
        return LookupResult(wl.key, source, tuned["config"], tuned, snapshot=latest)
    near = nearest(db, wl, candidates)
    if near is not None:
        tuned, neighbour_key, distance, latest = near
        return LookupResult(wl.key, "nearest", tuned["config"], tuned, distance, neighbour_key, latest)
    # Read after the misses, so the snapshot is at least as new as what they saw.
    latest = db.execute(_LATEST_SNAPSHOT).scalar_one()
    config = heuristic_config(wl.pattern, wl.backend, wl.dtype).to_dict()
    return LookupResult(wl.key, "heuristic", config, snapshot=latest)


def _lookup_at(
    db: Session | Connection, wl: Workload, versions: dict[str, str | None], candidates: int, snapshot: int
) -> LookupResult:
    latest = db.execute(_LATEST_SNAPSHOT).scalar_one()
    if snapshot > latest:
        raise SnapshotAheadError(snapshot, latest)
    row = db.execute(_CURRENT_BY_KEY_AT, {"key": wl.key, "snapshot": snapshot}).first()
    if row is not None:
        tuned = row._asdict()
        source = "tuned" if versions_match(tuned, versions) else "stale"
        return LookupResult(wl.key, source, tuned["config"], tuned, snapshot=snapshot)
    near = nearest(db, wl, candidates, snapshot=snapshot)
    if near is not None:
        tuned, neighbour_key, distance, _ = near
        return LookupResult(wl.key, "nearest", tuned["config"], tuned, distance, neighbour_key, snapshot)
    config = heuristic_config(wl.pattern, wl.backend, wl.dtype).to_dict()
    return LookupResult(wl.key, "heuristic", config, snapshot=snapshot)


def nearest(
    db: Session | Connection, wl: Workload, candidates: int, *, snapshot: int | None = None
) -> tuple[dict[str, Any], str, float, int] | None:
    """Closest tuned workload of the same device kind, backend, kernel version and family:
    (its tuned columns, its key, the distance, the snapshot read).

    Candidates are the ``candidates`` nearest by sequence length on each side (an
    index range scan), compared on their feature columns; only the winner's config
    is loaded. With ``snapshot`` the candidates are the configs current at it.
    """
    found = nearest_k(db, wl, 1, candidates, snapshot=snapshot)
    return found[0] if found else None


def nearest_k(
    db: Session | Connection, wl: Workload, k: int, candidates: int, *, snapshot: int | None = None
) -> list[tuple[dict[str, Any], str, float, int]]:
    """The ``k`` closest tuned workloads as :func:`nearest` chooses the first, closest first
    (ties by key, so every process orders them alike); only their ``k`` configs are loaded."""
    params: dict[str, Any] = {
        "device_kind": wl.device_kind,
        "backend": wl.backend,
        "kernel_version": wl.kernel_version,
        "family": wl.family,
        "key": wl.key,
        "seq": wl.pattern.seq_len,
        "n": candidates,
    }
    if snapshot is None:
        rows = db.execute(_NEIGHBOURS_BOTH, params).all()
    else:
        rows = db.execute(_NEIGHBOURS_BOTH_AT, {**params, "snapshot": snapshot}).all()
    if not rows:
        return []
    mine = wl.features()
    scored = []
    for r in rows:
        features = dict(
            zip(
                FEATURES,
                (r.frames, r.tokens_per_frame, r.text_tokens, r.heads, r.head_dim, r.batch, r.mean_window),
                strict=True,
            )
        )
        scored.append((feature_distance(mine, features), r.key, r.id))
    latest = rows[0].snapshot if snapshot is None else snapshot
    out = []
    for distance, key, tuned_id in sorted(scored)[:k]:
        tuned = db.execute(_TUNED_BY_ID, {"tuned_id": tuned_id}).one()._asdict()
        out.append((tuned, key, distance, latest))
    return out
