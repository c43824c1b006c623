"""Request and response models of the HTTP API (pydantic 2).

Field limits are checked here first (types, ranges, sizes); the kernel's own
reader of the workload JSON (:meth:`kernel.workload.Workload.from_dict`) then
checks the cross-field rules (pattern or preset, windows against the layout,
heads and sequence length consistent) and its messages are returned as
validation errors that name the field. The bounds here are the most any
deployment may admit; a deployment's own, lower limits (``TILETUNE_MAX_*``) are
checked by the routes (:func:`server.api.limits.check_workload`).
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from kernel.layout import MAX_SEQ_LEN
from kernel.presets import PRESETS
from kernel.workload import MAX_BATCH, MAX_HEAD_DIM, Backend, Dtype, Workload
from server.settings import MAX_HEADS

MAX_ID = 2**31 - 1  # ids (jobs, tuned configs, snapshots): INTEGER, int4 on PostgreSQL
Strict = ConfigDict(extra="forbid", strict=True)  # strict: no true/"4"/4.0 for an int
NO_NUL = r"^[^\x00]*$"  # PostgreSQL text cannot hold NUL


class LayoutSpec(BaseModel):
    model_config = Strict
    frames: int = Field(
        ge=1, le=MAX_SEQ_LEN, description="Latent frames F (F*P + T: at most TILETUNE_MAX_TOKENS tokens)"
    )
    tokens_per_frame: int = Field(ge=1, le=MAX_SEQ_LEN, description="Tokens per frame P")
    text_tokens: int = Field(0, ge=0, le=MAX_SEQ_LEN, description="Text tokens T")
    text_position: Literal["prefix", "suffix"] = "suffix"


class HeadSpec(BaseModel):
    model_config = Strict
    kind: Literal["dense", "spatial", "temporal", "band"]
    window_frames: int | None = Field(None, ge=0, le=MAX_SEQ_LEN, description="spatial heads: |f - f'| <= w")
    window_positions: int | None = Field(None, ge=0, le=MAX_SEQ_LEN, description="temporal heads: |p - p'| <= w")
    tokens: int | None = Field(None, ge=1, le=MAX_SEQ_LEN, description="band heads: |i - j| < tokens")
    first_frame_sink: bool = False


class PatternSpec(BaseModel):
    model_config = Strict
    layout: LayoutSpec
    heads: Annotated[
        list[HeadSpec],
        Field(
            min_length=1,
            max_length=MAX_HEADS,
            description="At most TILETUNE_MAX_HEADS heads of at most TILETUNE_MAX_HEAD_CLASSES distinct patterns",
        ),
    ]


class WorkloadSpec(BaseModel):
    """A workload: give ``pattern`` (or a ``preset`` name for a real model's pattern)."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [{"device_kind": "TPU v6 lite", "backend": "tpu", "dtype": "bfloat16", "preset": "wan2.1-480p"}]
        },
    )
    device_kind: str = Field(min_length=1, max_length=64, pattern=NO_NUL, description="jax.devices()[0].device_kind")
    backend: Backend
    dtype: Dtype = "bfloat16"
    batch: int = Field(1, ge=1, le=MAX_BATCH, description="At most TILETUNE_MAX_BATCH")
    head_dim: int | None = Field(None, ge=1, le=MAX_HEAD_DIM, description="Required unless a preset gives it")
    pattern: PatternSpec | None = None
    preset: str | None = Field(None, max_length=64, pattern=NO_NUL, description=f"One of {', '.join(PRESETS)}")
    heads: int | None = Field(None, ge=1, le=MAX_HEADS, description="Optional check: must equal the pattern's heads")
    seq_len: int | None = Field(None, ge=1, le=MAX_SEQ_LEN, description="Optional check: must equal F*P + T")
    kernel_version: str | None = Field(
        None, min_length=1, max_length=16, pattern=NO_NUL, description="Default: the backend's current kernel version"
    )

    _workload: Workload | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _consistent(self) -> WorkloadSpec:
        self._workload = self._build()
        return self

    def to_workload(self) -> Workload:
        """The kernel's Workload (built once, by validation)."""
        return self._workload if self._workload is not None else self._build()

    def _build(self) -> Workload:
        return Workload.from_dict(self.model_dump(exclude_none=True))


class Versions(BaseModel):
    model_config = Strict
    jax: str | None = Field(None, max_length=32, pattern=NO_NUL)
    jaxlib: str | None = Field(None, max_length=32, pattern=NO_NUL)
    libtpu: str | None = Field(None, max_length=64, pattern=NO_NUL)


class LookupRequest(BaseModel):
    model_config = Strict
    workload: WorkloadSpec
    versions: Versions = Field(default_factory=lambda: Versions(), description="The caller's software versions")
    enqueue: bool = Field(False, description="On a miss, queue one tuning job (needs a writer token)")
    snapshot: int | None = Field(
        None,
        ge=0,
        le=MAX_ID,
        description="Answer as of this snapshot (the 'snapshot' of an earlier answer): only tuned configs "
        "that existed then count, so every host pinned to it gets the same config",
    )


class TileConfigOut(BaseModel):
    variant: str
    block_q: int
    block_kv: int
    block_kv_compute: int
    layout: str
    align: str
    head_grouping: str


class TimingOut(BaseModel):
    """Times of a tuned config and of its two anchors, all taken in the same interleaved rounds."""

    median_ms: float
    p10_ms: float | None = None
    p90_ms: float | None = None
    dense_ms: float | None = Field(None, description="The library's dense attention (jax.nn.dot_product_attention)")
    speedup: float | None = Field(None, description="dense_ms / median_ms: the speedup over the library's dense")
    tiled_dense_ms: float | None = Field(
        None, description="The same backend running these tiles on an all-dense pattern (the tiled dense anchor)"
    )
    speedup_vs_tiled_dense: float | None = Field(
        None, description="tiled_dense_ms / median_ms: what the sparsity saves on this backend"
    )
    others_cores: float | None = Field(
        None,
        description="Cores other programs kept busy while these were timed (null: not measured); above 0.25 a "
        "CPU speedup over dense reads low",
    )
    speedup_p10_p90: dict[str, list[float]] | None = Field(
        None,
        description="The spread of the speedups by anchor ('dense', 'tiled_dense'): [p10, p90] of the ratios of "
        "runs taken side by side, pooled over the measuring processes they were timed in (null: not measured)",
    )


class LookupResponse(BaseModel):
    workload_key: str
    source: Literal["tuned", "stale", "nearest", "heuristic"]
    config: TileConfigOut
    config_id: int | None = None
    timing: TimingOut | None = None
    versions: Versions | None = Field(None, description="Versions the config was tuned with")
    distance: float | None = Field(None, description="For 'nearest': dissimilarity to the neighbour")
    neighbour_key: str | None = None
    job_id: int | None = Field(None, description="The job queued (or already queued) for this workload")
    snapshot: int = Field(
        description="The highest tuned-config id when this answer was read (the pinned one, if pinned); "
        "0 on an empty database. Pin a run to it with the request's 'snapshot'"
    )


class TunedConfigOut(BaseModel):
    id: int
    workload_key: str
    config: TileConfigOut
    timing: TimingOut
    versions: Versions
    is_current: bool
    created_at: dt.datetime
    superseded_at: dt.datetime | None = None


class ConfigPage(BaseModel):
    items: list[TunedConfigOut]
    next_cursor: int | None = None


class WorkloadConfigs(BaseModel):
    workload_key: str
    workload: dict[str, Any]
    current: TunedConfigOut | None
    history: list[TunedConfigOut]


class TrialOut(BaseModel):
    id: int
    workload_key: str
    job_id: int | None
    number: int | None
    params: dict[str, Any]
    status: str
    compile_ms: float | None
    median_ms: float | None
    p10_ms: float | None
    p90_ms: float | None
    max_error: float | None
    error: str | None
    versions: dict[str, Any]
    host: str | None
    worker: str | None = Field(None, description="The tuning worker that measured it (trials of jobs)")
    created_at: dt.datetime
    finished_at: dt.datetime | None = None


class TrialPage(BaseModel):
    items: list[TrialOut]
    next_cursor: int | None = None


class JobRequest(BaseModel):
    model_config = Strict
    workload: WorkloadSpec
    budget: int = Field(64, ge=1, le=100000, description="Trials to measure")
    priority: int = Field(0, ge=-1000, le=1000)
    parallelism: int = Field(1, ge=1, le=64, description="Workers that may share the job (one Optuna study)")


class JobOut(BaseModel):
    id: int
    workload_key: str
    status: str
    budget: int
    priority: int
    parallelism: int
    attempts: int
    workers: list[str] = Field(description="Workers holding the job now")
    error: str | None
    requested_by: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    finished_at: dt.datetime | None
    trials: int = Field(0, description="Trials measured so far (invalid proposals not counted)")
    trials_running: int = Field(0, description="Trials being measured now")
    best_ms: float | None = Field(None, description="Best median time of an ok trial so far")


class JobPage(BaseModel):
    items: list[JobOut]
    next_cursor: int | None = None


class ErrorOut(BaseModel):
    detail: Any
    message: str = Field(description="The field and the rule (a 422 names its first 10 problems)")
    errors: int | None = Field(None, description="422 of a body: how many problems it had")
