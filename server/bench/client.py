"""``tiletune bench client``: what a model pays for its config, beside a plain dict lookup measured in the same run.

- ``dict``: what a hand-written table of tuned block sizes costs, the floor: a
  function called with the resolver's own arguments that answers ``table[shape]``
  (the same 4-int tuple key the client's hot path uses);
- ``memory``: :meth:`TileClient.resolve` answered from its in-memory table (what
  every eager call, and every trace under ``jax.jit``, pays once the shape is known);
- ``disk``: the first resolution of a shape in a *new process* whose answer is on
  disk (the server is gone): ``--disk-calls`` fresh interpreters each import the
  client, build it and time its first ``resolve`` (the import is reported apart);
- ``server_cold``: a new client (new connection, no disk cache) asking a local
  server: uvicorn on loopback with a temporary SQLite database holding the tuned
  config, started as ``tiletune bench service`` starts it;
- ``server_warm``: the same client asking again on its kept-alive connection;
- ``hanging``: a server that accepts connections and never answers: the time
  until the heuristic is returned with ``--timeout``; the overhead beyond the
  timeout is what the client adds;
- ``refused``: nothing listening: the time until the heuristic (retries with
  back-off inside the timeout).

``dict``, ``memory`` and an empty timing loop are timed in interleaved rounds
(each round times all three, in a fresh random order) so a change of the
machine's load touches all alike; only their ratio is meaningful on a shared
machine, and it is the median over rounds of the ratio within a round, with and
without the cost of the timing loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
import timeit
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from autotune.client import TileClient
from autotune.compare import interleaved
from autotune.versions import software_versions
from kernel.config import TileConfig
from kernel.heuristic import heuristic_config
from kernel.presets import get_preset
from server.bench.harness import HOST, Child, free_port
from server.bench.load import latency_summary
from server.bench.service import APP_TARGET, serving
from server.store import records, workloads
from server.store.db import Database
from server.store.migrate import upgrade

# A tuned config unlike the heuristic, so a report can tell which one was served.
BENCH_CONFIG = TileConfig("split", 64, 64, 0, "frame_major", "frame", "all")
MEMORY_LIMIT_RATIO = 10.0  # the in-memory path must stay within 10x a dict lookup
HANG_OVERHEAD_LIMIT_MS = 250.0  # beyond the configured timeout


@dataclasses.dataclass
class ClientBenchOptions:
    preset: str = "cpu-demo"
    rounds: int = 7
    number: int = 200_000  # calls per timed round of dict / memory
    disk_calls: int = 10  # new processes, each timing its first resolution from disk
    server_calls: int = 30
    timeout_s: float = 0.5
    hang_calls: int = 3

    def check(self) -> None:
        for name in ("rounds", "number", "disk_calls", "server_calls", "hang_calls"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
        if self.timeout_s <= 0:
            raise ValueError("--timeout must be > 0")


@contextlib.contextmanager
def hanging_server() -> Iterator[str]:
    """A loopback server that accepts connections and never answers: its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    sock.settimeout(0.05)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                held.append(sock.accept()[0])

    thread = threading.Thread(target=accept, name="hanging-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        sock.close()


def _timed(fn: Callable[[], Any], calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def run_client_bench(opts: ClientBenchOptions, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measure every path (see the module docstring); the server and temporary files never outlive the call."""
    opts.check()
    say = progress or (lambda _msg: None)
    preset = get_preset(opts.preset)
    pattern = preset.pattern()
    shape = (1, pattern.num_heads, pattern.seq_len, preset.head_dim)
    backend, dtype = "xla", "float32"
    wl = TileClient.workload(pattern, shape, backend, dtype)
    heuristic = heuristic_config(pattern, backend, dtype)
    tmp = Path(tempfile.mkdtemp(prefix="tiletune-bench-client-"))
    report: dict[str, Any] = {
        "options": {**dataclasses.asdict(opts), "cpus": os.cpu_count()},
        "workload": {"key": wl.key, "shape": list(shape), "pattern": pattern.describe(), "device_kind": wl.device_kind},
    }
    try:
        say("starting a local server")
        url = f"sqlite:///{tmp / 'bench.db'}"
        upgrade(url)
        db = Database(url)
        try:
            with db.transaction() as session:
                row = workloads.workload_row(session, wl)
                records.publish_tuned_config(
                    session, row, BENCH_CONFIG.to_dict(), median_ms=1.0, versions=software_versions("xla")
                )
        finally:
            db.dispose()
        with serving(APP_TARGET, workers=1, database_url=url, name="tiletune") as server:
            base_url = server.base_url
            say("server lookups")
            cold: list[float] = []
            for _ in range(opts.server_calls):
                client = TileClient(server_url=server.base_url, cache_dir=None, timeout_s=30.0)
                t0 = time.perf_counter()
                config = client.resolve(pattern, shape, backend, dtype)
                cold.append(time.perf_counter() - t0)
                client.close()
                if config != BENCH_CONFIG:
                    raise RuntimeError(f"the server did not serve the seeded config: {config}")
            with TileClient(server_url=server.base_url, cache_dir=None, timeout_s=30.0) as client:
                client.resolve(pattern, shape, backend, dtype)

                def ask_again() -> None:
                    client.clear_memory()
                    client.resolve(pattern, shape, backend, dtype)

                warm = _timed(ask_again, opts.server_calls)
            with TileClient(server_url=server.base_url, cache_dir=tmp / "cache", timeout_s=30.0) as client:
                client.resolve(pattern, shape, backend, dtype)  # writes the disk entry
        say(f"first resolutions in {opts.disk_calls} new processes")
        # The server is gone: a request would fail (and be counted), so only the disk can answer.
        disk, imports = _first_resolutions(opts, base_url, tmp / "cache")
        say("memory lookups")
        with TileClient(server_url=base_url, cache_dir=tmp / "cache", timeout_s=opts.timeout_s) as client:
            report["lookups"] = _memory_vs_dict(client, pattern, shape, backend, dtype, opts)
            report["lookups"]["disk"] = latency_summary(disk)
            report["lookups"]["disk"]["import_client_ms"] = latency_summary(imports)["p50_ms"]
        report["lookups"]["server_cold"] = latency_summary(cold)
        report["lookups"]["server_warm"] = latency_summary(warm)

        say("hanging server")
        report["hanging"] = _unreachable(opts, pattern, shape, backend, dtype, heuristic, hang=True)
        say("refused connections")
        report["refused"] = _unreachable(opts, pattern, shape, backend, dtype, heuristic, hang=False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lookups = report["lookups"]
    per_round = lookups.pop("ratio_per_round")
    report["ratios"] = {
        **per_round,
        "disk_p50_over_dict": round(lookups["disk"]["p50_ms"] * 1e6 / lookups["dict"]["ns"], 1),
        "hang_overhead_ms": report["hanging"]["max_overhead_ms"],
    }
    report["checks"] = {
        "memory_within_10x_dict": report["ratios"]["memory_over_dict_net_of_loop"] <= MEMORY_LIMIT_RATIO,
        "hang_within_timeout_plus_250ms": report["hanging"]["max_overhead_ms"] <= HANG_OVERHEAD_LIMIT_MS,
        "fallbacks_are_the_heuristic": report["hanging"]["heuristic"] and report["refused"]["heuristic"],
    }
    return report


# One new process's first resolution: the server is gone, the answer is on disk.
FIRST_RESOLUTION = """
import json, sys, time
t0 = time.perf_counter()
from autotune.client import TileClient
from autotune.compare import interleaved
from kernel.presets import get_preset
t1 = time.perf_counter()
preset, server_url, cache_dir, timeout_s = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
pattern = get_preset(preset).pattern()
shape = (1, pattern.num_heads, pattern.seq_len, get_preset(preset).head_dim)
client = TileClient(server_url=server_url, cache_dir=cache_dir, timeout_s=timeout_s)
t2 = time.perf_counter()
config = client.resolve(pattern, shape, "xla", "float32")
t3 = time.perf_counter()
origin = client.lookup(TileClient.workload(pattern, shape, "xla", "float32")).origin
print(json.dumps({"import_s": t1 - t0, "first_resolve_s": t3 - t2, "origin": origin,
                  "requests": client.stats.get("requests", 0), "config": config.to_dict()}))
"""


def _first_resolutions(opts: ClientBenchOptions, server_url: str, cache_dir: Path) -> tuple[list[float], list[float]]:
    """(first-resolve seconds, import seconds) of ``opts.disk_calls`` new processes answered from disk."""
    resolves: list[float] = []
    imports: list[float] = []
    for _ in range(opts.disk_calls):
        argv = [sys.executable, "-c", FIRST_RESOLUTION, opts.preset, server_url, str(cache_dir), str(opts.timeout_s)]
        child = Child("first resolution", argv)
        code = child.wait(120)
        output = child.output()
        child.close()
        if code != 0:
            raise RuntimeError(f"a first resolution failed (exit {code}):\n{output[-2000:]}")
        answer = json.loads(output.strip().splitlines()[-1])
        if answer["requests"] or answer["origin"] != "disk" or TileConfig.from_dict(answer["config"]) != BENCH_CONFIG:
            raise RuntimeError(f"the disk entry was not used by a new process: {answer}")
        resolves.append(answer["first_resolve_s"])
        imports.append(answer["import_s"])
    return resolves, imports


def _memory_vs_dict(
    client: TileClient, pattern: Any, shape: tuple[int, ...], backend: str, dtype: str, opts: ClientBenchOptions
) -> dict[str, Any]:
    """Per-call ns of each statement (median and min over the rounds) and the median over rounds of
    memory / dict, each round timing both back to back. Operands are bound in timeit's setup, so
    they are locals of the timing function, as the kernel's are when it calls its resolver."""
    table = {shape: BENCH_CONFIG}

    def hand_written(pattern: Any, shape: tuple[int, ...], backend: str, dtype: str) -> TileConfig:
        return table[shape]

    scope = {"client": client, "the_table": hand_written, "the_pattern": pattern, "the_shape": shape}
    scope.update(the_backend=backend, the_dtype=dtype)
    setup = (
        "resolve, pattern, shape, backend, dtype = client.resolve, the_pattern, the_shape, the_backend, the_dtype\n"
        "tuned = the_table"
    )
    statements = {
        "empty_loop": "pass",
        "dict": "tuned(pattern, shape, backend, dtype)",
        "memory": "resolve(pattern, shape, backend, dtype)",
    }
    if client.resolve(pattern, shape, backend, dtype) != BENCH_CONFIG:
        raise RuntimeError("the in-memory table does not hold the seeded config")
    timers = {name: timeit.Timer(stmt, setup, globals=scope) for name, stmt in statements.items()}
    rounds = interleaved(statements, lambda name: [timers[name].timeit(opts.number) / opts.number * 1e9], opts.rounds)
    out: dict[str, Any] = {
        name: {"ns": round(statistics.median(v), 2), "min_ns": round(min(v), 2), "statement": statements[name]}
        for name, v in rounds.items()
    }
    pairs = list(zip(rounds["empty_loop"], rounds["dict"], rounds["memory"], strict=True))
    out["ratio_per_round"] = {
        "memory_over_dict": round(statistics.median(m / d for _, d, m in pairs), 2),
        "memory_over_dict_net_of_loop": round(statistics.median((m - e) / max(d - e, 1e-3) for e, d, m in pairs), 2),
    }
    return out


def _unreachable(
    opts: ClientBenchOptions,
    pattern: Any,
    shape: tuple[int, ...],
    backend: str,
    dtype: str,
    heuristic: TileConfig,
    *,
    hang: bool,
) -> dict[str, Any]:
    """Fresh clients (no disk cache) against a hanging server or a closed port."""
    elapsed: list[float] = []
    heuristic_every_time = True
    with contextlib.ExitStack() as stack:
        quiet = logging.getLogger("tiletune.client")  # the fallback warnings are expected here
        stack.callback(quiet.setLevel, quiet.level)
        quiet.setLevel(logging.ERROR)
        url = stack.enter_context(hanging_server()) if hang else f"http://{HOST}:{free_port()}"
        for _ in range(opts.hang_calls):
            with TileClient(server_url=url, cache_dir=None, timeout_s=opts.timeout_s) as client:
                t0 = time.perf_counter()
                config = client.resolve(pattern, shape, backend, dtype)
                elapsed.append(time.perf_counter() - t0)
                heuristic_every_time &= config == heuristic and client.lookup(client.workload(
                    pattern, shape, backend, dtype
                )).source == "fallback"  # fmt: skip
    out: dict[str, Any] = {"timeout_s": opts.timeout_s, **latency_summary(elapsed), "heuristic": heuristic_every_time}
    out["max_overhead_ms"] = round(max(e - opts.timeout_s for e in elapsed) * 1000.0, 2) if hang else None
    return out


def print_client_report(report: dict[str, Any], out: Any) -> None:
    """The report as a rich table on ``out`` (a rich Console)."""
    from rich.table import Table

    opts, w, lk, r = report["options"], report["workload"], report["lookups"], report["ratios"]
    out.print(
        f"[bold]tiletune bench client[/bold]: {w['pattern']}, shape {w['shape']} on {w['device_kind']}, "
        f"{opts['cpus']} CPUs; {opts['rounds']} interleaved rounds of {opts['number']:,} calls for dict and memory"
    )
    from rich.markup import escape

    table = Table("path", "per call", "p90", "max", "calls", "what")
    for name, what in (
        ("dict", escape(lk["dict"]["statement"] + ": a hand-written table[shape]")),
        ("memory", "TileClient.resolve, in-memory hit"),
    ):
        table.add_row(name, f"{lk[name]['ns']:.1f} ns", "-", f"min {lk[name]['min_ns']:.1f} ns", "-", what)
    for name, what in (
        ("disk", f"first resolution in a new process from disk (import: {lk['disk']['import_client_ms']:.0f} ms)"),
        ("server_cold", "new client and connection, local uvicorn + SQLite"),
        ("server_warm", "the same client asking again (keep-alive)"),
    ):
        s = lk[name]
        table.add_row(
            name, f"{s['p50_ms']:.3f} ms", f"{s['p90_ms']:.3f} ms", f"{s['max_ms']:.3f} ms", str(s["count"]), what
        )
    for name, what in (
        ("hanging", f"accepts, never answers; timeout {report['hanging']['timeout_s']:g} s"),
        ("refused", "nothing listening; retries inside the timeout"),
    ):
        s = report[name]
        table.add_row(
            name, f"{s['p50_ms']:.1f} ms", f"{s['p90_ms']:.1f} ms", f"{s['max_ms']:.1f} ms", str(s["count"]), what
        )
    out.print(table)
    out.print(
        f"memory / dict: {r['memory_over_dict']:.2f}x ({r['memory_over_dict_net_of_loop']:.2f}x net of the "
        f"{lk['empty_loop']['ns']:.1f} ns timing loop); disk p50 / dict: {r['disk_p50_over_dict']:,.0f}x; "
        f"hanging server: heuristic {r['hang_overhead_ms']:.1f} ms after the timeout at most"
    )
    failed = [name for name, ok in report["checks"].items() if not ok]
    out.print("checks: " + ("all passed" if not failed else "[red]FAILED[/red] " + ", ".join(failed)))
