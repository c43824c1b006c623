"""CLI of the tuning engine: ``tiletune tune`` and ``tiletune bench search``."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

err = Console(stderr=True)


def _out() -> Console:
    return Console() if sys.stdout.isatty() else Console(width=160)


def tune(
    preset: Annotated[str | None, typer.Option(help="Workload preset (see `tiletune presets`)")] = None,
    workload: Annotated[Path | None, typer.Option(help="Workload JSON file (the API's workload object)")] = None,
    backend: Annotated[str, typer.Option(help="auto | tpu | xla | interpret")] = "auto",
    trials: Annotated[int, typer.Option(min=1, help="Configs to measure")] = 40,
    timeout: Annotated[float | None, typer.Option(min=1, help="Time budget of the whole search, seconds")] = None,
    trial_timeout: Annotated[
        float, typer.Option(min=1, help="A trial not done in this many seconds is a timeout")
    ] = 300,
    sampler: Annotated[str, typer.Option(help="tpe | tpe-plain | random | grid | gp | brute")] = "tpe",
    seed: Annotated[int, typer.Option(help="Sampler seed")] = 0,
    dtype: Annotated[str | None, typer.Option(help="float32 | bfloat16 (preset default; float32 on xla)")] = None,
    repeats: Annotated[int, typer.Option(min=1, help="Timed runs per trial (at least)")] = 5,
    database_url: Annotated[str | None, typer.Option("--database-url", help="Where results go")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON")] = False,
) -> None:
    """Tune one workload on this machine and store the trials and the best config."""
    from autotune.measure import MeasureOptions
    from autotune.search import SAMPLERS, SearchOptions
    from autotune.tune import local_workload, tune_workload
    from server.settings import Settings

    if (preset is None) == (workload is None):
        raise typer.BadParameter("give exactly one of --preset or --workload")
    if sampler not in SAMPLERS:
        raise typer.BadParameter(f"--sampler must be one of {SAMPLERS}")
    try:
        spec = json.loads(workload.read_text()) if workload else None
        wl = local_workload(spec, preset, backend, dtype, 1)
    except (ValueError, OSError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    url = database_url or Settings().database_url
    err.print(f"tuning {wl.key} on {wl.device_kind} ({wl.backend}, {wl.dtype}): {wl.pattern.describe()}")
    progress = Progress(
        TextColumn("trial"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("{task.fields[best]}"),
        TextColumn("{task.fields[failures]}"),
        TimeElapsedColumn(),
        console=err,
    )
    task = progress.add_task("tune", total=trials, best="best -", failures="failures 0")

    def on_trial(trial: Any, result: Any) -> None:
        failures = sum(n for s, n in result.counts().items() if s not in ("ok", "pruned"))
        best = result.best.measurement.median_ms if result.best else None
        progress.update(
            task,
            completed=len(result.trials),
            failures=f"failures {failures}",
            best=f"best {best:.3f} ms" if best else "best -",
        )

    options = SearchOptions(trials=trials, sampler=sampler, seed=seed, timeout_s=timeout)
    try:
        with progress:
            outcome = tune_workload(
                wl,
                database_url=url,
                search=options,
                measure=MeasureOptions(repeats=repeats),
                trial_timeout_s=trial_timeout,
                on_trial=on_trial,
            )
    except ValueError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    result = outcome.result
    ranked = sorted(
        (t for t in result.trials if t.measurement.status == "ok"), key=lambda t: t.measurement.median_ms or 0.0
    )
    report: dict[str, Any] = {
        "workload_key": outcome.workload_key,
        "measured": len(result.trials),
        "invalid_proposals": result.invalid,
        "repeated_proposals": result.repeated,
        "statuses": result.counts(),
        "dense_ms": result.dense_ms,
        "best": None
        if result.best is None
        else {
            "config": result.best.config.to_dict(),
            "median_ms": result.best_median_ms,
            "spread": result.best_spread,
            "speedup": (result.dense_ms / result.best_median_ms) if result.dense_ms and result.best_median_ms else None,
            "tuned_config_id": outcome.tuned_config_id,
        },
        "top": [
            {"config": t.config.to_dict(), "median_ms": t.measurement.median_ms, "spread": t.measurement.spread}
            for t in ranked[:10]
        ],
    }
    if as_json:
        print(json.dumps(report, indent=2))
        return
    out = _out()
    table = Table("rank", "config", "median ms", "p10-p90 ms", "spread", "speedup vs dense")
    for i, t in enumerate(ranked[:10], 1):
        m = t.measurement
        speed = f"{result.dense_ms / m.median_ms:.2f}x" if result.dense_ms and m.median_ms else "-"
        table.add_row(
            str(i),
            t.config.describe(),
            f"{m.median_ms:.3f}",
            f"{m.p10_ms:.3f}-{m.p90_ms:.3f}",
            f"{(m.spread or 0):.1%}",
            speed,
        )
    out.print(table)
    out.print(
        f"statuses: {report['statuses']}; invalid proposals skipped: {result.invalid}; "
        f"repeats answered from the study: {result.repeated}"
    )
    if result.best is not None:
        best = report["best"]
        speed = f", {best['speedup']:.2f}x over dense" if best["speedup"] else ""
        out.print(
            f"[bold]winner[/bold] (re-timed against the top {len(result.finalists)}): "
            f"{result.best.config.describe()} {best['median_ms']:.3f} ms, spread {best['spread']:.1%}{speed}; "
            f"stored as tuned config {outcome.tuned_config_id} of workload {outcome.workload_key}"
        )
    else:
        out.print("[red]no config measured ok[/red]")


def bench_search(
    record: Annotated[bool, typer.Option("--record", help="Measure every valid config and save the table")] = False,
    preset: Annotated[str | None, typer.Option(help="Workload preset to record")] = None,
    workload: Annotated[Path | None, typer.Option(help="Workload JSON file to record")] = None,
    out: Annotated[Path | None, typer.Option(help="Where --record writes the table")] = None,
    replay: Annotated[list[Path] | None, typer.Option("--replay", help="Recorded tables to replay")] = None,
    sampler: Annotated[str, typer.Option(help="Samplers to compare, comma-separated")] = "tpe,random,grid",
    seeds: Annotated[int, typer.Option(min=1, help="Runs per sampler and table")] = 20,
    budget: Annotated[
        int | None, typer.Option(min=1, help="Measured trials per replayed run (default: the table)")
    ] = None,
    backend: Annotated[str, typer.Option(help="Backend to record on")] = "xla",
    repeats: Annotated[int, typer.Option(min=1)] = 5,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    tables: Annotated[
        list[Path] | None,
        typer.Argument(help="More tables to replay: --replay A.json B.json C.json", show_default=False),
    ] = None,
) -> None:
    """Record exhaustive tables (--record) or compare search strategies on them (--replay TABLE...)."""
    from autotune.bench_search import BUDGETS, record_table
    from autotune.bench_search import replay as replay_table
    from autotune.measure import MeasureOptions
    from autotune.replay import RecordedTable
    from autotune.search import SAMPLERS
    from autotune.tune import local_workload

    if tables and not replay:
        raise typer.BadParameter(f"tables {[str(t) for t in tables]} without --replay")
    replay = [*(replay or []), *(tables or [])]
    if record == bool(replay):
        raise typer.BadParameter("give --record (with --preset/--workload and --out) or --replay TABLE...")
    if record:
        if (preset is None) == (workload is None) or out is None:
            raise typer.BadParameter("--record needs one of --preset/--workload, and --out")
        spec = json.loads(workload.read_text()) if workload else None
        wl = local_workload(spec, preset, backend, None, 1)
        with Progress(
            TextColumn("recording"),
            MofNCompleteColumn(),
            BarColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[last]}"),
            console=err,
        ) as progress:
            task = progress.add_task("record", total=None, last="")

            def step(i: int, n: int, config: Any, m: Any) -> None:
                progress.update(task, completed=i, total=n, last=f"{config.describe()}: {m.status} {m.median_ms}")

            table = record_table(wl, measure=MeasureOptions(repeats=repeats), progress=step)
        table.save(out)
        best_config, best = table.best
        err.print(f"saved {len(table.entries)} configs to {out}; best {best_config.describe()} {best.median_ms:.3f} ms")
        return
    samplers = [s.strip() for s in sampler.split(",") if s.strip()]
    for s in samplers:
        if s not in SAMPLERS:
            raise typer.BadParameter(f"--sampler: unknown {s!r}; choose from {SAMPLERS}")
    rows = []
    for path in replay or []:
        table = RecordedTable.load(path)
        for s in samplers:
            err.print(f"replaying {path.name} with {s} ({seeds} seeds)")
            rows.append(replay_table(table, path.name, s, seeds, budget).summary())
    if as_json:
        print(json.dumps(rows, indent=2))
        return

    def reached(row: dict[str, Any]) -> bool:  # the median seed got within 2% inside the budget
        return math.isfinite(row["median_trials_to_within_2pct"])

    t = Table("table", "size", "sampler", "median trials to 2%", "of table", "reached", *[f"best@{b}" for b in BUDGETS])
    for r in rows:
        t.add_row(
            r["table"],
            str(r["table_size"]),
            r["sampler"],
            f"{r['median_trials_to_within_2pct']:.1f}" if reached(r) else "not reached",
            f"{r['fraction_of_table']:.1%}" if reached(r) else "-",
            r["reached"],
            *[f"{r['best_at_budget'][str(b)]:.3f}" for b in BUDGETS],
        )
    _out().print(t)
    _out().print("best@N: median over seeds of (best found in N measured trials) / (table's best); 1.000 = the best")
