"""``tiletune up``: the whole service on one machine, for a newcomer or a laptop.

It applies the migrations to the database (the SQLite default unless told
otherwise), starts the API server and one tuning worker as child processes,
queues a preset (``cpu-demo``) for tuning on this machine's backend, shows the
job's progress and, once it is tuned, prints a lookup to paste. Ctrl-C (or
SIGTERM) stops both children cleanly: the worker finishes its trial in flight
and gives the job back, the server drains; a second Ctrl-C abandons the trial.

The children run in their own sessions so that a Ctrl-C in the terminal reaches
them once, through this process, and their output goes to log files (named at
start) so the progress display stays readable.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import IO, Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

STOP_GRACE_S = 60.0  # a worker finishing its trial in flight, a server draining


@dataclasses.dataclass
class UpOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    database_url: str = "sqlite:///./tiletune.db"
    backend: str = "auto"
    preset: str | None = "cpu-demo"
    trials: int = 40
    exit_when_tuned: bool = False
    ready_timeout_s: float = 60.0
    log_dir: Path | None = None


class _Child:
    """A child process of ``up`` with its log file."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log = log
        self._out: IO[bytes] = log.open("wb")
        self.proc = subprocess.Popen(argv, stdout=self._out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            self.proc.send_signal(sig)

    def wait(self, timeout_s: float) -> int | None:
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait(10)

    def tail(self, lines: int = 15) -> str:
        self._out.flush()
        text = self.log.read_text(errors="replace").rstrip().splitlines()
        return "\n".join(text[-lines:])

    def close(self) -> None:
        self._out.close()


def lookup_example(base_url: str, workload: Any, versions: dict[str, str | None], preset: str) -> str:
    """A curl command that looks up ``workload`` (given by its preset) on the server."""
    body = {
        "workload": {
            "device_kind": workload.device_kind,
            "backend": workload.backend,
            "dtype": workload.dtype,
            "preset": preset,
        },
        "versions": {k: v for k, v in versions.items() if v is not None},
    }
    return (
        f"curl -s {base_url}/v1/lookup -H 'content-type: application/json' "
        f"-d {shlex.quote(json.dumps(body, separators=(',', ':')))}"
    )


def run_up(o: UpOptions, console: Console) -> int:
    """Run the service until Ctrl-C (or, with ``exit_when_tuned``, until the job ends); the exit code."""
    from autotune.device import probe_device
    from autotune.tune import local_workload, software_versions
    from kernel.attention import resolve_backend
    from kernel.config import TileConfig
    from server import jobs, store
    from server.db import Database
    from server.migrate import upgrade

    start = time.monotonic()
    stop = threading.Event()
    signals = {"n": 0}

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        signals["n"] += 1
        stop.set()

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    log_dir = o.log_dir or Path(tempfile.mkdtemp(prefix="tiletune-up-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    base_url = f"http://{o.host}:{o.port}"
    env = {**os.environ, "TILETUNE_DATABASE_URL": o.database_url, "PYTHONUNBUFFERED": "1"}
    children: list[_Child] = []
    db = None
    try:
        console.print(f"database {o.database_url}: applying migrations")
        upgrade(o.database_url)
        cli = [sys.executable, "-m", "autotune.cli"]
        server = _Child(
            "server",
            [*cli, "serve", "--host", o.host, "--port", str(o.port), "--no-migrate"],
            log_dir / "server.log",
            env,
        )
        children.append(server)
        _wait_ready(server, base_url, o.ready_timeout_s, stop)
        console.print(f"server on {base_url} (API docs at {base_url}/docs; log {server.log})")
        device = probe_device()
        backend = resolve_backend(o.backend, device.platform)
        worker = _Child(
            "worker",
            [*cli, "worker", "--database-url", o.database_url, "--backend", backend, "--poll", "1"],
            log_dir / "worker.log",
            env,
        )
        children.append(worker)
        console.print(f"worker for {backend} jobs on {device.kind!r} (log {worker.log})")
        if o.preset is None:
            console.print("service up; Ctrl-C stops it")
            return _watch(children, stop, console)
        workload = local_workload(None, o.preset, backend, None, 1)
        versions = software_versions()
        db = Database(o.database_url)
        with db.sessions() as session:
            row = store.workload_row(session, workload)
            tuned = store.current_config(session, row.id)
            job_id = None
            if tuned is None:
                job, created = jobs.enqueue_job(session, row, budget=o.trials, requested_by="tiletune up")
                job_id = job.id
                console.print(
                    f"{'queued' if created else 'already queued:'} job {job.id}: {o.preset} on "
                    f"{workload.device_kind} ({workload.backend}, {workload.dtype}), {o.trials} trials"
                )
        example = lookup_example(base_url, workload, versions, o.preset)
        if job_id is None:
            console.print(f"{o.preset} is tuned already (tuned config {tuned.id if tuned else '?'}); look it up with:")
            console.print(example, soft_wrap=True, highlight=False)
        else:
            status = _follow(db, job_id, o.trials, children, stop, console)
            if status == "done":
                with db.sessions() as session:
                    current = store.current_config(session, row.id)
                    assert current is not None
                    speed = f", {current.speedup:.2f}x over dense" if current.speedup else ""
                    console.print(
                        f"[bold]tuned[/bold] {o.preset} in {time.monotonic() - start:.0f} s from start: "
                        f"{TileConfig.from_dict(current.config).describe()} {current.median_ms:.3f} ms{speed}"
                    )
                console.print("look it up with:")
                console.print(example, soft_wrap=True, highlight=False)
            elif status is not None:
                console.print(f"[red]job {job_id} ended {status}[/red]; see {worker.log}")
                if o.exit_when_tuned:
                    return 1
        if o.exit_when_tuned or stop.is_set():
            return 0 if not _dead(children, console) else 1
        console.print("service up; Ctrl-C stops it")
        return _watch(children, stop, console)
    finally:
        if db is not None:
            db.dispose()
        _stop_children(children, signals, console)
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _wait_ready(server: _Child, base_url: str, timeout_s: float, stop: threading.Event) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not stop.is_set():
        if not server.alive():
            raise RuntimeError(f"the server exited before it was ready:\n{server.tail()}")
        try:
            if httpx.get(f"{base_url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    if not stop.is_set():
        raise RuntimeError(f"the server did not answer {base_url}/healthz within {timeout_s:g} s:\n{server.tail()}")


def _dead(children: list[_Child], console: Console) -> bool:
    dead = [c for c in children if not c.alive()]
    for c in dead:
        console.print(f"[red]the {c.name} exited (code {c.proc.returncode}):[/red]\n{c.tail()}")
    return bool(dead)


def _follow(
    db: Any, job_id: int, budget: int, children: list[_Child], stop: threading.Event, console: Console
) -> str | None:
    """Show the job's progress until it ends (its final status) or we are stopped (None)."""
    from server import jobs, models

    progress = Progress(
        TextColumn("tuning"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("{task.fields[best]}"),
        TextColumn("{task.fields[state]}"),
        TimeElapsedColumn(),
        console=console,
    )
    task = progress.add_task("job", total=budget, best="best -", state="queued")
    with progress:
        while not stop.wait(0.5):
            if _dead(children, console):
                return "failed (a child process died)"
            with db.read_sessions() as session:
                job = session.get(models.Job, job_id)
                assert job is not None
                p = jobs.job_progress(session, [job_id])[job_id]
                status = job.status
            best = f"best {p.best_ms:.3f} ms" if p.best_ms is not None else "best -"
            progress.update(task, completed=min(p.trials_done, budget), best=best, state=status)
            if status in ("done", "failed", "cancelled"):
                return status
    return None


def _watch(children: list[_Child], stop: threading.Event, console: Console) -> int:
    while not stop.wait(1.0):
        if _dead(children, console):
            return 1
    return 0


def _stop_children(children: list[_Child], signals: dict[str, int], console: Console) -> None:
    """SIGTERM to each child (the worker first: it gives its job back); a second
    Ctrl-C meanwhile is passed on (the worker abandons its trial); kill at the end."""
    if any(c.alive() for c in children):
        console.print("stopping the worker and the server")
    for c in reversed(children):
        c.signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    forwarded = signals["n"]
    while time.monotonic() < deadline and any(c.alive() for c in children):
        if signals["n"] > forwarded:
            forwarded = signals["n"]
            for c in children:
                c.signal(signal.SIGTERM)
        time.sleep(0.1)
    for c in children:
        if c.alive():
            console.print(f"the {c.name} did not stop within {STOP_GRACE_S:g} s: killed")
        c.kill()
        c.close()
