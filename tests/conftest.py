"""Shared fixtures. Tests that need PostgreSQL read TILETUNE_TEST_DATABASE_URL.

``database_url`` runs a test on SQLite and, when TILETUNE_TEST_DATABASE_URL is
set, on PostgreSQL; migrations run once per database; ``db`` empties
tiletune's tables before each test.

The suite runs in parallel processes (pytest-xdist, ``-n auto`` in pyproject.toml).
Each process gets its own PostgreSQL database beside the given one, created here and
dropped when the process ends, so one process emptying tables never hits another's
test; TILETUNE_TEST_DATABASE_URL is pointed at it for the tests and the processes
they start.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

from server.store.db import Database
from server.store.migrate import upgrade

_WORKER_DATABASE = pytest.StashKey[contextlib.ExitStack]()


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    url = os.environ.get("TILETUNE_TEST_DATABASE_URL")
    if not worker or not url:
        return
    from server.bench.crash import scratch_database

    stack = contextlib.ExitStack()
    os.environ["TILETUNE_TEST_DATABASE_URL"] = stack.enter_context(scratch_database(url, worker))
    config.stash[_WORKER_DATABASE] = stack


def pytest_unconfigure(config: pytest.Config) -> None:
    stack = config.stash.get(_WORKER_DATABASE, None)
    if stack is not None:
        stack.close()


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
