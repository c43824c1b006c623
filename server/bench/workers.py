"""``tiletune bench workers``: jobs per minute of the job queue as worker processes are added.

For each worker count N the bench empties the database's ``tt_*`` tables,
starts N ``tiletune worker --backend replay`` processes on an empty queue, then
queues ``jobs_per_worker * N`` jobs at once and times until every one is done.
The replay backend answers each trial from a recorded table and sleeps
``replay_sleep`` of its recorded compile + run time: that sleep stands for the
device time of a real worker (on a TPU VM the host CPU waits while the TPU
runs), so what the bench measures is the coordination around it -- claims,
leases, trial reservations, the shared Optuna storage -- and how it scales.

Jobs per minute counts the jobs that ended ``done`` (failed ones are reported
apart, never as throughput). Scaling efficiency at N workers = (jobs per minute
at N / N) / (jobs per minute at 1 worker), measured in the same run. With
``rounds`` > 1 the worker counts take turns in interleaved rounds (each round
runs every count once, in a fresh random order) so a drift of the machine's
background load touches all alike, and each count reports its median.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.compare import interleaved
from autotune.replay import RecordedTable, bundled_table
from server.bench.harness import Child, tiletune_command
from server.store import models, queue, workloads
from server.store.db import Database
from server.store.migrate import upgrade

DEFAULT_TABLE = bundled_table("small-mixed.xla.json")


@dataclasses.dataclass
class WorkersBenchOptions:
    database_url: str | None = None  # None: a temporary SQLite file
    workers: tuple[int, ...] = (1, 2, 4)
    jobs_per_worker: int = 4
    budget: int = 8
    replay_sleep: float = 1.0
    table: Path = DEFAULT_TABLE
    timeout_s: float = 900.0
    rounds: int = 1
    seed: int = 0  # the order the worker counts take in each round


def run_workers_bench(
    options: WorkersBenchOptions, progress: Callable[[str], None] = lambda _m: None
) -> dict[str, Any]:
    if not options.table.is_file():
        raise ValueError(f"--table {options.table} does not exist (record one with tiletune bench search --record)")
    tmp = None
    url = options.database_url
    if url is None:
        tmp = tempfile.TemporaryDirectory(prefix="tiletune-bench-workers-")
        url = f"sqlite:///{Path(tmp.name) / 'bench.db'}"
    upgrade(url)
    db = Database(url)
    table = RecordedTable.load(options.table)
    per_trial_s = sum((m.compile_ms or 0) + sum(m.runs_ms) for _c, m in table.entries.values()) / 1e3
    per_trial_s = per_trial_s / len(table.entries) * options.replay_sleep
    visits = {"n": 0}
    total = options.rounds * len(set(options.workers))

    def visit(n: int) -> list[dict[str, Any]]:
        visits["n"] += 1
        progress(f"run {visits['n']}/{total}, {n} worker(s): starting")
        return [_one_run(db, url, n, options, table, progress)]

    try:
        measured = interleaved(options.workers, visit, options.rounds, seed=options.seed)
    finally:
        db.dispose()
        if tmp is not None:
            tmp.cleanup()
    runs: list[dict[str, Any]] = []
    for n in measured:
        ordered = sorted(measured[n], key=lambda run: run["jobs_per_minute"])
        median = dict(ordered[len(ordered) // 2])
        median["rounds_jobs_per_minute"] = [run["jobs_per_minute"] for run in measured[n]]
        runs.append(median)
    base = runs[0]["jobs_per_minute"] if runs and runs[0]["workers"] == 1 else None
    for run in runs:
        run["efficiency"] = (run["jobs_per_minute"] / run["workers"] / base) if base else None
    return {
        "options": {
            "database": db.dialect,
            "database_url": url.split("@")[-1],
            "jobs_per_worker": options.jobs_per_worker,
            "budget": options.budget,
            "replay_sleep": options.replay_sleep,
            "replayed_seconds_per_trial": round(per_trial_s, 4),
            "table": options.table.name,
            "rounds": options.rounds,
            "cpus": os.cpu_count(),
        },
        "runs": runs,
    }


def _one_run(
    db: Database, url: str, n: int, options: WorkersBenchOptions, table: RecordedTable, progress: Any
) -> dict[str, Any]:
    db.empty_tables()
    args = ["worker", "--database-url", url, "--backend", "replay", "--replay-table", str(options.table)]
    args += ["--replay-sleep", str(options.replay_sleep), "--poll", "0.2", "--quiet"]
    workers = [Child(f"worker {i}", tiletune_command(*args)) for i in range(n)]
    try:
        for w in workers:  # every worker has imported everything and claims
            w.wait_for_output("claiming", options.timeout_s)
        count = options.jobs_per_worker * n
        t0 = time.perf_counter()
        with db.transaction() as session:
            for i in range(count):
                wl = dataclasses.replace(table.workload, batch=1 + i)
                queue.enqueue_job(session, workloads.workload_row(session, wl), budget=options.budget)
        deadline = time.monotonic() + options.timeout_s
        while True:
            with db.read_sessions() as session:
                ended = session.query(models.Job).filter(models.Job.status.in_(("done", "failed"))).count()
            progress(f"{n} worker(s): {ended}/{count} jobs")
            if ended == count:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{n} workers: {ended}/{count} jobs after {options.timeout_s:g} s")
            dead = [w for w in workers if not w.alive()]
            if dead:
                raise RuntimeError(f"{dead[0].name} exited early (code {dead[0].returncode}):\n{dead[0].tail()}")
            time.sleep(0.1)
        wall = time.perf_counter() - t0
        with db.read_sessions() as session:
            failed = session.query(models.Job).filter(models.Job.status == "failed").count()
            done = count - failed
            trials = session.query(models.Trial).filter(models.Trial.status != "invalid").count()
    finally:
        for w in workers:
            w.signal(signal.SIGTERM)
        for w in workers:
            w.stop(grace_s=60)
    return {
        "workers": n,
        "jobs": count,
        "done": done,
        "failed": failed,
        "trials": trials,
        "seconds": round(wall, 3),
        "jobs_per_minute": round(done / wall * 60, 2),  # failed jobs are not throughput
    }


def print_workers_report(report: dict[str, Any], out: Any) -> None:
    """The report as a rich table on ``out`` (a rich Console)."""
    from rich.table import Table

    opts = report["options"]
    out.print(
        f"[bold]tiletune bench workers[/bold] on {opts['database']} ({opts['database_url']}), replay of "
        f"{opts['table']}, {opts['jobs_per_worker']} jobs per worker x {opts['budget']} trials, "
        f"{opts['replayed_seconds_per_trial']} s slept per trial, {opts['cpus']} CPUs, median of {opts['rounds']} "
        "round(s)"
    )
    t = Table("workers", "jobs", "done", "failed", "trials", "seconds", "done/min", "each round", "scaling efficiency")
    for r in report["runs"]:
        eff = f"{r['efficiency']:.2f}" if r["efficiency"] is not None else "-"
        each = ", ".join(f"{x:.1f}" for x in r["rounds_jobs_per_minute"])
        t.add_row(str(r["workers"]), str(r["jobs"]), str(r["done"]), str(r["failed"]), str(r["trials"]),
                  f"{r['seconds']:.1f}", f"{r['jobs_per_minute']:.1f}", each, eff)  # fmt: skip
    out.print(t)
    out.print(
        "done/min: jobs that ended done per minute (failed jobs are not throughput); scaling efficiency: "
        "(done/min at N / N) / (done/min at 1 worker), measured in this run"
    )
