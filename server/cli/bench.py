"""``tiletune bench``: benchmarks, each a ratio of figures measured side by side in one run."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from server.cli.common import BenchDatabaseOpt, DatabaseOpt, err, fail, ints, local_workload_or_exit, out, print_json
from server.cli.common import database_url as database_url_of
from server.cli.progress import LoggedProgress, status

bench_app = typer.Typer(help="Benchmarks (ratios measured side by side in one run).", no_args_is_help=True)


def _run(
    bench: Callable[..., dict[str, Any]],
    opts: Any,
    printer: Callable[[dict[str, Any], Any], None],
    as_json: bool,
    errors: tuple[type[Exception], ...] = (ValueError, RuntimeError),
) -> dict[str, Any]:
    """Run ``bench(opts, progress=...)`` with a status line, print its report (JSON or a table);
    a bench that cannot run is a usage error naming why."""
    try:
        with status(err, "benchmarking") as line:
            report = bench(opts, progress=lambda msg: line.update(msg))
    except errors as exc:
        raise fail(str(exc)) from None
    if as_json:
        print_json(report)
    else:
        printer(report, out())
    return report


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
    repeats: Annotated[int, typer.Option(min=1, help="Timed runs of each callable per round.")] = 1,
    rounds: Annotated[
        int, typer.Option(min=1, help="Interleaved rounds (each times every callable once, in a fresh order).")
    ] = 10,
    tables: Annotated[str, typer.Option(help="Preset whose block-table build is timed ('' to skip).")] = "wan2.1-720p",
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout.")] = False,
) -> None:
    """Time the sparse kernel against dense attention on one workload."""
    from kernel.config import VARIANTS
    from server.bench.kernel import KernelBenchOptions, bench_kernel, print_kernel_report

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
        blocks=ints(blocks, "--blocks"),
        variants=variant_list,
        repeats=repeats,
        rounds=rounds,
        table_preset=tables or None,
    )
    _run(bench_kernel, opts, print_kernel_report, as_json, errors=(ValueError,))


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
    abuse: Annotated[
        bool,
        typer.Option(
            help="Also measure lookups with and without one client sending the worst requests the limits allow."
        ),
    ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout.")] = False,
) -> None:
    """Service throughput and p50/p99 latency beside a bare FastAPI route, on an empty and a seeded database.

    Starts uvicorn on 127.0.0.1 (free ports) for the tiletune app and for a bare
    route with the same settings, and drives each phase from concurrent clients:
    lookups on the empty database, then, after seeding, the bare route, lookups
    and history pages in turn; then lookups with and without an abuse client
    (the largest bodies, the largest workload, its new figures) in turn, with the
    server's peak memory. With --database-url the bench deletes every row of that database's
    tt_* tables first. Exits 1 when any measured request failed.
    """
    from server.bench import BenchError
    from server.bench.service import ServiceBenchOptions, print_service_report, run_service_bench

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
        abuse=abuse,
    )
    report = _run(run_service_bench, opts, print_service_report, as_json, errors=(BenchError,))
    failed = {name: p["errors"] for name, p in report["phases"].items() if p["errors"]}
    if failed:
        err.print(f"[red]failed requests:[/red] {failed}")
        for name, p in report["phases"].items():
            for sample in p["error_samples"]:
                err.print(f"  {name}: {sample}")
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
    from server.bench.workers import DEFAULT_TABLE, WorkersBenchOptions, print_workers_report, run_workers_bench

    counts = ints(workers, "--workers")
    opts = WorkersBenchOptions(
        database_url=database_url,
        workers=counts,
        jobs_per_worker=jobs_per_worker,
        budget=budget,
        replay_sleep=replay_sleep,
        table=table or DEFAULT_TABLE,
        rounds=rounds,
    )
    _run(run_workers_bench, opts, print_workers_report, as_json)


@bench_app.command("crash")
def bench_crash_cmd(
    runs: Annotated[int, typer.Option(min=1, help="Runs per scenario and database")] = 50,
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url",
            help="A PostgreSQL URL: also run on scratch databases created beside it (CREATEDB needed) and "
            "dropped afterwards; the database itself is not touched. SQLite always runs, on temporary files.",
        ),
    ] = None,
    scenarios: Annotated[
        str, typer.Option(help="Comma-separated: upgrade, starts, worker-trial, worker-publish, server")
    ] = "upgrade,starts,worker-trial,worker-publish,server",
    seed: Annotated[int | None, typer.Option(help="Seed of the kill points (default: random, reported)")] = None,
    sqlite: Annotated[bool, typer.Option(help="Run on SQLite (--no-sqlite: PostgreSQL only)")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout.")] = False,
) -> None:
    """SIGKILL tiletune's processes at random points (db upgrade, concurrent starts, a worker in a trial or
    in its publish, the server), restart, and check that every database upgrades, no job is lost or
    finished twice and no trial stays running. Exits 1 when any run failed its checks."""
    from server.bench import BenchError
    from server.bench.crash import CrashBenchOptions, print_crash_report, run_crash_bench

    opts = CrashBenchOptions(
        runs=runs,
        database_url=database_url,
        scenarios=tuple(s.strip() for s in scenarios.split(",") if s.strip()),
        seed=seed,
        sqlite=sqlite,
    )
    report = _run(run_crash_bench, opts, print_crash_report, as_json, errors=(ValueError, BenchError))
    if any(s["failures"] for s in report["scenarios"]):
        raise typer.Exit(1)


@bench_app.command("client")
def bench_client_cmd(
    preset: Annotated[str, typer.Option(help="Workload preset whose config is resolved.")] = "cpu-demo",
    rounds: Annotated[int, typer.Option(min=1, help="Alternating timed rounds of dict and memory lookups.")] = 7,
    number: Annotated[int, typer.Option(min=1, help="Calls per timed round of dict and memory lookups.")] = 200_000,
    disk_calls: Annotated[
        int, typer.Option(min=1, help="New processes, each timing its first resolution from the disk cache.")
    ] = 10,
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
    from server.bench import BenchError
    from server.bench.client import ClientBenchOptions, print_client_report, run_client_bench

    opts = ClientBenchOptions(
        preset=preset,
        rounds=rounds,
        number=number,
        disk_calls=disk_calls,
        server_calls=server_calls,
        timeout_s=timeout,
        hang_calls=hang_calls,
    )
    _run(run_client_bench, opts, print_client_report, as_json, errors=(ValueError, BenchError))


@bench_app.command("search")
def bench_search_cmd(
    record: Annotated[bool, typer.Option("--record", help="Measure every valid config and save the table")] = False,
    preset: Annotated[str | None, typer.Option(help="Workload preset to record")] = None,
    workload: Annotated[Path | None, typer.Option(help="Workload JSON file to record")] = None,
    out_path: Annotated[Path | None, typer.Option("--out", help="Where --record writes the table")] = None,
    replay: Annotated[list[Path] | None, typer.Option("--replay", help="Recorded tables to replay")] = None,
    sampler: Annotated[
        str, typer.Option(help="Strategies, comma-separated: tiletune's samplers, kt:<strategy> or kt:all (peers)")
    ] = "surrogate,tpe,tpe-plain,random",
    warm_start: Annotated[
        str, typer.Option(help="on | off | both: every strategy starts from the heuristic config, or none does")
    ] = "both",
    seeds: Annotated[int, typer.Option(min=1, help="Runs per strategy and table")] = 20,
    budget: Annotated[int, typer.Option(min=1, help="Measured trials per replayed run")] = 40,
    backend: Annotated[str, typer.Option(help="Backend to record on")] = "xla",
    rounds: Annotated[
        int,
        typer.Option(min=1, help="--record: interleaved rounds (at least 5); every ok config is timed once per round"),
    ] = 10,
    neighbours: Annotated[
        bool,
        typer.Option(
            "--neighbours",
            help="What a database holding the other replayed tables of the same family as tuned workloads "
            "offers: their fastest configs join every strategy's warm start, and the family's model, fitted on "
            "a 40-trial tune of each, steers the default (surrogate)",
        ),
    ] = False,
    peer_order: Annotated[
        str,
        typer.Option(
            help="listed | reversed | shuffled: how Kernel Tuner sees each parameter's values listed (ascending, "
            "each list reversed, each drawn from the seed); its strategies' figures can depend on it",
        ),
    ] = "listed",
    tied: Annotated[
        str,
        typer.Option(
            help="recorded | normalised: the tied set from the runs as recorded (every shipped figure), or from "
            "each run divided by its round's factor, taking a drift of the machine between rounds out",
        ),
    ] = "recorded",
    as_json: Annotated[bool, typer.Option("--json")] = False,
    tables: Annotated[
        list[Path] | None,
        typer.Argument(help="More tables to replay: --replay A.json B.json C.json", show_default=False),
    ] = None,
) -> None:
    """Record exhaustive tables (--record) or compare search strategies on them side by side (--replay TABLE...)."""
    from autotune.compare import MIN_RUNS
    from autotune.replay import RecordedTable, record_table
    from server.bench.search import (
        PEER_ORDERS,
        TIED_RULES,
        check_choice,
        drift_note,
        family_prior,
        neighbour_bests,
        print_search_report,
        recorded_summary,
        replay_versions,
        strategies,
    )
    from server.bench.search import replay as replay_table

    if tables and not replay:
        raise typer.BadParameter(f"tables {[str(t) for t in tables]} without --replay")
    replay = [*(replay or []), *(tables or [])]
    if record == bool(replay):
        raise typer.BadParameter("give --record (with --preset/--workload and --out) or --replay TABLE...")
    if record:
        if (preset is None) == (workload is None) or out_path is None:
            raise typer.BadParameter("--record needs one of --preset/--workload, and --out")
        if rounds < MIN_RUNS:  # refused before any compile: the table would be all ties
            raise typer.BadParameter(
                f"--rounds {rounds}: a config is timed once per round, and fewer than {MIN_RUNS} runs cannot tell "
                f"two configs apart (every config would be tied with the best); give at least {MIN_RUNS} (default 10)"
            )
        wl = local_workload_or_exit("bench search --record", workload, preset, backend, None)
        with LoggedProgress(
            TextColumn("{task.fields[stage]}"),
            MofNCompleteColumn(),
            BarColumn(),
            TimeElapsedColumn(),
            console=err,
        ) as progress:
            task = progress.add_task("record", total=None, stage="recording")

            def step(stage: str, done: int, total: int) -> None:
                progress.update(task, completed=done, total=total, stage=stage[:60])

            table = record_table(wl, rounds=rounds, progress=step)
        table.save(out_path)
        saved = f"saved {len(table.entries)} configs to {out_path} ({rounds} interleaved rounds)"
        err.print(f"{saved}; {recorded_summary(table)}")
        if (note := drift_note(table)) is not None:
            err.print(f"[yellow]{escape(note)}[/]")
        return
    if warm_start not in ("on", "off", "both"):
        raise typer.BadParameter("--warm-start must be on, off or both")
    for flag, what, value, choices in (
        ("--peer-order", "peer order", peer_order, PEER_ORDERS),
        ("--tied", "tied rule", tied, TIED_RULES),
    ):
        try:
            check_choice(what, value, choices)
        except ValueError as exc:
            raise typer.BadParameter(f"{flag}: {exc}") from None
    try:
        names = strategies([s.strip() for s in sampler.split(",") if s.strip()])
    except ValueError as exc:
        raise fail(str(exc)) from None
    starts = {"on": (True,), "off": (False,), "both": (True, False)}[warm_start]
    rows = []
    versions = replay_versions()  # in every row: rows of runs in other installs stay told apart
    loaded = {path: RecordedTable.load(path) for path in replay}
    for path, table in loaded.items():
        if (note := drift_note(table)) is not None:
            hint = "" if tied == "normalised" else " (--tied normalised takes the rounds' speeds out of the tied test)"
            err.print(f"[yellow]{path.name}: {escape(note)}{hint}[/]")
        seeds_of = neighbour_bests(table, list(loaded.values())) if neighbours else []
        prior = family_prior(table, list(loaded.values())) if neighbours else None
        for name in names:
            for start in starts:
                err.print(f"replaying {path.name} with {name}, warm start {'on' if start else 'off'} ({seeds} seeds)")
                scores = replay_table(
                    table,
                    path.name,
                    name,
                    seeds,
                    budget,
                    warm_start=start,
                    neighbours=seeds_of,
                    prior=prior,
                    peer_order=peer_order,
                    tied_rule=tied,
                )
                if scores.error is not None:
                    err.print(f"[yellow]{name} failed on {path.name}: {escape(scores.error)}[/]")
                rows.append({**scores.summary(), "versions": versions})
    if as_json:
        print_json(rows)
        return
    print_search_report(rows, out())


@bench_app.command("winner")
def bench_winner_cmd(
    table: Annotated[
        str, typer.Option(help="A recorded table: a path, or the name of a shipped one (cpu-demo.xla.json)")
    ] = "cpu-demo.xla.json",
    config: Annotated[
        str | None, typer.Option(help="The winner as a TileConfig JSON object (default: the database's tuned one)")
    ] = None,
    database_url: DatabaseOpt = None,
    rounds: Annotated[
        int, typer.Option(min=2, help="Interleaved rounds in each measuring process (each times every candidate once)")
    ] = 10,
    runs: Annotated[int, typer.Option(min=1, help="Timed runs per visit")] = 2,
    processes: Annotated[
        int, typer.Option(min=1, help="Measuring processes the rounds are taken in, pooled (the first, then fresh)")
    ] = 3,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Re-time a tuned winner beside the configs a recorded table found tied with its fastest."""
    from autotune.replay import bundled_table
    from kernel.config import TileConfig
    from server.bench.winner import WinnerBenchOptions, bench_winner, print_winner_report

    path = Path(table)
    try:
        path = path if path.is_file() else bundled_table(table)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--table") from None
    try:
        given = TileConfig.from_dict(json.loads(config)) if config is not None else None
    except (ValueError, TypeError, KeyError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--config") from None
    opts = WinnerBenchOptions(path, database_url_of(database_url), given, rounds, runs, processes)
    _run(bench_winner, opts, print_winner_report, as_json)


@bench_app.command("pipeline")
def bench_pipeline_cmd(
    preset: Annotated[str, typer.Option(help="Workload preset (see `tiletune presets`).")] = "cpu-demo",
    generation: Annotated[str, typer.Option(help="TPU generation: v4, v5e, v5p, v6e, tpu7x.")] = "v6e",
    trials: Annotated[int, typer.Option(min=2, help="Measured configs per search.")] = 12,
    processes: Annotated[int, typer.Option(min=1, help="Compiling processes of the pipeline.")] = 2,
    lookahead: Annotated[int, typer.Option(min=1, help="Configs the pipelined search proposes ahead.")] = 2,
    trial_s: Annotated[
        float, typer.Option(min=0, help="Replayed device seconds per trial besides its runs (warm-up, checks).")
    ] = 1.0,
    rounds: Annotated[int, typer.Option(min=1, help="Interleaved rounds of both modes.")] = 2,
    worker_configs: Annotated[
        int, typer.Option(min=0, help="Verdicts per compile-worker throughput measurement (0: skip it).")
    ] = 12,
    seed: Annotated[int, typer.Option(help="Seed of the searches and of the rounds' order.")] = 0,
    sampler: Annotated[
        str, typer.Option(help="Sampler of both searches (random: the same configs in both modes).")
    ] = "random",
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout.")] = False,
) -> None:
    """Device-busy fraction of a tpu search with real compiles and a replayed device, compiling in line
    against the compile-ahead pipeline (side by side), and compile-worker throughput (configs/min)."""
    from kernel.tpu_targets import TpuCompilerUnavailableError
    from server.bench.pipeline import PipelineBenchOptions, print_pipeline_report, run_pipeline_bench

    opts = PipelineBenchOptions(
        preset,
        generation,
        trials,
        processes,
        lookahead,
        trial_s,
        rounds=rounds,
        seed=seed,
        worker_configs=worker_configs,
        sampler=sampler,
    )
    _run(run_pipeline_bench, opts, print_pipeline_report, as_json, errors=(ValueError, TpuCompilerUnavailableError))


@bench_app.command("compile")
def bench_compile_cmd(
    preset: Annotated[str, typer.Option(help="Workload preset (see `tiletune presets`).")],
    generation: Annotated[
        str, typer.Option(help="TPU generation(s), comma-separated: v4, v5e, v5p, v6e, tpu7x (or device kinds).")
    ] = "v6e",
    sample: Annotated[
        int | None, typer.Option(min=1, help="Compile this many configs (half of them estimated not to fit).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the sample.")] = 0,
    max_seconds: Annotated[
        float | None, typer.Option(min=1, help="Per generation: start no compile after this many seconds.")
    ] = None,
    markdown: Annotated[
        Path | None, typer.Option(help="Write the table of estimate/compiler disagreements to this file.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the reports as JSON on stdout.")] = False,
) -> None:
    """Compile a preset's TPU space for real TPU generations here (no TPU needed): compile time per config,
    failures by cause, and where the VMEM/SMEM estimates and the compiler disagree."""
    from kernel.tpu_targets import TpuCompilerUnavailableError
    from server.bench.compile import CompileBenchOptions, agreement_markdown, bench_compile, print_compile_report

    reports = []
    for gen in (g.strip() for g in generation.split(",") if g.strip()):
        opts = CompileBenchOptions(preset, gen, sample, seed, max_seconds)
        reports.append(
            _run(bench_compile, opts, print_compile_report, as_json, errors=(ValueError, TpuCompilerUnavailableError))
        )
    if markdown is not None:
        markdown.write_text(agreement_markdown(reports))
        err.print(f"wrote the agreement table to {markdown}")
