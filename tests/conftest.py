"""Shared fixtures. Tests that need PostgreSQL read TILETUNE_TEST_DATABASE_URL.

``database_url`` runs a test on SQLite and, when TILETUNE_TEST_DATABASE_URL is
set, on PostgreSQL; migrations run once per database; ``db`` empties
tiletune's tables before each test.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from server.store.db import Database
from server.store.migrate import upgrade


@pytest.fixture
def postgres_url() -> str:
    url = os.environ.get("TILETUNE_TEST_DATABASE_URL")
    if not url:
        pytest.skip("TILETUNE_TEST_DATABASE_URL is not set (.ci/run sets it to a fresh database)")
    return url


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
