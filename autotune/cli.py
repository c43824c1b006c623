"""The ``tiletune`` command line (typer). Later features add their sub-commands here."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from autotune import report as report_cli
from autotune import tune_cli, worker_cli
from server import cli as server_cli

app = typer.Typer(help="tiletune: autotuned tile configs for sparse video attention.", no_args_is_help=True)
bench_app = typer.Typer(help="Benchmarks (ratios measured side by side in one run).", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
app.add_typer(server_cli.db_app, name="db")
app.add_typer(server_cli.token_app, name="token")
app.command()(server_cli.serve)
app.command()(server_cli.lookup)
app.command()(server_cli.configs)
app.command()(server_cli.history)
app.command()(tune_cli.tune)
app.command()(worker_cli.worker)
app.command()(worker_cli.up)
app.command()(report_cli.report)
bench_app.command("search")(tune_cli.bench_search)

console = Console(stderr=True)

# The benchmarks that own a database: they empty it.
BenchDatabaseOpt = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        help="Run on this database (e.g. postgresql+psycopg://...). ALL ROWS OF ITS tt_* TABLES ARE DELETED "
        "before each run. Default: a new temporary SQLite file, removed afterwards.",
    ),
]


def _ints(text: str | None, option: str) -> tuple[int, ...]:
    if not text:
        return ()
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise typer.BadParameter(f"{option} takes comma-separated integers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise typer.BadParameter(f"{option} values must be >= 1")
    return values


@app.command()
def presets() -> None:
    """List the workload presets (real model shapes)."""
    from kernel.presets import PRESETS

    table = Table("preset", "frames x tokens", "text", "heads (per chip) x dim", "dtype", "pattern")
    for p in PRESETS.values():
        lay = p.layout
        text = f"{lay.text_tokens} {lay.text_position}" if lay.text_tokens else "-"
        table.add_row(
            p.name,
            f"{lay.frames} x {lay.tokens_per_frame} = {lay.video_tokens:,}",
            text,
            f"{p.heads} ({p.heads_per_chip}) x {p.head_dim}",
            p.dtype,
            p.pattern().describe().split("; ")[1],
        )
    _stdout_console().print(table)


@bench_app.command("kernel")
def bench_kernel_cmd(
    preset: Annotated[str, typer.Option(help="Workload preset (see `tiletune presets`).")] = "cpu-demo",
    backend: Annotated[str, typer.Option(help="xla | tpu | auto (interpret mode has no meaningful timing).")] = "xla",
    frames: Annotated[int | None, typer.Option(min=1, help="Override the preset's frame count.")] = None,
    tokens_per_frame: Annotated[int | None, typer.Option(min=1, help="Override tokens per frame.")] = None,
    heads: Annotated[str | None, typer.Option(help="Heads as KIND[:WINDOW][+sink]xCOUNT,... e.g. spatial:0x4.")] = None,
    dtype: Annotated[str | None, typer.Option(help="float32 | bfloat16 (default: float32 on xla).")] = None,
    blocks: Annotated[str | None, typer.Option(help="Square tile sizes to try, e.g. 64,128,256.")] = None,
    variants: Annotated[str | None, typer.Option(help="Variants to run, e.g. naive,compact.")] = None,
    repeats: Annotated[int, typer.Option(min=1, help="Timed runs per measurement (at least).")] = 5,
    min_time: Annotated[float, typer.Option(min=0.0, help="Seconds of timed runs per measurement (at least).")] = 0.5,
    tables: Annotated[str, typer.Option(help="Preset whose block-table build is timed ('' to skip).")] = "wan2.1-720p",
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout.")] = False,
) -> None:
    """Time the sparse kernel against dense attention on one workload."""
    from autotune.bench_kernel import KernelBenchOptions, bench_kernel
    from kernel.config import VARIANTS

    variant_list = tuple(v.strip() for v in variants.split(",")) if variants else ()
    for v in variant_list:
        if v not in VARIANTS:
            raise typer.BadParameter(f"--variants: unknown variant {v!r}; choose from {VARIANTS}")
    if dtype not in (None, "float32", "bfloat16"):
        raise typer.BadParameter("--dtype must be float32 or bfloat16")
    opts = KernelBenchOptions(
        preset=preset,
        backend=backend,
        frames=frames,
        tokens_per_frame=tokens_per_frame,
        heads=heads,
        dtype=dtype,
        blocks=_ints(blocks, "--blocks"),
        variants=variant_list,
        repeats=repeats,
        min_time_s=min_time,
        table_preset=tables or None,
    )
    try:
        with console.status("benchmarking") as status:
            report = bench_kernel(opts, progress=lambda msg: status.update(f"measuring {msg}"))
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        _print_kernel_report(report)


@bench_app.command("service")
def bench_service_cmd(
    workloads: Annotated[int, typer.Option(min=1, help="Workloads to seed (a quarter get no tuned config).")] = 1000,
    trials: Annotated[int, typer.Option(min=0, help="Trials to seed, spread unevenly over the workloads.")] = 10000,
    clients: Annotated[
        int, typer.Option(min=1, help="Concurrent clients (threads, one keep-alive connection each).")
    ] = 8,
    duration: Annotated[float, typer.Option(min=0.1, help="Measured seconds per phase.")] = 10.0,
    warmup: Annotated[float, typer.Option(min=0.0, help="Unmeasured seconds of load before each phase.")] = 1.0,
    workers: Annotated[int, typer.Option(min=1, help="uvicorn worker processes (the same for both servers).")] = 1,
    database_url: BenchDatabaseOpt = None,
    compare_empty: Annotated[
        bool, typer.Option(help="Also measure the same lookups on the empty database, before seeding.")
    ] = True,
    miss_fraction: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Lookups of workloads without a tuned config (nearest).")
    ] = 0.1,
    rounds: Annotated[
        int, typer.Option(min=1, help="Windows per seeded phase: bare, lookup and history take turns.")
    ] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout.")] = False,
) -> None:
    """Service throughput and p50/p99 latency beside a bare FastAPI route, on an empty and a seeded database.

    Starts uvicorn on 127.0.0.1 (free ports) for the tiletune app and for a bare
    route with the same settings, and drives each phase from concurrent clients:
    lookups on the empty database, then, after seeding, the bare route, lookups
    and history pages in turn. With --database-url the bench deletes every row of that database's
    tt_* tables first. Exits 1 when any request failed.
    """
    from server.bench_service import ServiceBenchError, ServiceBenchOptions, run_service_bench

    opts = ServiceBenchOptions(
        workloads=workloads,
        trials=trials,
        clients=clients,
        duration_s=duration,
        warmup_s=warmup,
        workers=workers,
        database_url=database_url,
        compare_empty=compare_empty,
        miss_fraction=miss_fraction,
        rounds=rounds,
    )
    try:
        with console.status("benchmarking") as status:
            report = run_service_bench(opts, progress=lambda msg: status.update(msg))
    except ServiceBenchError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        _print_service_report(report)
    failed = {name: p["errors"] for name, p in report["phases"].items() if p["errors"]}
    if failed:
        console.print(f"[red]failed requests:[/red] {failed}")
        for name, p in report["phases"].items():
            for sample in p["error_samples"]:
                console.print(f"  {name}: {sample}")
        raise typer.Exit(1)


@bench_app.command("workers")
def bench_workers_cmd(
    database_url: BenchDatabaseOpt = None,
    workers: Annotated[
        str, typer.Option(help="Worker process counts, e.g. 1,2,4 (start with 1: the baseline)")
    ] = "1,2,4",
    jobs_per_worker: Annotated[int, typer.Option(min=1, help="Jobs queued per worker in each run")] = 4,
    budget: Annotated[int, typer.Option(min=1, help="Trials per job")] = 8,
    replay_sleep: Annotated[
        float, typer.Option(min=0.0, help="Fraction of each recorded compile + run time slept (stands for device time)")
    ] = 1.0,
    table: Annotated[Path | None, typer.Option(help="Recorded table the replay backend serves")] = None,
    rounds: Annotated[int, typer.Option(min=1, help="Times the worker counts take turns (median reported)")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout.")] = False,
) -> None:
    """Jobs per minute on the replay backend as worker processes are added, and the scaling efficiency."""
    from autotune.bench_workers import DEFAULT_TABLE, WorkersBenchOptions, run_workers_bench

    counts = _ints(workers, "--workers")
    opts = WorkersBenchOptions(
        database_url=database_url,
        workers=counts,
        jobs_per_worker=jobs_per_worker,
        budget=budget,
        replay_sleep=replay_sleep,
        table=table or DEFAULT_TABLE,
        rounds=rounds,
    )
    try:
        with console.status("benchmarking") as status:
            report = run_workers_bench(opts, progress=lambda msg: status.update(msg))
    except (ValueError, RuntimeError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    if as_json:
        print(json.dumps(report, indent=2))
        return
    o = report["options"]
    out = _stdout_console()
    out.print(
        f"[bold]tiletune bench workers[/bold] on {o['database']} ({o['database_url']}), replay of {o['table']}, "
        f"{o['jobs_per_worker']} jobs per worker x {o['budget']} trials, {o['replayed_seconds_per_trial']} s "
        f"slept per trial, {o['cpus']} CPUs, median of {o['rounds']} round(s)"
    )
    t = Table("workers", "jobs", "failed", "trials", "seconds", "jobs/min", "each round", "scaling efficiency")
    for r in report["runs"]:
        eff = f"{r['efficiency']:.2f}" if r["efficiency"] is not None else "-"
        each = ", ".join(f"{x:.1f}" for x in r["rounds_jobs_per_minute"])
        t.add_row(str(r["workers"]), str(r["jobs"]), str(r["failed"]), str(r["trials"]), f"{r['seconds']:.1f}",
                  f"{r['jobs_per_minute']:.1f}", each, eff)  # fmt: skip
    out.print(t)
    out.print("scaling efficiency: (jobs/min at N / N) / (jobs/min at 1 worker), measured in this run")


@bench_app.command("client")
def bench_client_cmd(
    preset: Annotated[str, typer.Option(help="Workload preset whose config is resolved.")] = "cpu-demo",
    rounds: Annotated[int, typer.Option(min=1, help="Alternating timed rounds of dict and memory lookups.")] = 7,
    number: Annotated[int, typer.Option(min=1, help="Calls per timed round of dict and memory lookups.")] = 200_000,
    disk_calls: Annotated[int, typer.Option(min=1, help="Timed resolutions from the disk cache.")] = 500,
    server_calls: Annotated[int, typer.Option(min=1, help="Timed resolutions from the local server.")] = 30,
    timeout: Annotated[float, typer.Option(min=0.001, help="Client timeout (s) against the hanging server.")] = 0.5,
    hang_calls: Annotated[int, typer.Option(min=1, help="Resolutions against the hanging and refusing servers.")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout.")] = False,
) -> None:
    """The client's cost per lookup (memory, disk, local server) beside a dict lookup, and its timeout on a
    hanging server.

    Starts uvicorn on 127.0.0.1 with a temporary SQLite database holding one tuned
    config. The report's checks (memory within 10x a dict lookup net of the timing
    loop; the heuristic within 250 ms after the timeout) are printed, not enforced:
    the figures depend on the machine's load.
    """
    from autotune.bench_client import ClientBenchOptions, print_client_report, run_client_bench
    from server.bench_service import ServiceBenchError

    opts = ClientBenchOptions(
        preset=preset,
        rounds=rounds,
        number=number,
        disk_calls=disk_calls,
        server_calls=server_calls,
        timeout_s=timeout,
        hang_calls=hang_calls,
    )
    try:
        with console.status("benchmarking") as status:
            report = run_client_bench(opts, progress=lambda msg: status.update(msg))
    except (ValueError, ServiceBenchError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        print_client_report(report, _stdout_console())


def _print_service_report(report: dict) -> None:
    out = _stdout_console()
    o, s = report["options"], report["seed"]
    out.print(
        f"[bold]tiletune bench service[/bold] on {o['database']} ({o['database_url']}), uvicorn {o['uvicorn']}, "
        f"{o['clients']} clients, {o['duration_s']:g} s per phase ({o['rounds']} windows after seeding), "
        f"{o['cpus']} CPUs"
    )
    out.print(
        f"seeded {s['workloads']:,} workloads ({s['tuned_configs']:,} tuned), {s['trials']:,} trials in "
        f"{s['seconds']:.1f} s ({s['trials_per_s'] or 0:,} trials/s; plan {s['plan_s']:.1f} s)"
    )
    table = Table(
        "phase", "requests", "errors", "req/s", "p50 ms", "p99 ms", "max ms", "server CPU ms/req", "load", "answers"
    )
    for name, p in report["phases"].items():
        answers = ", ".join(f"{k} {v['count']:,} (p99 {v['p99_ms']:.1f})" for k, v in p.get("by_label", {}).items())
        table.add_row(
            name,
            f"{p['requests']:,}",
            str(p["errors"]),
            f"{p['rps']:,.0f}",
            f"{p['p50_ms']:.2f}" if p["p50_ms"] is not None else "-",
            f"{p['p99_ms']:.2f}" if p["p99_ms"] is not None else "-",
            f"{p['max_ms']:.1f}" if p["max_ms"] is not None else "-",
            f"{p['server_cpu_ms_per_request']:.2f}" if p["server_cpu_ms_per_request"] is not None else "-",
            f"{p['loadavg_1m']:.1f}" if p["loadavg_1m"] is not None else "-",
            answers,
        )
    out.print(table)
    r = report["ratios"]

    def fmt(value: float | None, unit: str = "x") -> str:
        return f"{value:.2f}{unit}" if value is not None else "-"

    out.print(
        f"lookup req/s / bare req/s: {fmt(r['lookup_rps_over_bare_rps'])}; "
        f"lookup p99 seeded / empty: {fmt(r['lookup_p99_seeded_over_empty'])}; "
        f"history p99: {fmt(r['history_p99_ms'], ' ms')}"
    )
    out.print(
        "load: 1-minute load average of the machine during the phase; with more runnable work than "
        f"{o['cpus']} CPUs, latencies include waiting for a CPU"
    )


def _stdout_console() -> Console:
    """Wide tables when piped to a file; the terminal's width otherwise."""
    return Console() if sys.stdout.isatty() else Console(width=160)


def _print_kernel_report(report: dict) -> None:
    out = _stdout_console()
    out.print(f"[bold]{report['preset']}[/bold]: {report['pattern']}")
    out.print(f"backend {report['backend']} on {report['device']}, shape {report['shape']} {report['dtype']}")
    out.print(
        f"mask density {report['density']:.4f} -> ideal speedup {report['ideal_speedup']:.2f}x; "
        f"dense (jax.nn.dot_product_attention) {report['dense']['median_ms']:.2f} ms"
    )
    table = Table(
        "config",
        "median ms",
        "p10-p90 ms",
        "speedup",
        "of ideal",
        "vs tiled dense",
        "of ideal",
        "tile density",
        "max err",
    )
    for r in report["configs"]:
        table.add_row(
            r["describe"],
            f"{r['median_ms']:.2f}",
            f"{r['p10_ms']:.2f}-{r['p90_ms']:.2f}",
            f"{r['speedup']:.2f}x",
            f"{r['fraction_of_ideal']:.2f}",
            f"{r['speedup_vs_tiled_dense']:.2f}x",
            f"{r['fraction_of_ideal_vs_tiled_dense']:.2f}",
            f"{r['tile_density']:.3f}",
            f"{r['max_error']:.1e}" + ("" if r["correct"] else " WRONG"),
        )
    out.print(table)
    out.print(
        "speedup / of ideal: against jax.nn.dot_product_attention; vs tiled dense: against this backend "
        "running the same tiles on an all-dense pattern (1.00 of ideal = every masked pair skipped for free)"
    )
    if "temporal_layout" in report:
        t = report["temporal_layout"]
        out.print(
            f"temporal heads ({t['heads']}): frame-major {t['frame_major']['median_ms']:.2f} ms, "
            f"temporal-major {t['temporal_major']['median_ms']:.2f} ms -> permutation "
            f"{t['permutation_speedup']:.2f}x faster"
        )
    if "block_tables" in report:
        bt = report["block_tables"]
        for r in bt["runs"]:
            out.print(
                f"block tables {bt['preset']} ({bt['heads']} heads, {r['distinct_patterns']} distinct patterns, "
                f"{bt['seq_len']:,} tokens) {r['config']}: {r['build_ms']:.0f} ms, peak {r['peak_mb']:.1f} MB, "
                f"{r['full']:,} full / {r['partial']:,} partial / {r['empty']:,} empty tiles"
            )


if __name__ == "__main__":  # pragma: no cover
    app()
