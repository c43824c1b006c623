"""``tiletune bench search``: record exhaustive tables, replay search strategies on them.

``--record`` measures every valid config of a workload once (supervised, as a
real study would) and saves the table. ``--replay`` runs each sampler with
several seeds on each table through the ``replay`` backend and reports the
number of measured trials needed to get within 2% of the table's best (median
over seeds) and the best found at fixed budgets, relative to the table's best.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from autotune.measure import Measurement, MeasureOptions
from autotune.replay import RecordedTable, ReplayMeasurer
from autotune.search import SearchOptions, run_search
from autotune.space import SearchSpace
from autotune.supervisor import Supervisor
from autotune.versions import software_versions
from kernel.workload import Workload

WITHIN = 0.02
BUDGETS = (5, 10, 20, 40)


def record_table(
    workload: Workload,
    *,
    measure: MeasureOptions | None = None,
    trial_timeout_s: float = 300.0,
    progress: Callable[[int, int, Any, Measurement], None] | None = None,
    space: SearchSpace | None = None,
) -> RecordedTable:
    """Measure every valid config of ``space`` (default: the workload's full space) once."""
    space = space or SearchSpace(workload, workload.backend)
    configs = space.enumerate()
    entries = {}
    from autotune.measure import config_key

    with Supervisor(workload, workload.backend, measure, trial_timeout_s) as supervisor:
        for i, config in enumerate(configs):
            m = supervisor.measure(config)
            entries[config_key(config)] = (config, m)
            if progress is not None:
                progress(i + 1, len(configs), config, m)
        dense = supervisor.dense_ms()
    return RecordedTable(
        workload,
        workload.backend,
        workload.device_kind,
        entries,
        dense,
        {k: v for k, v in software_versions().items() if v},
    )


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
