"""``tiletune bench winner``: a tuned config re-timed beside a recorded table's tied set.

A recorded table (``tiletune bench search --record``) knows which configs of a workload
are statistically tied with its fastest. Whether a search's winner is one of them is
decided here by measuring, not by looking it up: the winner (the workload's current
tuned config in the database, or one given) and every config of the table's tied set
are compiled and checked against the reference in one supervised measuring child, as a
tuning run measures, then timed in interleaved rounds (every candidate once per round,
in a fresh order: :func:`autotune.compare.interleaved`), in each of several fresh
measuring processes (``processes``): a difference of 1-2% that one process shows can be
gone in the next, so the verdict is taken on the runs of all of them pooled
(:func:`autotune.compare.interleaved_over_processes`). Each is compared with the one
with the fastest pooled median by :func:`autotune.compare.difference`: the winner
succeeded when it is not reliably slower. Each row also says how it compared with that
config in every process alone, so a reader sees whether a verdict holds process by process.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.compare import difference, interleaved_over_processes, pooled
from autotune.measure import MeasureOptions, RunStats
from autotune.replay import RecordedTable
from autotune.supervisor import Supervisor
from kernel.config import TileConfig
from kernel.workload import Workload


@dataclasses.dataclass
class WinnerBenchOptions:
    table: Path
    database_url: str | None = None  # where the tuned winner is read (ignored with ``config``)
    config: TileConfig | None = None  # a winner given directly
    rounds: int = 10  # interleaved rounds in each measuring process
    runs: int = 2  # timed runs per visit
    processes: int = 3  # measuring processes the rounds are taken in (the first, then fresh ones)
    seed: int = 0


def tuned_winner(database_url: str, workload: Workload) -> TileConfig:
    """The current tuned config of ``workload`` in the database; a ValueError names what is missing."""
    from server.store import records, workloads
    from server.store.db import Database
    from server.store.migrate import upgrade

    upgrade(database_url)  # a database never used before is an empty one, not an error
    db = Database(database_url)
    try:
        with db.transaction() as session:
            row = workloads.find_workload(session, workload.key)
            tuned = records.current_config(session, row.id) if row is not None else None
            config = tuned.config if tuned is not None else None
    finally:
        db.dispose()
    if config is None:
        raise ValueError(
            f"no tuned config of the table's workload {workload.key} in {database_url}: tune it first "
            "(e.g. `tiletune tune --preset cpu-demo --trials 40`) or give --config"
        )
    return TileConfig.from_dict(config)


def bench_winner(opts: WinnerBenchOptions, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Time the winner beside the table's tied set (module doc); the report has a row per candidate,
    fastest first, and the verdict on the winner."""
    say = progress or (lambda _msg: None)
    table = RecordedTable.load(opts.table)
    if opts.config is not None:
        winner = opts.config
    else:
        assert opts.database_url is not None, "give a database URL or a config"
        winner = tuned_winner(opts.database_url, table.workload)
    outside = table.space().violation(winner)
    if outside is not None:
        raise ValueError(f"config {winner.describe()}: not in the table's space: {outside}")
    best_ms = table.best[1].median_ms or 0.0
    recorded = {k: table.entries[k][1].median_ms for k in table.tied_with_best()}
    candidates = {k: table.entries[k][0] for k in sorted(recorded, key=lambda k: recorded[k] or 0.0)}
    candidates.setdefault(winner.key, winner)
    options = MeasureOptions(repeats=1, min_time_s=0.0, keep_compiled=len(candidates) + 2)
    failed: dict[str, str] = {}
    with Supervisor(table.workload, table.backend, options) as supervisor:
        clock = supervisor.clock()["clock"]
        for i, (key, config) in enumerate(candidates.items()):
            say(f"compiling and checking {i + 1}/{len(candidates)}: {config.describe()}")
            measured = supervisor.measure(config)
            if measured.status != "ok":
                failed[key] = f"{measured.status}: {measured.error}"
        ok = [k for k in candidates if k not in failed]
        visits = {"n": 0}
        total = len(ok) * opts.rounds * max(1, opts.processes)

        def visit(key: str) -> list[float]:
            visits["n"] += 1
            say(f"timing in interleaved rounds {visits['n']}/{total}")
            return supervisor.retime(candidates[key], opts.runs)

        def restart() -> None:
            say("starting a fresh measuring process")
            supervisor.restart()

        per_process = interleaved_over_processes(ok, visit, opts.rounds, opts.processes, restart, opts.seed)
    if winner.key in failed:
        raise RuntimeError(f"the winner {winner.describe()} did not measure: {failed[winner.key]}")
    runs = pooled(per_process)
    stats = {k: s for k in ok if (s := RunStats.of(runs[k])) is not None}
    order = sorted(stats, key=lambda k: stats[k].median_ms)
    fastest = order[0]
    rows = []
    for key in order:
        s = stats[key]
        d = difference(runs[key], runs[fastest])
        alone = [difference(p[key], p[fastest]) for p in per_process if p.get(key) and p.get(fastest)]
        table_ms = table.entries[key][1].median_ms if key in table.entries else None
        rows.append(
            {
                "config": candidates[key].describe(),
                "winner": key == winner.key,
                "in_table_tied_set": key in recorded,
                "table_ratio": table_ms / best_ms if table_ms and best_ms else None,
                "median_ms": s.median_ms,
                "p10_ms": s.p10_ms,
                "p90_ms": s.p90_ms,
                "ratio": d.ratio,
                "p_value": d.p_value,
                "tied": not (d.real and d.ratio > 1.0),
                # Over the pooled fastest, in each process alone, and in how many it was reliably slower.
                "process_ratios": [a.ratio for a in alone],
                "slower_in_processes": sum(a.real and a.ratio > 1.0 for a in alone),
            }
        )
    verdict = next(r for r in rows if r["winner"])
    return {
        "table": opts.table.name,
        "workload": table.workload.key,
        "clock": clock,
        "table_clock": table.clock,
        "rounds": opts.rounds,
        "runs_per_visit": opts.runs,
        "processes": len(per_process),
        "tied_set": len(recorded),
        "failed": {candidates[k].describe(): why for k, why in failed.items()},
        "winner": winner.describe(),
        "winner_in_table_tied_set": verdict["in_table_tied_set"],
        "winner_ratio": verdict["ratio"],
        "winner_p_value": verdict["p_value"],
        "winner_tied": verdict["tied"],
        "rows": rows,
    }


def print_winner_report(report: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    table = Table(
        "config",
        "in table's tied set (ratio recorded)",
        "median ms (p10-p90)",
        "over fastest",
        "p",
        "tied",
        "over fastest, process by process",
        title=f"{report['table']}: winner beside the table's {report['tied_set']} tied configs, "
        f"{report['rounds']} interleaved rounds of {report['runs_per_visit']} runs in each of "
        f"{report['processes']} measuring process{'es' if report['processes'] != 1 else ''}, pooled; "
        f"{report['clock']} clock",
    )
    for r in report["rows"]:
        recorded = f"{'yes' if r['in_table_tied_set'] else 'no'} ({r['table_ratio']:.3f})" if r["table_ratio"] else "-"
        table.add_row(
            ("[bold]winner[/bold] " if r["winner"] else "") + r["config"],
            recorded,
            f"{r['median_ms']:.2f} ({r['p10_ms']:.2f}-{r['p90_ms']:.2f})",
            f"{r['ratio']:.3f}",
            f"{r['p_value']:.3f}",
            "yes" if r["tied"] else "no",
            _process_ratios(r),
        )
    console.print(table)
    for config, why in report["failed"].items():
        console.print(f"[red]{config}[/red] did not measure: {why}")
    if report["clock"] != report["table_clock"]:
        console.print(f"the table was timed by the {report['table_clock']} clock: its recorded ratios are not these")
    ratio, p = report["winner_ratio"], report["winner_p_value"]
    console.print(
        f"winner {report['winner']}: "
        + ("tied with the fastest" if report["winner_tied"] else "reliably slower than the fastest")
        + f" ({ratio:.3f}x its median, p={p:.3f})"
    )


def _process_ratios(row: dict[str, Any]) -> str:
    ratios = row["process_ratios"]
    if not ratios:
        return "-"
    spread = f"{min(ratios):.3f}-{max(ratios):.3f}" if len(ratios) > 1 else f"{ratios[0]:.3f}"
    return f"{spread}, slower in {row['slower_in_processes']} of {len(ratios)}"
