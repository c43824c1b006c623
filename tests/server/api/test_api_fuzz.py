"""Property-based API tests generated from the app's OpenAPI document (schemathesis).

Every operation of /openapi.json is fuzzed in-process (ASGI) with schema-valid
and schema-invalid requests. Each generated request is sent twice, anonymously
and with a writer token (so the write routes get past auth and reach their
validation and store code), against ``create_app(settings, db)`` on the test
database (SQLite, and PostgreSQL when TILETUNE_TEST_DATABASE_URL is set).
Properties: no answer is a 5xx (nor an unhandled exception), and every 4xx is
JSON with a ``message``.

Schema-driven generation rarely builds a workload that also passes the
cross-field rules (windows within the layout, exactly one of pattern/preset), so
``test_valid_workloads_round_trip`` adds a Hypothesis strategy of valid
workloads and follows each through lookup, job creation, reads and cancel.

Bounded and deterministic: a fixed seed, derandomized Hypothesis, no deadline,
no example database, MAX_EXAMPLES per operation.

The document is loaded once at import from a database-less app (the document
does not depend on the database); requests go to the fixture's app through
``case.call(app=...)``. ``schemathesis.pytest.from_fixture`` would be the
direct route, but schemathesis 4.32's lazy loader reads ``Function._nodeid``,
which pytest 9.2 no longer has.
"""

from __future__ import annotations

from typing import Any

import hypothesis
import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig

from kernel.presets import PRESETS
from kernel.workload import BACKENDS, DTYPES, MAX_HEAD_DIM
from server.app import create_app
from server.settings import Settings
from server.store.db import Database
from tests.server.conftest import row_counts

SEED = 20240611
LIMITS = Settings(database_url="sqlite://")  # the default limits the valid workloads stay within
# Per operation (fuzzing phase; the examples and coverage phases add a fixed,
# deterministic set on top). Both databases together run in well under 60 s on 2 cores.
MAX_EXAMPLES = 30

FUZZ_CONFIG: dict[str, Any] = {
    "seed": SEED,
    "generation": {"mode": "all", "max-examples": MAX_EXAMPLES, "deterministic": True, "database": "none"},
    "phases": {"stateful": {"enabled": False}},
}

V1_OPERATIONS = {
    ("post", "/v1/lookup"),
    ("post", "/v1/jobs"),
    ("get", "/v1/jobs"),
    ("get", "/v1/jobs/{job_id}"),
    ("post", "/v1/jobs/{job_id}/cancel"),
    ("get", "/v1/configs"),
    ("get", "/v1/configs/{key}"),
    ("get", "/v1/workloads/{key}/history"),
    ("get", "/v1/trials"),
}

# The OpenAPI document of the app; the database is never touched to serve it.
schema = schemathesis.openapi.from_asgi(
    "/openapi.json",
    create_app(Settings(database_url="sqlite://")),
    config=SchemathesisConfig.from_dict(FUZZ_CONFIG),
)


@pytest.fixture
def app(settings: Settings, db: Database) -> FastAPI:
    """The app under test, on the test database."""
    return create_app(settings, db)


@schema.parametrize()
@hypothesis.settings(
    max_examples=MAX_EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_server_error(case: schemathesis.Case, app: FastAPI, db: Database, writer_token: str) -> None:
    """No generated request, anonymous or with a writer token, gets a 5xx; every 4xx carries a message."""
    for headers in ({}, {"Authorization": f"Bearer {writer_token}"}):
        response = case.call(app=app, headers=headers)
        case.validate_response(response, checks=[not_a_server_error], headers=headers)
        if 400 <= response.status_code < 500:
            body = response.json()
            assert isinstance(body, dict), f"{response.status_code} is not a JSON object: {response.text[:200]}"
            assert isinstance(body.get("message"), str), f"{response.status_code} has no message: {response.text[:200]}"
            assert body["message"], f"{response.status_code} has an empty message"


def test_schema_covers_v1_operations() -> None:
    """The fuzzed document holds every /v1 operation (nothing silently left out of the fuzz)."""
    fuzzed = {(op.ok().method.lower(), op.ok().path) for op in schema.get_all_operations()}
    assert fuzzed >= V1_OPERATIONS


def test_openapi_documents_every_v1_route(app: FastAPI, writer_token: str) -> None:
    """/openapi.json is served as JSON and documents exactly the /v1 routes, each of which is routed."""
    concrete = {"{job_id}": "1", "{key}": "0" * 32}
    with TestClient(app) as client:
        response = client.get("/openapi.json")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("application/json")
        document = response.json()
        assert document["openapi"].startswith("3.")
        paths: dict[str, dict[str, Any]] = document["paths"]
        documented = {(m, p) for p, ops in paths.items() if p.startswith("/v1/") for m in ops}
        assert documented == V1_OPERATIONS
        for method, path in sorted(V1_OPERATIONS):
            assert "422" in paths[path][method]["responses"], f"{method.upper()} {path} does not document its 422"
            url = path
            for placeholder, value in concrete.items():
                url = url.replace(placeholder, value)
            probe = client.request(method, url, headers={"Authorization": f"Bearer {writer_token}"}, json={})
            # The route exists: the router's own "Not Found" / 405 would carry no field name.
            assert probe.status_code != 405, f"{method.upper()} {path} is documented but not routed"
            assert probe.json().get("detail") != "Not Found", f"{method.upper()} {path} is documented but not routed"


@st.composite
def head_specs(draw: st.DrawFn, frames: int, tokens_per_frame: int) -> dict[str, Any]:
    """One head whose window fits the layout."""
    kind = draw(st.sampled_from(["dense", "spatial", "temporal", "band"]))
    head: dict[str, Any] = {"kind": kind}
    if kind == "spatial":
        head["window_frames"] = draw(st.integers(0, frames - 1))
    elif kind == "temporal":
        head["window_positions"] = draw(st.integers(0, tokens_per_frame - 1))
    elif kind == "band":
        head["tokens"] = draw(st.integers(1, frames * tokens_per_frame))
    if draw(st.booleans()):
        head["first_frame_sink"] = draw(st.booleans())
    return head


@st.composite
def valid_workloads(draw: st.DrawFn) -> dict[str, Any]:
    """A workload the API must accept: a preset (optionally with a head count) or a pattern that fits,
    within the default limits (TILETUNE_MAX_*)."""
    body: dict[str, Any] = {
        "device_kind": draw(st.sampled_from(["cpu", "TPU v5 lite", "TPU v6 lite"])),
        "backend": draw(st.sampled_from(BACKENDS)),
        "dtype": draw(st.sampled_from(DTYPES)),
        "batch": draw(st.integers(1, LIMITS.max_batch)),
    }
    if draw(st.booleans()):
        body["preset"] = draw(st.sampled_from(sorted(PRESETS)))
        if draw(st.booleans()):
            body["heads"] = draw(st.integers(1, 64))
        return body
    frames = draw(st.integers(1, 64))
    text_tokens = draw(st.integers(0, 512))
    tokens_per_frame = draw(st.integers(1, min(4096, (LIMITS.max_tokens - text_tokens) // frames)))
    layout = {
        "frames": frames,
        "tokens_per_frame": tokens_per_frame,
        "text_tokens": text_tokens,
        "text_position": draw(st.sampled_from(["prefix", "suffix"])),
    }
    heads = draw(st.lists(head_specs(frames, tokens_per_frame), min_size=1, max_size=12))
    body["head_dim"] = draw(st.integers(1, MAX_HEAD_DIM))
    body["pattern"] = {"layout": layout, "heads": heads}
    if draw(st.booleans()):
        body["heads"] = len(heads)
        body["seq_len"] = frames * tokens_per_frame + text_tokens
    return body


@given(workload=valid_workloads())
@hypothesis.settings(
    max_examples=20,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_valid_workloads_round_trip(workload: dict[str, Any], app: FastAPI, db: Database, writer_token: str) -> None:
    """A valid workload is looked up (writing nothing), queued, listed, read and cancelled; never a 5xx."""
    auth = {"Authorization": f"Bearer {writer_token}"}
    with TestClient(app, raise_server_exceptions=False) as client:
        before = row_counts(db)
        found = client.post("/v1/lookup", json={"workload": workload})
        assert found.status_code == 200, found.text[:400]
        key = found.json()["workload_key"]
        assert found.json()["source"] in ("heuristic", "nearest", "stale", "tuned")
        assert row_counts(db) == before, "a lookup without enqueue wrote to the database"

        queued = client.post("/v1/jobs", json={"workload": workload, "budget": 4}, headers=auth)
        assert queued.status_code in (200, 201), queued.text[:400]  # 200: the same workload was drawn before
        job = queued.json()
        assert job["workload_key"] == key
        again = client.post("/v1/jobs", json={"workload": workload}, headers=auth)
        assert again.status_code == 200 and again.json()["id"] == job["id"], again.text[:400]

        for path in (
            f"/v1/jobs/{job['id']}",
            f"/v1/configs/{key}",
            f"/v1/workloads/{key}/history",
            f"/v1/trials?workload_key={key}",
            f"/v1/jobs?workload_key={key}",
        ):
            read = client.get(path)
            assert read.status_code == 200, f"{path}: {read.status_code} {read.text[:300]}"

        cancelled = client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth)
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled", cancelled.text[:400]
