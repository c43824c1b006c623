"""Load generation of ``tiletune bench service``: concurrent keep-alive clients, measured windows.

:func:`drive_load` gives every target its measured seconds in windows taken in
turn (A B C A B C ...), so a drift of the machine's background load touches
every phase alike; each window reports throughput, latency percentiles, the
CPU time of the clients and of the server's process tree, and the peak resident
memory of that tree. A target may bring a companion (the abuse client of
:mod:`server.bench.abuse`) that runs during its windows only.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import httpx

from server.bench import BenchError
from server.bench.harness import Child
from server.bench.seeding import WorkloadPlan

SEQUENCE_LENGTH = 4096  # length of the cyclic request sequence the clients walk


@dataclasses.dataclass(frozen=True)
class BenchRequest:
    method: str
    path: str
    body: bytes | None = None


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (q in [0, 1])."""
    if not sorted_values:
        return math.nan
    return sorted_values[max(0, min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1))]


def latency_summary(latencies: Sequence[float]) -> dict[str, Any]:
    """Count and p50 / p90 / p99 / max / mean in milliseconds of latencies in seconds."""
    values = sorted(latencies)
    ms = 1000.0
    return {
        "count": len(values),
        "p50_ms": round(percentile(values, 0.50) * ms, 4) if values else None,
        "p90_ms": round(percentile(values, 0.90) * ms, 4) if values else None,
        "p99_ms": round(percentile(values, 0.99) * ms, 4) if values else None,
        "max_ms": round(values[-1] * ms, 4) if values else None,
        "mean_ms": round(sum(values) / len(values) * ms, 4) if values else None,
    }


Labeller = Callable[[httpx.Response], str]


def source_label(response: httpx.Response) -> str:
    """Lookup answers are labelled by their ``source`` (tuned, nearest, ...)."""
    return str(response.json().get("source", "?"))


def page_labeller(limit: int) -> Labeller:
    """History answers are labelled ``full`` (``limit`` items) or ``partial``."""

    def label(response: httpx.Response) -> str:
        return "full" if len(response.json().get("items", ())) >= limit else "partial"

    return label


RSS_SAMPLE_S = 0.1  # how often the server tree's resident memory is read during a window


class Companion(Protocol):
    """Work that runs beside a target's clients during its windows (warm-up included)."""

    def start(self) -> None: ...

    def stop(self) -> None:
        """Stop and wait for the request in flight, so the next window starts clean."""


@dataclasses.dataclass(frozen=True)
class LoadTarget:
    """One phase's load: where it goes, what it sends, how answers are labelled, whose CPU and memory
    are counted, and what runs beside it."""

    name: str
    base_url: str
    requests: Sequence[BenchRequest]
    labeller: Labeller | None = None
    server: Child | None = None
    companion: Companion | None = None


@dataclasses.dataclass
class _Window:
    """Raw figures of one measured window."""

    latencies: list[float]
    labels: list[str]
    errors: int
    samples: list[str]
    duration_s: float
    client_cpu_s: float
    server_cpu_s: float | None
    loadavg: float | None
    peak_rss_bytes: int | None


def _measure(target: LoadTarget, *, clients: int, duration_s: float, warmup_s: float) -> _Window:
    """``clients`` threads, one keep-alive ``httpx.Client`` each, walk the target's requests cyclically
    (from spread-out offsets) for ``warmup_s`` unmeasured then ``duration_s`` measured seconds.

    A request counts when it starts inside the measured window; its latency is
    ``perf_counter`` around the call, body read included. Errors are non-2xx
    answers and transport exceptions.
    """
    requests = target.requests
    if not requests:
        raise BenchError(f"{target.name}: no requests to send")
    window: dict[str, float] = {}
    barrier = threading.Barrier(clients + 1)
    results: list[dict[str, Any]] = [{} for _ in range(clients)]
    headers = {"content-type": "application/json", "accept": "application/json"}

    def client_loop(idx: int) -> None:
        latencies: list[float] = []
        labels: list[str] = []
        errors = 0
        samples: list[str] = []
        j = idx * len(requests) // clients
        with httpx.Client(base_url=target.base_url, timeout=30.0, headers=headers) as client:
            barrier.wait()
            start, end = window["start"], window["end"]
            while True:
                t0 = time.perf_counter()
                if t0 >= end:
                    break
                req = requests[j % len(requests)]
                j += 1
                label = ""
                ok = False
                try:
                    response = client.request(req.method, req.path, content=req.body)
                    ok = 200 <= response.status_code < 300
                    if ok and target.labeller is not None:
                        label = target.labeller(response)
                    elif not ok and len(samples) < 5:
                        samples.append(f"{req.method} {req.path}: {response.status_code} {response.text[:200]}")
                except (httpx.HTTPError, ValueError) as exc:
                    if len(samples) < 5:
                        samples.append(f"{req.method} {req.path}: {type(exc).__name__}: {exc}")
                t1 = time.perf_counter()
                if t0 < start:
                    continue
                if ok:
                    latencies.append(t1 - t0)
                    labels.append(label)
                else:
                    errors += 1
        results[idx] = {"latencies": latencies, "labels": labels, "errors": errors, "samples": samples}

    threads = [threading.Thread(target=client_loop, args=(i,), name=f"bench-client-{i}") for i in range(clients)]
    for t in threads:
        t.start()
    begin = time.perf_counter()
    window["start"] = begin + warmup_s
    window["end"] = begin + warmup_s + duration_s
    if target.companion is not None:
        target.companion.start()
    barrier.wait()
    server = target.server
    time.sleep(max(0.0, window["start"] - time.perf_counter()))
    cpu0, server0 = time.process_time(), server.cpu_seconds() if server else None
    peak_rss = _peak_rss(server, window["end"]) if server else None
    cpu1, server1 = time.process_time(), server.cpu_seconds() if server else None
    for t in threads:
        t.join()
    if target.companion is not None:
        target.companion.stop()
    return _Window(
        latencies=[x for r in results for x in r["latencies"]],
        labels=[x for r in results for x in r["labels"]],
        errors=sum(r["errors"] for r in results),
        samples=[x for r in results for x in r["samples"]][:5],
        duration_s=duration_s,
        client_cpu_s=cpu1 - cpu0,
        server_cpu_s=server1 - server0 if server0 is not None and server1 is not None else None,
        loadavg=os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        peak_rss_bytes=peak_rss,
    )


def _peak_rss(server: Child, until: float) -> int | None:
    """The most resident memory of ``server``'s process tree seen until ``until`` (perf_counter)."""
    peak: int | None = None
    while True:
        rss = server.rss_bytes()
        if rss is not None:
            peak = rss if peak is None else max(peak, rss)
        left = until - time.perf_counter()
        if left <= 0:
            return peak
        time.sleep(min(RSS_SAMPLE_S, left))


def _summarize(target: LoadTarget, windows: list[_Window]) -> dict[str, Any]:
    """One phase's report from its windows: throughput, latency percentiles, CPU use, per-label breakdown.

    CPU time of this process (the clients) and of the server's process tree, and
    the 1-minute load average, tell whether the clients or other work on the
    machine limited the figures; the peak resident memory is the server tree's.
    """
    latencies = [x for w in windows for x in w.latencies]
    labels = [x for w in windows for x in w.labels]
    errors = sum(w.errors for w in windows)
    duration = sum(w.duration_s for w in windows)
    done = len(latencies) + errors
    server_cpu = [w.server_cpu_s for w in windows]
    loads = [w.loadavg for w in windows if w.loadavg is not None]
    peaks = [w.peak_rss_bytes for w in windows if w.peak_rss_bytes is not None]
    out: dict[str, Any] = {
        "requests": done,
        "errors": errors,
        "duration_s": round(duration, 3),
        "windows": len(windows),
        "rps": round(len(latencies) / duration, 1),
        **latency_summary(latencies),
        "client_cpu_fraction": round(sum(w.client_cpu_s for w in windows) / duration, 2),
        "server_cpu_fraction": None,
        "server_cpu_ms_per_request": None,
        "loadavg_1m": round(sum(loads) / len(loads), 2) if loads else None,
        "server_peak_rss_mb": round(max(peaks) / 2**20, 1) if peaks else None,
        "error_samples": [x for w in windows for x in w.samples][:5],
    }
    if server_cpu and all(c is not None for c in server_cpu):
        total = sum(c for c in server_cpu if c is not None)
        out["server_cpu_fraction"] = round(total / duration, 2)
        if done:
            out["server_cpu_ms_per_request"] = round(total * 1000 / done, 3)
    if target.labeller is not None:
        by_label: dict[str, list[float]] = {}
        for latency, label in zip(latencies, labels, strict=True):
            by_label.setdefault(label, []).append(latency)
        out["by_label"] = {k: latency_summary(v) for k, v in sorted(by_label.items())}
    return out


def drive_load(
    targets: Sequence[LoadTarget], *, clients: int, duration_s: float, warmup_s: float = 1.0, rounds: int = 1
) -> dict[str, dict[str, Any]]:
    """Give every target ``duration_s`` measured seconds, in ``rounds`` windows taken in turn
    (A B C A B C ...), so that a change of the machine's background load during the
    run touches every phase alike. The first window of each target is preceded by
    ``warmup_s`` unmeasured seconds, later ones by a short re-warm of fresh connections.
    """
    windows: dict[str, list[_Window]] = {t.name: [] for t in targets}
    for r in range(rounds):
        for target in targets:
            warm = warmup_s if r == 0 else min(warmup_s, 0.25)
            windows[target.name].append(
                _measure(target, clients=clients, duration_s=duration_s / rounds, warmup_s=warm)
            )
    return {t.name: _summarize(t, windows[t.name]) for t in targets}


def lookup_requests(plan: WorkloadPlan, *, miss_fraction: float, seed: int = 0) -> list[BenchRequest]:
    """The cyclic lookup sequence: seeded tuned keys, and ``miss_fraction`` misses
    (alternately never-seeded workloads and seeded ones without a tuned config)."""
    rng = random.Random(seed + 3)
    misses = [plan.miss_bodies, plan.untuned_bodies]
    misses = [m for m in misses if m]
    if not plan.hit_bodies and not misses:
        raise BenchError("no lookup bodies: seed at least one workload")
    out: list[BenchRequest] = []
    for j in range(SEQUENCE_LENGTH):
        if plan.hit_bodies and (rng.random() >= miss_fraction or not misses):
            body = rng.choice(plan.hit_bodies)
        else:
            body = rng.choice(misses[j % len(misses)])
        out.append(BenchRequest("POST", "/v1/lookup", body))
    return out


def history_requests(keys: Sequence[str], limit: int) -> list[BenchRequest]:
    return [BenchRequest("GET", f"/v1/workloads/{key}/history?limit={limit}") for key in keys]
