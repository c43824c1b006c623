"""``tiletune tune``: one local study on this machine; trials and the winner go to the database."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from server.cli.common import (
    CoreOpt,
    DatabaseOpt,
    JsonOpt,
    checked_core,
    err,
    fail,
    local_workload_or_exit,
    out,
    print_json,
    speedups,
)
from server.cli.common import database_url as database_url_of
from server.cli.progress import LoggedProgress


def tune(
    preset: Annotated[str | None, typer.Option(help="Workload preset (see `tiletune presets`)")] = None,
    workload: Annotated[Path | None, typer.Option(help="Workload JSON file (the API's workload object)")] = None,
    backend: Annotated[str, typer.Option(help="auto | tpu | xla | interpret")] = "auto",
    trials: Annotated[int, typer.Option(min=1, help="Configs to measure")] = 40,
    timeout: Annotated[float | None, typer.Option(min=1, help="Time budget of the whole search, seconds")] = None,
    trial_timeout: Annotated[
        float, typer.Option(min=1, help="A trial not done in this many seconds is a timeout")
    ] = 300,
    sampler: Annotated[
        str, typer.Option(help="surrogate | tpe | tpe-plain | random | grid | gp | brute")
    ] = "surrogate",
    seed: Annotated[int, typer.Option(help="Sampler seed")] = 0,
    warm_start: Annotated[
        bool,
        typer.Option(
            help="Measure first the heuristic, this workload's tuned config and the nearest tuned workloads' configs"
        ),
    ] = True,
    dtype: Annotated[str | None, typer.Option(help="float32 | bfloat16 (preset default; float32 on xla)")] = None,
    repeats: Annotated[int, typer.Option(min=1, help="Timed runs per trial (at least)")] = 5,
    core: CoreOpt = None,
    database_url: DatabaseOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Tune one workload on this machine and store the trials and the best config."""
    from autotune.host_load import BUSY_ABOVE_CORES
    from autotune.measure import MeasureOptions
    from autotune.samplers import SAMPLERS
    from autotune.search import SearchOptions
    from server.worker.tune import tune_workload

    if (preset is None) == (workload is None):
        raise typer.BadParameter("give exactly one of --preset or --workload")
    if sampler not in SAMPLERS:
        raise typer.BadParameter(f"--sampler must be one of {SAMPLERS}")
    wl = local_workload_or_exit("tune", workload, preset, backend, dtype)
    url = database_url_of(database_url)
    err.print(f"tuning {wl.key} on {wl.device_kind} ({wl.backend}, {wl.dtype}): {wl.pattern.describe()}")
    progress = LoggedProgress(
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

    options = SearchOptions(trials=trials, sampler=sampler, seed=seed, timeout_s=timeout, warm_start=warm_start)
    try:
        with progress:
            outcome = tune_workload(
                wl,
                database_url=url,
                search=options,
                measure=MeasureOptions(repeats=repeats, core=checked_core(core)),
                trial_timeout_s=trial_timeout,
                on_trial=on_trial,
            )
    except ValueError as exc:
        raise fail(str(exc)) from None
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
        "anchors_ms": {name: result.anchor_ms(name) for name in result.anchors},
        "best": None
        if result.best is None
        else {
            "config": result.best.config.to_dict(),
            "median_ms": result.best_median_ms,
            "spread": result.best_spread,
            "tied_finalists": [c.to_dict() for c in result.tied],
            "speedup": _over(result.dense_ms, result.best_median_ms),
            "speedup_vs_tiled_dense": _over(result.anchor_ms("tiled_dense"), result.best_median_ms),
            "speedup_p10_p90": result.speedup_p10_p90(),  # per pair of runs taken side by side
            "tuned_config_id": outcome.tuned_config_id,
            "others_cores": result.others_cores,
            "anchor_processes": result.anchor_processes,
            "resolve_processes": result.resolve_processes,
        },
        "top": [
            {"config": t.config.to_dict(), "median_ms": t.measurement.median_ms, "spread": t.measurement.spread}
            for t in ranked[:10]
        ],
    }
    if as_json:
        print_json(report)
        return
    console = out()
    table = Table("rank", "config", "median ms", "p10-p90 ms", "spread")
    for i, t in enumerate(ranked[:10], 1):
        m = t.measurement
        table.add_row(
            str(i),
            t.config.describe(),
            f"{m.median_ms:.3f}",
            f"{m.p10_ms:.3f}-{m.p90_ms:.3f}",
            f"{(m.spread or 0):.1%}",
        )
    console.print(table)
    console.print(
        f"statuses: {report['statuses']}; invalid proposals skipped: {result.invalid}; "
        f"repeats answered from the study: {result.repeated}"
    )
    if result.best is not None:
        best = report["best"]
        spread = {name: result.speedup(name) for name in ("dense", "tiled_dense")}
        speed = speedups(result.best_median_ms, result.dense_ms, result.anchor_ms("tiled_dense"), spread)
        tied = f", {len(result.tied)} of them tied within the noise" if len(result.tied) > 1 else ""
        if result.resolve_processes:
            tied += f"; the tied ones re-timed more in {result.resolve_processes} measuring process(es)"
        console.print(
            f"[bold]winner[/bold] (re-timed in interleaved rounds against the top {len(result.finalists)}{tied}): "
            f"{result.best.config.describe()} {best['median_ms']:.3f} ms, spread {best['spread']:.1%}{speed}; "
            f"stored as tuned config {outcome.tuned_config_id} of workload {outcome.workload_key}"
        )
        console.print(
            "median times of a trial come from its own runs; the winner's and its anchors' from interleaved "
            f"rounds in {result.anchor_processes} measuring process(es), their spreads pooled over them"
        )
        if result.others_cores is not None and result.others_cores > BUSY_ABOVE_CORES:
            err.print(
                f"[yellow]other programs kept {result.others_cores:.1f} cores busy while the winner and its anchors "
                "were timed: a load slows the kernel and dense attention unequally, so the speedups may read "
                "differently on a quiet machine[/yellow]"
            )
    else:
        console.print("[red]no config measured ok[/red]")


def _over(anchor_ms: float | None, median_ms: float | None) -> float | None:
    return anchor_ms / median_ms if anchor_ms and median_ms else None
