"""Exhaustive tables: recording, the replay backend, and the search benchmark on the committed fixtures."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
from typing import Any

import numpy as np
import pytest

from autotune.measure import Measurement, tiled_dense
from autotune.replay import TABLES as TABLES_DIR
from autotune.replay import RecordedTable, ReplayMeasurer, host_description, record_table
from autotune.search import SearchOptions, run_search
from autotune.space import SearchSpace
from kernel.layout import VideoLayout
from kernel.pattern import HeadPattern, SparsityPattern
from kernel.reference import TOLERANCE
from kernel.workload import Workload
from server.bench.search import (
    BUDGETS,
    PEER_ORDERS,
    answers,
    heuristic_key,
    measured_sequence,
    neighbour_bests,
    print_search_report,
    regret_beyond,
    replay,
    score,
    strategies,
)
from server.bench.verdicts import REGRET_BOUND, head_to_head

TABLES = sorted(TABLES_DIR.glob("*.xla.json"))


def test_at_least_three_committed_tables_are_exhaustive_and_valid() -> None:
    assert len(TABLES) >= 3
    for path in TABLES:
        table = RecordedTable.load(path)
        space = table.space()
        assert table.backend == "xla" and table.device_kind == "cpu"
        assert {c.key for c in space.enumerate()} == set(table.entries)  # every valid point, once
        _, best = table.best
        assert best.status == "ok" and best.max_error is not None and best.max_error <= TOLERANCE[table.workload.dtype]
        assert table.dense_ms and table.dense_ms > 0


def test_a_tables_space_counts_each_configs_grid_steps_once(monkeypatch: Any) -> None:
    """Every replay of a table (a seed, a strategy) shares one SearchSpace, which builds a config's block
    tables to count its grid steps once: the default's model asks for every valid config's, and recounting
    them per seed took most of a replay's time. A table given another workload gets its own space."""
    from autotune import space as space_module
    from kernel.cost import grid_steps

    table = RecordedTable.load(TABLES_DIR / "suffix-sink.xla.json")
    counted: list[Any] = []

    def counting(*args: Any) -> int:
        counted.append(args[1])
        return grid_steps(*args)

    monkeypatch.setattr(space_module, "grid_steps", counting)
    space = table.space()
    assert table.space() is space and space.enumerate() == SearchSpace(table.workload, table.backend).enumerate()
    for seed in range(2):
        run_search(
            table.space(),
            ReplayMeasurer(table),
            SearchOptions(trials=5, seed=seed, sampler="surrogate", prune=False),
            finalize=False,
        )
    valid = space.enumerate()
    assert sorted(counted, key=lambda c: c.key) == sorted(valid, key=lambda c: c.key)  # each once, no more
    assert [space.grid_steps(c) for c in valid] == [
        grid_steps(space.pattern, c, "xla", table.workload.kernel_version) for c in valid
    ]
    other = dataclasses.replace(table, workload=dataclasses.replace(table.workload, batch=2))
    assert other.space() is not space and other.space().workload.batch == 2


def test_replay_answers_recorded_measurements() -> None:
    table = RecordedTable.load(TABLES[0])
    measurer = ReplayMeasurer(table)
    config, recorded = next(iter(table.entries.values()))
    assert measurer.measure(config) == recorded
    assert measurer.retime(config, 4) and len(measurer.retime(config, 4)) == 4
    measurer = ReplayMeasurer(table)
    result = run_search(table.space(), measurer, SearchOptions(trials=15, seed=2))
    assert len(result.trials) == 15 and len(set(measurer.measured)) == 15
    assert result.best is not None and result.best.measurement.status == "ok"


def _synthetic(table: RecordedTable, medians: dict[str, float]) -> RecordedTable:
    """``table`` with every ok entry re-timed: 20 runs tightly around the given median (default 50 ms)."""
    entries = {}
    for key, (config, m) in table.entries.items():
        centre = medians.get(key, 50.0)
        runs = tuple(centre * (1 + 0.001 * ((i * 7) % 11 - 5)) for i in range(20))
        entries[key] = (config, dataclasses.replace(m, status="ok", runs_ms=runs, max_error=0.0))
    return dataclasses.replace(table, entries=entries)


def test_scores_count_trials_to_the_tied_set_and_regret_at_each_budget() -> None:
    base = RecordedTable.load(TABLES[-1])
    keys = list(base.entries)
    # keys[0] is the fastest, keys[1] within its noise (0.5% slower: tied), keys[2] 5% slower, the rest 50 ms.
    table = _synthetic(base, {keys[0]: 10.0, keys[1]: 10.05, keys[2]: 10.5})
    tied = table.tied_with_best()
    assert tied == {keys[0], keys[1]}
    sequence = [*keys[3:17], keys[2], *keys[17:25], keys[1], *keys[25:40]]  # 15th: keys[2]; 24th: keys[1]
    hit, regret = score(table, sequence, tied)
    assert hit == 24
    assert regret[10] == pytest.approx(50.0 / 10.0, rel=0.01)
    assert regret[20] == pytest.approx(10.5 / 10.0, rel=0.01)
    assert regret[40] == pytest.approx(10.05 / 10.0, rel=0.01)
    assert score(table, keys[3:43], tied) == (math.inf, {b: pytest.approx(5.0, rel=0.01) for b in BUDGETS})


def test_a_regret_over_the_bound_is_told_from_the_runs_noise() -> None:
    """The answer after N trials is the fastest recorded config among them; whether it runs reliably slower
    than REGRET_BOUND x the table's fastest is read from their recorded runs. A config 10% slower with runs
    within 0.5% is over the bound beyond the noise; one 12% slower whose runs and the fastest's spread 40%
    is over it by the medians only."""
    from rich.console import Console

    base = RecordedTable.load(TABLES[-1])
    keys = list(base.entries)
    tight = _synthetic(base, {keys[0]: 10.0, keys[1]: 11.0})
    spread = [1 + 0.04 * ((i * 7) % 11 - 5) for i in range(20)]  # +-20%, in a fixed shuffled order
    noisy = dataclasses.replace(tight, entries=dict(tight.entries))
    for key, centre in ((keys[0], 10.0), (keys[1], 11.2)):
        config, m = noisy.entries[key]
        noisy.entries[key] = (config, dataclasses.replace(m, runs_ms=tuple(centre * f for f in spread)))
    assert REGRET_BOUND == 1.03
    assert answers(tight, [keys[5], keys[1], keys[7]]) == {b: keys[1] for b in BUDGETS}
    reached_late = answers(tight, [keys[5], keys[1], *keys[6:20], keys[0]])  # the fastest is the 17th
    assert (reached_late[10], reached_late[20]) == (keys[1], keys[0])
    assert regret_beyond(tight, keys[1]) and not regret_beyond(tight, keys[0])
    assert not regret_beyond(noisy, keys[1])
    assert regret_beyond(tight, None)  # nothing in the budget ran: missed by any measure
    # Plain random on the tight table: every config but the fastest runs 1.1x or 5x it within 0.5%, so a
    # seed's answer is over the bound beyond the noise exactly when its regret is over the bound.
    scores = replay(tight, "tight", "random", seeds=6, budget=40, warm_start=False)
    over = {b: sum(r > REGRET_BOUND for r in scores.regret[b]) for b in BUDGETS}
    assert scores.summary()["over_bound_beyond_noise"] == {str(b): over[b] for b in BUDGETS}
    assert over[10] > 0  # the check above compares something
    cells = {"table_size": 9, "tied_set": 1, "median_regret": {str(b): 1.12 for b in BUDGETS}}
    rows = [
        {**_row("t", "surrogate", True, 3), **cells, "over_bound_beyond_noise": {"20": 10}},  # 10 of 20 seeds
        {**_row("t", "random", True, 9), **cells},
        {**_row("u", "surrogate", True, 3), **cells, "over_bound_beyond_noise": {"20": 11}},
        {**_row("u", "random", True, 9), **cells},
        {**_row("v", "surrogate", True, 3), **cells},  # a report from before the test: no verdict
        {**_row("v", "random", True, 9), **cells},
        {**_row("w", "surrogate", True, 3, regret=1.03), "over_bound_beyond_noise": {"20": 0}},
        _row("w", "random", True, 9),
    ]
    verdicts = {v["table"]: v["regret_20_verdict"] for v in head_to_head(rows)}
    assert verdicts == {"t": "over, within noise", "u": "over, beyond noise", "v": None, "w": "within"}
    console = Console(record=True, width=300)
    print_search_report([r for r in rows if r["table"] != "w"], console)
    text = " ".join(console.export_text().split())
    assert "│ 1.120 (within noise) │" in text and "│ 1.120 (beyond noise) │" in text
    assert "at most 3% over the fastest on 0 of 2 rows, over it within the runs' noise on 1 and beyond it on 1" in text


def test_regret_is_reported_only_at_budgets_the_run_reached() -> None:
    """With --budget 15 on a larger table the regret at 20 and 40 trials was never measured: null, not the
    regret at 15 under another name; a budget that measures the whole table knows every later regret."""
    table = RecordedTable.load(TABLES_DIR / "cpu-demo.xla.json")
    assert len(table.entries) > max(BUDGETS)
    short = replay(table, "cpu-demo", "random", seeds=2, budget=15).summary()
    assert short["median_regret"]["10"] is not None
    assert short["median_regret"]["20"] is None and short["max_regret"]["40"] is None
    assert None not in replay(table, "cpu-demo", "random", seeds=2, budget=40).summary()["median_regret"].values()
    tiny = Workload("cpu", "xla", "float32", 1, 32, SparsityPattern(VideoLayout(2, 64), (HeadPattern.spatial(0),)))
    configs = SearchSpace(tiny, "xla").enumerate()
    assert len(configs) < max(BUDGETS)  # a budget of 100 measures all of them
    timed = {c.key: 10.0 + i for i, c in enumerate(configs)}
    small = _synthetic(RecordedTable(tiny, "xla", "cpu", {c.key: (c, Measurement("ok")) for c in configs}), timed)
    whole = replay(small, "tiny", "random", seeds=1, budget=100).summary()["median_regret"]
    assert whole["40"] == 1.0 and None not in whole.values()


def test_warm_start_is_the_same_switch_for_every_strategy() -> None:
    table = RecordedTable.load(TABLES[-1])
    heuristic = heuristic_key(table)
    assert heuristic is not None
    for strategy in ("tpe", "tpe-plain", "random"):
        with_start = measured_sequence(table, strategy, seed=1, budget=12, warm_start=True)
        without = measured_sequence(table, strategy, seed=1, budget=12, warm_start=False)
        assert with_start[0] == heuristic and len(with_start) == len(set(with_start)) == 12
        assert len(without) == len(set(without)) == 12 and set(without) <= set(table.entries)
    # Without the warm start, random is plain random: across seeds it starts anywhere.
    starts = {measured_sequence(table, "random", seed, 3, warm_start=False)[0] for seed in range(8)}
    assert len(starts) > 1


def test_tuned_neighbours_of_the_family_join_every_strategys_warm_start() -> None:
    """cpu-demo, small-mixed and mixed-2k are one family (mixed spatial and temporal heads, no text): each
    offers the others its best (when it lies in their space); the tables of other families offer nothing."""
    loaded = [RecordedTable.load(path) for path in TABLES]
    small = next(t for t in loaded if t.workload.pattern.seq_len == 1024 and "spatial,temporal" in t.workload.family)
    family = [t for t in loaded if t is not small and t.workload.family == small.workload.family]
    assert len(family) == 2
    neighbours = neighbour_bests(small, loaded)
    offered = {t.best[0].key for t in family if t.best[0].key in small.entries}
    assert offered and {c.key for c in neighbours} == offered and len(neighbours) == len(offered)
    heuristic = heuristic_key(small)
    strategies_ = ["tpe", "random"] + (["kt:random_sample"] if importlib.util.find_spec("kernel_tuner") else [])
    for strategy in strategies_:
        started = measured_sequence(small, strategy, seed=2, budget=8, warm_start=True, neighbours=neighbours)
        assert started[:2] == [heuristic, neighbours[0].key] and len(started) == len(set(started)) == 8
        plain = measured_sequence(small, strategy, seed=2, budget=8, warm_start=False, neighbours=neighbours)
        assert neighbours[0].key not in plain[:1]  # no warm start: the neighbours are not offered either
    assert replay(small, "s", "tpe", seeds=1, budget=8, neighbours=neighbours).summary()["neighbours"] == len(
        neighbours
    )


def test_kernel_tuner_peers_replay_the_same_table() -> None:
    pytest.importorskip("kernel_tuner", reason="the peers extra (Kernel Tuner) is not installed")
    table = RecordedTable.load(TABLES[-1])
    first = measured_sequence(table, "kt:random_sample", seed=3, budget=15, warm_start=False)
    assert len(first) == len(set(first)) == 15 and set(first) <= set(table.entries)
    assert measured_sequence(table, "kt:random_sample", seed=3, budget=15, warm_start=False) == first
    assert measured_sequence(table, "kt:random_sample", seed=4, budget=15, warm_start=False) != first
    started = measured_sequence(table, "kt:bayes_opt", seed=0, budget=15, warm_start=True)
    assert started[0] == heuristic_key(table) and len(started) == len(set(started)) <= 15
    scores = replay(table, "t", "kt:greedy_ils", seeds=2, budget=20, warm_start=False)
    assert len(scores.trials_to_tied) == 2 and all(len(v) == 2 for v in scores.regret.values())


@pytest.mark.parametrize("peer", ["kt:diff_evo", "kt:bayes_opt"])
def test_peers_that_start_from_a_latin_hypercube_repeat_with_their_seed(peer: str) -> None:
    # Kernel Tuner draws these strategies' first samples from an unseeded scipy LatinHypercube: without
    # the bench seeding it, the same seed gave a different sequence on each run.
    pytest.importorskip("kernel_tuner", reason="the peers extra (Kernel Tuner) is not installed")
    table = RecordedTable.load(TABLES_DIR / "dense-mixed-bf16.xla.json")
    runs = [measured_sequence(table, peer, seed=s, budget=12, warm_start=False) for s in (0, 0, 0, 1)]
    assert runs[0] == runs[1] == runs[2]
    assert runs[3] != runs[0]


def test_a_peer_can_see_the_values_of_each_parameter_listed_in_another_order() -> None:
    """Kernel Tuner numbers a space's configs by how each parameter's values are listed, and diff_evo measures
    its first population in the order of those numbers: the same seed on the same table measures other
    configs when the lists are reversed or shuffled, each a repeatable, valid sequence of the table's configs."""
    pytest.importorskip("kernel_tuner", reason="the peers extra (Kernel Tuner) is not installed")
    table = RecordedTable.load(TABLES_DIR / "dense-band-f32.xla.json")
    runs = {
        order: [
            measured_sequence(table, "kt:diff_evo", seed=s, budget=6, warm_start=False, peer_order=order)
            for s in (0, 1)
        ]
        for order in PEER_ORDERS
    }
    for order, (first, second) in runs.items():
        for run in (first, second):
            assert len(run) == len(set(run)) == 6 and set(run) <= set(table.entries), order
        assert second != first, order
        again = measured_sequence(table, "kt:diff_evo", seed=0, budget=6, warm_start=False, peer_order=order)
        assert again == first, order
    assert runs["reversed"] != runs["listed"] and runs["shuffled"] != runs["listed"]
    assert runs["shuffled"] != runs["reversed"]
    scores = replay(table, "t", "kt:random_sample", seeds=1, budget=5, warm_start=False, peer_order="reversed")
    assert scores.summary()["peer_order"] == "reversed"
    assert replay(table, "t", "random", seeds=1, budget=5, peer_order="reversed").summary()["peer_order"] is None
    with pytest.raises(ValueError, match="peer order"):
        replay(table, "t", "kt:random_sample", seeds=1, budget=5, peer_order="sideways")


def test_diff_evo_runs_where_its_first_population_is_the_whole_space() -> None:
    """Kernel Tuner 1.5.0's diff_evo asks for a population of 16 x the tunable parameters and, when that is
    exactly the space's size, calls ``np.shuffle`` (no such function). spatial-w3-f32 (80 configs, 5 tunable
    parameters) is such a space; the bench answers that case as Kernel Tuner's later fix does, so diff_evo
    runs there, repeatably, and measures every config once; the patch is gone after the run."""
    pytest.importorskip("kernel_tuner", reason="the peers extra (Kernel Tuner) is not installed")
    from kernel_tuner.searchspace import Searchspace

    original = Searchspace.get_LHS_sample_indices
    table = RecordedTable.load(TABLES_DIR / "spatial-w3-f32.xla.json")
    assert len(table.entries) == 16 * sum(len(v) > 1 for v in table.space().dimensions().values())
    first = measured_sequence(table, "kt:diff_evo", seed=0, budget=100, warm_start=False)
    assert sorted(first) == sorted(table.entries)
    assert measured_sequence(table, "kt:diff_evo", seed=0, budget=100, warm_start=False) == first
    assert measured_sequence(table, "kt:diff_evo", seed=1, budget=100, warm_start=False) != first
    assert Searchspace.get_LHS_sample_indices is original


def test_a_peer_that_fails_on_a_table_is_reported_not_fatal(monkeypatch: Any) -> None:
    """A peer's own bug on one table ends that peer's row with the error; tiletune's samplers still raise."""
    import server.bench.search as bench

    table = RecordedTable.load(TABLES_DIR / "small-mixed.xla.json")

    def broken(*args: Any, **kwargs: Any) -> list[str]:
        raise AttributeError("module 'numpy' has no attribute 'shuffle'")

    monkeypatch.setattr(bench, "_peer_sequence", broken)
    row = replay(table, "t", "kt:diff_evo", seeds=3, budget=5, warm_start=False).summary()
    assert row["error"] == "seed 0: AttributeError: module 'numpy' has no attribute 'shuffle'"
    assert "median_trials_to_tied" not in row and "median_regret" not in row
    assert "error" not in replay(table, "t", "random", seeds=1, budget=5).summary()
    monkeypatch.setattr(bench, "run_search", broken)
    with pytest.raises(AttributeError):
        replay(table, "t", "random", seeds=1, budget=5)


def _row(table: str, strategy: str, warm: bool, trials: float, reached: str = "20/20", regret: float = 1.0) -> Any:
    return {
        "table": table,
        "strategy": strategy,
        "warm_start": warm,
        "neighbours": 0,
        "median_trials_to_tied": trials,
        "reached": reached,
        "median_regret": {"20": regret},
    }


def test_head_to_head_sets_the_default_against_the_best_other_strategy_of_each_row() -> None:
    rows = [
        _row("a", "surrogate", True, 4),
        _row("a", "tpe-plain", True, 6.5),
        _row("a", "kt:pso", True, 5),
        _row("a", "surrogate", False, 13, regret=1.004),
        _row("a", "tpe-plain", False, 11),
        _row("a", "random", False, 11, reached="17/20"),  # as few trials, fewer seeds reaching: not the best
        _row("b", "surrogate", True, 1),
        _row("b", "random", True, 1),
        {**_row("b", "kt:diff_evo", False, 0), "error": "seed 0: AttributeError"},  # failed: no figures
        _row("b", "surrogate", False, math.inf, reached="0/20"),
        _row("b", "random", False, 40, reached="11/20"),
        _row("c", "tpe", True, 3),  # no default in this row: nothing to set against
    ]
    verdicts = {(v["table"], v["warm_start"]): v for v in head_to_head(rows)}
    assert set(verdicts) == {("a", True), ("a", False), ("b", True), ("b", False)}
    assert verdicts["a", True] == {
        "table": "a",
        "warm_start": True,
        "default": "surrogate",
        "trials": 4,
        "regret_20": 1.0,
        "regret_20_verdict": "within",
        "best_other": "kt:pso",
        "best_other_trials": 5,
        "margin": 1,
        "verdict": "leads",
        # Rows without per-seed figures (older reports) give no verdict beyond the noise.
        "noise_verdict": None,
        "p_value": None,
        "ahead_beyond_noise": [],
        "within_noise": [],
    }
    assert (verdicts["a", False]["best_other"], verdicts["a", False]["margin"]) == ("tpe-plain", -2)
    assert verdicts["a", False]["verdict"] == "trails" and verdicts["a", False]["regret_20"] == 1.004
    assert (verdicts["b", True]["margin"], verdicts["b", True]["verdict"]) == (0, "level")
    assert verdicts["b", False]["verdict"] == "trails" and verdicts["b", False]["best_other"] == "random"
    named = {(v["table"], v["warm_start"]): v for v in head_to_head(rows, default="tpe-plain")}
    assert set(named) == {("a", True), ("a", False)}  # "c" has tpe alone: nothing to set it against
    assert (named["a", True]["best_other"], named["a", True]["verdict"]) == ("surrogate", "trails")


def _seeds(row: dict[str, Any], per_seed: list[float | None]) -> dict[str, Any]:
    """``row`` with its trials per seed (None: not reached) and the median and count they give."""
    trials = [math.inf if t is None else t for t in per_seed]
    reached = f"{sum(t is not None for t in per_seed)}/{len(per_seed)}"
    return {**row, "trials_to_tied": per_seed, "median_trials_to_tied": float(np.median(trials)), "reached": reached}


def test_the_head_to_head_tells_a_median_difference_from_the_seeds_noise() -> None:
    spread: list[float | None] = [5, 6, 7, 9, 9, 11, 11, 11, 11, 13, 13, 13, 14, 15, 16, 16, 16, 19, 20, 21]
    rows = [
        # 13 against 11: behind by medians, but the seeds of both spread over 5-21.
        _seeds(_row("near", "surrogate", False, 0), spread),
        _seeds(_row("near", "tpe-plain", False, 0), [t - 2 for t in spread]),  # type: ignore[operator]
        _seeds(_row("near", "random", False, 0), [t + 30 for t in spread]),  # type: ignore[operator]
        # Every seed of plain TPE reaches in 3-5 trials, every one of the default's in 12-20: it trails.
        _seeds(_row("far", "surrogate", False, 0), [12 + s % 9 for s in range(20)]),
        _seeds(_row("far", "tpe-plain", False, 0), [3 + s % 3 for s in range(20)]),
        _seeds(_row("far", "random", False, 0), [40 + s for s in range(20)]),
        # Reliably ahead of both.
        _seeds(_row("ahead", "surrogate", True, 0), [1 + s % 3 for s in range(20)]),
        _seeds(_row("ahead", "tpe-plain", True, 0), [9 + s % 5 for s in range(20)]),
        _seeds(_row("ahead", "kt:pso", True, 0), [6 + s % 7 for s in range(20)]),
        # Kernel Tuner's median (2) is far below the default's 30, but 9 of its 20 seeds never reached: a seed
        # that did not reach counts as the most trials, so the two cannot be told apart.
        _seeds(_row("misses", "surrogate", True, 0), [30.0] * 20),
        _seeds(_row("misses", "kt:mls", True, 0), [2.0] * 11 + [None] * 9),
        # One strategy without per-seed figures (an older report): no verdict beyond the noise for the row.
        _seeds(_row("old", "surrogate", True, 0), spread),
        _row("old", "random", True, 40),
    ]
    verdicts = {v["table"]: v for v in head_to_head(rows)}
    near, far, ahead, misses = verdicts["near"], verdicts["far"], verdicts["ahead"], verdicts["misses"]
    assert (near["margin"], near["verdict"], near["noise_verdict"]) == (-2, "trails", "level")
    assert near["within_noise"] == ["tpe-plain"] and near["ahead_beyond_noise"] == [] and near["p_value"] > 0.05
    assert (far["verdict"], far["noise_verdict"], far["ahead_beyond_noise"]) == ("trails", "trails", ["tpe-plain"])
    assert far["p_value"] < 0.05 and far["within_noise"] == []
    assert (ahead["verdict"], ahead["noise_verdict"], ahead["within_noise"]) == ("leads", "leads", [])
    assert (misses["best_other"], misses["margin"], misses["verdict"]) == ("kt:mls", -28, "trails")
    assert misses["noise_verdict"] == "level" and misses["within_noise"] == ["kt:mls"]
    assert verdicts["old"]["verdict"] == "leads" and verdicts["old"]["noise_verdict"] is None


def test_the_report_gives_each_median_its_seeds_spread() -> None:
    from rich.console import Console

    spread: list[float | None] = [5, 6, 7, 9, 9, 11, 11, 11, 11, 13, 13, 13, 14, 15, 16, 16, 16, 19, 20, 21]
    cells = {"table_size": 160, "tied_set": 2, "median_regret": {str(b): 1.0 for b in BUDGETS}}
    rows = [
        {**_seeds(_row("t", "surrogate", False, 0), spread), **cells},
        {**_seeds(_row("t", "random", False, 0), [3] * 6 + [None] * 14), **cells},
        {**_row("t", "tpe", False, 7), **cells},  # an older row: no per-seed figures
    ]
    console = Console(record=True, width=300)
    print_search_report(rows, console)
    lines = [" ".join(line.split()) for line in console.export_text().splitlines()]
    assert any("│ surrogate │ off │ 13.0 (9-16) │ 20/20 │" in line for line in lines)
    assert any("│ random │ off │ not reached (3-never) │ 6/20 │" in line for line in lines)
    assert any("│ tpe │ off │ 7.0 │ 20/20 │" in line for line in lines)


def test_the_printed_head_to_head_names_the_strategies_behind_a_noise_verdict() -> None:
    from rich.console import Console

    cells = {"table_size": 136, "tied_set": 7, "median_regret": {str(b): 1.0 for b in BUDGETS}}
    names = ["surrogate", "tpe", "tpe-plain", "random", "kt:pso", "kt:mls"]
    rows = [{**_seeds(_row("t", n, True, 0), [1.0] * 20), **cells} for n in names]  # every seed starts tied
    rows += [
        {**_seeds(_row("u", "surrogate", False, 0), [12 + s % 9 for s in range(20)]), **cells},
        {**_seeds(_row("u", "tpe-plain", False, 0), [3 + s % 3 for s in range(20)]), **cells},
    ]
    console = Console(record=True, width=300)
    print_search_report(rows, console)
    text = " ".join(console.export_text().split())
    assert "│ level │ 1 │ level (tpe, tpe-plain, random and 2 more) │" in text
    assert "│ trails │ " in text and " │ trails (tpe-plain) │" in text
    assert "beyond the seeds' noise it leads on 0 of 2 rows, is level on 1 and trails on 1" in text


def test_every_row_carries_its_trials_per_seed() -> None:
    table = RecordedTable.load(TABLES_DIR / "band-sink-suffix-bf16.xla.json")
    row = replay(table, "t", "random", seeds=6, budget=4, warm_start=False).summary()
    per_seed = row["trials_to_tied"]
    # Two tied configs of 160 in four random trials: most seeds do not reach, and say so as null, not Infinity.
    assert len(per_seed) == 6 and None in per_seed and json.loads(json.dumps(per_seed, allow_nan=False)) == per_seed
    assert row["reached"] == f"{sum(t is not None for t in per_seed)}/6"
    assert all(t is None or 1 <= t <= 4 for t in per_seed)
    trials = [math.inf if t is None else t for t in per_seed]
    assert float(np.median(trials)) == row["median_trials_to_tied"]


def test_unknown_strategies_are_named() -> None:
    with pytest.raises(ValueError, match="kt:fastest"):
        strategies(["tpe", "kt:fastest"])
    assert strategies(["kt:all"])[0] == "kt:random_sample"


@pytest.mark.slow
def test_record_a_small_table_and_reload_it(tmp_path: Any) -> None:
    workload = Workload("cpu", "xla", "float32", 1, 32, SparsityPattern(VideoLayout(2, 64), (HeadPattern.spatial(0),)))
    space = SearchSpace(workload, "xla", blocks_q=(32, 64), blocks_kv=(32, 64))
    visits: list[tuple[str, int, int]] = []
    table = record_table(
        workload, space=space, rounds=4, progress=lambda stage, done, total: visits.append((stage, done, total))
    )
    assert len(table.entries) == len(space.enumerate()) == 16
    assert all(m.status == "ok" and len(m.runs_ms) == 4 for _, m in table.entries.values())  # one run per round
    # The anchors were timed in the same rounds: the library's dense and one tiled dense per tile size.
    tiles = {f"tiled_dense:{tiled_dense(workload.pattern, c)[1].key}" for c, _ in table.entries.values()}
    assert table.rounds == 4 and "dense" in table.anchors and set(table.anchors) - {"dense"} <= tiles
    assert all(len(runs) == 4 for runs in table.anchors.values())
    timed = 16 + len(table.anchors)
    assert visits[-1] == ("timing in interleaved rounds", timed * 4, timed * 4)
    assert table.dense_ms == pytest.approx(float(np.median(table.anchors["dense"])))
    path = tmp_path / "t.json"
    table.save(path)
    again = RecordedTable.load(path)
    assert set(again.entries) == set(table.entries) and again.best[1].median_ms == table.best[1].median_ms
    assert again.anchors == table.anchors and again.tied_with_best() == table.tied_with_best()
    # Recorded as a CPU backend is measured: on one core, in CPU time; older tables read as wall.
    assert table.clock == again.clock == "cpu"
    # The header names the host: a table of the same workload from another machine is not the same table.
    assert again.host == table.host == host_description() and f"{os.cpu_count()} cores" in table.host
    old = table.to_json()
    del old["clock"], old["host"]
    path.write_text(json.dumps(old))
    assert RecordedTable.load(path).clock == "wall" and RecordedTable.load(path).host == ""
    replayer = ReplayMeasurer(again)
    config = again.best[0]
    assert replayer.anchor_runs("tiled_dense", 6, config)[:4] == list(
        table.anchors[f"tiled_dense:{tiled_dense(workload.pattern, config)[1].key}"]
    )


def test_the_host_is_read_from_cpuinfo_and_falls_back_without_it(tmp_path: Any) -> None:
    (tmp_path / "cpuinfo").write_text("processor\t: 0\nmodel name\t: Example CPU 9000\nflags\t\t: fpu\n")
    assert host_description(tmp_path) == f"Example CPU 9000, {os.cpu_count()} cores"
    bare = host_description(tmp_path / "missing")  # no /proc: what the platform module says
    assert bare.endswith(f", {os.cpu_count()} cores") and not bare.startswith(",")
