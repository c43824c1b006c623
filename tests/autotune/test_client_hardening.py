"""The client against everything a server or a disk can say (issue 14: no answer can take a model down).

Nothing the server or the disk says may raise out of ``TileClient.resolve`` (except the
documented ``ConfigMissError``), block it past its deadline, or hand the kernel a config
it cannot use. Servers that misbehave at the socket level are real loopback servers;
answers and cache files are generated (hypothesis) and served through an
``httpx.MockTransport``. As in test_client.py, no test asserts a wall-clock time: a
resolution only has to end well inside ten times its timeout, where the colleague's
reproductions took 10 to 30 times it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import autotune.client as tt_client
from autotune.client import ConfigMissError, TileClient
from autotune.client.answer import CACHE_FORMAT, MAX_ID, SERVER_SOURCES, Answer, cache_entry
from kernel import candidates
from kernel.attention import sparse_attention
from kernel.config import MAX_BLOCK, TileConfig, max_tile
from kernel.heuristic import heuristic_config
from kernel.layout import VideoLayout
from kernel.pattern import HeadPattern, SparsityPattern
from kernel.reference import reference_attention
from kernel.workload import BACKENDS, DTYPES, Workload
from tests.kernel.strategies import patterns

PATTERN = SparsityPattern.grouped(
    VideoLayout(4, 64), [(HeadPattern.spatial(1), 1), (HeadPattern.temporal(4), 1)]
)  # seq 256, 2 heads
SHAPE = (1, 2, 256, 32)
TUNED = TileConfig("split", 64, 32, 0, "frame_major", "frame", "all")
OTHER = TileConfig("naive", 32, 64, 0, "temporal_major", "none", "by_pattern")
HEURISTIC = heuristic_config(PATTERN, "xla", "float32")
URL = "http://tiletune.test"
TIMEOUT = 1.0
SLOW = 10 * TIMEOUT  # "well inside ten times the timeout"
GIVEN = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def workload(backend: str = "xla", dtype: str = "float32") -> Workload:
    return TileClient.workload(PATTERN, SHAPE, backend, dtype)


WL = workload()


def lookup_answer(config: TileConfig = TUNED, wl: Workload = WL, **fields: Any) -> dict[str, Any]:
    """A well-formed answer of POST /v1/lookup."""
    answer = {"workload_key": wl.key, "source": "tuned", "config": config.to_dict(), "config_id": 3, "snapshot": 5}
    return {**answer, "job_id": None, "timing": {"median_ms": 1.0}, **fields}


def answering(body: bytes | dict[str, Any], status: int = 200) -> Callable[[httpx.Request], httpx.Response]:
    raw = json.dumps(body).encode() if isinstance(body, dict) else body
    return lambda _request: httpx.Response(status, content=raw)


def mock_client(handler: Callable[[httpx.Request], httpx.Response], **options: Any) -> TileClient:
    """A client whose server is ``handler`` (no retries, no disk cache unless given)."""
    options.setdefault("cache_dir", None)
    options.setdefault("retries", 0)
    options.setdefault("timeout_s", 5.0)
    return TileClient(server_url=URL, transport=httpx.MockTransport(handler), **options)


@pytest.fixture(autouse=True)
def _no_resolver() -> Iterator[None]:
    yield
    tt_client.uninstall()


def usable(config: TileConfig | None, wl: Workload = WL) -> bool:
    assert config is not None
    try:
        config.check_usable(wl.pattern.seq_len, wl.backend, wl.dtype)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------- servers that misbehave on the socket


class SocketServer:
    """A loopback server that reads each request's head and body, then runs ``behaviour(conn, stop)``.

    ``hung_up`` counts connections whose client closed them while the behaviour was still sending."""

    def __init__(self, behaviour: Callable[[socket.socket, threading.Event], None]) -> None:
        self.behaviour = behaviour
        self.stop = threading.Event()
        self.hung_up = 0
        self.handlers: list[threading.Thread] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                conn, _ = self.sock.accept()
                handler = threading.Thread(target=self._serve, args=(conn,), daemon=True)
                self.handlers.append(handler)
                handler.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5.0)
            try:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                fields = dict(line.lower().partition(b":")[::2] for line in head.split(b"\r\n")[1:])
                length = int(fields.get(b"content-length", b"0"))
                while len(body) < length:
                    body += conn.recv(65536)
                self.behaviour(conn, self.stop)
            except (BrokenPipeError, ConnectionResetError):
                self.hung_up += 1
            except OSError:
                pass

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        for handler in self.handlers:
            handler.join(30)
        self.sock.close()


@contextlib.contextmanager
def socket_server(behaviour: Callable[[socket.socket, threading.Event], None]) -> Iterator[SocketServer]:
    server = SocketServer(behaviour)
    try:
        yield server
    finally:
        server.close()


def send_slowly(conn: socket.socket, stop: threading.Event, data: bytes, interval: float) -> None:
    for i in range(len(data)):
        if stop.wait(interval):
            return
        conn.sendall(data[i : i + 1])


def headers(length: int) -> bytes:
    """Response headers of a body of ``length`` bytes (one request per connection: the server closes it)."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
    return head + b"content-length: %d\r\n\r\n" % length


TRICKLED_BODY = json.dumps(lookup_answer()).encode()[:60]  # 60 bytes at 0.5 s: 30 s


def trickle_body(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(headers(len(TRICKLED_BODY)))
    send_slowly(conn, stop, TRICKLED_BODY, 0.5)


def trickle_headers(conn: socket.socket, stop: threading.Event) -> None:
    send_slowly(conn, stop, b"HTTP/1.1 200 OK\r\nx-padding: " + b"a" * 100 + b"\r\n" + headers(2)[17:] + b"{}", 0.25)


def stall_after_headers(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(headers(100))
    stop.wait(60)


def endless_chunked_body(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
    chunk = b"[" * 4096
    while not stop.wait(0.01):
        conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))


def oversized_body(conn: socket.socket, stop: threading.Event) -> None:
    body = b" " * (8 << 20) + b"{}"
    conn.sendall(headers(len(body)) + body)


@pytest.mark.parametrize(
    "behaviour",
    [trickle_body, trickle_headers, stall_after_headers, endless_chunked_body, oversized_body],
    ids=lambda f: f.__name__,
)
def test_a_misbehaving_server_costs_at_most_the_timeout(behaviour: Any) -> None:
    with socket_server(behaviour) as server:
        client = TileClient(server_url=server.url, cache_dir=None, timeout_s=TIMEOUT)
        start = time.monotonic()
        config = client.resolve(PATTERN, SHAPE, "xla", "float32")
        elapsed = time.monotonic() - start
        answer = client.lookup(WL)
        client.close()
    assert config == HEURISTIC and answer.source == "fallback", answer
    assert elapsed < SLOW, elapsed


def test_a_trickling_answer_is_abandoned_and_its_connection_closed() -> None:
    """The reproduction: headers, then one byte every 0.5 s. The client gives up at its deadline,
    and the request it abandoned stops reading too: the server sees the connection closed
    before it has sent its whole body, instead of a reader that stays until the end."""
    with (
        socket_server(trickle_body) as server,
        TileClient(server_url=server.url, cache_dir=None, timeout_s=TIMEOUT) as client,
    ):
        start = time.monotonic()
        assert client.resolve(PATTERN, SHAPE, "xla", "float32") == HEURISTIC
        elapsed = time.monotonic() - start
        assert "deadline" in (client.lookup(WL).detail or "")
        for handler in server.handlers:  # the client is still open: its request stops reading by itself
            handler.join(SLOW)  # the server's sends fail as soon as the connection is closed
        assert server.hung_up == len(server.handlers) >= 1
    assert elapsed < SLOW, elapsed


def test_a_hanging_name_lookup_costs_at_most_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """httpx's connect timeout does not cover DNS: a resolver that hangs must not hold the caller."""
    release = threading.Event()
    getaddrinfo = socket.getaddrinfo

    def hanging(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "tiletune.hanging-dns.test":
            release.wait(30)
            raise socket.gaierror("released")
        return getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", hanging)
    try:
        client = TileClient(server_url="http://tiletune.hanging-dns.test:8000", cache_dir=None, timeout_s=TIMEOUT)
        start = time.monotonic()
        config = client.resolve(PATTERN, SHAPE, "xla", "float32")
        elapsed = time.monotonic() - start
    finally:
        release.set()
    assert config == HEURISTIC and elapsed < SLOW, elapsed


def test_one_deadline_covers_the_lookup_asked_again_without_enqueue() -> None:
    """A token that may not queue jobs is refused (403) and the lookup is asked again without
    ``enqueue``: both requests share the resolution's one deadline. Each answer here takes 0.7 of
    the timeout, so the second one can only come after the deadline."""
    seen: list[bool] = []

    def slow(request: httpx.Request) -> httpx.Response:
        time.sleep(0.7 * TIMEOUT)
        seen.append(bool(json.loads(request.content).get("enqueue")))
        if seen[-1]:
            return httpx.Response(403, json={"message": "authorization: role 'worker' may not queue jobs"})
        return httpx.Response(200, json=lookup_answer())

    client = mock_client(slow, token="tt_worker", timeout_s=TIMEOUT)
    answer = client.lookup(WL)
    assert seen[0] is True and answer.source == "fallback" and "deadline" in (answer.detail or ""), answer
    assert mock_client(slow, token="tt_worker", timeout_s=3 * TIMEOUT).lookup(WL).config == TUNED  # given the time


def test_each_poll_of_the_wait_policy_ends_by_the_wait() -> None:
    """Under ``wait`` the job's status is polled until ``wait_timeout_s``: a poll answered by a trickle
    is abandoned by the end of the wait (here shorter than the timeout), and the server's untuned
    answer is used as ``TILETUNE_WAIT_FALLBACK=heuristic`` says."""
    miss = json.dumps(lookup_answer(HEURISTIC, source="heuristic", config_id=None, job_id=7)).encode()
    connections: list[socket.socket] = []

    def lookup_then_trickle(conn: socket.socket, stop: threading.Event) -> None:
        connections.append(conn)
        if len(connections) == 1:  # the lookup
            conn.sendall(headers(len(miss)) + miss)
        else:  # every poll of the job
            trickle_body(conn, stop)

    wait = 1.0
    with socket_server(lookup_then_trickle) as server:
        client = TileClient(
            server_url=server.url, cache_dir=None, token="tt_writer", miss_policy="wait", timeout_s=5.0,
            wait_timeout_s=wait, wait_poll_s=0.1,
        )  # fmt: skip
        start = time.monotonic()
        answer = client.lookup(WL)
        elapsed = time.monotonic() - start
        client.close()
    assert (answer.source, answer.config, answer.job_id) == ("heuristic", HEURISTIC, 7), answer
    assert client.stats["job_polls"] >= 1
    assert elapsed < 10 * wait, elapsed


# ---------------------------------------------------------------- the validity rule of a config


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10**6))
def test_max_tile_is_the_smallest_power_of_two_covering_the_sequence(seq_len: int) -> None:
    tile = max_tile(seq_len)
    assert tile & (tile - 1) == 0 and tile >= seq_len and tile >= 128
    assert tile == 128 or tile // 2 < seq_len


@settings(max_examples=80, deadline=None)
@given(patterns(max_frames=12, max_per_frame=200, max_text=40), st.sampled_from(BACKENDS), st.sampled_from(DTYPES))
def test_heuristic_configs_are_usable(pattern: SparsityPattern, backend: str, dtype: str) -> None:
    heuristic_config(pattern, backend, dtype).check_usable(pattern.seq_len, backend, dtype)


@settings(max_examples=25, deadline=None)
@given(patterns(max_frames=12, max_per_frame=120, max_text=40), st.sampled_from(BACKENDS), st.sampled_from(DTYPES))
def test_every_config_the_search_may_measure_is_usable(pattern: SparsityPattern, backend: str, dtype: str) -> None:
    """The default candidate grids after the search's own rules: a tuned config always passes."""
    wl = Workload("TPU v6 lite" if backend == "tpu" else "cpu", backend, dtype, 1, 64, pattern)
    dims = candidates.dimensions(wl, backend)
    for config in candidates.grid(dims):
        if candidates.violation(wl, backend, config, dims) is None:
            config.check_usable(pattern.seq_len, backend, dtype)


@pytest.mark.parametrize(
    ("config", "seq_len", "backend", "dtype", "rule"),
    [
        (TileConfig(block_q=65536, block_kv=65536), 256, "xla", "float32", r"block_q \(65536\) must be <= 256"),
        (TileConfig(block_q=256, block_kv=257), 256, "xla", "float32", r"block_kv \(257\) must be <= 256"),
        (TileConfig(block_q=129, block_kv=64), 100, "xla", "float32", r"block_q \(129\) must be <= 128"),
        (TileConfig(block_q=96, block_kv=128, align="frame"), 256, "xla", "float32", r"lcm.* = 384.*<= 256"),
        (TileConfig(block_q=8, block_kv=128), 256, "tpu", "bfloat16", r"block_q \(8\) must be a multiple of 16"),
        (TileConfig(block_q=8, block_kv=128), 256, "interpret", "bfloat16", r"multiple of 16"),
        (TileConfig(block_q=16, block_kv=64), 256, "tpu", "float32", r"block_kv \(64\) must be a multiple of 128"),
    ],
)
def test_an_unusable_config_names_the_rule(
    config: TileConfig, seq_len: int, backend: str, dtype: str, rule: str
) -> None:
    with pytest.raises(ValueError, match=rule):
        config.check_usable(seq_len, backend, dtype)


@pytest.mark.parametrize(
    ("config", "seq_len", "backend", "dtype"),
    [
        (TileConfig(block_q=256, block_kv=256), 256, "xla", "float32"),
        (TileConfig(block_q=128, block_kv=128), 1, "xla", "float32"),  # the bound is never below one lane tile
        (TileConfig(block_q=1024, block_kv=1024, align="frame"), 839, "tpu", "bfloat16"),  # 1.22x: the grid has it
        (TileConfig(block_q=96, block_kv=128, align="none"), 256, "xla", "float32"),
        (TileConfig(block_q=8, block_kv=64), 256, "xla", "bfloat16"),  # xla tiles any size
    ],
)
def test_a_usable_config_passes(config: TileConfig, seq_len: int, backend: str, dtype: str) -> None:
    config.check_usable(seq_len, backend, dtype)


# ---------------------------------------------------------------- unusable configs from the server or the disk

UNUSABLE = [
    ("xla", "float32", TileConfig(block_q=65536, block_kv=65536), "block_q (65536) must be <= 256"),
    ("tpu", "bfloat16", TileConfig(block_q=8, block_kv=128), "multiple of 16"),
    ("interpret", "bfloat16", TileConfig(block_q=8, block_kv=128), "multiple of 16"),
    ("xla", "float32", TileConfig(block_q=255, block_kv=256, align="frame"), "lcm(block_q, block_kv) = 65280"),
]


@pytest.mark.parametrize(("backend", "dtype", "config", "rule"), UNUSABLE, ids=["65536", "tpu-q8", "interp-q8", "lcm"])
def test_an_unusable_served_config_is_a_failed_lookup(
    backend: str, dtype: str, config: TileConfig, rule: str, caplog: pytest.LogCaptureFixture
) -> None:
    wl = workload(backend, dtype)
    now = [0.0]
    requests: list[int] = []

    def serve(_request: httpx.Request) -> httpx.Response:
        requests.append(1)
        return httpx.Response(200, json=lookup_answer(config, wl))

    client = mock_client(serve, clock=lambda: now[0], breaker_cooldown_s=30.0, breaker_failures=10)
    caplog.set_level(logging.WARNING, logger="tiletune.client")
    got = client.resolve(PATTERN, SHAPE, backend, dtype)
    answer = client.lookup(wl)
    assert got == heuristic_config(PATTERN, backend, dtype) and usable(got, wl)
    assert answer.source == "fallback" and rule in (answer.detail or ""), answer.detail
    assert client.resolve(PATTERN, SHAPE, backend, dtype) == got and len(requests) == 1  # until the cool-down
    now[0] += 31.0
    assert client.resolve(PATTERN, SHAPE, backend, dtype) == got and len(requests) == 2  # asked again after it
    assert len([r for r in caplog.records if wl.key in r.getMessage()]) == 1  # logged once

    for policy, fallback in (("error", "heuristic"), ("wait", "error")):
        strict = mock_client(serve, miss_policy=policy, wait_fallback=fallback)
        with pytest.raises(ConfigMissError, match=wl.key):
            strict.resolve(PATTERN, SHAPE, backend, dtype)


def test_an_unusable_served_config_falls_back_to_an_expired_disk_answer(tmp_path: Path) -> None:
    client = mock_client(answering(lookup_answer(TileConfig(block_q=65536, block_kv=65536))), cache_dir=tmp_path)
    write_entry(client, OTHER, time.time() - 1)
    got = client.lookup(WL)
    assert (got.config, got.origin) == (OTHER, "disk-expired")


@pytest.mark.parametrize("lifetime", [60.0, -60.0], ids=["fresh", "expired"])
def test_an_unusable_cached_config_is_never_used(tmp_path: Path, lifetime: float) -> None:
    def entry_in(client: TileClient) -> None:
        write_entry(client, TileConfig(block_q=65536, block_kv=65536), time.time() + lifetime)

    up = mock_client(answering(lookup_answer()), cache_dir=tmp_path / "up")
    entry_in(up)
    assert up.resolve(PATTERN, SHAPE, "xla", "float32") == TUNED and up.lookup(WL).origin == "server"
    down = mock_client(answering(b"", 503), cache_dir=tmp_path / "down")
    entry_in(down)
    assert down.resolve(PATTERN, SHAPE, "xla", "float32") == HEURISTIC  # not even as an expired fallback
    assert down.lookup(WL).origin == "local"


@GIVEN
@given(
    block_q=st.one_of(st.sampled_from([8, 16, 32, 128, 256, 257, 512, MAX_BLOCK]), st.integers(1, MAX_BLOCK)),
    block_kv_compute=st.one_of(st.sampled_from([8, 64, 128, 256]), st.integers(1, 1024)),
    multiple=st.integers(1, 64),
    align=st.sampled_from(["none", "frame"]),
    backend=st.sampled_from(BACKENDS),
    dtype=st.sampled_from(DTYPES),
)
def test_a_served_config_is_used_only_when_usable(
    block_q: int, block_kv_compute: int, multiple: int, align: str, backend: str, dtype: str
) -> None:
    block_kv = min(block_kv_compute * multiple, MAX_BLOCK // block_kv_compute * block_kv_compute)
    config = TileConfig("compact", block_q, block_kv, block_kv_compute, "frame_major", align, "by_pattern")
    wl = workload(backend, dtype)
    with mock_client(answering(lookup_answer(config, wl))) as client:
        got = client.resolve(PATTERN, SHAPE, backend, dtype)
    assert got == (config if usable(config, wl) else heuristic_config(PATTERN, backend, dtype))
    assert usable(got, wl)


def test_sparse_attention_never_runs_an_oversized_served_config() -> None:
    tt_client.install(mock_client(answering(lookup_answer(TileConfig(block_q=65536, block_kv=65536)))))
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal(SHAPE), jnp.float32) for _ in range(3))
    out = sparse_attention(q, k, v, PATTERN, backend="xla")
    np.testing.assert_allclose(np.asarray(out), reference_attention(q, k, v, PATTERN), atol=2e-5, rtol=0)


# ---------------------------------------------------------------- answers, read field by field

NESTED = b"[" * 50_000 + b"]" * 50_000  # under the size limit, deeper than any recursion limit
NESTED_VALUE = "@NESTED@"


def with_nested(document: dict[str, Any], field: str) -> bytes:
    return json.dumps({**document, field: NESTED_VALUE}).replace(f'"{NESTED_VALUE}"', NESTED.decode()).encode()


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (200, NESTED),
        (200, with_nested(lookup_answer(), "config")),
        (200, with_nested(lookup_answer(), "snapshot")),
        (
            200,
            json.dumps(lookup_answer()).replace('"variant": "split"', '"variant": ' + "[" * 900 + "]" * 900).encode(),
        ),
        (422, NESTED),
        (422, with_nested({"message": "bad"}, "detail")),
    ],
    ids=["body", "config", "snapshot", "config-field-900-deep", "4xx-body", "4xx-detail"],
)
def test_deeply_nested_answers_are_a_miss(status: int, body: bytes) -> None:
    client = mock_client(answering(body, status))
    assert client.resolve(PATTERN, SHAPE, "xla", "float32") == HEURISTIC
    assert client.lookup(WL).source == "fallback"


def test_sparse_attention_survives_a_deeply_nested_answer() -> None:
    tt_client.install(mock_client(answering(NESTED)))
    rng = np.random.default_rng(1)
    q, k, v = (jnp.asarray(rng.standard_normal(SHAPE), jnp.float32) for _ in range(3))
    out = sparse_attention(q, k, v, PATTERN, backend="xla")
    np.testing.assert_allclose(np.asarray(out), reference_attention(q, k, v, PATTERN), atol=2e-5, rtol=0)


ABSENT = object()
BAD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "workload_key": st.one_of(st.just(ABSENT), st.none(), st.text(max_size=40), st.integers()),
    "source": st.one_of(
        st.just(ABSENT), st.none(), st.text(max_size=12).filter(lambda s: s not in SERVER_SOURCES), st.integers()
    ),
    "config": st.one_of(
        st.just(ABSENT),
        st.none(),
        st.lists(st.integers(), max_size=3),
        st.dictionaries(st.text(max_size=8), st.integers(), max_size=3),
        st.sampled_from(list(TUNED.to_dict())).map(lambda f: {k: v for k, v in TUNED.to_dict().items() if k != f}),
        st.sampled_from(list(TUNED.to_dict())).map(lambda f: {**TUNED.to_dict(), f: [1]}),
        st.sampled_from(["block_q", "block_kv", "block_kv_compute"]).map(lambda f: {**TUNED.to_dict(), f: True}),
        st.integers(257, 10**9).map(lambda n: {**TUNED.to_dict(), "block_q": n}),
        st.integers(-(10**9), 0).map(lambda n: {**TUNED.to_dict(), "block_kv": n}),
        st.just({**TUNED.to_dict(), "extra": 1}),
    ),
    "snapshot": st.one_of(
        st.just(ABSENT),
        st.none(),
        st.integers(max_value=-1),
        st.integers(min_value=MAX_ID + 1),
        st.integers(0, 2),  # below config_id 3
        st.booleans(),
        st.floats(),
        st.text(max_size=5),
    ),
    "config_id": st.one_of(
        st.integers(max_value=0), st.integers(6, 10**6), st.booleans(), st.floats(), st.text(max_size=5)
    ),
    "job_id": st.one_of(st.integers(max_value=0), st.integers(min_value=MAX_ID + 1), st.booleans(), st.floats()),
}


@GIVEN
@given(st.sampled_from(sorted(BAD_VALUES)).flatmap(lambda f: st.tuples(st.just(f), BAD_VALUES[f])))
@example(("snapshot", -1))  # the colleague's reproduction
@example(("job_id", 0))
def test_an_answer_with_one_bad_field_is_a_miss(bad: tuple[str, Any]) -> None:
    field, value = bad
    answer = lookup_answer()
    if value is ABSENT:
        del answer[field]
    else:
        answer[field] = value
    with mock_client(answering(answer)) as client:
        assert client.resolve(PATTERN, SHAPE, "xla", "float32") == HEURISTIC
        got = client.lookup(WL)
    assert got.source == "fallback" and field in (got.detail or ""), (field, got.detail)


@st.composite
def ids_up_to(draw: st.DrawFn) -> tuple[int, int | None]:
    """(snapshot, config_id): the snapshot is the highest tuned-config id, so it bounds the config's."""
    snapshot = draw(st.one_of(st.integers(0, 10), st.integers(0, MAX_ID)))
    return snapshot, draw(st.none() | st.integers(1, snapshot)) if snapshot >= 1 else None


@GIVEN
@given(
    source=st.sampled_from(SERVER_SOURCES),
    ids=ids_up_to(),
    job_id=st.one_of(st.none(), st.integers(1, MAX_ID)),
    extra=st.dictionaries(st.text(max_size=8).filter(lambda k: k not in lookup_answer()), st.integers(), max_size=3),
)
def test_a_well_formed_answer_is_used(
    source: str, ids: tuple[int, int | None], job_id: int | None, extra: dict[str, int]
) -> None:
    snapshot, config_id = ids
    answer = {**extra, **lookup_answer(source=source, snapshot=snapshot, config_id=config_id, job_id=job_id)}
    with mock_client(answering(answer)) as client:
        got = client.lookup(WL)
    assert (got.config, got.source, got.origin, got.snapshot, got.config_id, got.job_id) == (
        TUNED, source, "server", snapshot, config_id, job_id
    )  # fmt: skip


def test_a_pinned_client_takes_only_answers_at_its_snapshot() -> None:
    assert mock_client(answering(lookup_answer(snapshot=5)), snapshot=5).lookup(WL).config == TUNED
    answer = mock_client(answering(lookup_answer(snapshot=6)), snapshot=5).lookup(WL)
    assert answer.source == "fallback" and "pinned snapshot 5" in (answer.detail or "")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=30,
)
documents = st.one_of(
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=200),
    st.integers(1, 60_000).map(lambda depth: b"[" * depth + b"]" * depth),
    st.dictionaries(st.sampled_from(sorted(lookup_answer())), json_values, max_size=8).map(
        lambda d: json.dumps({**lookup_answer(), **d}).encode()
    ),
)


@GIVEN
@given(st.sampled_from([200, 201, 204, 301, 400, 404, 409, 422, 429, 500, 503]), documents)
def test_nothing_a_server_says_raises_out_of_resolve(status: int, body: bytes) -> None:
    with mock_client(answering(body, status)) as lenient:
        assert usable(lenient.resolve(PATTERN, SHAPE, "xla", "float32"))
    with mock_client(answering(body, status), miss_policy="error") as strict:
        try:
            config = strict.resolve(PATTERN, SHAPE, "xla", "float32")
        except ConfigMissError:
            return
        assert usable(config) and strict.lookup(WL).tuned


# ---------------------------------------------------------------- the disk cache


def resolve_in_thread(client: TileClient, wait: float = SLOW) -> TileConfig | None:
    """resolve() in a daemon thread, so that a client that blocks fails the test instead of hanging it."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(client.resolve(PATTERN, SHAPE, "xla", "float32")))
    thread.daemon = True
    thread.start()
    thread.join(wait)
    assert not thread.is_alive(), "resolve() blocked"
    return result[0]  # type: ignore[no-any-return]


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _link_to_fifo(path: Path) -> None:
    os.mkfifo(path.with_suffix(".fifo"))
    path.symlink_to(path.with_suffix(".fifo"))


def _directory(path: Path) -> None:
    path.mkdir()


def _device(path: Path) -> None:
    path.symlink_to("/dev/null")


def _huge(path: Path) -> None:
    with path.open("wb") as fh:
        fh.truncate(1 << 30)  # sparse: a gigabyte of zeros that takes no space


@pytest.mark.parametrize("make", [_fifo, _link_to_fifo, _directory, _device, _huge], ids=lambda f: f.__name__[1:])
def test_anything_but_a_small_regular_file_at_the_cache_path_is_a_miss(
    tmp_path: Path, make: Callable[[Path], None]
) -> None:
    client = mock_client(answering(lookup_answer()), cache_dir=tmp_path)
    path = client.cache_path(WL)
    assert path is not None
    tmp_path.mkdir(exist_ok=True)
    make(path)
    try:
        assert resolve_in_thread(client) == TUNED
        assert client.lookup(WL).origin == "server"
        if make is not _directory:  # the answer replaced it (a directory cannot be replaced by a file)
            assert (
                path.is_file() and not path.is_symlink() and json.loads(path.read_bytes())["config"] == TUNED.to_dict()
            )
    finally:
        fifo = path.with_suffix(".fifo") if make is _link_to_fifo else path
        if make in (_fifo, _link_to_fifo) and fifo.exists() and not fifo.is_file():
            with contextlib.suppress(OSError):  # ENXIO: no reader is stuck in open(), as it should be
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # else this frees it


def write_entry(client: TileClient, config: TileConfig, expires_at: Any, snapshot: int = 2) -> Path:
    path = client.cache_path(WL)
    assert path is not None
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = cache_entry(Answer(config, "tuned", "server", WL.key, 2, snapshot), 0.0, time.time())
    path.write_text(json.dumps({**entry, "expires_at": expires_at}))
    return path


@pytest.mark.parametrize(
    "expires_at",
    [None, math.inf, 1e300, "later", [1], True, "ttl*100"],
    ids=["null", "infinity", "1e300", "text", "list", "true", "beyond-the-ttl"],
)
def test_every_disk_entry_expires(tmp_path: Path, expires_at: Any) -> None:
    """An entry is fresh until its finite ``expires_at``, and never longer than the TTL in force from
    now: whatever the file says, the server is asked again, and the entry rewritten with an expiry."""
    client = mock_client(answering(lookup_answer()), cache_dir=tmp_path, cache_ttl_s=100.0)
    if expires_at == "ttl*100":
        expires_at = time.time() + 100 * 100.0
    path = write_entry(client, OTHER, expires_at)
    assert client.resolve(PATTERN, SHAPE, "xla", "float32") == TUNED and client.lookup(WL).origin == "server"
    rewritten = json.loads(path.read_bytes())["expires_at"]
    assert isinstance(rewritten, float) and 0 < rewritten - time.time() <= 100.0


def test_an_entry_without_expiry_is_still_the_offline_answer(tmp_path: Path) -> None:
    """``"expires_at": null`` (what pinned clients wrote before expiry was mandatory) reads as
    expired: the server is asked, and when it cannot answer the entry is still used."""
    client = mock_client(answering(b"", 503), cache_dir=tmp_path, snapshot=2)
    write_entry(client, OTHER, None, snapshot=2)
    answer = client.lookup(WL)
    assert (answer.config, answer.origin) == (OTHER, "disk-expired")
    assert client.stats["requests"] == 1


def test_a_fresh_entry_is_used_without_asking(tmp_path: Path) -> None:
    client = mock_client(answering(b"", 503), cache_dir=tmp_path, cache_ttl_s=100.0)
    write_entry(client, OTHER, time.time() + 50)
    assert client.lookup(WL).origin == "disk" and "requests" not in client.stats


entry_fields = st.dictionaries(
    st.sampled_from(["format", "workload_key", "source", "config", "config_id", "snapshot", "expires_at", "x"]),
    json_values,
    max_size=4,
)


@GIVEN
@given(
    st.one_of(
        documents,
        entry_fields.map(
            lambda d: json.dumps(
                {**cache_entry(Answer(OTHER, "tuned", "server", WL.key, 2, 2), time.time() + 50, time.time()), **d}
            ).encode()
        ),
    )
)
def test_nothing_a_cache_file_says_raises_out_of_resolve(tmp_path: Path, raw: bytes) -> None:
    client = mock_client(answering(lookup_answer()), cache_dir=tmp_path / "cache")
    path = client.cache_path(WL)
    assert path is not None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw)
    got = client.resolve(PATTERN, SHAPE, "xla", "float32")
    answer = client.lookup(WL)
    assert got in (TUNED, OTHER) and usable(got)
    if answer.origin == "disk":  # only a well-formed, fresh entry of this workload is used as is
        data = json.loads(raw)
        assert data["format"] == CACHE_FORMAT and data["workload_key"] == WL.key and got == OTHER
