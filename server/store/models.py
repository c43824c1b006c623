"""SQLAlchemy 2.0 typed models: one set for SQLite and PostgreSQL.

- ``Workload``: one row per workload key, with the numeric features that the
  nearest-neighbour lookup filters on.
- ``Trial``: every measured TileConfig, failures included (failures are data), and
  every compile verdict of a TPU config (compiled or refused, not timed).
- ``TunedConfig``: the best ok trial of a workload. A new best supersedes the old
  row (``superseded_at`` set, ``is_current`` cleared); nothing is deleted.
- ``Job``: a request to tune a workload; at most one queued or running job per
  workload, enforced by a partial unique index. Up to ``parallelism`` workers
  hold it at once, each through a ``JobLease``.
- ``JobLease``: one worker's hold on a job, extended by its heartbeat. Rows are
  kept after they end (``ended_at``, ``end_reason``), so who held a job when is
  on record.
- ``ApiToken``: bearer tokens, stored as SHA-256 hashes only.

Table names carry a ``tt_`` prefix so Optuna's own tables (and its own
``alembic_version``) can live in the same database.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# Measured trials (of a search) end in one of FINAL_TRIAL_STATUSES. ``running``: reserved by a
# worker and being measured (a trial of a job is inserted as running before its measurement, so
# two workers of one job never measure the same params).
FINAL_TRIAL_STATUSES = ("ok", "failed", "invalid", "pruned", "crashed", "timeout", "wrong")
# Compile verdicts (server.store.compiles): a config compiled, or refused, for the workload's TPU
# generation by the compiler of the versions recorded, without being timed. ``compiling``: reserved
# by a compile worker.
COMPILE_STATUSES = ("compiled", "uncompilable")
TRIAL_STATUSES = (*FINAL_TRIAL_STATUSES, *COMPILE_STATUSES, "running", "compiling")
JOB_STATUSES = ("queued", "running", "done", "failed", "cancelled")
ACTIVE_JOB_STATUSES = ("queued", "running")
ACTIVE_JOB_WHERE = "status IN ('queued', 'running')"  # predicate of the one-active-job-per-workload index
TOKEN_ROLES = ("writer", "worker", "admin")


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, dt.datetime: DateTime(timezone=True)}


class Workload(Base):
    __tablename__ = "tt_workload"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    device_kind: Mapped[str] = mapped_column(String(64))
    backend: Mapped[str] = mapped_column(String(16))
    dtype: Mapped[str] = mapped_column(String(16))
    family: Mapped[str] = mapped_column(String(200))
    pattern_hash: Mapped[str] = mapped_column(String(64))
    kernel_version: Mapped[str] = mapped_column(String(16))
    batch: Mapped[int] = mapped_column(Integer)
    heads: Mapped[int] = mapped_column(Integer)
    head_dim: Mapped[int] = mapped_column(Integer)
    seq_len: Mapped[int] = mapped_column(Integer)
    # Features of the nearest-neighbour distance (kernel.workload.FEATURES), kept as
    # columns so a miss compares numbers instead of decoding specs.
    frames: Mapped[int | None] = mapped_column(Integer)
    tokens_per_frame: Mapped[int | None] = mapped_column(Integer)
    text_tokens: Mapped[int | None] = mapped_column(Integer)
    mean_window: Mapped[float | None] = mapped_column(Float)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)  # canonical Workload form
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ix_tt_workload_neighbours", "device_kind", "backend", "family", "seq_len"),)


class Trial(Base):
    __tablename__ = "tt_trial"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("tt_workload.id", ondelete="CASCADE"))
    job_id: Mapped[int | None] = mapped_column(ForeignKey("tt_job.id", ondelete="SET NULL"))
    number: Mapped[int | None] = mapped_column(Integer)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    params_key: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    compile_ms: Mapped[float | None] = mapped_column(Float)
    median_ms: Mapped[float | None] = mapped_column(Float)
    p10_ms: Mapped[float | None] = mapped_column(Float)
    p90_ms: Mapped[float | None] = mapped_column(Float)
    max_error: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    versions: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    host: Mapped[str | None] = mapped_column(String(255))
    worker: Mapped[str | None] = mapped_column(String(255))  # the worker that measured it (jobs only)
    # Compile verdicts only: hash of params and compiler versions (one verdict per pair), and the
    # executable's memory figures (kernel.tpu_compile.MEMORY_FIELDS).
    compile_key: Mapped[str | None] = mapped_column(String(64))
    memory: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[dt.datetime | None] = mapped_column()

    __table_args__ = (
        Index("ix_tt_trial_history", "workload_id", "id"),
        Index("ix_tt_trial_status", "workload_id", "status"),
        Index("ix_tt_trial_job", "job_id"),
        # One trial per params in a job: the reservation that keeps workers from measuring twice.
        Index(
            "uq_tt_trial_job_params",
            "job_id",
            "params_key",
            unique=True,
            postgresql_where=text("job_id IS NOT NULL"),
            sqlite_where=text("job_id IS NOT NULL"),
        ),
        # One compile verdict (or reservation) per params and compiler versions of a workload.
        Index(
            "uq_tt_trial_compile",
            "workload_id",
            "compile_key",
            unique=True,
            postgresql_where=text("compile_key IS NOT NULL"),
            sqlite_where=text("compile_key IS NOT NULL"),
        ),
    )


class TunedConfig(Base):
    __tablename__ = "tt_tuned_config"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("tt_workload.id", ondelete="CASCADE"))
    trial_id: Mapped[int | None] = mapped_column(ForeignKey("tt_trial.id", ondelete="SET NULL"))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    median_ms: Mapped[float] = mapped_column(Float)
    p10_ms: Mapped[float | None] = mapped_column(Float)
    p90_ms: Mapped[float | None] = mapped_column(Float)
    dense_ms: Mapped[float | None] = mapped_column(Float)  # the library's dense attention, timed beside it
    tiled_dense_ms: Mapped[float | None] = mapped_column(Float)  # the same backend's tiles, all-dense pattern
    # Cores other programs kept busy while the winner and its anchors were timed (autotune.host_load).
    others_cores: Mapped[float | None] = mapped_column(Float)
    # {"dense": [p10, p90], "tiled_dense": [p10, p90]}: the speedups' spread, per pair of runs taken side by
    # side (autotune.compare.speedup); NULL where not measured.
    speedup_p10_p90: Mapped[dict[str, list[float]] | None] = mapped_column(JSON)
    jax_version: Mapped[str] = mapped_column(String(32))
    jaxlib_version: Mapped[str] = mapped_column(String(32))
    libtpu_version: Mapped[str | None] = mapped_column(String(64))
    is_current: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    superseded_at: Mapped[dt.datetime | None] = mapped_column()

    __table_args__ = (
        Index(
            "uq_tt_tuned_config_current",
            "workload_id",
            unique=True,
            postgresql_where=text("is_current"),
            sqlite_where=text("is_current = 1"),
        ),
        Index("ix_tt_tuned_config_workload", "workload_id", "id"),
    )

    @property
    def speedup(self) -> float | None:
        return self.dense_ms / self.median_ms if self.dense_ms and self.median_ms else None

    @property
    def speedup_vs_tiled_dense(self) -> float | None:
        return self.tiled_dense_ms / self.median_ms if self.tiled_dense_ms and self.median_ms else None


class Job(Base):
    __tablename__ = "tt_job"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("tt_workload.id", ondelete="CASCADE"))
    status: Mapped[str] = mapped_column(String(16), default="queued")
    budget: Mapped[int] = mapped_column(Integer)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    parallelism: Mapped[int] = mapped_column(Integer, default=1)  # workers that may share the job
    finalizer: Mapped[str | None] = mapped_column(String(255))  # the worker re-timing the top configs
    error: Mapped[str | None] = mapped_column(Text)
    requested_by: Mapped[str | None] = mapped_column(String(100))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    finished_at: Mapped[dt.datetime | None] = mapped_column()

    __table_args__ = (
        Index(
            "uq_tt_job_active_workload",
            "workload_id",
            unique=True,
            postgresql_where=text(ACTIVE_JOB_WHERE),
            sqlite_where=text(ACTIVE_JOB_WHERE),
        ),
        Index("ix_tt_job_claim", "status", "priority", "id"),
    )


class JobLease(Base):
    __tablename__ = "tt_job_lease"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("tt_job.id", ondelete="CASCADE"))
    worker: Mapped[str] = mapped_column(String(255))
    claimed_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[dt.datetime] = mapped_column()
    ended_at: Mapped[dt.datetime | None] = mapped_column()
    # done (this worker finished the job), job_done (another did), budget (its share was spent),
    # released (it stopped on a signal), failed, cancelled, expired (it died: the next claim ended it)
    end_reason: Mapped[str | None] = mapped_column(String(32))

    __table_args__ = (Index("ix_tt_job_lease_job", "job_id", "ended_at"),)


class ApiToken(Base):
    __tablename__ = "tt_api_token"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    role: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[dt.datetime | None] = mapped_column()
