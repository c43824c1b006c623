"""Server fixtures: every API test runs on SQLite and, when TILETUNE_TEST_DATABASE_URL
is set, on PostgreSQL. Migrations run once per database; tables are emptied per test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from server import store
from server.app import create_app
from server.db import Database
from server.migrate import upgrade
from server.models import Base
from server.settings import Settings

TABLES = [t.name for t in reversed(Base.metadata.sorted_tables)]


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'tiletune-test.db'}"
    else:
        env = os.environ.get("TILETUNE_TEST_DATABASE_URL")
        if not env:
            pytest.skip("TILETUNE_TEST_DATABASE_URL is not set (.ci/run sets it to a fresh database)")
        url = env
    upgrade(url)
    return url


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    database.empty_tables()
    yield database
    database.dispose()


@pytest.fixture
def settings(database_url: str) -> Settings:
    return Settings(database_url=database_url)


@pytest.fixture
def client(settings: Settings, db: Database) -> Iterator[TestClient]:
    with TestClient(create_app(settings, db)) as c:
        yield c


@pytest.fixture
def writer_token(db: Database) -> str:
    with db.sessions() as session:
        return store.create_token(session, "writer-test", "writer")


@pytest.fixture
def worker_token(db: Database) -> str:
    with db.sessions() as session:
        return store.create_token(session, "worker-test", "worker")


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
