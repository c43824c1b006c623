"""``tiletune bench workers``: jobs per minute of the job queue as worker processes are added.

For each worker count N the bench empties the database's ``tt_*`` tables,
starts N ``tiletune worker --backend replay`` processes on an empty queue, then
queues ``jobs_per_worker * N`` jobs at once and times until every one is done.
The replay backend answers each trial from a recorded table and sleeps
``replay_sleep`` of its recorded compile + run time: that sleep stands for the
device time of a real worker (on a TPU VM the host CPU waits while the TPU
runs), so what the bench measures is the coordination around it -- claims,
leases, trial reservations, the shared Optuna storage -- and how it scales.

Scaling efficiency at N workers = (jobs per minute at N / N) / (jobs per minute
at 1 worker), measured in the same run. With ``rounds`` > 1 the worker counts
take turns (1, 2, 4, 1, 2, 4, ...) so a drift of the machine's background load
touches all alike, and each count reports its median.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.replay import RecordedTable

DEFAULT_TABLE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "tables" / "small-mixed.xla.json"


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


def run_workers_bench(o: WorkersBenchOptions, progress: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    from server.db import Database
    from server.migrate import upgrade

    if not o.table.is_file():
        raise ValueError(f"--table {o.table} does not exist (record one with tiletune bench search --record)")
    tmp = None
    url = o.database_url
    if url is None:
        tmp = tempfile.TemporaryDirectory(prefix="tiletune-bench-workers-")
        url = f"sqlite:///{Path(tmp.name) / 'bench.db'}"
    upgrade(url)
    db = Database(url)
    table = RecordedTable.load(o.table)
    per_trial_s = sum((m.compile_ms or 0) + sum(m.runs_ms) for _c, m in table.entries.values()) / 1e3
    per_trial_s = per_trial_s / len(table.entries) * o.replay_sleep
    measured: dict[int, list[dict[str, Any]]] = {n: [] for n in o.workers}
    try:
        for i in range(o.rounds):
            for n in o.workers:
                progress(f"round {i + 1}/{o.rounds}, {n} worker(s): starting")
                measured[n].append(_one_run(db, url, n, o, table, progress))
    finally:
        db.dispose()
        if tmp is not None:
            tmp.cleanup()
    runs: list[dict[str, Any]] = []
    for n in o.workers:
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
            "jobs_per_worker": o.jobs_per_worker,
            "budget": o.budget,
            "replay_sleep": o.replay_sleep,
            "replayed_seconds_per_trial": round(per_trial_s, 4),
            "table": o.table.name,
            "rounds": o.rounds,
            "cpus": os.cpu_count(),
        },
        "runs": runs,
    }


def _one_run(db: Any, url: str, n: int, o: WorkersBenchOptions, table: RecordedTable, progress: Any) -> dict[str, Any]:
    from server import jobs, models, store

    db.empty_tables()
    argv = [sys.executable, "-m", "autotune.cli", "worker", "--database-url", url, "--backend", "replay"]
    argv += ["--replay-table", str(o.table), "--replay-sleep", str(o.replay_sleep), "--poll", "0.2", "--quiet"]
    logs = tempfile.TemporaryDirectory(prefix="tiletune-bench-workers-logs-")
    paths = [Path(logs.name) / f"worker-{i}.log" for i in range(n)]
    procs = [
        subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=path.open("wb"), start_new_session=True)
        for path in paths
    ]
    try:
        _wait_started(procs, paths, o.timeout_s)
        count = o.jobs_per_worker * n
        t0 = time.perf_counter()
        with db.sessions() as session:
            for i in range(count):
                wl = dataclasses.replace(table.workload, batch=1 + i)
                jobs.enqueue_job(session, store.workload_row(session, wl), budget=o.budget)
        deadline = time.monotonic() + o.timeout_s
        while True:
            with db.read_sessions() as session:
                done = session.query(models.Job).filter(models.Job.status.in_(("done", "failed"))).count()
            progress(f"{n} worker(s): {done}/{count} jobs")
            if done == count:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{n} workers: {done}/{count} jobs after {o.timeout_s:g} s")
            dead = [i for i, p in enumerate(procs) if p.poll() is not None]
            if dead:
                tail = paths[dead[0]].read_text(errors="replace")[-2000:]
                raise RuntimeError(f"a worker exited early (code {procs[dead[0]].returncode}):\n{tail}")
            time.sleep(0.1)
        wall = time.perf_counter() - t0
        with db.read_sessions() as session:
            failed = session.query(models.Job).filter(models.Job.status == "failed").count()
            trials = session.query(models.Trial).filter(models.Trial.status != "invalid").count()
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
        logs.cleanup()
    return {
        "workers": n,
        "jobs": count,
        "failed": failed,
        "trials": trials,
        "seconds": round(wall, 3),
        "jobs_per_minute": round(count / wall * 60, 2),
    }


def _wait_started(procs: list[subprocess.Popen[bytes]], logs: list[Path], timeout_s: float) -> None:
    """Until every worker logged its first line (it has imported everything and claims)."""
    deadline = time.monotonic() + timeout_s
    for p, log in zip(procs, logs, strict=True):
        while b"claiming" not in log.read_bytes():
            if p.poll() is not None:
                raise RuntimeError(f"a worker exited at start (code {p.returncode}):\n{log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"a worker did not start within {timeout_s:g} s")
            time.sleep(0.1)
