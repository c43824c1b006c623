"""The library client against a real uvicorn server on loopback, and against servers that misbehave.

No test asserts a wall-clock time: a hanging server only has to give the
heuristic back well inside ten times the configured timeout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.server
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autotune.client as tt_client
from autotune.client import (
    CircuitBreaker,
    ClientConfigError,
    ClientSettings,
    ConfigMissError,
    TileClient,
)
from autotune.versions import software_versions
from kernel import attention
from kernel.attention import sparse_attention
from kernel.config import TileConfig
from kernel.heuristic import heuristic_config
from kernel.layout import VideoLayout
from kernel.pattern import HeadPattern, SparsityPattern
from kernel.reference import reference_attention
from kernel.workload import Workload
from server.bench.client import hanging_server
from server.bench.service import APP_TARGET, serving
from server.store import models, queue, records, tokens, workloads
from server.store.db import Database
from server.store.migrate import upgrade
from tests.serving import free_port

PATTERN = SparsityPattern.grouped(
    VideoLayout(4, 64), [(HeadPattern.spatial(1), 1), (HeadPattern.temporal(4), 1)]
)  # seq 256, 2 heads
SHAPE = (1, 2, 256, 32)
# Differs from the heuristic (compact 128x128 temporal_major by_pattern) in every field.
TUNED = TileConfig("split", 64, 32, 0, "frame_major", "frame", "all")
OTHER = TileConfig("naive", 32, 64, 0, "temporal_major", "none", "by_pattern")
HEURISTIC = heuristic_config(PATTERN, "xla", "float32")


def workload(pattern: SparsityPattern = PATTERN, shape: tuple[int, ...] = SHAPE) -> Workload:
    return TileClient.workload(pattern, shape, "xla", "float32")


def pattern_with(frames: int) -> SparsityPattern:
    return SparsityPattern.grouped(VideoLayout(frames, 64), [(HeadPattern.spatial(1), 1), (HeadPattern.temporal(4), 1)])


@dataclasses.dataclass
class Served:
    base_url: str
    db: Database

    def publish(self, wl: Workload, config: TileConfig, versions: dict[str, Any] | None = None) -> int:
        with self.db.transaction() as session:
            row = workloads.workload_row(session, wl)
            tuned = records.publish_tuned_config(
                session, row, config.to_dict(), median_ms=1.0, versions=versions or software_versions(wl.backend)
            )
            return tuned.id

    def lookups(self) -> int:
        """POST /v1/lookup requests the server answered so far (from its Prometheus metrics)."""
        text = httpx.get(self.base_url + "/metrics", timeout=10).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith("tiletune_http_requests_total{") and 'route="/v1/lookup"' in line:
                total += float(line.rsplit(" ", 1)[1])
        return int(total)

    def jobs(self) -> list[dict[str, Any]]:
        return list(httpx.get(self.base_url + "/v1/jobs", timeout=10).json()["items"])

    def writer_token(self, name: str = "client-test") -> str:
        with self.db.transaction() as session:
            return tokens.create_token(session, name, "writer")


@pytest.fixture(scope="module")
def served_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    url = f"sqlite:///{tmp_path_factory.mktemp('client-db') / 'client.db'}"
    upgrade(url)
    db = Database(url)
    with serving(APP_TARGET, workers=1, database_url=url, name="tiletune") as server:
        yield Served(server.base_url, db)
    db.dispose()


@pytest.fixture
def served(served_module: Served) -> Served:
    served_module.db.empty_tables()
    return served_module


@pytest.fixture
def make_client(tmp_path: Path) -> Iterator[Any]:
    made: list[TileClient] = []

    def make(**options: Any) -> TileClient:
        options.setdefault("cache_dir", tmp_path / "cache")
        options.setdefault("timeout_s", 10.0)
        client = TileClient(**options)
        made.append(client)
        return client

    yield make
    for c in made:
        c.close()


@pytest.fixture(autouse=True)
def _no_resolver() -> Iterator[None]:
    yield
    tt_client.uninstall()


class Stub:
    """A loopback HTTP server answering every request with ``status`` and ``body``, counting requests."""

    def __init__(self, status: int = 500, body: bytes = b'{"message": "boom"}') -> None:
        self.status, self.body, self.requests = status, body, 0
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                self.do_GET()

            def do_GET(self) -> None:
                stub.requests += 1
                self.send_response(stub.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(stub.body)))
                self.end_headers()
                self.wfile.write(stub.body)

            def log_message(self, *_args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@contextlib.contextmanager
def stub_server(status: int = 500, body: bytes = b'{"message": "boom"}') -> Iterator[Stub]:
    stub = Stub(status, body)
    try:
        yield stub
    finally:
        stub.close()


# ---------------------------------------------------------------- imports and settings


def test_import_is_light() -> None:
    heavy = ("sqlalchemy", "fastapi", "optuna", "uvicorn", "starlette", "alembic")
    code = f"import sys, autotune.client\nprint([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_settings_from_env_name_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "TILETUNE_SERVER_URL": "http://127.0.0.1:9/",
        "TILETUNE_TOKEN": "tt_x",
        "TILETUNE_CLIENT_TIMEOUT": "0.5",
        "TILETUNE_CACHE_DIR": str(tmp_path),
        "TILETUNE_MISS_POLICY": "wait",
        "TILETUNE_SNAPSHOT": "12",
        "TILETUNE_ENQUEUE": "false",
    }
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    s = ClientSettings.from_env()
    assert (s.server_url, s.token, s.timeout_s, s.cache_dir) == ("http://127.0.0.1:9", "tt_x", 0.5, tmp_path)
    assert (s.miss_policy, s.snapshot, s.enqueue) == ("wait", 12, False)
    assert ClientSettings.from_env(timeout_s=3.0).timeout_s == 3.0  # options win over variables
    assert ClientSettings().server_url is None  # a client built from options reads no variable
    monkeypatch.setenv("TILETUNE_CACHE_DIR", "none")
    assert ClientSettings.from_env().cache_dir is None
    for var, value in [
        ("TILETUNE_CLIENT_TIMEOUT", "soon"),
        ("TILETUNE_CLIENT_TIMEOUT", "-1"),
        ("TILETUNE_CLIENT_TIMEOUT", "inf"),
        ("TILETUNE_MISS_POLICY", "pray"),
        ("TILETUNE_SNAPSHOT", "latest"),
        ("TILETUNE_SERVER_URL", "127.0.0.1:8000"),
        ("TILETUNE_ENQUEUE", "maybe"),
    ]:
        with monkeypatch.context() as m:
            m.setenv(var, value)
            with pytest.raises(ClientConfigError, match=var):
                ClientSettings.from_env()
    with pytest.raises(ClientConfigError, match="miss_policy"):
        TileClient(miss_policy="sometimes")
    with pytest.raises(ClientConfigError, match="retries"):
        TileClient(retries=True)


# ---------------------------------------------------------------- the server path


def test_hit_then_memory_then_disk(served: Served, make_client: Any) -> None:
    config_id = served.publish(workload(), TUNED)
    before = served.lookups()
    client = make_client(server_url=served.base_url)
    assert client.resolve(PATTERN, SHAPE, "xla", "float32") == TUNED
    assert client.resolve(PATTERN, SHAPE, "xla", "float32") == TUNED  # memory
    answer = client.lookup(workload())
    assert (answer.source, answer.origin, answer.config_id, answer.snapshot) == (
        "tuned",
        "server",
        config_id,
        config_id,
    )
    assert client.last_snapshot == config_id
    equal_pattern = pattern_with(4)  # another object, the same workload: no second lookup
    assert equal_pattern is not PATTERN and client.resolve(equal_pattern, SHAPE, "xla", "float32") == TUNED
    assert served.lookups() - before == 1 and client.stats["requests"] == 1

    other_process = make_client(server_url=served.base_url)  # same cache directory
    assert other_process.resolve(PATTERN, SHAPE, "xla", "float32") == TUNED
    assert other_process.lookup(workload()).origin == "disk"
    assert served.lookups() - before == 1 and "requests" not in other_process.stats


def test_miss_with_enqueue_queues_a_job(served: Served, make_client: Any) -> None:
    anonymous = make_client(server_url=served.base_url, cache_dir=None)
    answer = anonymous.lookup(workload())
    assert answer.source == "heuristic" and answer.config == HEURISTIC and answer.job_id is None
    assert served.jobs() == []  # no token: only a look-up

    writer = make_client(server_url=served.base_url, token=served.writer_token())
    answer = writer.lookup(workload())
    assert answer.source == "heuristic" and answer.config == HEURISTIC and answer.job_id is not None
    jobs = served.jobs()
    assert [(j["id"], j["status"], j["workload_key"]) for j in jobs] == [(answer.job_id, "queued", workload().key)]


def test_a_token_that_may_not_queue_only_looks_up(served: Served, make_client: Any) -> None:
    with served.db.transaction() as session:
        token = tokens.create_token(session, "a-worker", "worker")
    client = make_client(server_url=served.base_url, token=token)
    answer = client.lookup(workload())
    assert answer.source == "heuristic" and answer.origin == "server" and served.jobs() == []


def test_server_down_gives_the_heuristic(make_client: Any) -> None:
    client = make_client(server_url=f"http://127.0.0.1:{free_port()}", timeout_s=2.0)
    assert client.resolve(PATTERN, SHAPE, "xla", "float32") == HEURISTIC
    answer = client.lookup(workload())
    assert answer.source == "fallback" and answer.origin == "local" and "ConnectError" in (answer.detail or "")
    assert client.stats["requests"] == 3  # first try + 2 retries
    assert client.resolve(PATTERN, SHAPE, "xla", "float32") == HEURISTIC  # remembered until the cool-down
    assert client.stats["requests"] == 3 and client.stats["slow_resolves"] == 1
    assert not list((client.settings.cache_dir).glob("*.json"))  # a fallback is never written to disk


def test_hanging_server_honours_the_timeout(make_client: Any) -> None:
    timeout = 0.5
    with hanging_server() as url:
        client = make_client(server_url=url, timeout_s=timeout)
        start = time.monotonic()
        config = client.resolve(PATTERN, SHAPE, "xla", "float32")
        elapsed = time.monotonic() - start
    assert config == HEURISTIC
    assert elapsed < 10 * timeout, elapsed  # bounded by the timeout, not by the server
    assert client.lookup(workload()).source == "fallback"


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (500, b'{"message": "boom"}'),
        (503, b"<html>bad gateway</html>"),
        (200, b"{not json"),
        (200, b'["a", "list"]'),
        (200, b'{"source": "tuned", "config": {"block_q": "big"}}'),
    ],
    ids=["500", "503-html", "malformed-json", "json-list", "bad-config"],
)
def test_server_errors_give_the_heuristic(make_client: Any, status: int, body: bytes) -> None:
    with stub_server(status, body) as stub:
        client = make_client(server_url=stub.url, timeout_s=5.0)
        assert client.resolve(PATTERN, SHAPE, "xla", "float32") == HEURISTIC
        assert 1 <= stub.requests <= 3
    assert client.lookup(workload()).source == "fallback"


def test_corrupt_disk_cache_is_ignored_and_replaced(served: Served, make_client: Any) -> None:
    served.publish(workload(), TUNED)
    first = make_client(server_url=served.base_url)
    assert first.resolve(PATTERN, SHAPE, "xla", "float32") == TUNED
    (entry,) = first.settings.cache_dir.glob("*.json")
    good = entry.read_bytes()
    for junk in [
        b"",
        good[: len(good) // 2],
        b"\xff\xfe\x00",
        b"[1, 2]",
        b'{"format": 1}',
        good.replace(b"64", b'"x"'),
    ]:
        entry.write_bytes(junk)
        client = make_client(server_url=served.base_url)
        assert client.resolve(PATTERN, SHAPE, "xla", "float32") == TUNED
        assert client.lookup(workload()).origin == "server"
        assert json.loads(entry.read_bytes())["config"] == TUNED.to_dict()  # rewritten whole


def test_what_is_cached_on_disk_and_for_how_long(served: Served, make_client: Any) -> None:
    served.publish(workload(), TUNED)
    client = make_client(server_url=served.base_url, cache_ttl_s=1000.0, miss_ttl_s=10.0)
    client.lookup(workload())
    client.lookup(workload(pattern_with(5)))  # nearest
    client.lookup(workload(shape=(1, 2, 256, 16)))  # head_dim 16: another workload, nearest too
    entries = {
        json.loads(p.read_bytes())["source"]: json.loads(p.read_bytes()) for p in client.disk.directory.glob("*")
    }
    assert set(entries) == {"tuned", "nearest"}
    now = time.time()
    assert 900 < entries["tuned"]["expires_at"] - now <= 1000
    assert 0 < entries["nearest"]["expires_at"] - now <= 10

    # An expired entry is not used while the server answers, but it is better than the heuristic when it does not.
    (tuned_file,) = [p for p in client.disk.directory.glob("*") if json.loads(p.read_bytes())["source"] == "tuned"]
    data = json.loads(tuned_file.read_bytes())
    tuned_file.write_text(json.dumps({**data, "expires_at": now - 1, "config": OTHER.to_dict()}))
    assert make_client(server_url=served.base_url).lookup(workload()).config == TUNED
    tuned_file.write_text(json.dumps({**data, "expires_at": now - 1, "config": OTHER.to_dict()}))
    offline = make_client(server_url=f"http://127.0.0.1:{free_port()}", timeout_s=1.0)
    # another server URL is another cache key: nothing cached for it
    assert offline.lookup(workload()).source == "fallback"
    offline_same = make_client(server_url=served.base_url)
    for _ in range(3):  # open the breaker: the server is not asked
        offline_same.breaker.failure()
    answer = offline_same.lookup(workload())
    assert (answer.config, answer.origin) == (OTHER, "disk-expired")


# ---------------------------------------------------------------- concurrency


def test_many_threads_one_lookup(served: Served, make_client: Any) -> None:
    served.publish(workload(), TUNED)
    before = served.lookups()
    client = make_client(server_url=served.base_url)
    barrier = threading.Barrier(16)
    results: list[Any] = []

    def run() -> None:
        barrier.wait()
        results.append(client.resolve(pattern_with(4), SHAPE, "xla", "float32"))

    threads = [threading.Thread(target=run) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [TUNED] * 16
    assert served.lookups() - before == 1


PROCESS_SCRIPT = """
import json, sys, threading
from autotune.client import TileClient
from kernel.layout import VideoLayout
from kernel.pattern import HeadPattern, SparsityPattern
client = TileClient(server_url=sys.argv[1], cache_dir=sys.argv[2], timeout_s=30.0)
barrier = threading.Barrier(8)
out = {}
def run(i):
    barrier.wait()
    for frames in (4, 5, 6, 7):
        pattern = SparsityPattern.grouped(
            VideoLayout(frames, 64), [(HeadPattern.spatial(1), 1), (HeadPattern.temporal(4), 1)]
        )
        config = client.resolve(pattern, (1, 2, frames * 64, 32), "xla", "float32")
        out[(i, frames)] = config.to_dict()
threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps({str(frames): [out[(i, frames)] for i in range(8)] for frames in (4, 5, 6, 7)}))
"""


def test_two_processes_share_the_disk_cache(served: Served, tmp_path: Path) -> None:
    served.publish(workload(pattern_with(4), (1, 2, 256, 32)), TUNED)
    served.publish(workload(pattern_with(6), (1, 2, 384, 32)), OTHER)
    cache = tmp_path / "shared"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PROCESS_SCRIPT, served.base_url, str(cache)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        outputs.append(json.loads(out))
    assert outputs[0] == outputs[1]
    for frames, configs in outputs[0].items():
        assert all(c == configs[0] for c in configs), frames
    assert outputs[0]["4"][0] == TUNED.to_dict() and outputs[0]["6"][0] == OTHER.to_dict()
    entries = list(cache.glob("*.json"))
    assert len(entries) == 4 and not list(cache.glob(".tmp-*"))
    for entry in entries:
        json.loads(entry.read_bytes())  # every file whole


# ---------------------------------------------------------------- snapshots


def test_pinned_snapshot_keeps_its_configs(served: Served, make_client: Any, tmp_path: Path) -> None:
    served.publish(workload(), TUNED)
    first = make_client(server_url=served.base_url, cache_dir=tmp_path / "first")
    assert first.resolve(PATTERN, SHAPE, "xla", "float32") == TUNED
    snapshot = first.last_snapshot
    assert snapshot is not None

    newer_id = served.publish(workload(), OTHER)  # a better config lands
    assert newer_id > snapshot
    pinned = make_client(server_url=served.base_url, cache_dir=tmp_path / "pinned", snapshot=snapshot)
    assert pinned.resolve(PATTERN, SHAPE, "xla", "float32") == TUNED
    assert pinned.lookup(workload()).snapshot == snapshot
    unpinned = make_client(server_url=served.base_url, cache_dir=tmp_path / "unpinned")
    assert unpinned.resolve(PATTERN, SHAPE, "xla", "float32") == OTHER
    # A pinned answer never changes: kept as long as a tuned one, whatever its source (expiry is mandatory).
    (entry,) = (tmp_path / "pinned").glob("*.json")
    expires_in = json.loads(entry.read_bytes())["expires_at"] - time.time()
    assert pinned.settings.cache_ttl_s - 60 < expires_in <= pinned.settings.cache_ttl_s
    again = make_client(server_url=served.base_url, cache_dir=tmp_path / "pinned", snapshot=snapshot)
    assert again.resolve(PATTERN, SHAPE, "xla", "float32") == TUNED and again.lookup(workload()).origin == "disk"


def test_a_snapshot_the_server_has_not_reached_is_rejected(served: Served, make_client: Any) -> None:
    client = make_client(server_url=served.base_url, snapshot=10**6)
    answer = client.lookup(workload())
    assert answer.source == "fallback" and "snapshot" in (answer.detail or "")
    strict = make_client(server_url=served.base_url, snapshot=10**6, miss_policy="error")
    with pytest.raises(ConfigMissError, match="snapshot"):
        strict.lookup(workload())


# ---------------------------------------------------------------- the kernel plug-in


def test_jitted_step_makes_one_lookup_and_uses_the_tuned_config(
    served: Served, make_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    served.publish(workload(), TUNED)
    client = tt_client.install(make_client(server_url=served.base_url))
    calls: list[tuple[int, ...]] = []
    resolve = client.resolve

    def counting(pattern: SparsityPattern, shape: tuple[int, ...], backend: str, dtype: str) -> Any:
        calls.append(shape)
        return resolve(pattern, shape, backend, dtype)

    attention.set_config_resolver(counting)
    used: list[TileConfig] = []
    prepare = attention.prepare_group

    def spy(pattern: SparsityPattern, heads: list[int], config: TileConfig) -> Any:
        used.append(config)
        return prepare(pattern, heads, config)

    monkeypatch.setattr(attention, "prepare_group", spy)
    before = served.lookups()

    @jax.jit
    def step(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        h = sparse_attention(q, k, v, PATTERN)
        return sparse_attention(h, k, v, PATTERN)

    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal(SHAPE), jnp.float32) for _ in range(3))
    out = step(q, k, v)
    out2 = step(q * 0.5, k, v)
    assert served.lookups() - before == 1  # one lookup for two calls and two steps
    assert calls == [SHAPE, SHAPE]  # resolved while tracing only
    assert used and all(c == TUNED for c in used)  # TUNED groups all heads: one kernel call per attention
    h = reference_attention(q, k, v, PATTERN)
    np.testing.assert_allclose(np.asarray(out), reference_attention(h, k, v, PATTERN), atol=2e-5, rtol=0)
    h2 = reference_attention(q * 0.5, k, v, PATTERN)
    np.testing.assert_allclose(np.asarray(out2), reference_attention(h2, k, v, PATTERN), atol=2e-5, rtol=0)


def test_install_from_environment(served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    served.publish(workload(), TUNED)
    monkeypatch.setenv("TILETUNE_SERVER_URL", served.base_url)
    monkeypatch.setenv("TILETUNE_CACHE_DIR", str(tmp_path / "env-cache"))
    client = tt_client.install()
    assert tt_client.installed() is client
    assert attention._resolver is not None
    assert attention._resolver(PATTERN, SHAPE, "xla", "float32") == TUNED
    tt_client.uninstall()
    assert attention._resolver is None and tt_client.installed() is None


def test_without_a_server_the_heuristic_is_final() -> None:
    client = TileClient(cache_dir=None)
    for _ in range(3):
        assert client.resolve(PATTERN, SHAPE, "xla", "float32") == HEURISTIC
    assert client.resolve(PATTERN, SHAPE, "xla", "float16") is None  # not a service workload: the kernel's heuristic
    assert client.resolve(PATTERN, SHAPE, "xla", "float16") is None
    assert client.stats["slow_resolves"] == 2


# ---------------------------------------------------------------- the circuit breaker


def test_breaker_stops_calling_a_failing_server_then_probes_it(make_client: Any) -> None:
    now = [0.0]
    with stub_server(500) as stub:
        client = TileClient(
            server_url=stub.url, cache_dir=None, retries=0, breaker_failures=3, breaker_cooldown_s=30.0,
            clock=lambda: now[0],
        )  # fmt: skip
        for frames in (4, 5, 6):
            assert client.lookup(workload(pattern_with(frames))).source == "fallback"
        assert stub.requests == 3 and client.breaker.state == "open"
        for frames in (7, 8, 9):  # open: no call goes to the server
            assert client.lookup(workload(pattern_with(frames))).source == "fallback"
        assert stub.requests == 3 and client.stats["breaker_rejections"] == 3

        now[0] += 31.0  # cool-down over: one probe; it fails, the breaker opens again
        assert client.lookup(workload(pattern_with(10))).source == "fallback"
        assert client.lookup(workload(pattern_with(11))).source == "fallback"
        assert stub.requests == 4 and client.breaker.state == "open"

        stub.status, stub.body = 200, json.dumps(
            {"workload_key": workload(pattern_with(12)).key, "source": "tuned", "config": TUNED.to_dict(),
             "config_id": 1, "snapshot": 1}
        ).encode()  # fmt: skip
        now[0] += 31.0  # the probe succeeds: closed again
        assert client.lookup(workload(pattern_with(12))).config == TUNED
        assert stub.requests == 5 and client.breaker.state == "closed"
        # An answer for another workload is malformed: a fallback, asked again only after the cool-down.
        assert client.lookup(workload(pattern_with(13))).source == "fallback" and stub.requests == 6
        assert client.lookup(workload(pattern_with(13))).source == "fallback" and stub.requests == 6
        now[0] += 31.0
        client.lookup(workload(pattern_with(13)))
        assert stub.requests == 7


def test_breaker_half_open_lets_one_probe_through() -> None:
    now = [0.0]
    breaker = CircuitBreaker(2, 10.0, clock=lambda: now[0])
    breaker.failure()
    assert breaker.allow() and breaker.state == "closed"
    breaker.failure()
    assert not breaker.allow() and breaker.state == "open" and breaker.opened == 1
    now[0] = 10.5
    assert breaker.state == "half-open"
    assert breaker.allow() and not breaker.allow()  # one probe at a time
    breaker.success()
    assert breaker.state == "closed" and breaker.allow()


# ---------------------------------------------------------------- miss policies


def test_error_policy_raises_on_a_miss(served: Served, make_client: Any) -> None:
    client = make_client(server_url=served.base_url, miss_policy="error")
    with pytest.raises(
        ConfigMissError,
        match=r"no tuned config for workload .*answered 'heuristic'.*TILETUNE_MISS_POLICY=error.*TILETUNE_TOKEN",
    ):
        client.resolve(PATTERN, SHAPE, "xla", "float32")
    served.publish(workload(), TUNED)
    assert client.resolve(PATTERN, SHAPE, "xla", "float32") == TUNED  # a failed resolution is not remembered
    served.publish(workload(pattern_with(5)), OTHER, versions={"jax": "0.0.1", "jaxlib": "0.0.1"})
    assert client.lookup(workload(pattern_with(5))).source == "stale"  # tuned, with other versions: accepted
    down = make_client(server_url=f"http://127.0.0.1:{free_port()}", miss_policy="error", cache_dir=None)
    with pytest.raises(ConfigMissError, match="nothing usable is cached"):
        down.lookup(workload())


def _worker(served: Served, config: TileConfig, stop: threading.Event) -> threading.Thread:
    """Claims the first queued job, publishes ``config`` as its result and finishes it."""

    def run() -> None:
        while not stop.is_set():
            with served.db.transaction() as session:
                job = queue.claim_job(session, "test-worker", device_kind="cpu", backend="xla")
                if job is not None:
                    row = session.get(models.Workload, job.workload_id)
                    assert row is not None
                    versions = software_versions(row.backend)
                    records.publish_tuned_config(session, row, config.to_dict(), median_ms=1.0, versions=versions)
                    queue.finish_job(session, job.id, "test-worker", "done")
                    return
            time.sleep(0.05)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_wait_policy_waits_for_the_job(served: Served, make_client: Any) -> None:
    stop = threading.Event()
    worker = _worker(served, TUNED, stop)
    client = make_client(
        server_url=served.base_url, token=served.writer_token(), miss_policy="wait", wait_timeout_s=60, wait_poll_s=0.2
    )
    try:
        answer = client.lookup(workload())
    finally:
        stop.set()
        worker.join()
    assert (answer.source, answer.config) == ("tuned", TUNED)
    assert client.stats["job_polls"] >= 1
    assert [j["status"] for j in served.jobs()] == ["done"]


def test_wait_policy_times_out_to_its_fallback(served: Served, make_client: Any) -> None:
    token = served.writer_token()
    lenient = make_client(server_url=served.base_url, token=token, miss_policy="wait", wait_timeout_s=0.5)
    answer = lenient.lookup(workload())
    assert answer.source == "heuristic" and answer.config == HEURISTIC and "still running" in (answer.detail or "")
    strict = make_client(
        server_url=served.base_url, token=token, miss_policy="wait", wait_timeout_s=0.3, wait_fallback="error",
        cache_dir=None,
    )  # fmt: skip
    with pytest.raises(ConfigMissError, match="after waiting for its tuning job"):
        strict.lookup(workload(pattern_with(5)))
    no_token = make_client(server_url=served.base_url, miss_policy="wait", wait_fallback="error", cache_dir=None)
    with pytest.raises(ConfigMissError, match="TILETUNE_TOKEN"):
        no_token.lookup(workload(pattern_with(6)))
