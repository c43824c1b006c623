"""Routes take their settings and database only through dependencies, so a test (or an embedding
application) swaps them with ``app.dependency_overrides`` and every router follows."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from server.api.deps import get_database, get_settings
from server.api.schemas import WorkloadSpec
from server.app import create_app
from server.settings import Settings
from server.store import records, workloads
from server.store.db import Database
from server.store.migrate import upgrade
from tests.server.conftest import workload_body


def test_settings_override_reaches_every_router(settings: Settings, db: Database) -> None:
    app = create_app(settings, db)
    strict = settings.model_copy(update={"require_read_token": True})
    with TestClient(app) as client:
        assert client.get("/v1/configs").status_code == 200
        app.dependency_overrides[get_settings] = lambda: strict
        for path in ("/v1/configs", "/v1/jobs", "/v1/trials"):
            answer = client.get(path)
            assert answer.status_code == 401, path
            assert answer.json()["message"] == "authorization: a bearer token is required"
        lookup = client.post("/v1/lookup", json={"workload": workload_body()})
        assert lookup.status_code == 401
        app.dependency_overrides.clear()
        assert client.get("/v1/configs").status_code == 200


def test_database_override_reaches_every_router(settings: Settings, db: Database, tmp_path: Path) -> None:
    other_url = f"sqlite:///{tmp_path / 'other.db'}"
    upgrade(other_url)
    other = Database(other_url)
    body = workload_body()
    with other.transaction() as session:
        row = workloads.workload_row(session, WorkloadSpec.model_validate(body).to_workload())
        config = {"variant": "compact", "block_q": 64, "block_kv": 64, "block_kv_compute": 64,
                  "layout": "temporal_major", "align": "none", "head_grouping": "by_pattern"}  # fmt: skip
        records.publish_tuned_config(session, row, config, median_ms=2.0, versions={"jax": "x", "jaxlib": "x"})
    app = create_app(settings, db)
    try:
        with TestClient(app) as client:
            assert client.post("/v1/lookup", json={"workload": body}).json()["source"] == "heuristic"
            app.dependency_overrides[get_database] = lambda: other
            answer = client.post("/v1/lookup", json={"workload": body}).json()
            assert (answer["source"], answer["config"]["block_q"]) == ("stale", 64)
            assert len(client.get("/v1/configs").json()["items"]) == 1
            assert client.get("/readyz").json()["database"] == "sqlite"
    finally:
        other.dispose()
