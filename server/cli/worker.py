"""``tiletune worker``: claim queued tuning jobs of this machine's device kind and backend, run them."""

from __future__ import annotations

import dataclasses
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from autotune.host_load import BUSY_ABOVE_CORES
from server.cli.common import CoreOpt, DatabaseOpt, checked_core, err, fail, no_tpu_device, speedups
from server.cli.common import database_url as database_url_of
from server.cli.signals import SignalRelay

if TYPE_CHECKING:  # imported when a worker starts: the CLI's other commands do not load the search
    from autotune.search import SearchOptions


def install_stop_signals(stop: Any, what: str) -> SignalRelay:
    """SIGTERM / SIGINT: the first calls ``stop(False)`` (finish the trial in flight, give
    the job back), the second ``stop(True)`` (abandon it now); called from the relay thread
    (:class:`server.cli.signals.SignalRelay`), not inside the handler, where ``stop`` setting
    an event could deadlock."""
    seen = {"n": 0}

    def on_signal(signum: int) -> None:
        seen["n"] += 1
        name = signal.Signals(signum).name
        if seen["n"] == 1:
            err.print(f"{name}: {what} stops after the trial in flight (again to abandon it)")
            stop(False)
        else:
            err.print(f"{name}: abandoning the trial in flight")
            stop(True)

    return SignalRelay(on_signal)


def worker(
    database_url: DatabaseOpt = None,
    backend: Annotated[str, typer.Option(help="auto | tpu | xla | interpret | replay")] = "auto",
    device_kind: Annotated[
        str, typer.Option(help="Jobs of this device kind (auto: this machine's jax.devices()[0].device_kind)")
    ] = "auto",
    max_jobs: Annotated[int | None, typer.Option(min=1, help="Stop after this many jobs")] = None,
    exit_when_idle: Annotated[bool, typer.Option(help="Stop when no job is left to claim")] = False,
    lease: Annotated[float, typer.Option(min=1, help="Lease seconds (a heartbeat extends it every third)")] = 60,
    poll: Annotated[float, typer.Option(min=0.05, help="Seconds between claims when the queue is empty")] = 2,
    trial_timeout: Annotated[
        float, typer.Option(min=1, help="A trial not done in this many seconds is a timeout")
    ] = 300,
    repeats: Annotated[int, typer.Option(min=1, help="Timed runs per trial (at least)")] = 5,
    core: CoreOpt = None,
    replay_table: Annotated[
        list[Path] | None, typer.Option("--replay-table", help="Recorded tables served by --backend replay")
    ] = None,
    replay_sleep: Annotated[
        float, typer.Option(min=0, help="Replay: sleep this fraction of each recorded compile + run time")
    ] = 1.0,
    name: Annotated[str | None, typer.Option(help="Worker name in leases and trials (default host-pid-random)")] = None,
    quiet: Annotated[bool, typer.Option(help="Print jobs only, not every trial")] = False,
    compile_only: Annotated[
        bool,
        typer.Option(
            help="Compile the candidate configs of queued TPU jobs (any host with the tpu extra, no TPU needed) "
            "instead of claiming jobs; TPU workers then skip the configs that do not compile"
        ),
    ] = False,
    processes: Annotated[int, typer.Option(min=1, help="--compile-only: compiling processes at once")] = 1,
    lookahead: Annotated[
        int,
        typer.Option(
            min=0, help="tpu jobs: configs compiled on the host while the TPU times the current one (0: in line)"
        ),
    ] = 2,
    compile_timeout: Annotated[
        float, typer.Option(min=1, help="--compile-only: a compile not done in this many seconds is refused")
    ] = 300,
    max_configs: Annotated[
        int | None, typer.Option(min=1, help="--compile-only: compile at most this many configs per job")
    ] = None,
    finalize_processes: Annotated[
        int | None,
        typer.Option(
            min=1,
            envvar="TILETUNE_FINALIZE_PROCESSES",
            help="Measuring processes a job's tied finalists and its winner's anchors are timed in (the search's, "
            "then fresh ones; default 3); 1 keeps them in the search's: faster, but the spread shown misses how much "
            "a speedup moves from one process to the next",
        ),
    ] = None,
) -> None:
    """Claim queued tuning jobs of this machine's device kind and backend and run them.

    Trials are stored as they finish; the best config becomes the workload's
    tuned config. SIGTERM or Ctrl-C stops after the trial in flight and gives the
    job back; a second one abandons the trial at once.

    With --compile-only the worker claims nothing: it compiles, for their TPU
    generation, the configs queued TPU jobs will try (warm starts first) and stores
    each verdict, so TPU workers never spend a compile on a config that fails.
    """
    if compile_only:
        _compile_worker(database_url, exit_when_idle, poll, processes, compile_timeout, max_configs, name, quiet)
        return
    import logging

    from autotune.measure import MeasureOptions
    from kernel.attention import NoTpuDeviceError
    from server.store.migrate import upgrade
    from server.worker.worker import WORKER_BACKENDS, Worker, WorkerOptions

    if backend not in WORKER_BACKENDS:
        raise typer.BadParameter(f"--backend must be one of {WORKER_BACKENDS}")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    url = database_url_of(database_url)
    options = WorkerOptions(
        database_url=url,
        backend=backend,
        device_kind=device_kind,
        max_jobs=max_jobs,
        exit_when_idle=exit_when_idle,
        lease_s=lease,
        poll_s=poll,
        trial_timeout_s=trial_timeout,
        measure=MeasureOptions(repeats=repeats, compile_threads=max(1, lookahead), core=checked_core(core)),
        search=_search_options(lookahead, finalize_processes),
        replay_tables=tuple(replay_table or ()),
        replay_sleep=replay_sleep,
        name=name,
    )
    try:
        upgrade(url)
        w = Worker(options, on_event=lambda kind, data: _print_event(kind, data, quiet))
    except NoTpuDeviceError as exc:
        raise no_tpu_device("worker", exc.platform) from None
    except (ValueError, RuntimeError, OSError) as exc:
        raise fail(str(exc)) from None
    relay = install_stop_signals(lambda abandon: w.request_stop(abandon), "the worker")
    try:
        outcomes = w.run()
    finally:
        w.close()
        relay.close()  # the earlier handlers back: a caller running this command in-process keeps its own
    failed = [outcome for outcome in outcomes if outcome.status == "failed"]
    err.print(f"worker {w.name} stopped after {len(outcomes)} job(s), {len(failed)} failed")


def _search_options(lookahead: int, finalize_processes: int | None) -> SearchOptions:
    """The worker's :class:`autotune.search.SearchOptions`: the search's defaults but for these two."""
    from autotune.search import SearchOptions

    options = SearchOptions(lookahead=lookahead)
    if finalize_processes is not None:
        options = dataclasses.replace(
            options, anchor_processes=finalize_processes, resolve_processes=finalize_processes
        )
    return options


def _compile_worker(
    database_url: str | None,
    exit_when_idle: bool,
    poll: float,
    processes: int,
    compile_timeout: float,
    max_configs: int | None,
    name: str | None,
    quiet: bool,
) -> None:
    from kernel.tpu_targets import TpuCompilerUnavailableError
    from server.store.migrate import upgrade
    from server.worker.compile_worker import CompileWorker, CompileWorkerOptions

    url = database_url_of(database_url)
    options = CompileWorkerOptions(
        database_url=url,
        processes=processes,
        compile_timeout_s=compile_timeout,
        poll_s=poll,
        exit_when_idle=exit_when_idle,
        max_configs=max_configs,
        name=name,
    )
    try:
        upgrade(url)
        w = CompileWorker(options, on_event=lambda kind, data: _print_compile_event(kind, data, quiet))
    except (TpuCompilerUnavailableError, ValueError, RuntimeError, OSError) as exc:
        raise fail(str(exc)) from None
    relay = install_stop_signals(lambda _abandon: w.request_stop(), "the compile worker")
    try:
        jobs = w.run()
    finally:
        w.close()
        relay.close()
    total = sum(j.compiled for j in jobs)
    err.print(f"compile worker {w.name} stopped after {total} verdict(s) on {len(jobs)} job(s)")


def _print_compile_event(kind: str, d: dict[str, Any], quiet: bool) -> None:
    if kind == "started":
        v = d["versions"]
        err.print(
            f"compile worker {d['worker']} compiling for queued TPU jobs (jax {v.get('jax')}, libtpu {v.get('libtpu')})"
        )
    elif kind == "compiled" and not quiet:
        verdict = "ok" if d["ok"] else f"refused: {(d['error'] or '')[:100]}"
        err.print(f"  job {d['job_id']}: {d['config']}: {verdict} ({d['compile_s']:.2f} s)")
    elif kind == "job_compiled":
        err.print(f"job {d['job_id']}: {d['compiled']} verdict(s), {d['refused']} refused, in {d['seconds']:.0f} s")


def _print_event(kind: str, d: dict[str, Any], quiet: bool) -> None:
    if kind == "started":
        err.print(f"worker {d['worker']} claiming {d['backend']} jobs for device kind {d['device_kind']!r}")
    elif kind == "job_started":
        err.print(f"job {d['job_id']}: tuning {d['workload_key']} (budget {d['budget']}, attempt {d['attempt']})")
    elif kind == "trial" and not quiet:
        ms = f"{d['median_ms']:.3f} ms" if d["median_ms"] is not None else "-"
        err.print(f"  job {d['job_id']} trial {d['number']}: {d['config']}: {d['status']} {ms}")
    elif kind == "tuned":
        speed = speedups(d["median_ms"], d["dense_ms"], d.get("tiled_dense_ms"), p10_p90=d.get("speedup_p10_p90"))
        processes = d.get("anchor_processes") or 0
        where = f", timed beside its anchors in {processes} measuring process(es)" if processes else ""
        err.print(
            f"job {d['job_id']}: [bold]tuned[/bold] {d['config']} {d['median_ms']:.3f} ms{speed} "
            f"(tuned config {d['tuned_config_id']}{where})"
        )
        if (d.get("others_cores") or 0.0) > BUSY_ABOVE_CORES:
            err.print(
                f"[yellow]job {d['job_id']}: other programs kept {d['others_cores']:.1f} cores busy while the winner "
                "and its anchors were timed; the speedups may read differently on a quiet machine[/yellow]"
            )
    elif kind == "job_finished" and d["status"] != "done":
        extra = f": {d['error']}" if d.get("error") else ""
        err.print(f"job {d['job_id']}: {d['status']} after {d['trials']} trial(s) here{extra}")
