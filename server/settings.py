"""All settings of the service, read from ``TILETUNE_*`` environment variables.

The ``max_*`` limits say what a deployment is willing to tune, serve and draw; the API
checks a workload against them before any work and answers a 422 naming the variable
(:mod:`server.api.limits`). Their defaults admit every preset of :mod:`kernel.presets`
with headroom (the largest, hunyuan-720p, is 119,056 tokens; cogvideox has 48 heads and
every preset two head classes). The ``figure_*`` settings bound the dashboard's drawing
(:mod:`server.dashboard.renderer`).
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from kernel.layout import MAX_SEQ_LEN
from kernel.workload import MAX_BATCH

DEFAULT_DATABASE_URL = "sqlite:///./tiletune.db"
MAX_HEADS = 1024  # the most heads any deployment may admit (the request schema's bound)


class Settings(BaseSettings):
    """One settings class for the server and the CLI commands that touch the database."""

    model_config = SettingsConfigDict(env_prefix="TILETUNE_", extra="ignore")

    database_url: str = Field(DEFAULT_DATABASE_URL, description="SQLAlchemy URL (sqlite:/// or postgresql+psycopg://)")
    require_read_token: bool = Field(False, description="Reads (and /metrics, /docs, /openapi.json) need a token too")
    max_page_size: int = Field(500, ge=1, le=10000, description="Upper bound of ?limit= on listings")
    default_page_size: int = Field(50, ge=1, le=10000)
    max_body_bytes: int = Field(1 << 20, ge=1024, description="Larger request bodies get 413")
    sqlite_busy_timeout_ms: int = Field(10000, ge=0)
    job_budget_default: int = Field(64, ge=1, description="Trials of a job queued by a lookup miss")
    nearest_candidates: int = Field(64, ge=1, description="Same-family workloads compared on a miss")

    max_tokens: int = Field(1 << 18, ge=1, le=MAX_SEQ_LEN, description="Sequence length of a workload (F*P + T)")
    max_heads: int = Field(128, ge=1, le=MAX_HEADS, description="Heads of a workload")
    max_head_classes: int = Field(16, ge=1, le=MAX_HEADS, description="Distinct head patterns of a workload")
    max_batch: int = Field(64, ge=1, le=MAX_BATCH, description="Batch of a workload")

    max_figure_tiles: int = Field(
        1 << 22,
        ge=1,
        description="Tiles a block map classifies one by one; a larger map is drawn from coarse cells instead",
    )
    figure_workers: int = Field(1, ge=1, le=64, description="Processes drawing figures, per server process")
    figure_queue: int = Field(16, ge=0, description="Figure requests that may wait for a drawing process; more get 503")
    figure_timeout_s: float = Field(30.0, gt=0, description="Seconds a figure may take; the drawing process is killed")
    figure_memory_mb: int = Field(1024, ge=256, description="Address space of a drawing process (RLIMIT_AS), MiB")
    figure_cache_mb: int = Field(32, ge=0, description="PNG bytes of drawn figures kept per server process, MiB")


def get_settings() -> Settings:
    return Settings()
