"""The abuse client of ``tiletune bench service``: the worst requests the service's limits allow,
sent back to back by one client while the measured clients send lookups.

Each round sends, in order:

- ``crowded_body``: a lookup body of ``TILETUNE_MAX_BODY_BYTES`` holding as many unknown keys as
  fit (about 100,000 at 1 MiB): refused by the body scan (413);
- ``invalid_body``: a body as large as allowed with as many unknown keys as the scan admits, each a
  long string: the most validation work a body can ask for (422, with a bounded report);
- ``largest_job``: ``POST /v1/jobs`` of a workload at every limit at once (``TILETUNE_MAX_TOKENS``
  tokens, ``_MAX_HEADS`` heads of ``_MAX_HEAD_CLASSES`` classes, batch ``_MAX_BATCH``), new each
  round, so it writes a workload and a job;
- ``largest_lookup``: the same workload looked up (a miss: the nearest search of its family);
- ``page`` and ``figure``: its ``/ui`` page and its four figures, never drawn before (the
  workload is new), the block map at its largest (every head class in both token orders).

The client is a :class:`~server.bench.load.Companion`: it runs during the windows of the target
that carries it and, when stopped, waits for the request in flight.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from typing import Any

import httpx

from server.bench.load import latency_summary
from server.settings import Settings

FIGURES = ("history", "heatmap", "blockmap", "speedup")
DEVICE = ("TPU v6 lite", "tpu")
SMALL_WORKLOAD: dict[str, Any] = {"device_kind": "cpu", "backend": "xla", "preset": "cpu-demo"}
FRAMES = 64


def largest_workload(settings: Settings, round_: int) -> dict[str, Any]:
    """A workload at every limit of ``settings``, different for every ``round_``: temporal heads in
    ``max_head_classes`` classes (windows shifted by the round), over ``max_tokens`` tokens."""
    frames = min(FRAMES, settings.max_tokens)
    tokens_per_frame = settings.max_tokens // frames
    classes = min(settings.max_head_classes, settings.max_heads)
    windows = [(round_ * classes + c) % tokens_per_frame for c in range(classes)]
    heads = [{"kind": "temporal", "window_positions": windows[h % classes]} for h in range(settings.max_heads)]
    return {
        "device_kind": DEVICE[0],
        "backend": DEVICE[1],
        "dtype": "bfloat16",
        "batch": settings.max_batch,
        "head_dim": 128,
        "pattern": {"layout": {"frames": frames, "tokens_per_frame": tokens_per_frame}, "heads": heads},
    }


def crowded_body(settings: Settings) -> bytes:
    """A lookup body just under the size limit, filled with unknown keys."""
    head = b'{"workload":' + json.dumps(SMALL_WORKLOAD).encode()
    room = settings.max_body_bytes - len(head) - 1
    keys = []
    used = 0
    for i in range(room):
        key = b',"k%d":0' % i
        if used + len(key) > room:
            break
        keys.append(key)
        used += len(key)
    return head + b"".join(keys) + b"}"


def invalid_body(settings: Settings, max_structure: int) -> bytes:
    """A lookup body just under the size limit with as many unknown keys as both limits admit (two
    structural characters each for the JSON scan), their values long strings filling the body."""
    head = b'{"workload":' + json.dumps(SMALL_WORKLOAD, separators=(",", ":")).encode()
    room = settings.max_body_bytes - len(head) - 1
    entry = len(b',"k000000":""')
    keys = max(1, min((max_structure - sum(head.count(c) for c in b"{[,:")) // 2, room // (entry + 1)))
    value = b"x" * (room // keys - entry)
    return head + b"".join(b',"k%06d":"%s"' % (i, value) for i in range(keys)) + b"}"


class AbuseClient:
    """One client sending the rounds above to ``base_url`` from a thread, between ``start`` and ``stop``."""

    def __init__(self, base_url: str, settings: Settings, writer_token: str, max_structure: int) -> None:
        self.base_url = base_url
        self.settings = settings
        self.auth = {"authorization": f"Bearer {writer_token}"}
        self.crowded = crowded_body(settings)
        self.invalid = invalid_body(settings, max_structure)
        self.rounds = 0
        self._latencies: dict[str, list[float]] = collections.defaultdict(list)
        self._statuses: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="bench-abuse", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        headers = {"content-type": "application/json", "accept": "application/json"}
        with httpx.Client(base_url=self.base_url, timeout=300.0, headers=headers) as client:
            while not self._stop.is_set():
                self._round(client)

    def _round(self, client: httpx.Client) -> None:
        self._send(client, "crowded_body", "POST", "/v1/lookup", content=self.crowded)
        self._send(client, "invalid_body", "POST", "/v1/lookup", content=self.invalid)
        workload = largest_workload(self.settings, self.rounds)
        self.rounds += 1
        body = json.dumps({"workload": workload}).encode()
        job = self._send(client, "largest_job", "POST", "/v1/jobs", content=body, headers=self.auth)
        self._send(client, "largest_lookup", "POST", "/v1/lookup", content=body)
        if job is None or job.status_code not in (200, 201):
            return
        key = job.json()["workload_key"]
        self._send(client, "page", "GET", f"/ui/workloads/{key}")
        for name in FIGURES:
            if self._stop.is_set():
                return
            self._send(client, "figure", "GET", f"/ui/workloads/{key}/figures/{name}.png")

    def _send(self, client: httpx.Client, kind: str, method: str, path: str, **kwargs: Any) -> httpx.Response | None:
        t0 = time.perf_counter()
        try:
            response = client.request(method, path, **kwargs)
            response.read()
        except httpx.HTTPError as exc:
            self._statuses[kind][type(exc).__name__] += 1
            return None
        self._latencies[kind].append(time.perf_counter() - t0)
        self._statuses[kind][str(response.status_code)] += 1
        return response

    def report(self) -> dict[str, Any]:
        """Per kind of request: the answers' statuses and latencies; the rounds done; the body sizes."""
        return {
            "rounds": self.rounds,
            "crowded_body_bytes": len(self.crowded),
            "invalid_body_bytes": len(self.invalid),
            "largest_workload": {
                "tokens": self.settings.max_tokens,
                "heads": self.settings.max_heads,
                "head_classes": min(self.settings.max_head_classes, self.settings.max_heads),
                "batch": self.settings.max_batch,
            },
            "requests": {
                kind: {"statuses": dict(sorted(self._statuses[kind].items())), **latency_summary(self._latencies[kind])}
                for kind in sorted(self._statuses)
            },
        }
