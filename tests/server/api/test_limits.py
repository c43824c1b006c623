"""What a deployment is willing to tune and serve: workload limits, bounded bodies and validation
reports, authentication before validation, and the documents and metrics behind the read gate.

Attack inputs are generated (Hypothesis), not picked: workloads over each limit by any amount,
bodies of many unknown keys at any depth, lists and nestings up to the body-size limit.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import hypothesis
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from kernel.presets import PRESETS
from server.api.limits import MAX_REPORTED_ERRORS, max_json_structure
from server.app import create_app
from server.settings import Settings
from server.store import tokens
from server.store.db import Database
from tests.server.conftest import row_counts, workload_body

DEFAULTS = Settings(database_url="sqlite://")
HYPOTHESIS = hypothesis.settings(
    max_examples=25,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
MAX_ANSWER_BYTES = 8 << 10  # a refusal names the problems; it never echoes the body


@pytest.fixture
def locked(database_url: str, db: Database) -> Iterator[TestClient]:
    """A client of an app whose reads need a token."""
    with TestClient(create_app(Settings(database_url=database_url, require_read_token=True), db)) as c:
        yield c


def _pattern(frames: int, tokens_per_frame: int, heads: list[dict[str, Any]]) -> dict[str, Any]:
    return {"layout": {"frames": frames, "tokens_per_frame": tokens_per_frame}, "heads": heads}


# ---------------------------------------------------------------- workload limits


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("full_model", [False, True])
def test_default_limits_admit_every_preset(client: TestClient, preset: str, full_model: bool) -> None:
    """Every preset, at its heads per chip and at the model's full head count, is within the defaults."""
    body: dict[str, Any] = {"device_kind": "TPU v6 lite", "backend": "tpu", "preset": preset}
    if full_model:
        body["heads"] = PRESETS[preset].heads
    answer = client.post("/v1/lookup", json={"workload": body})
    assert answer.status_code == 200, answer.text


@st.composite
def over_one_limit(draw: st.DrawFn) -> tuple[str, str, dict[str, Any]]:
    """(variable, field, workload) with exactly one of the default limits exceeded, by any amount."""
    limit = draw(st.sampled_from(["tokens", "heads", "classes", "batch", "preset_heads"]))
    body = workload_body()
    if limit == "tokens":
        frames = draw(st.integers(1, 4096))
        low = DEFAULTS.max_tokens // frames + 1
        tokens_per_frame = draw(st.integers(low, max(low, (1 << 24) // frames)))
        body["pattern"] = _pattern(frames, tokens_per_frame, [{"kind": "dense"}])
        return "TILETUNE_MAX_TOKENS", "workload.pattern", body
    if limit == "heads":
        n = draw(st.integers(DEFAULTS.max_heads + 1, 2 * DEFAULTS.max_heads))
        body["pattern"] = _pattern(4, 64, [{"kind": "dense"}] * n)
        return "TILETUNE_MAX_HEADS", "workload.pattern.heads", body
    if limit == "classes":
        n = draw(st.integers(DEFAULTS.max_head_classes + 1, DEFAULTS.max_heads))
        body["pattern"] = _pattern(4, 256, [{"kind": "temporal", "window_positions": w} for w in range(n)])
        return "TILETUNE_MAX_HEAD_CLASSES", "workload.pattern.heads", body
    if limit == "batch":
        body["batch"] = draw(st.integers(DEFAULTS.max_batch + 1, 4096))
        return "TILETUNE_MAX_BATCH", "workload.batch", body
    heads = draw(st.integers(DEFAULTS.max_heads + 1, 1024))
    body = {"device_kind": "cpu", "backend": "xla", "preset": draw(st.sampled_from(sorted(PRESETS))), "heads": heads}
    return "TILETUNE_MAX_HEADS", "workload.heads", body


@HYPOTHESIS
@given(case=over_one_limit())
def test_a_workload_over_a_limit_gets_a_422_naming_it(
    case: tuple[str, str, dict[str, Any]], client: TestClient, db: Database, writer_token: str
) -> None:
    variable, field, workload = case
    limit = {
        "TILETUNE_MAX_TOKENS": DEFAULTS.max_tokens,
        "TILETUNE_MAX_HEADS": DEFAULTS.max_heads,
        "TILETUNE_MAX_HEAD_CLASSES": DEFAULTS.max_head_classes,
        "TILETUNE_MAX_BATCH": DEFAULTS.max_batch,
    }[variable]
    before = row_counts(db)
    auth = {"Authorization": f"Bearer {writer_token}"}
    for path, body, headers in (
        ("/v1/lookup", {"workload": workload}, {}),
        ("/v1/lookup", {"workload": workload, "enqueue": True}, auth),
        ("/v1/jobs", {"workload": workload}, auth),
    ):
        answer = client.post(path, json=body, headers=headers)
        assert answer.status_code == 422, (path, answer.text[:300])
        message = answer.json()["message"]
        assert message.startswith(f"{field}: ") and message.endswith(f"> the limit {variable}={limit}"), message
    assert row_counts(db) == before


def test_a_workload_at_the_limits_is_accepted(database_url: str, db: Database, writer_token: str) -> None:
    """The limits are inclusive, and a deployment sets its own."""
    settings = Settings(database_url=database_url, max_tokens=4096, max_heads=6, max_head_classes=3, max_batch=2)
    heads = [{"kind": "temporal", "window_positions": w % 3} for w in range(6)]
    workload = workload_body(batch=2, pattern=_pattern(16, 256, heads))
    with TestClient(create_app(settings, db)) as client:
        assert client.post("/v1/lookup", json={"workload": workload}).status_code == 200
        auth = {"Authorization": f"Bearer {writer_token}"}
        queued = client.post("/v1/jobs", json={"workload": workload}, headers=auth)
        assert queued.status_code == 201
        over = workload_body(batch=2, pattern=_pattern(16, 257, heads))
        answer = client.post("/v1/lookup", json={"workload": over})
        assert answer.json()["message"] == "workload.pattern: 4112 tokens > the limit TILETUNE_MAX_TOKENS=4096"


def test_the_api_document_states_the_limits(database_url: str, db: Database) -> None:
    settings = Settings(database_url=database_url, max_tokens=123_456, max_batch=7)
    with TestClient(create_app(settings, db)) as client:
        description = client.get("/openapi.json").json()["info"]["description"]
    assert "| `TILETUNE_MAX_TOKENS` | 123,456 |" in description
    assert "| `TILETUNE_MAX_BATCH` | 7 |" in description


# ---------------------------------------------------------------- bounded bodies and reports


@st.composite
def crowded_bodies(draw: st.DrawFn) -> bytes:
    """A lookup body up to the size limit with many unknown keys (top level, in the workload, in the
    layout, in every head), a long list, or a deep nesting."""
    shape = draw(st.sampled_from(["top", "workload", "layout", "heads", "list", "deep"]))
    n = draw(st.integers(max_json_structure(DEFAULTS) + 1, 90_000))
    body: dict[str, Any] = {"workload": workload_body()}
    extra = {f"k{i}": 0 for i in range(n)}
    if shape == "top":
        body.update(extra)
    elif shape == "workload":
        body["workload"].update(extra)
    elif shape == "layout":
        body["workload"]["pattern"]["layout"].update(extra)
    elif shape == "heads":
        body["workload"]["pattern"]["heads"] = [{"kind": "dense", "x": 1, "y": 2}] * (n // 4)
    elif shape == "list":
        body["workload"]["device_kind"] = [0] * n
    else:
        depth = min(n, 100_000)
        return b'{"x":' * depth + b"1" + b"}" * depth
    raw = json.dumps(body, separators=(",", ":")).encode()
    return raw[: DEFAULTS.max_body_bytes - 1] if len(raw) >= DEFAULTS.max_body_bytes else raw


@HYPOTHESIS
@given(raw=crowded_bodies())
def test_a_crowded_body_is_refused_before_it_is_parsed(raw: bytes, client: TestClient) -> None:
    """More JSON values than any valid body holds: a 413 naming the limit, from a scan of the bytes
    instead of one validation error per key, computed on the event loop and echoed in the answer."""
    answer = client.post("/v1/lookup", content=raw, headers={"content-type": "application/json"})
    assert answer.status_code == 413, answer.text[:300]
    assert len(answer.content) <= MAX_ANSWER_BYTES
    message = answer.json()["message"]
    assert message.startswith("body: ") and f"TILETUNE_MAX_HEADS={DEFAULTS.max_heads}" in message


@HYPOTHESIS
@given(unknown=st.integers(MAX_REPORTED_ERRORS + 1, 600), where=st.sampled_from(["top", "workload", "layout"]))
def test_a_validation_report_names_the_first_problems_and_counts_the_rest(
    unknown: int, where: str, client: TestClient
) -> None:
    body: dict[str, Any] = {"workload": workload_body()}
    target = {"top": body, "workload": body["workload"], "layout": body["workload"]["pattern"]["layout"]}[where]
    target.update({f"unknown_{i}": "x" * 100 for i in range(unknown)})
    answer = client.post("/v1/lookup", json=body)
    assert answer.status_code == 422
    assert len(answer.content) <= MAX_ANSWER_BYTES
    report = answer.json()
    assert report["errors"] == unknown and len(report["detail"]) == MAX_REPORTED_ERRORS
    assert report["message"].count("unknown_") == MAX_REPORTED_ERRORS
    assert report["message"].endswith(f"; and {unknown - MAX_REPORTED_ERRORS} more problem(s)")
    assert "x" * 100 not in answer.text  # never the input


# ---------------------------------------------------------------- authentication first


@HYPOTHESIS
@given(unknown=st.integers(1, 500))
def test_reads_that_need_a_token_authenticate_before_validating(unknown: int, locked: TestClient, db: Database) -> None:
    """An anonymous body, however bad, is refused as anonymous: no validation work, no report."""
    body: dict[str, Any] = {"workload": workload_body(batch="many"), **{f"k{i}": i for i in range(unknown)}}
    anonymous = locked.post("/v1/lookup", json=body)
    assert anonymous.status_code == 401, anonymous.text[:300]
    assert anonymous.json()["message"] == "authorization: a bearer token is required"
    with db.transaction() as session:
        token = tokens.create_token(session, f"reader-{unknown}", "worker")
    signed = locked.post("/v1/lookup", json=body, headers={"Authorization": f"Bearer {token}"})
    assert signed.status_code == 422 and signed.json()["errors"] == unknown + 1


# ---------------------------------------------------------------- documents and metrics


PUBLIC_READS = ("/metrics", "/openapi.json", "/docs", "/redoc")


def test_documents_and_metrics_follow_the_read_token_setting(
    client: TestClient, locked: TestClient, db: Database
) -> None:
    for path in PUBLIC_READS:
        assert client.get(path).status_code == 200, path  # reads open: so are these
    with db.transaction() as session:
        token = tokens.create_token(session, "scraper", "worker")
    for path in PUBLIC_READS:
        denied = locked.get(path)
        assert denied.status_code == 401, path
        assert denied.json()["message"] == "authorization: a bearer token is required"
        assert locked.get(path, headers={"Authorization": "Bearer tt_wrong"}).status_code == 401
        assert locked.get(path, headers={"Authorization": f"Bearer {token}"}).status_code == 200, path
    for path in ("/healthz", "/readyz"):  # probes stay open
        assert locked.get(path).status_code == 200
    document = locked.get("/openapi.json", headers={"Authorization": f"Bearer {token}"}).json()
    assert "/v1/lookup" in document["paths"] and "/docs" not in document["paths"]
