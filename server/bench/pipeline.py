"""``tiletune bench pipeline``: does compiling ahead keep a TPU busy, and how fast do compile workers go?

Two figures, both on this machine with real compiles for a TPU generation (libtpu's
compile-only targets) and no TPU:

1. **Device-busy fraction**, a search on the ``tpu`` backend against a replayed device
   (:class:`autotune.pipeline.ReplayedDevice`: compiles real, device time modelled),
   compiling in line (``lookahead`` 0: propose, compile, run) against the pipeline
   (the search proposes ``lookahead`` configs ahead and ``processes`` compiling
   processes prepare them while the device runs). Both modes run with the same seed in
   interleaved rounds (each round runs both, in a fresh random order). Compile times
   differ from config to config by 10x and more, so both modes must measure the same
   configs: the bench's sampler is ``random`` by default (after the warm start), whose
   proposals do not depend on results, and the report says whether the sequences matched. Reported per
   mode: the device-busy fraction (medians over rounds), and the seconds the device
   waited for a compile after the first trial (the first wait is the pipeline filling).
2. **Compile throughput** of a compile worker (``tiletune worker --compile-only``) with
   1, 2 and ``processes`` compiling processes: verdicts per minute on a queued TPU job of
   the same workload, the processes' start-up included, against a temporary SQLite
   database.

The device model decides how much there is to overlap: a trial that keeps the device
busy for less than a compile takes on the host can only be kept busy by enough
compiling processes; the report gives both so the reader sees which case it is.
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.compare import interleaved
from autotune.compile_pool import CompilePool
from autotune.pipeline import ReplayedDevice
from autotune.search import SearchOptions, run_search
from autotune.space import SearchSpace
from autotune.versions import software_versions
from kernel.presets import get_preset
from kernel.tpu_targets import require_libtpu, tpu_target
from kernel.workload import Workload
from server.store import queue, workloads
from server.store.db import Database
from server.store.migrate import upgrade
from server.worker.compile_worker import CompileWorker, CompileWorkerOptions


@dataclasses.dataclass(frozen=True)
class PipelineBenchOptions:
    preset: str = "cpu-demo"
    generation: str = "v6e"
    trials: int = 12  # measured configs per search
    processes: int = 2  # compiling processes of the pipeline (one per free core)
    lookahead: int = 2
    trial_s: float = 1.0  # device seconds per trial besides its timed runs (see autotune.pipeline)
    runs: int = 10
    rounds: int = 2
    seed: int = 0
    worker_configs: int = 12  # verdicts per compile-worker measurement (0: skip that part)
    sampler: str = "random"  # proposals independent of results: both modes measure the same configs


def tpu_workload(preset: str, generation: str) -> Workload:
    p = get_preset(preset)
    return Workload(tpu_target(generation).device_kind, "tpu", p.dtype, 1, p.head_dim, p.pattern())


def _search_once(workload: Workload, opts: PipelineBenchOptions, lookahead: int, seed: int) -> dict[str, Any]:
    processes = opts.processes if lookahead > 0 else 1
    with CompilePool(workload, processes) as pool:
        # Every compiling process is up before the clock starts (one warm-up compile each, at once).
        first = SearchSpace(workload, "tpu").enumerate()[0]
        for warm in [pool.submit(first) for _ in range(processes)]:
            warm.result()
        device = ReplayedDevice(workload, pool, runs=opts.runs, trial_s=opts.trial_s)
        options = SearchOptions(trials=opts.trials, sampler=opts.sampler, seed=seed, lookahead=lookahead, prune=False)
        start = time.monotonic()
        result = run_search(SearchSpace(workload, "tpu"), device, options, finalize=False)
        wall = time.monotonic() - start
    log = device.log
    compiles = [c.compile_s for c in log.compiles if c.ok]
    return {
        "trials": len(result.trials),
        "wall_s": wall,
        "busy_fraction": log.busy_fraction,
        "busy_s": log.busy_s,
        "device_s_per_trial": log.busy_s / len(result.trials) if result.trials else None,
        "waiting_s": log.waiting_s,
        "waiting_after_first_s": sum(log.waits_s[1:]),
        "refused": sum(not c.ok for c in log.compiles),
        "configs": [t.config.key for t in result.trials],
        "waits_s": [round(w, 4) for w in log.waits_s],  # per trial, in order
        "compile_s": [round(c.compile_s, 4) for c in log.compiles],
        "median_compile_s": statistics.median(compiles) if compiles else None,
    }


def compile_worker_rate(workload: Workload, processes: int, configs: int) -> dict[str, Any]:
    """Verdicts per minute of one compile worker on a fresh queued job of ``workload``."""
    with tempfile.TemporaryDirectory(prefix="tiletune-bench-pipeline-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'compile.db'}"
        upgrade(url)
        db = Database(url)
        try:
            with db.transaction() as session:
                queue.enqueue_job(session, workloads.workload_row(session, workload), budget=configs)
            worker = CompileWorker(
                CompileWorkerOptions(url, processes=processes, exit_when_idle=True, max_configs=configs)
            )
            start = time.monotonic()
            try:
                jobs = worker.run()
            finally:
                worker.close()
            wall = time.monotonic() - start
        finally:
            db.dispose()
    verdicts = sum(j.compiled for j in jobs)
    return {
        "processes": processes,
        "verdicts": verdicts,
        "refused": sum(j.refused for j in jobs),
        "wall_s": wall,
        "per_minute": verdicts / wall * 60 if wall > 0 else None,
    }


def run_pipeline_bench(opts: PipelineBenchOptions, progress: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    require_libtpu()
    workload = tpu_workload(opts.preset, opts.generation)
    modes = {"inline": 0, "pipelined": opts.lookahead}
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    visit = {"n": 0}

    def one(mode: str) -> list[float]:
        visit["n"] += 1
        progress(f"search {visit['n']}/{len(modes) * opts.rounds}: {mode}, {opts.trials} trials")
        row = _search_once(workload, opts, modes[mode], opts.seed)
        runs[mode].append(row)
        return [row["busy_fraction"]]

    interleaved(list(modes), one, opts.rounds, opts.seed)
    summary = {}
    for mode, rows in runs.items():
        summary[mode] = {
            "busy_fraction": statistics.median(r["busy_fraction"] for r in rows),
            "busy_fraction_runs": [round(r["busy_fraction"], 4) for r in rows],
            "waiting_after_first_s": statistics.median(r["waiting_after_first_s"] for r in rows),
            "wall_s": statistics.median(r["wall_s"] for r in rows),
            "median_compile_s": statistics.median(r["median_compile_s"] or 0.0 for r in rows),
            "device_s_per_trial": statistics.median(r["device_s_per_trial"] or 0.0 for r in rows),
            "runs": rows,
        }
    # Whether compiling can keep up at all: configs the pipeline's processes compile per second
    # (at the compile time the in-line mode saw, one process alone) against trials the device runs.
    solo = summary["inline"]["median_compile_s"]
    device = summary["inline"]["device_s_per_trial"]
    rates = []
    if opts.worker_configs:
        for processes in sorted({1, 2, opts.processes}):
            progress(f"compile worker with {processes} process(es): {opts.worker_configs} configs")
            rates.append(compile_worker_rate(workload, processes, opts.worker_configs))
    return {
        "options": dataclasses.asdict(opts),
        "device_kind": workload.device_kind,
        "versions": software_versions("tpu"),
        "modes": summary,
        "same_configs": len({tuple(r["configs"]) for rows in runs.values() for r in rows}) == 1,
        "compile_capacity_per_s": opts.processes / solo if solo else None,
        "device_trials_per_s": 1 / device if device else None,
        "compile_worker": rates,
    }


def print_pipeline_report(report: dict[str, Any], out: Any) -> None:
    from rich.table import Table

    o = report["options"]
    out.print(
        f"[bold]{o['preset']}[/bold] on {report['device_kind']} (compiles real, device replayed: "
        f"{o['trial_s']} s + {o['runs']} modelled runs per trial), {o['trials']} trials, {o['rounds']} round(s)"
    )
    table = Table("mode", "device busy", "per round", "waited after the 1st trial s", "wall s", "median compile s")
    for mode, s in report["modes"].items():
        table.add_row(
            mode,
            f"{s['busy_fraction']:.1%}",
            ", ".join(f"{b:.1%}" for b in s["busy_fraction_runs"]),
            f"{s['waiting_after_first_s']:.2f}",
            f"{s['wall_s']:.1f}",
            f"{s['median_compile_s']:.2f}",
        )
    out.print(table)
    if not report["same_configs"]:
        out.print("[yellow]the modes measured different configs: their compile times are not comparable[/yellow]")
    capacity, demand = report["compile_capacity_per_s"], report["device_trials_per_s"]
    if capacity and demand:
        verdict = "can keep the device busy" if capacity >= demand else "cannot keep the device busy"
        out.print(
            f"{o['processes']} compiling process(es) at the in-line compile time: {capacity:.2f} configs/s; "
            f"the device runs {demand:.2f} trials/s: compiling ahead {verdict} on this host"
        )
    for rate in report["compile_worker"]:
        out.print(
            f"compile worker, {rate['processes']} process(es): {rate['verdicts']} verdicts "
            f"({rate['refused']} refused) in {rate['wall_s']:.1f} s = {rate['per_minute']:.1f} configs/min"
        )
