"""``tiletune bench search``: search strategies replayed on recorded exhaustive tables.

``--record`` measures a table (:func:`autotune.replay.record_table`). ``--replay``
runs each sampler with several seeds on each table through the ``replay``
backend and reports the number of measured trials needed to get within 2% of
the table's best (median over seeds) and the best found at fixed budgets,
relative to the table's best.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from autotune.replay import RecordedTable, ReplayMeasurer
from autotune.search import SearchOptions, run_search

WITHIN = 0.02
BUDGETS = (5, 10, 20, 40)


@dataclasses.dataclass
class ReplayStats:
    table: str
    sampler: str
    size: int
    trials_to_within: list[float]  # per seed; inf when never reached
    best_at_budget: dict[int, list[float]]  # budget -> per seed best/table-best

    def summary(self) -> dict[str, Any]:
        finite = [t for t in self.trials_to_within if math.isfinite(t)]
        median = float(np.median(self.trials_to_within))
        return {
            "table": self.table,
            "sampler": self.sampler,
            "table_size": self.size,
            "median_trials_to_within_2pct": median,
            "fraction_of_table": median / self.size,
            "reached": f"{len(finite)}/{len(self.trials_to_within)}",
            "best_at_budget": {str(b): float(np.median(v)) for b, v in self.best_at_budget.items()},
        }


def replay(table: RecordedTable, name: str, sampler: str, seeds: int, budget: int | None = None) -> ReplayStats:
    """Run ``sampler`` ``seeds`` times on ``table``, each with ``budget`` measured trials
    (default: the whole table, so every run eventually reaches the best)."""
    best = table.best[1].median_ms or 0.0
    size = len(table.entries)
    space = table.space()
    stats = ReplayStats(name, sampler, size, [], {b: [] for b in BUDGETS})
    for seed in range(seeds):
        measurer = ReplayMeasurer(table)
        options = SearchOptions(trials=budget or size, sampler=sampler, seed=seed, prune=False, retime_rounds=1)
        result = run_search(space, measurer, options)
        medians = [t.measurement.median_ms if t.measurement.status == "ok" else math.inf for t in result.trials]
        running = np.minimum.accumulate(np.asarray(medians, dtype=float)) if medians else np.asarray([math.inf])
        hit = np.flatnonzero(running <= best * (1 + WITHIN))
        stats.trials_to_within.append(float(hit[0] + 1) if hit.size else math.inf)
        for b in BUDGETS:
            found = running[min(b, len(running)) - 1]
            stats.best_at_budget[b].append(float(found / best) if math.isfinite(found) else math.inf)
    return stats


def print_search_report(rows: list[dict[str, Any]], out: Any) -> None:
    """The replay summaries as a rich table on ``out`` (a rich Console)."""
    from rich.table import Table

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
    out.print(t)
    out.print("best@N: median over seeds of (best found in N measured trials) / (table's best); 1.000 = the best")
