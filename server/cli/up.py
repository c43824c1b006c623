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
import shlex
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from server.bench.harness import Child, child_env, tiletune_command
from server.cli.common import DatabaseOpt, err, speedups
from server.cli.common import database_url as database_url_of
from server.cli.progress import LoggedProgress
from server.cli.signals import SignalRelay

STOP_GRACE_S = 60.0  # a worker finishing its trial in flight, a server draining
FOLLOW_POLL_S = 0.5  # how often the job's progress is read
TUNED_READ_PATIENCE_S = 60.0  # the tuned config, read once the job is done, waits out an outage this long


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


def up(
    host: Annotated[str, typer.Option(help="Bind address of the server")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8000,
    database_url: DatabaseOpt = None,
    backend: Annotated[str, typer.Option(help="The local worker's backend: auto | tpu | xla | interpret")] = "auto",
    preset: Annotated[str | None, typer.Option(help="Preset queued for tuning ('' for none)")] = "cpu-demo",
    trials: Annotated[int, typer.Option(min=1, help="Trial budget of the queued job")] = 40,
    exit_when_tuned: Annotated[bool, typer.Option(help="Stop everything once the queued job is done")] = False,
    log_dir: Annotated[
        Path | None, typer.Option(help="Where the server and worker logs go (default: a new temp dir)")
    ] = None,
) -> None:
    """Run the whole service on this machine: migrations, the server, one worker, a demo job.

    Applies the migrations, starts the API server and one tuning worker on this
    machine's backend, queues PRESET (cpu-demo), shows the job's progress, prints
    a lookup to paste once it is tuned, and stops both cleanly on Ctrl-C.
    """
    options = UpOptions(
        host=host,
        port=port,
        database_url=database_url_of(database_url),
        backend=backend,
        preset=preset or None,
        trials=trials,
        exit_when_tuned=exit_when_tuned,
        log_dir=log_dir,
    )
    try:
        code = run_up(options, err)
    except (ValueError, RuntimeError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    if code:
        raise typer.Exit(code)


def run_up(options: UpOptions, console: Console) -> int:
    """Run the service until Ctrl-C (or, with ``exit_when_tuned``, until the job ends); the exit code."""
    from autotune.device import probe_device
    from autotune.versions import software_versions
    from kernel.attention import resolve_backend
    from kernel.config import TileConfig
    from server.store import queue, records, workloads
    from server.store.db import Database
    from server.store.migrate import upgrade
    from server.worker.tune import local_workload

    start = time.monotonic()
    stop = threading.Event()
    signals = {"n": 0}

    def on_signal(_signum: int) -> None:  # in the relay thread (server.cli.signals), where setting an event is safe
        signals["n"] += 1
        stop.set()

    relay = SignalRelay(on_signal)
    log_dir = options.log_dir or Path(tempfile.mkdtemp(prefix="tiletune-up-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    base_url = f"http://{options.host}:{options.port}"
    env = child_env({"TILETUNE_DATABASE_URL": options.database_url})
    children: list[Child] = []
    db = None
    try:
        console.print(f"database {options.database_url}: applying migrations")
        upgrade(options.database_url)
        server = Child(
            "server",
            tiletune_command("serve", "--host", options.host, "--port", str(options.port), "--no-migrate"),
            env=env,
            log=log_dir / "server.log",
        )
        children.append(server)
        server.wait_until(lambda: stop.is_set() or _healthy(base_url), options.ready_timeout_s, f"answering {base_url}")
        console.print(f"server on {base_url} (API docs at {base_url}/docs; log {server.log})")
        device = probe_device()
        backend = resolve_backend(options.backend, device.platform)
        worker = Child(
            "worker",
            tiletune_command("worker", "--database-url", options.database_url, "--backend", backend, "--poll", "1"),
            env=env,
            log=log_dir / "worker.log",
        )
        children.append(worker)
        console.print(f"worker for {backend} jobs on {device.kind!r} (log {worker.log})")
        if options.preset is None:
            console.print("service up; Ctrl-C stops it")
            return _watch(children, stop, console)
        workload = local_workload(None, options.preset, backend, None, 1)
        versions = software_versions(workload.backend)
        db = Database(options.database_url)
        with db.transaction() as session:
            row = workloads.workload_row(session, workload)
            tuned = records.current_config(session, row.id)
            job_id = None
            if tuned is None:
                job, created = queue.enqueue_job(session, row, budget=options.trials, requested_by="tiletune up")
                job_id = job.id
                console.print(
                    f"{'queued' if created else 'already queued:'} job {job.id}: {options.preset} on "
                    f"{workload.device_kind} ({workload.backend}, {workload.dtype}), {options.trials} trials"
                )
        example = lookup_example(base_url, workload, versions, options.preset)
        if job_id is None:
            console.print(
                f"{options.preset} is tuned already (tuned config {tuned.id if tuned else '?'}); look it up with:"
            )
            console.print(example, soft_wrap=True, highlight=False)
        else:
            status = _follow(db, job_id, options.trials, children, stop, console)
            if status == "done":
                current = db.read(
                    lambda session: records.current_config(session, row.id),
                    what="reading the tuned config",
                    patience=TUNED_READ_PATIENCE_S,
                )
                assert current is not None
                speed = speedups(
                    current.median_ms, current.dense_ms, current.tiled_dense_ms, p10_p90=current.speedup_p10_p90
                )
                console.print(
                    f"[bold]tuned[/bold] {options.preset} in {time.monotonic() - start:.0f} s from start: "
                    f"{TileConfig.from_dict(current.config).describe()} {current.median_ms:.3f} ms{speed}"
                )
                console.print("look it up with:")
                console.print(example, soft_wrap=True, highlight=False)
            elif status is not None:
                console.print(f"[red]job {job_id} ended {status}[/red]; see {worker.log}")
                if options.exit_when_tuned:
                    return 1
        if options.exit_when_tuned or stop.is_set():
            return 0 if not _dead(children, console) else 1
        console.print("service up; Ctrl-C stops it")
        return _watch(children, stop, console)
    finally:
        if db is not None:
            db.dispose()
        _stop_children(children, signals, console)
        relay.close()


def _healthy(base_url: str) -> bool:
    try:
        return httpx.get(f"{base_url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _dead(children: list[Child], console: Console) -> bool:
    dead = [c for c in children if not c.alive()]
    for c in dead:
        console.print(f"[red]the {c.name} exited (code {c.returncode}):[/red]\n{c.tail()}")
    return bool(dead)


def _follow(
    db: Any, job_id: int, budget: int, children: list[Child], stop: threading.Event, console: Console
) -> str | None:
    """Show the job's progress until it ends (its final status) or we are stopped (None).

    A database outage (PostgreSQL restarting) is waited out, as the worker does: the
    progress shows it, and the reads start again, backing off, until it passes."""
    from server.store import models, queue
    from server.store.outage import OutageWait, is_outage

    def read(session: Any) -> tuple[str, queue.JobProgress]:
        job = session.get(models.Job, job_id)
        assert job is not None
        return job.status, queue.job_progress(session, [job_id])[job_id]

    progress = LoggedProgress(
        TextColumn("tuning"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("{task.fields[best]}"),
        TextColumn("{task.fields[state]}"),
        TimeElapsedColumn(),
        console=console,
        phase_fields=("state",),
    )
    task = progress.add_task("job", total=budget, best="best -", state="queued")
    outage = OutageWait("tiletune up", FOLLOW_POLL_S, max_s=5.0)  # a child that dies is noticed within 5 s
    wait = FOLLOW_POLL_S
    with progress:
        while not stop.wait(wait):
            if _dead(children, console):
                return "failed (a child process died)"
            try:
                with db.read_sessions() as session:
                    status, p = read(session)
            except Exception as exc:
                if not is_outage(exc):
                    raise
                wait = outage.failed(exc)
                progress.update(task, state="database unavailable, retrying")
                continue
            outage.succeeded()
            wait = FOLLOW_POLL_S
            best = f"best {p.best_ms:.3f} ms" if p.best_ms is not None else "best -"
            progress.update(task, completed=min(p.trials_done, budget), best=best, state=status)
            if status in ("done", "failed", "cancelled"):
                return status
    return None


def _watch(children: list[Child], stop: threading.Event, console: Console) -> int:
    while not stop.wait(1.0):
        if _dead(children, console):
            return 1
    return 0


def _stop_children(children: list[Child], signals: dict[str, int], console: Console) -> None:
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
