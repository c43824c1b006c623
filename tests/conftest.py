"""Shared fixtures. Tests that need PostgreSQL read TILETUNE_TEST_DATABASE_URL."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def postgres_url() -> str:
    url = os.environ.get("TILETUNE_TEST_DATABASE_URL")
    if not url:
        pytest.skip("TILETUNE_TEST_DATABASE_URL is not set (.ci/run sets it to a fresh database)")
    return url
