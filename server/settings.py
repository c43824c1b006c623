"""All settings of the service, read from ``TILETUNE_*`` environment variables."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATABASE_URL = "sqlite:///./tiletune.db"


class Settings(BaseSettings):
    """One settings class for the server and the CLI commands that touch the database."""

    model_config = SettingsConfigDict(env_prefix="TILETUNE_", extra="ignore")

    database_url: str = Field(DEFAULT_DATABASE_URL, description="SQLAlchemy URL (sqlite:/// or postgresql+psycopg://)")
    require_read_token: bool = Field(False, description="Reads need a bearer token too")
    max_page_size: int = Field(500, ge=1, le=10000, description="Upper bound of ?limit= on listings")
    default_page_size: int = Field(50, ge=1, le=10000)
    max_body_bytes: int = Field(1 << 20, ge=1024, description="Larger request bodies get 413")
    sqlite_busy_timeout_ms: int = Field(10000, ge=0)
    job_budget_default: int = Field(64, ge=1, description="Trials of a job queued by a lookup miss")
    nearest_candidates: int = Field(64, ge=1, description="Same-family workloads compared on a miss")


def get_settings() -> Settings:
    return Settings()
