"""A table of bad requests: each gets its 4xx, a JSON ``message`` that names the
field at fault, and leaves the database exactly as it was.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from server.settings import Settings
from server.store.db import Database
from tests.server.conftest import row_counts, workload_body

MISSING_KEY = "0123456789abcdef0123456789abcdef"  # well-formed, never stored
WRITER = {"Authorization": "Bearer {writer}"}
WORKER = {"Authorization": "Bearer {worker}"}
JSON = {"Content-Type": "application/json"}
MAX_BODY = 1 << 20  # Settings.max_body_bytes default


class _NoBody:
    def __repr__(self) -> str:
        return "NO_BODY"


NO_BODY: Any = _NoBody()


@dataclasses.dataclass(frozen=True)
class Bad:
    """One bad request and what the server must answer."""

    id: str
    method: str
    path: str
    status: int
    names: str  # substring of the JSON message that names the field
    json: Any = NO_BODY
    content: bytes | Callable[[], Iterator[bytes]] | None = None
    headers: dict[str, str] = dataclasses.field(default_factory=dict)


def _pattern(heads: list[dict[str, Any]] | None = None, **layout: Any) -> dict[str, Any]:
    lay = {"frames": 4, "tokens_per_frame": 64, "text_tokens": 0, "text_position": "suffix"}
    lay.update(layout)
    return {"layout": lay, "heads": heads if heads is not None else [{"kind": "spatial", "window_frames": 1}]}


def _without(d: dict[str, Any], *path: str) -> dict[str, Any]:
    """A deep copy of ``d`` without the key at ``path``."""
    out = copy.deepcopy(d)
    node = out
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return out


def lookup(id_: str, names: str, *, status: int = 422, **overrides: Any) -> Bad:
    """POST /v1/lookup of the valid workload with ``overrides`` applied."""
    return Bad(id_, "POST", "/v1/lookup", status, names, json={"workload": workload_body(**overrides)})


def job(id_: str, names: str, body: dict[str, Any], *, status: int = 422) -> Bad:
    """POST /v1/jobs with a valid writer token."""
    return Bad(id_, "POST", "/v1/jobs", status, names, json=body, headers=WRITER)


def get(id_: str, path: str, names: str, *, status: int = 422) -> Bad:
    return Bad(id_, "GET", path, status, names)


def _chunked_oversize() -> Iterator[bytes]:
    """A body without Content-Length, streamed past the limit."""
    yield b'{"workload": "' + b"x" * (MAX_BODY // 2)
    yield b"x" * (MAX_BODY // 2 + 16) + b'"}'


VALID = workload_body()
PRESET = {"device_kind": "cpu", "backend": "xla", "preset": "cpu-demo"}

ROWS: list[Bad] = [
    # ------------------------------------------------------------ POST /v1/lookup: missing fields
    Bad("lookup-missing-workload", "POST", "/v1/lookup", 422, "workload", json={}),
    Bad(
        "lookup-missing-device_kind",
        "POST",
        "/v1/lookup",
        422,
        "device_kind",
        json={"workload": _without(VALID, "device_kind")},
    ),
    Bad("lookup-missing-backend", "POST", "/v1/lookup", 422, "backend", json={"workload": _without(VALID, "backend")}),
    Bad(
        "lookup-missing-frames",
        "POST",
        "/v1/lookup",
        422,
        "frames",
        json={"workload": _without(VALID, "pattern", "layout", "frames")},
    ),
    Bad(
        "lookup-missing-layout",
        "POST",
        "/v1/lookup",
        422,
        "layout",
        json={"workload": _without(VALID, "pattern", "layout")},
    ),
    Bad(
        "lookup-missing-head-kind",
        "POST",
        "/v1/lookup",
        422,
        "kind",
        json={"workload": workload_body(pattern=_pattern([{"window_frames": 1}]))},
    ),
    lookup("lookup-missing-head_dim-without-preset", "head_dim", head_dim=None),
    lookup("lookup-spatial-without-window_frames", "window_frames", pattern=_pattern([{"kind": "spatial"}])),
    # ------------------------------------------------------------ zero / negative sizes
    lookup("lookup-frames-zero", "frames", pattern=_pattern(frames=0)),
    lookup("lookup-frames-negative", "frames", pattern=_pattern(frames=-4)),
    lookup("lookup-tokens_per_frame-zero", "tokens_per_frame", pattern=_pattern(tokens_per_frame=0)),
    lookup("lookup-tokens_per_frame-negative", "tokens_per_frame", pattern=_pattern(tokens_per_frame=-64)),
    lookup("lookup-text_tokens-negative", "text_tokens", pattern=_pattern(text_tokens=-1)),
    lookup("lookup-batch-zero", "batch", batch=0),
    lookup("lookup-batch-negative", "batch", batch=-2),
    lookup("lookup-head_dim-zero", "head_dim", head_dim=0),
    lookup("lookup-head_dim-negative", "head_dim", head_dim=-64),
    lookup(
        "lookup-window_frames-negative", "window_frames", pattern=_pattern([{"kind": "spatial", "window_frames": -1}])
    ),
    lookup(
        "lookup-window_positions-negative",
        "window_positions",
        pattern=_pattern([{"kind": "temporal", "window_positions": -3}]),
    ),
    lookup("lookup-band-tokens-zero", "tokens", pattern=_pattern([{"kind": "band", "tokens": 0}])),
    lookup("lookup-heads-empty-list", "heads", pattern=_pattern([])),
    # ------------------------------------------------------------ absurd sizes
    lookup("lookup-seq-over-2**24", "tokens_per_frame", pattern=_pattern(frames=4096, tokens_per_frame=4097)),
    lookup("lookup-frames-over-2**24", "frames", pattern=_pattern(frames=2**24 + 1)),
    lookup("lookup-head_dim-1e9", "head_dim", head_dim=10**9),
    lookup("lookup-batch-1e6", "batch", batch=10**6),
    lookup("lookup-heads-2000-preset", "heads", pattern=None, preset="cpu-demo", heads=2000),
    # More JSON values than any body of TILETUNE_MAX_HEADS heads holds: refused before parsing.
    lookup("lookup-2000-head-entries", "TILETUNE_MAX_HEADS", status=413, pattern=_pattern([{"kind": "dense"}] * 2000)),
    lookup("lookup-frames-1e30", "frames", pattern=_pattern(frames=10**30)),
    # ------------------------------------------------------------ enums and cross-field rules
    lookup("lookup-text_position-unknown", "text_position", pattern=_pattern(text_tokens=8, text_position="middle")),
    lookup("lookup-kind-unknown", "kind", pattern=_pattern([{"kind": "diagonal", "window_frames": 1}])),
    lookup("lookup-backend-unknown", "backend", backend="cuda"),
    lookup("lookup-dtype-unknown", "dtype", dtype="int8"),
    lookup("lookup-seq_len-mismatch", "seq_len", seq_len=255),
    lookup("lookup-heads-mismatch", "heads", heads=3),
    lookup("lookup-seq_len-mismatch-preset", "seq_len", pattern=None, preset="cpu-demo", seq_len=4097),
    lookup(
        "lookup-window_frames-out-of-range",
        "window_frames",
        pattern=_pattern([{"kind": "spatial", "window_frames": 4}]),
    ),
    lookup(
        "lookup-window_positions-out-of-range",
        "window_positions",
        pattern=_pattern([{"kind": "temporal", "window_positions": 64}]),
    ),
    lookup("lookup-band-tokens-out-of-range", "tokens", pattern=_pattern([{"kind": "band", "tokens": 257}])),
    lookup("lookup-dense-head-with-window", "window_frames", pattern=_pattern([{"kind": "dense", "window_frames": 1}])),
    lookup(
        "lookup-spatial-head-with-band-field",
        "tokens",
        pattern=_pattern([{"kind": "spatial", "window_frames": 1, "tokens": 3}]),
    ),
    lookup("lookup-pattern-and-preset", "preset", preset="cpu-demo"),
    lookup("lookup-neither-pattern-nor-preset", "pattern", pattern=None),
    lookup("lookup-preset-unknown", "preset", pattern=None, preset="wan9-8k"),
    lookup("lookup-device_kind-empty", "device_kind", device_kind=""),
    lookup("lookup-device_kind-blank", "device_kind", device_kind="   "),
    lookup("lookup-device_kind-too-long", "device_kind", device_kind="x" * 65),
    lookup("lookup-kernel_version-too-long", "kernel_version", kernel_version="1" * 17),
    Bad(
        "lookup-versions-jax-too-long",
        "POST",
        "/v1/lookup",
        422,
        "jax",
        json={"workload": VALID, "versions": {"jax": "0." * 20}},
    ),
    # ------------------------------------------------------------ unknown fields (extra="forbid")
    Bad("lookup-unknown-top-field", "POST", "/v1/lookup", 422, "colour", json={"workload": VALID, "colour": "blue"}),
    lookup("lookup-unknown-workload-field", "flavour", flavour="vanilla"),
    lookup("lookup-unknown-layout-field", "fps", pattern=_pattern(fps=24)),
    lookup("lookup-unknown-head-field", "stride", pattern=_pattern([{"kind": "dense", "stride": 2}])),
    Bad(
        "lookup-unknown-versions-field",
        "POST",
        "/v1/lookup",
        422,
        "cuda",
        json={"workload": VALID, "versions": {"cuda": "12"}},
    ),
    # ------------------------------------------------------------ wrong types
    lookup("lookup-batch-string", "batch", batch="abc"),
    lookup("lookup-batch-float", "batch", batch=2.5),
    lookup("lookup-batch-bool", "batch", batch=True),
    lookup("lookup-frames-string", "frames", pattern=_pattern(frames="four")),
    lookup("lookup-pattern-list", "pattern", pattern=[]),
    lookup("lookup-heads-object", "heads", pattern={"layout": _pattern()["layout"], "heads": {"kind": "dense"}}),
    lookup("lookup-backend-null", "backend", backend=None),
    lookup("lookup-device_kind-number", "device_kind", device_kind=7),
    Bad("lookup-workload-null", "POST", "/v1/lookup", 422, "workload", json={"workload": None}),
    Bad("lookup-workload-list", "POST", "/v1/lookup", 422, "workload", json={"workload": [VALID]}),
    Bad("lookup-versions-list", "POST", "/v1/lookup", 422, "versions", json={"workload": VALID, "versions": ["0.4"]}),
    Bad("lookup-enqueue-string", "POST", "/v1/lookup", 422, "enqueue", json={"workload": VALID, "enqueue": "maybe"}),
    # ------------------------------------------------------------ snapshot pinning
    Bad("lookup-snapshot-string", "POST", "/v1/lookup", 422, "snapshot", json={"workload": VALID, "snapshot": "7"}),
    Bad("lookup-snapshot-float", "POST", "/v1/lookup", 422, "snapshot", json={"workload": VALID, "snapshot": 1.5}),
    Bad("lookup-snapshot-bool", "POST", "/v1/lookup", 422, "snapshot", json={"workload": VALID, "snapshot": True}),
    Bad("lookup-snapshot-negative", "POST", "/v1/lookup", 422, "snapshot", json={"workload": VALID, "snapshot": -1}),
    Bad("lookup-snapshot-list", "POST", "/v1/lookup", 422, "snapshot", json={"workload": VALID, "snapshot": [3]}),
    Bad(
        "lookup-snapshot-too-large",
        "POST",
        "/v1/lookup",
        422,
        "snapshot",
        json={"workload": VALID, "snapshot": 2**31},
    ),
    Bad(
        "lookup-snapshot-ahead-of-database",  # the table is empty: its latest snapshot is 0
        "POST",
        "/v1/lookup",
        422,
        "snapshot",
        json={"workload": VALID, "snapshot": 5},
    ),
    Bad(
        "lookup-snapshot-ahead-with-enqueue",
        "POST",
        "/v1/lookup",
        422,
        "snapshot",
        json={"workload": VALID, "snapshot": 5, "enqueue": True},
        headers=WRITER,
    ),
    # ------------------------------------------------------------ malformed bodies
    Bad(
        "lookup-body-malformed-json",
        "POST",
        "/v1/lookup",
        422,
        "body",
        content=b'{"workload": {',
        headers=JSON,
    ),
    Bad("lookup-body-empty", "POST", "/v1/lookup", 422, "body", content=b"", headers=JSON),
    Bad("lookup-body-absent", "POST", "/v1/lookup", 422, "body"),
    Bad("lookup-body-json-null", "POST", "/v1/lookup", 422, "body", content=b"null", headers=JSON),
    Bad("lookup-body-json-list", "POST", "/v1/lookup", 422, "body", content=b"[]", headers=JSON),
    Bad(
        "lookup-body-not-utf8",
        "POST",
        "/v1/lookup",
        422,
        "body",
        content=b"\xff\xfe{}",
        headers=JSON,
    ),
    Bad(
        "lookup-body-form-encoded",
        "POST",
        "/v1/lookup",
        422,
        "body",
        content=b"workload=x",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    ),
    Bad(
        "lookup-body-too-deep",
        "POST",
        "/v1/lookup",
        413,
        "body",
        content=b'{"a":' * 5000 + b"1" + b"}" * 5000,
        headers=JSON,
    ),
    Bad(
        "lookup-batch-nan",
        "POST",
        "/v1/lookup",
        422,
        "batch",
        content=b'{"workload": {"device_kind": "cpu", "backend": "xla", "preset": "cpu-demo", "batch": NaN}}',
        headers=JSON,
    ),
    Bad(
        "lookup-frames-infinity",
        "POST",
        "/v1/lookup",
        422,
        "frames",
        content=b'{"workload": {"device_kind": "cpu", "backend": "xla", "head_dim": 64, "pattern": '
        b'{"layout": {"frames": 1e400, "tokens_per_frame": 8}, "heads": [{"kind": "dense"}]}}}',
        headers=JSON,
    ),
    Bad(
        "lookup-jax-lone-surrogate",
        "POST",
        "/v1/lookup",
        422,
        "jax",
        content=b'{"workload": {"device_kind": "cpu", "backend": "xla", "preset": "cpu-demo"}, '
        b'"versions": {"jax": "\\ud800"}}',
        headers=JSON,
    ),
    lookup("lookup-device_kind-nul", "device_kind", device_kind="tpu\x00v5"),
    Bad(
        "lookup-body-oversize",
        "POST",
        "/v1/lookup",
        413,
        "body",
        content=b'{"workload": "' + b"x" * MAX_BODY + b'"}',
        headers=JSON,
    ),
    Bad(
        "lookup-body-oversize-chunked",
        "POST",
        "/v1/lookup",
        413,
        "body",
        content=_chunked_oversize,
        headers=JSON,
    ),
    # ------------------------------------------------------------ lookup with enqueue (a write): auth
    Bad(
        "lookup-enqueue-no-token", "POST", "/v1/lookup", 401, "authorization", json={"workload": VALID, "enqueue": True}
    ),
    Bad(
        "lookup-enqueue-basic-auth",
        "POST",
        "/v1/lookup",
        401,
        "authorization",
        json={"workload": VALID, "enqueue": True},
        headers={"Authorization": "Basic d3JpdGVyOnB3"},
    ),
    Bad(
        "lookup-enqueue-unknown-token",
        "POST",
        "/v1/lookup",
        401,
        "authorization",
        json={"workload": VALID, "enqueue": True},
        headers={"Authorization": "Bearer tt_not-a-token"},
    ),
    Bad(
        "lookup-enqueue-worker-token",
        "POST",
        "/v1/lookup",
        403,
        "authorization",
        json={"workload": VALID, "enqueue": True},
        headers=WORKER,
    ),
    Bad(
        "lookup-enqueue-bad-workload",
        "POST",
        "/v1/lookup",
        422,
        "batch",
        json={"workload": workload_body(batch=0), "enqueue": True},
        headers=WRITER,
    ),
    # ------------------------------------------------------------ POST /v1/jobs (writer token)
    job("jobs-missing-workload", "workload", {"budget": 8}),
    job("jobs-batch-negative", "batch", {"workload": workload_body(batch=-1)}),
    job("jobs-frames-zero", "frames", {"workload": workload_body(pattern=_pattern(frames=0))}),
    job(
        "jobs-window-out-of-range",
        "window_frames",
        {"workload": workload_body(pattern=_pattern([{"kind": "spatial", "window_frames": 9}]))},
    ),
    job("jobs-seq_len-mismatch", "seq_len", {"workload": {**PRESET, "seq_len": 1}}),
    job("jobs-heads-mismatch", "heads", {"workload": workload_body(heads=1)}),
    job("jobs-preset-unknown", "preset", {"workload": {**PRESET, "preset": "sora"}}),
    job("jobs-pattern-and-preset", "preset", {"workload": workload_body(preset="cpu-demo")}),
    job("jobs-budget-zero", "budget", {"workload": VALID, "budget": 0}),
    job("jobs-budget-absurd", "budget", {"workload": VALID, "budget": 10**9}),
    job("jobs-budget-string", "budget", {"workload": VALID, "budget": "lots"}),
    job("jobs-priority-out-of-range", "priority", {"workload": VALID, "priority": 5000}),
    job("jobs-parallelism-zero", "parallelism", {"workload": VALID, "parallelism": 0}),
    job("jobs-parallelism-absurd", "parallelism", {"workload": VALID, "parallelism": 10**6}),
    job("jobs-parallelism-float", "parallelism", {"workload": VALID, "parallelism": 2.5}),
    job("jobs-unknown-field", "urgent", {"workload": VALID, "urgent": True}),
    job(
        "jobs-device_kind-nul",
        "device_kind",
        {"workload": workload_body(device_kind="cpu\x00")},
    ),
    job(
        "jobs-kernel_version-nul",
        "kernel_version",
        {"workload": {**PRESET, "kernel_version": "\x00"}},
    ),
    Bad(
        "jobs-body-malformed-json",
        "POST",
        "/v1/jobs",
        422,
        "body",
        content=b"{budget: 3}",
        headers={**JSON, **WRITER},
    ),
    Bad("jobs-body-empty", "POST", "/v1/jobs", 422, "body", content=b"", headers={**JSON, **WRITER}),
    Bad(
        "jobs-body-oversize",
        "POST",
        "/v1/jobs",
        413,
        "body",
        content=b"[" + b"1," * MAX_BODY + b"1]",
        headers={**JSON, **WRITER},
    ),
    Bad("jobs-no-token", "POST", "/v1/jobs", 401, "authorization", json={"workload": VALID}),
    Bad(
        "jobs-auth-not-bearer",
        "POST",
        "/v1/jobs",
        401,
        "authorization",
        json={"workload": VALID},
        headers={"Authorization": "Token abc"},
    ),
    Bad(
        "jobs-auth-bearer-empty",
        "POST",
        "/v1/jobs",
        401,
        "authorization",
        json={"workload": VALID},
        headers={"Authorization": "Bearer "},
    ),
    Bad(
        "jobs-auth-bearer-huge",
        "POST",
        "/v1/jobs",
        401,
        "authorization",
        json={"workload": VALID},
        headers={"Authorization": "Bearer " + "a" * 600},
    ),
    Bad(
        "jobs-auth-unknown-token",
        "POST",
        "/v1/jobs",
        401,
        "authorization",
        json={"workload": VALID},
        headers={"Authorization": "Bearer tt_unknown"},
    ),
    Bad("jobs-auth-worker-role", "POST", "/v1/jobs", 403, "authorization", json={"workload": VALID}, headers=WORKER),
    # ------------------------------------------------------------ GET /v1/configs: pagination and filters
    get("configs-limit-zero", "/v1/configs?limit=0", "limit"),
    get("configs-limit-negative", "/v1/configs?limit=-1", "limit"),
    get("configs-limit-over-max", "/v1/configs?limit=501", "limit"),
    get("configs-limit-huge", "/v1/configs?limit=99999999999999999999", "limit"),
    get("configs-limit-string", "/v1/configs?limit=abc", "limit"),
    get("configs-cursor-zero", "/v1/configs?cursor=0", "cursor"),
    get("configs-cursor-negative", "/v1/configs?cursor=-7", "cursor"),
    get("configs-cursor-string", "/v1/configs?cursor=next", "cursor"),
    get("configs-cursor-over-int64", f"/v1/configs?cursor={10**30}", "cursor"),
    get(
        "configs-cursor-over-int32",
        f"/v1/configs?cursor={2**31}",
        "cursor",
    ),
    get("configs-device_kind-too-long", "/v1/configs?device_kind=" + "x" * 65, "device_kind"),
    get("configs-backend-too-long", "/v1/configs?backend=" + "x" * 17, "backend"),
    get(
        "configs-device_kind-nul",
        "/v1/configs?device_kind=tpu%00",
        "device_kind",
    ),
    # ------------------------------------------------------------ GET /v1/configs/{key}
    get("config-key-unknown", f"/v1/configs/{MISSING_KEY}", "workload_key", status=404),
    get("config-key-malformed", "/v1/configs/not-a-key", "key"),
    get("config-key-uppercase", f"/v1/configs/{MISSING_KEY.upper()}", "key"),
    get("config-key-too-long", f"/v1/configs/{MISSING_KEY}0", "key"),
    # ------------------------------------------------------------ GET /v1/workloads/{key}/history
    get("history-key-unknown", f"/v1/workloads/{MISSING_KEY}/history", "workload_key", status=404),
    get("history-key-malformed", "/v1/workloads/xyz/history", "key"),
    get("history-status-unknown", f"/v1/workloads/{MISSING_KEY}/history?status=great", "status"),
    get("history-limit-zero", f"/v1/workloads/{MISSING_KEY}/history?limit=0", "limit"),
    # ------------------------------------------------------------ GET /v1/trials
    get("trials-workload_key-malformed", "/v1/trials?workload_key=abc", "workload_key"),
    get("trials-workload_key-unknown", f"/v1/trials?workload_key={MISSING_KEY}", "workload_key", status=404),
    get("trials-job_id-zero", "/v1/trials?job_id=0", "job_id"),
    get("trials-job_id-string", "/v1/trials?job_id=first", "job_id"),
    get("trials-job_id-huge", f"/v1/trials?job_id={10**30}", "job_id"),
    get("trials-status-unknown", "/v1/trials?status=great", "status"),
    get("trials-limit-over-max", "/v1/trials?limit=1000", "limit"),
    # ------------------------------------------------------------ GET /v1/jobs
    get("jobs-list-status-unknown", "/v1/jobs?status=paused", "status"),
    get("jobs-list-workload_key-malformed", "/v1/jobs?workload_key=ABC", "workload_key"),
    get("jobs-list-workload_key-unknown", f"/v1/jobs?workload_key={MISSING_KEY}", "workload_key", status=404),
    get("jobs-list-limit-negative", "/v1/jobs?limit=-1", "limit"),
    get("jobs-list-cursor-zero", "/v1/jobs?cursor=0", "cursor"),
    get("jobs-list-cursor-over-int64", f"/v1/jobs?cursor={2**63}", "cursor"),
    # ------------------------------------------------------------ GET /v1/jobs/{id}
    get("job-id-zero", "/v1/jobs/0", "job_id"),
    get("job-id-negative", "/v1/jobs/-1", "job_id"),
    get("job-id-huge", f"/v1/jobs/{10**20}", "job_id"),
    get("job-id-string", "/v1/jobs/latest", "job_id"),
    get("job-id-float", "/v1/jobs/1.5", "job_id"),
    get("job-id-nonexistent", "/v1/jobs/424242", "job_id", status=404),
    get("job-id-over-int32", f"/v1/jobs/{2**31}", "job_id"),
    # ------------------------------------------------------------ POST /v1/jobs/{id}/cancel (writer token)
    Bad("cancel-id-zero", "POST", "/v1/jobs/0/cancel", 422, "job_id", headers=WRITER),
    Bad("cancel-id-negative", "POST", "/v1/jobs/-5/cancel", 422, "job_id", headers=WRITER),
    Bad("cancel-id-huge", "POST", f"/v1/jobs/{2**64}/cancel", 422, "job_id", headers=WRITER),
    Bad("cancel-id-string", "POST", "/v1/jobs/all/cancel", 422, "job_id", headers=WRITER),
    Bad("cancel-id-nonexistent", "POST", "/v1/jobs/777/cancel", 404, "job_id", headers=WRITER),
    Bad(
        "cancel-id-over-int32",
        "POST",
        f"/v1/jobs/{2**31}/cancel",
        422,
        "job_id",
        headers=WRITER,
    ),
    Bad("cancel-no-token", "POST", "/v1/jobs/1/cancel", 401, "authorization"),
    Bad(
        "cancel-auth-malformed", "POST", "/v1/jobs/1/cancel", 401, "authorization", headers={"Authorization": "tt_abc"}
    ),
    Bad(
        "cancel-auth-unknown-token",
        "POST",
        "/v1/jobs/1/cancel",
        401,
        "authorization",
        headers={"Authorization": "Bearer tt_revoked-or-never-was"},
    ),
    Bad("cancel-auth-worker-role", "POST", "/v1/jobs/1/cancel", 403, "authorization", headers=WORKER),
]


@pytest.fixture
def api(settings: Settings, db: Database) -> Iterator[TestClient]:
    """A client that answers a server error with its 500 rather than raising it."""
    with TestClient(create_app(settings, db), raise_server_exceptions=False) as c:
        yield c


def test_table_shape() -> None:
    """The table is large enough, 4xx only, ids unique, and covers every endpoint."""
    assert len(ROWS) >= 35
    assert len({r.id for r in ROWS}) == len(ROWS)
    assert all(400 <= r.status < 500 and r.names for r in ROWS)
    covered = {(r.method, r.path.split("?")[0]) for r in ROWS}
    for method, prefix in [
        ("POST", "/v1/lookup"),
        ("POST", "/v1/jobs"),
        ("GET", "/v1/configs"),
        ("GET", "/v1/configs/"),
        ("GET", "/v1/workloads/"),
        ("GET", "/v1/trials"),
        ("GET", "/v1/jobs"),
        ("GET", "/v1/jobs/"),
        ("POST", "/v1/jobs/"),
    ]:
        assert any(m == method and p.startswith(prefix) for m, p in covered), (method, prefix)


@pytest.mark.parametrize("row", [pytest.param(r, id=r.id) for r in ROWS])
def test_bad_request_is_rejected(
    row: Bad, api: TestClient, db: Database, writer_token: str, worker_token: str, request: pytest.FixtureRequest
) -> None:
    """The expected 4xx, a JSON message naming the field, and no row written."""
    headers = {k: v.format(writer=writer_token, worker=worker_token) for k, v in row.headers.items()}
    kwargs: dict[str, Any] = {}
    if row.json is not NO_BODY:
        kwargs["json"] = row.json
    elif row.content is not None:
        kwargs["content"] = row.content() if callable(row.content) else row.content
    before = row_counts(db)

    response = api.request(row.method, row.path, headers=headers, **kwargs)

    assert response.status_code == row.status, response.text[:400]
    assert 400 <= response.status_code < 500
    assert response.headers["content-type"].startswith("application/json"), response.headers["content-type"]
    body = response.json()
    assert isinstance(body, dict) and isinstance(body.get("message"), str), body
    assert row.names in body["message"], f"message does not name {row.names!r}: {body['message']!r}"
    assert row_counts(db) == before
