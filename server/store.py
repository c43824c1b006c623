"""Store functions: every read and write of the service goes through here.

Sessions are passed in; each function that writes commits its own unit of
work so a caller never leaves half a change behind.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import hmac
import json
import secrets
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Select, bindparam, exists, func, select, union_all, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, aliased

from kernel.heuristic import heuristic_config
from kernel.presets import get_preset
from kernel.workload import FEATURES, Workload, feature_distance
from server import models
from server.models import TOKEN_ROLES, utcnow

TOKEN_PREFIX = "tt_"
PUBLISH_LOCK = 0x7474_0001  # PostgreSQL advisory lock key serializing publish_tuned_config ("tt" 1)


# ---------------------------------------------------------------- workloads


def dialect_insert(session: Session, model: type[models.Base]) -> Any:
    """The session's dialect's INSERT of ``model`` (PostgreSQL and SQLite both have ON CONFLICT)."""
    dialect = session.get_bind().dialect.name
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(model)


def workload_row(session: Session, wl: Workload) -> models.Workload:
    """The workload's row, inserted on first sight (race-free per-dialect upsert)."""
    row = session.scalar(select(models.Workload).where(models.Workload.key == wl.key))
    if row is not None:
        return row
    values = {**workload_columns(wl), "created_at": utcnow()}
    session.execute(
        dialect_insert(session, models.Workload).values(**values).on_conflict_do_nothing(index_elements=["key"])
    )
    session.commit()
    row = session.scalar(select(models.Workload).where(models.Workload.key == wl.key))
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


def find_workload(session: Session, key: str) -> models.Workload | None:
    return session.scalar(select(models.Workload).where(models.Workload.key == key))


def workload_of(row: models.Workload) -> Workload:
    return Workload.from_dict(row.spec)


def preset_workloads(session: Session, preset: str, device_kind: str | None = None) -> list[models.Workload]:
    """Workloads whose pattern is the preset's (any head count, as the API's ``preset`` builds it), newest first."""
    p = get_preset(preset)
    lay = p.layout
    query = select(models.Workload).where(
        models.Workload.frames == lay.frames,
        models.Workload.tokens_per_frame == lay.tokens_per_frame,
        models.Workload.text_tokens == lay.text_tokens,
    )
    if device_kind is not None:
        query = query.where(models.Workload.device_kind == device_kind)
    rows = session.scalars(query.order_by(models.Workload.id.desc())).all()
    return [r for r in rows if r.pattern_hash == p.pattern(r.heads).pattern_hash]


# ---------------------------------------------------------------- trials and tuned configs


def params_key(params: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]


def record_trial(
    session: Session, workload: models.Workload, params: dict[str, Any], status: str, **fields: Any
) -> models.Trial:
    if status not in models.TRIAL_STATUSES:
        raise ValueError(f"trial status must be one of {models.TRIAL_STATUSES}, got {status!r}")
    trial = models.Trial(workload_id=workload.id, params=params, params_key=params_key(params), status=status, **fields)
    session.add(trial)
    session.commit()
    return trial


def workload_trials(session: Session, workload_id: int) -> Sequence[models.Trial]:
    """Every trial of a workload, oldest first."""
    return session.scalars(
        select(models.Trial).where(models.Trial.workload_id == workload_id).order_by(models.Trial.id)
    ).all()


def publish_tuned_config(
    session: Session,
    workload: models.Workload,
    config: dict[str, Any],
    *,
    median_ms: float,
    versions: dict[str, str | None],
    p10_ms: float | None = None,
    p90_ms: float | None = None,
    dense_ms: float | None = None,
    trial: models.Trial | None = None,
) -> models.TunedConfig:
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
        update(models.TunedConfig)
        .where(models.TunedConfig.workload_id == workload.id, models.TunedConfig.is_current == True)  # noqa: E712
        .values(is_current=False, superseded_at=now)
    )
    row = models.TunedConfig(
        workload_id=workload.id,
        trial_id=trial.id if trial else None,
        config=config,
        median_ms=median_ms,
        p10_ms=p10_ms,
        p90_ms=p90_ms,
        dense_ms=dense_ms,
        jax_version=versions.get("jax") or "unknown",
        jaxlib_version=versions.get("jaxlib") or "unknown",
        libtpu_version=versions.get("libtpu"),
        is_current=True,
        created_at=now,
    )
    session.add(row)
    session.commit()
    return row


def current_config(session: Session, workload_id: int) -> models.TunedConfig | None:
    return session.scalar(
        select(models.TunedConfig).where(
            models.TunedConfig.workload_id == workload_id,
            models.TunedConfig.is_current == True,  # noqa: E712
        )
    )


# ---------------------------------------------------------------- lookup

TUNED_COLUMNS = (
    models.TunedConfig.id,
    models.TunedConfig.config,
    models.TunedConfig.median_ms,
    models.TunedConfig.p10_ms,
    models.TunedConfig.p90_ms,
    models.TunedConfig.dense_ms,
    models.TunedConfig.jax_version,
    models.TunedConfig.jaxlib_version,
    models.TunedConfig.libtpu_version,
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
_W = models.Workload
_T = models.TunedConfig
_Latest = aliased(models.TunedConfig)  # an alias, so the subquery is never correlated with _T
_Newer = aliased(models.TunedConfig)
# The snapshot: the highest tuned-config id. Ids only grow and no row is deleted, so
# the rows with id <= S are exactly the rows that existed at S.
_SNAPSHOT_COLUMN = select(func.coalesce(func.max(_Latest.id), 0)).scalar_subquery().label("snapshot")
_LATEST_SNAPSHOT = select(func.coalesce(func.max(_Latest.id), 0))
_CURRENT_BY_KEY = (
    select(*TUNED_COLUMNS, _SNAPSHOT_COLUMN)
    .join(_W, _W.id == _T.workload_id)
    .where(_W.key == bindparam("key"), _T.is_current == True)  # noqa: E712
)
_TUNED_BY_ID = select(*TUNED_COLUMNS).where(_T.id == bindparam("tuned_id"))
# Pinned to snapshot S: a workload's config current at S is its newest row with id <= S
# (a publish supersedes the previous row in the same transaction that inserts the new one).
_CURRENT_AT_SNAPSHOT = (_T.id <= bindparam("snapshot")) & ~exists().where(
    _Newer.workload_id == _T.workload_id, _Newer.id > _T.id, _Newer.id <= bindparam("snapshot")
)
_CURRENT_BY_KEY_AT = (
    select(*TUNED_COLUMNS)
    .join(_W, _W.id == _T.workload_id)
    .where(_W.key == bindparam("key"), _T.id <= bindparam("snapshot"))
    .order_by(_T.id.desc())
    .limit(1)
)


def _neighbours_both(current: Any, *extra: Any) -> Any:
    """Tuned workloads that may be neighbours (``current`` selects each one's config), nearest by
    sequence length on both sides, in one round trip."""
    neighbours = (
        select(
            _W.key,
            _W.frames,
            _W.tokens_per_frame,
            _W.text_tokens,
            _W.heads,
            _W.head_dim,
            _W.batch,
            _W.mean_window,
            _T.id,
            *extra,
        )
        .join(_T, _T.workload_id == _W.id)
        .where(
            _W.device_kind == bindparam("device_kind"),
            _W.backend == bindparam("backend"),
            _W.family == bindparam("family"),
            _W.key != bindparam("key"),
            _W.frames.is_not(None),
            current,
        )
    )
    return union_all(
        neighbours.where(_W.seq_len >= bindparam("seq")).order_by(_W.seq_len).limit(bindparam("n")).subquery().select(),
        neighbours.where(_W.seq_len < bindparam("seq"))
        .order_by(_W.seq_len.desc())
        .limit(bindparam("n"))
        .subquery()
        .select(),
    )


# is_current == True matches the partial index predicate.
_NEIGHBOURS_BOTH = _neighbours_both(_T.is_current == True, _SNAPSHOT_COLUMN)  # noqa: E712
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
    """Closest tuned workload of the same device kind, backend and family:
    (its tuned columns, its key, the distance, the snapshot read).

    Candidates are the ``candidates`` nearest by sequence length on each side (an
    index range scan), compared on their feature columns; only the winner's config
    is loaded. With ``snapshot`` the candidates are the configs current at it.
    """
    params: dict[str, Any] = {
        "device_kind": wl.device_kind,
        "backend": wl.backend,
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
        return None
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
    distance, key, tuned_id = min(scored)
    tuned = db.execute(_TUNED_BY_ID, {"tuned_id": tuned_id}).one()._asdict()
    latest = rows[0].snapshot if snapshot is None else snapshot
    return tuned, key, distance, latest


# ---------------------------------------------------------------- listings


def page(
    session: Session, query: Select[Any], id_column: Any, limit: int, cursor: int | None, *, entities: bool = True
) -> tuple[Sequence[Any], int | None]:
    """Keyset pagination, newest first: rows with id < cursor; returns (rows, next cursor).

    ``entities=True`` returns ORM objects (a select of one entity); False returns
    the plain rows of a select of columns (cheaper, for read-only listings).
    """
    if cursor is not None:
        query = query.where(id_column < cursor)
    query = query.order_by(id_column.desc()).limit(limit + 1)
    rows = session.scalars(query).all() if entities else session.execute(query).all()
    if len(rows) > limit:
        return rows[:limit], rows[limit - 1].id
    return rows, None


# ---------------------------------------------------------------- tokens


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(session: Session, name: str, role: str) -> str:
    """Create a token; the plaintext is returned once and never stored."""
    if role not in TOKEN_ROLES:
        raise ValueError(f"role must be one of {TOKEN_ROLES}, got {role!r}")
    if not name or len(name) > 100:
        raise ValueError("token name must be 1-100 characters")
    if session.scalar(select(models.ApiToken).where(models.ApiToken.name == name)) is not None:
        raise ValueError(f"a token named {name!r} already exists")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    session.add(models.ApiToken(name=name, role=role, token_hash=hash_token(token)))
    session.commit()
    return token


def verify_token(session: Session, token: str) -> models.ApiToken | None:
    """The active token matching ``token``, compared in constant time, or None."""
    digest = hash_token(token)
    row = session.scalar(select(models.ApiToken).where(models.ApiToken.token_hash == digest))
    if row is None or not hmac.compare_digest(row.token_hash, digest) or row.revoked_at is not None:
        return None
    return row


def revoke_token(session: Session, name: str) -> bool:
    row = session.scalar(select(models.ApiToken).where(models.ApiToken.name == name))
    if row is None or row.revoked_at is not None:
        return False
    row.revoked_at = dt.datetime.now(dt.UTC)
    session.commit()
    return True


def list_tokens(session: Session) -> Sequence[models.ApiToken]:
    return session.scalars(select(models.ApiToken).order_by(models.ApiToken.id)).all()
