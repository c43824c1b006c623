"""TileClient: memory -> disk -> server -> heuristic resolution of tile configs (see :mod:`autotune.client`)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import httpx

from autotune.client.answer import (
    CACHE_FORMAT,
    MAX_DOCUMENT_BYTES,
    Answer,
    AnswerFormatError,
    parse_document,
    rejection_message,
    server_answer,
)
from autotune.client.breaker import CircuitBreaker
from autotune.client.cache import DiskCache
from autotune.client.exchange import ExchangeError, exchange
from autotune.client.settings import ClientSettings, ConfigMissError
from kernel.config import TileConfig
from kernel.heuristic import heuristic_config
from kernel.pattern import SparsityPattern
from kernel.workload import Workload

log = logging.getLogger("tiletune.client")

MEMO_LIMIT = 4096  # distinct (pattern object, shape) entries before the in-memory table is reset
BACKOFF_S = 0.05  # first retry delay; doubled per attempt, with jitter


@functools.cache
def _versions(backend: str) -> dict[str, str | None]:
    from autotune.versions import software_versions

    return software_versions(backend)


@functools.cache
def _device_kind() -> str:
    import jax

    return str(jax.devices()[0].device_kind)


class ServerUnavailable(Exception):  # noqa: N818 - a condition, not an error the caller sees
    """The server could not give an answer (down, hanging, 5xx, malformed, breaker open)."""


class ServerRejected(Exception):  # noqa: N818
    """The server answered 4xx: asking again would not help."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


@dataclasses.dataclass
class _Resolved:
    answer: Answer
    retry_at: float | None  # monotonic time after which a fallback is retried; None: final for this process


class TileClient:
    """Resolves TileConfigs for the kernel: memory -> disk -> server -> heuristic (see the module docstring).

    ``TileClient(server_url=..., token=..., timeout_s=..., cache_dir=..., miss_policy=...,
    snapshot=...)`` takes the fields of :class:`ClientSettings`; :meth:`from_env` reads
    them from ``TILETUNE_*`` variables. :meth:`resolve` is the kernel's config resolver;
    :func:`install` plugs it in. Thread-safe; one lookup per workload even when many
    threads resolve it at once.
    """

    def __init__(
        self,
        settings: ClientSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        transport: httpx.BaseTransport | None = None,
        **options: Any,
    ) -> None:
        if settings is not None and options:
            raise TypeError("give either settings or keyword options, not both")
        self.settings = settings or ClientSettings(**options)
        self.clock = clock  # the breaker's and the retry times' clock; deadlines are always time.monotonic
        self._transport = transport  # httpx's own when None; tests give an httpx.MockTransport
        self.breaker = CircuitBreaker(self.settings.breaker_failures, self.settings.breaker_cooldown_s, clock)
        self.disk = DiskCache(self.settings.cache_dir) if self.settings.cache_dir is not None else None
        self.last_snapshot: int | None = self.settings.snapshot
        # The hot table: per q/k/v shape, the last (pattern, backend, dtype) resolved for it with a final answer.
        self._recent: dict[tuple[int, ...], tuple[SparsityPattern, str, str, TileConfig | None]] = {}
        # Every call resolved: (pattern, config, retry_at or None when final), keyed by the pattern's identity.
        self._memo: dict[
            tuple[int, tuple[int, ...], str, str], tuple[SparsityPattern, TileConfig | None, float | None]
        ] = {}
        self._answers: dict[str, _Resolved] = {}
        self._lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}
        self._stats: dict[str, int] = {}
        self._http: httpx.Client | None = None
        self._pid = os.getpid()
        self._warned: set[str] = set()
        self._enqueue = self.settings.enqueue and self.settings.token is not None

    @classmethod
    def from_env(cls, **overrides: Any) -> TileClient:
        """A client on the ``TILETUNE_*`` variables, keyword options overriding them."""
        return cls(ClientSettings.from_env(**overrides))

    # ------------------------------------------------------------ the kernel's resolver

    def resolve(
        self, pattern: SparsityPattern, qkv_shape: tuple[int, ...], backend: str, dtype: str
    ) -> TileConfig | None:
        """The config for one ``sparse_attention`` call (the kernel's ConfigResolver).

        The hot path is one dict lookup keyed by the shape tuple the kernel passes,
        and identity checks; the workload key (a hash of the canonical JSON) is
        computed once per pattern object and shape.
        """
        try:  # a subscript and an unpack: cheaper than .get() and indexing
            known, known_backend, known_dtype, config = self._recent[qkv_shape]
        except KeyError:
            return self._resolve_memo(pattern, qkv_shape, backend, dtype)
        if known is pattern and known_backend == backend and known_dtype == dtype:
            return config
        return self._resolve_memo(pattern, qkv_shape, backend, dtype)

    def _resolve_memo(
        self, pattern: SparsityPattern, qkv_shape: tuple[int, ...], backend: str, dtype: str
    ) -> TileConfig | None:
        # The stored pattern keeps its id from being reused by another object while the entry lives.
        memo = self._memo.get((id(pattern), qkv_shape, backend, dtype))
        if memo is not None and memo[0] is pattern:
            if memo[2] is None:
                self._recent[qkv_shape] = (pattern, backend, dtype, memo[1])
                return memo[1]
            if self.clock() < memo[2]:  # a fallback, until it is retried
                return memo[1]
        return self._resolve_slow(pattern, qkv_shape, backend, dtype)

    def _resolve_slow(
        self, pattern: SparsityPattern, qkv_shape: tuple[int, ...], backend: str, dtype: str
    ) -> TileConfig | None:
        self._count("slow_resolves")
        try:
            wl = self.workload(pattern, qkv_shape, backend, dtype)
        except ValueError as exc:  # not a workload the service knows (e.g. float16): the kernel's heuristic
            self._warn_once(f"workload:{backend}:{dtype}", "tiletune: no tuned configs for this call (%s)", exc)
            self._remember(pattern, qkv_shape, backend, dtype, None, None)
            return None
        resolved = self._resolve_workload(wl)
        self._remember(pattern, qkv_shape, backend, dtype, resolved.answer.config, resolved.retry_at)
        return resolved.answer.config

    def _remember(
        self,
        pattern: SparsityPattern,
        qkv_shape: tuple[int, ...],
        backend: str,
        dtype: str,
        config: TileConfig | None,
        retry_at: float | None,
    ) -> None:
        if len(self._memo) >= MEMO_LIMIT:
            self._memo.clear()
            self._recent.clear()
        self._memo[(id(pattern), qkv_shape, backend, dtype)] = (pattern, config, retry_at)
        if retry_at is None:
            self._recent[qkv_shape] = (pattern, backend, dtype, config)

    @staticmethod
    def workload(pattern: SparsityPattern, qkv_shape: tuple[int, ...], backend: str, dtype: str) -> Workload:
        """The workload of a call: this process's device kind; batch and head_dim from the q/k/v shape."""
        batch = int(qkv_shape[0]) if len(qkv_shape) == 4 else 1
        return Workload(_device_kind(), backend, dtype, batch, int(qkv_shape[-1]), pattern)

    # ------------------------------------------------------------ one workload

    def lookup(self, wl: Workload) -> Answer:
        """The answer for ``wl`` (memory, disk, server, heuristic; the miss policy applied)."""
        return self._resolve_workload(wl).answer

    def _resolve_workload(self, wl: Workload) -> _Resolved:
        key = wl.key
        got = self._answers.get(key)
        if got is not None and (got.retry_at is None or self.clock() < got.retry_at):
            return got
        with self._key_lock(key):  # one lookup per workload, however many threads ask
            got = self._answers.get(key)
            if got is not None and (got.retry_at is None or self.clock() < got.retry_at):
                return got
            got = self._fetch(wl, key)
            self._answers[key] = got
            return got

    def _key_lock(self, key: str) -> threading.Lock:
        with self._lock:
            lock = self._key_locks.get(key)
            if lock is None:
                lock = self._key_locks[key] = threading.Lock()
            return lock

    def cache_path(self, wl: Workload) -> Path | None:
        """The disk cache file of ``wl``'s answer (None without a disk cache)."""
        return None if self.disk is None else self.disk.path(self._cache_key(wl.key, wl.backend))

    def _cache_key(self, workload_key: str, backend: str) -> str:
        versions = _versions(backend)
        parts = [CACHE_FORMAT, self.settings.server_url or "", workload_key, versions, self.settings.snapshot]
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:40]

    def _fetch(self, wl: Workload, key: str) -> _Resolved:
        policy = self.settings.miss_policy
        cache_key = self._cache_key(key, wl.backend)
        expired: Answer | None = None
        if self.disk is not None:
            cached = self.disk.get(cache_key, wl, self.settings.snapshot)
            if cached is not None:
                answer, now = cached.answer, time.time()
                # Fresh until its expiry, and never for longer than the TTL in force allows from now.
                fresh = now < cached.expires_at <= now + self._ttl(answer.source)
                if fresh and (answer.tuned or policy == "heuristic"):
                    self._count("disk_hits")
                    self._saw_snapshot(answer.snapshot)
                    return _Resolved(answer, None)
                expired = dataclasses.replace(answer, origin="disk-expired")
        if self.settings.server_url is None:
            return self._fallback(wl, key, expired, "no server configured (TILETUNE_SERVER_URL)", retry=False)
        try:
            answer = self._ask_server(wl, key, time.monotonic() + self.settings.timeout_s)
        except ServerUnavailable as exc:
            return self._fallback(wl, key, expired, str(exc))
        except ServerRejected as exc:
            if policy == "error" or (policy == "wait" and self.settings.wait_fallback == "error"):
                raise ConfigMissError(
                    f"tiletune: the server at {self.settings.server_url} rejected the lookup of workload {key} "
                    f"({exc}); TILETUNE_MISS_POLICY={policy}"
                ) from None
            self._warn_once(
                f"rejected:{exc.status}", "tiletune: the server rejected a lookup (%s); using the heuristic", exc
            )
            return _Resolved(self._local(wl, key, f"rejected: {exc}"), None)
        if not answer.tuned and policy == "wait":
            if answer.job_id is None:
                self._warn_once(
                    "wait-no-job", "tiletune: miss policy 'wait' but no job was queued (%s)", self._no_job()
                )
            elif self.settings.snapshot is not None:
                # The job's result lands after the pinned snapshot, so this run could never see it.
                self._warn_once("wait-pinned", "tiletune: not waiting for tuning: the client is pinned to a snapshot")
            else:
                answer = self._wait_for_job(wl, key, answer)
        if not answer.tuned and (policy == "error" or (policy == "wait" and self.settings.wait_fallback == "error")):
            raise ConfigMissError(self._miss_message(wl, key, answer))
        self._store(cache_key, answer)
        return _Resolved(answer, None)

    def _store(self, cache_key: str, answer: Answer) -> None:
        if self.disk is None:
            return
        ttl = self._ttl(answer.source)
        if ttl <= 0:
            return
        if self.disk.put(cache_key, answer, time.time() + ttl):
            self._count("disk_writes")

    def _ttl(self, source: str) -> float:
        """Seconds an answer of ``source`` stays fresh on disk. An answer at a pinned snapshot never
        changes, so every source of it is kept as long as a tuned answer."""
        if source == "tuned" or self.settings.snapshot is not None:
            return self.settings.cache_ttl_s
        return self.settings.miss_ttl_s

    def _fallback(
        self, wl: Workload, key: str, expired: Answer | None, reason: str, *, retry: bool = True
    ) -> _Resolved:
        """The server could not answer: an expired disk entry, else the heuristic; retried after the cool-down."""
        policy = self.settings.miss_policy
        self._count("fallbacks")
        answer = expired if expired is not None else self._local(wl, key, reason)
        if policy == "error" and not answer.tuned:
            raise ConfigMissError(
                f"tiletune: no tuned config for workload {key} ({wl.pattern.describe()}): {reason}, and nothing "
                f"usable is cached; TILETUNE_MISS_POLICY=error"
            )
        if policy == "wait" and self.settings.wait_fallback == "error" and not answer.tuned:
            raise ConfigMissError(
                f"tiletune: cannot wait for a tuned config of workload {key}: {reason}; TILETUNE_WAIT_FALLBACK=error"
            )
        if not retry:
            self._warn_once("no-server", "tiletune: %s; using heuristic and cached configs", reason, level=logging.INFO)
            return _Resolved(dataclasses.replace(answer, detail=reason), None)
        self._warn_once(
            f"fallback:{key}",
            "tiletune: using %s for workload %s: %s",
            "an expired cached config" if expired is not None else "the heuristic config",
            key,
            reason,
        )
        return _Resolved(dataclasses.replace(answer, detail=reason), self.clock() + self.settings.breaker_cooldown_s)

    @staticmethod
    def _local(wl: Workload, key: str, reason: str) -> Answer:
        config = heuristic_config(wl.pattern, wl.backend, wl.dtype)
        return Answer(config, "fallback", "local", key, detail=reason)

    def _no_job(self) -> str:
        if self.settings.token is None:
            return "set TILETUNE_TOKEN to a writer token so that a miss queues a tuning job"
        if not self.settings.enqueue:
            return "TILETUNE_ENQUEUE is off"
        return "the token may not queue jobs"

    def _miss_message(self, wl: Workload, key: str, answer: Answer) -> str:
        waited = self.settings.miss_policy == "wait" and answer.job_id is not None
        policy = f"TILETUNE_MISS_POLICY={self.settings.miss_policy}"
        if self.settings.miss_policy == "wait":
            policy += f", TILETUNE_WAIT_FALLBACK={self.settings.wait_fallback}"
        return (
            f"tiletune: no tuned config for workload {key} ({wl.device_kind}, {wl.backend}, {wl.dtype}, "
            f"batch {wl.batch}, head_dim {wl.head_dim}; {wl.pattern.describe()})"
            + (" after waiting for its tuning job" if waited else "")
            + f": the server answered {answer.source!r}"
            + (f" ({answer.detail})" if answer.detail else "")
            + f"; {policy}"
            + ("" if answer.job_id is not None else f"; no tuning job was queued: {self._no_job()}")
        )

    # ------------------------------------------------------------ the server

    def _ask_server(self, wl: Workload, key: str, deadline: float, *, enqueue: bool | None = None) -> Answer:
        """The server's answer for ``wl``, every request of it done by ``deadline`` (``time.monotonic()``)."""
        body: dict[str, Any] = {"workload": wl.canonical(), "versions": _versions(wl.backend)}
        want_enqueue = self._enqueue if enqueue is None else enqueue
        if want_enqueue:
            body["enqueue"] = True
        if self.settings.snapshot is not None:
            body["snapshot"] = self.settings.snapshot
        try:
            data = self._request("POST", "/v1/lookup", deadline, body)
        except ServerRejected as exc:
            if want_enqueue and exc.status in (401, 403):
                # A token that may not queue jobs: look up without queueing from now on.
                self._enqueue = False
                self._warn_once("enqueue", "tiletune: the token may not queue tuning jobs (%s); only looking up", exc)
                return self._ask_server(wl, key, deadline, enqueue=False)
            raise
        try:
            answer = server_answer(data, wl, self.settings.snapshot)
        except AnswerFormatError as exc:
            self.breaker.failure()
            self._count("server_failures")
            raise ServerUnavailable(f"malformed answer from {self.settings.server_url}: {exc}") from None
        self._saw_snapshot(answer.snapshot)
        return answer

    def _request(self, method: str, path: str, deadline: float, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """One call, retried until ``deadline`` (``time.monotonic()``): every attempt and the back-off
        between them end by it. Every failure becomes ServerUnavailable (counted by the breaker) or
        ServerRejected (4xx: the server is fine, the request is not)."""
        if not self.breaker.allow():
            self._count("breaker_rejections")
            raise ServerUnavailable(f"circuit breaker open after failed calls to {self.settings.server_url}")
        client = self._client()
        attempt = 0
        headers = {"authorization": f"Bearer {self.settings.token}"} if self.settings.token else None
        while True:
            self._count("requests")
            try:
                reply = exchange(
                    client, method, path, deadline=deadline, max_bytes=MAX_DOCUMENT_BYTES, json=body, headers=headers
                )
                if 400 <= reply.status < 500 and reply.status != 429:
                    self.breaker.success()
                    raise ServerRejected(reply.status, rejection_message(reply.body))
                if not 200 <= reply.status < 300:
                    raise ServerUnavailable(f"{reply.status} from {self.settings.server_url}{path}")
                data = parse_document(reply.body, "answer")
                self.breaker.success()
                return data
            except (ExchangeError, ServerUnavailable, AnswerFormatError) as exc:
                attempt += 1
                reason = str(exc)
                delay = BACKOFF_S * 2 ** (attempt - 1) * (0.5 + random.random())
                if attempt > self.settings.retries or time.monotonic() + delay >= deadline:
                    self.breaker.failure()
                    self._count("server_failures")
                    if self.breaker.state != "closed":
                        self._warn_once(
                            f"breaker:{self.breaker.opened}",
                            "tiletune: %s failed (%s); not calling it for %.0f s",
                            self.settings.server_url,
                            reason,
                            self.settings.breaker_cooldown_s,
                        )
                    raise ServerUnavailable(
                        f"{self.settings.server_url} did not answer within {self.settings.timeout_s:g} s "
                        f"({attempt} attempt{'s' if attempt > 1 else ''}; last: {reason})"
                    ) from None
                time.sleep(delay)

    def _client(self) -> httpx.Client:
        with self._lock:
            if self._http is None or self._pid != os.getpid():  # a forked child gets its own connections
                url = cast(str, self.settings.server_url)
                # Loading the CA bundle costs ~50 ms (300 ms the first time): only for https.
                self._http = httpx.Client(base_url=url, verify=url.startswith("https://"), transport=self._transport)
                self._pid = os.getpid()
            return self._http

    def _wait_for_job(self, wl: Workload, key: str, answer: Answer) -> Answer:
        """Poll the answer's job until it ends or the wait times out; a done job's config is looked up again.

        Every poll ends by the timeout and by the end of the wait; the lookup of a done job's
        config has the timeout of its own."""
        wait_end = time.monotonic() + self.settings.wait_timeout_s
        interval = min(self.settings.wait_poll_s, 0.25)
        log.info("tiletune: waiting up to %g s for tuning job %s", self.settings.wait_timeout_s, answer.job_id)
        while True:
            remaining = wait_end - time.monotonic()
            if remaining <= 0:
                return dataclasses.replace(answer, detail=f"job {answer.job_id} still running after the wait")
            time.sleep(min(interval, remaining))
            interval = min(interval * 2, self.settings.wait_poll_s)
            poll_deadline = min(time.monotonic() + self.settings.timeout_s, wait_end)
            try:
                self._count("job_polls")
                status = self._request("GET", f"/v1/jobs/{answer.job_id}", poll_deadline).get("status")
                if status == "done":
                    return self._ask_server(wl, key, time.monotonic() + self.settings.timeout_s, enqueue=False)
            except (ServerUnavailable, ServerRejected) as exc:
                if self.breaker.state != "closed" or isinstance(exc, ServerRejected):
                    return dataclasses.replace(answer, detail=f"stopped waiting: {exc}")
                continue
            if status in ("failed", "cancelled"):
                return dataclasses.replace(answer, detail=f"job {answer.job_id} {status}")

    # ------------------------------------------------------------ bookkeeping

    def _saw_snapshot(self, snapshot: int | None) -> None:
        if snapshot is not None and (self.last_snapshot is None or snapshot > self.last_snapshot):
            self.last_snapshot = snapshot

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._stats[name] = self._stats.get(name, 0) + n

    def _warn_once(self, topic: str, message: str, *args: Any, level: int = logging.WARNING) -> None:
        with self._lock:
            if topic in self._warned:
                return
            self._warned.add(topic)
        log.log(level, message, *args)

    @property
    def stats(self) -> dict[str, int]:
        """Counters: requests (HTTP calls), server_failures, disk_hits, disk_writes, fallbacks,
        breaker_rejections, job_polls, slow_resolves (resolutions that missed the in-memory table)."""
        with self._lock:
            return dict(self._stats)

    def clear_memory(self) -> None:
        """Forget what this process resolved (the disk cache stays)."""
        with self._lock:
            self._recent.clear()
            self._memo.clear()
            self._answers.clear()

    def close(self) -> None:
        with self._lock:
            http, self._http = self._http, None
        if http is not None:
            http.close()

    def __enter__(self) -> TileClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
