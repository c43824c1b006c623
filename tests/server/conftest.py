"""Server fixtures (``database_url`` and ``db``, in tests/conftest.py, give every API test SQLite
and, when TILETUNE_TEST_DATABASE_URL is set, PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from server.app import create_app
from server.settings import Settings
from server.store import tokens
from server.store.db import Database
from server.store.models import Base

TABLES = [t.name for t in reversed(Base.metadata.sorted_tables)]


@pytest.fixture
def settings(database_url: str) -> Settings:
    return Settings(database_url=database_url)


@pytest.fixture
def client(settings: Settings, db: Database) -> Iterator[TestClient]:
    with TestClient(create_app(settings, db)) as c:
        yield c


@pytest.fixture
def writer_token(db: Database) -> str:
    with db.transaction() as session:
        return tokens.create_token(session, "writer-test", "writer")


@pytest.fixture
def worker_token(db: Database) -> str:
    with db.transaction() as session:
        return tokens.create_token(session, "worker-test", "worker")


def row_counts(db: Database) -> dict[str, int]:
    with db.engine.connect() as conn:
        return {name: conn.execute(text(f"SELECT count(*) FROM {name}")).scalar_one() for name in TABLES}


def workload_body(**overrides: Any) -> dict[str, Any]:
    """A small valid workload object of the API."""
    body: dict[str, Any] = {
        "device_kind": "cpu",
        "backend": "xla",
        "dtype": "float32",
        "batch": 1,
        "head_dim": 64,
        "pattern": {
            "layout": {"frames": 4, "tokens_per_frame": 64, "text_tokens": 0, "text_position": "suffix"},
            "heads": [{"kind": "spatial", "window_frames": 1}, {"kind": "temporal", "window_positions": 4}],
        },
    }
    body.update(overrides)
    return body
