"""The search never measures an invalid point or the same params twice, never picks a
wrong config, and picks the winner by the re-timed median."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.measure import Measurement
from autotune.search import SearchOptions, run_search
from autotune.space import SearchSpace
from kernel.config import TileConfig
from kernel.layout import VideoLayout
from kernel.pattern import HeadPattern, SparsityPattern
from kernel.workload import Workload

WORKLOAD = Workload(
    "cpu",
    "xla",
    "float32",
    1,
    32,
    SparsityPattern(VideoLayout(4, 128), (HeadPattern.spatial(1), HeadPattern.temporal(4))),
)


def cost(config: TileConfig) -> float:
    """A smooth synthetic cost with its optimum at q128 kv128 compact temporal_major."""
    import math

    c = abs(math.log2(config.block_q / 128)) + abs(math.log2(config.block_kv / 128))
    c += 0.5 * (config.variant == "naive") + 0.8 * (config.layout == "frame_major") + 0.1 * (config.align == "none")
    return 10.0 + 3.0 * c + 0.2 * (config.head_grouping == "all")


@dataclasses.dataclass
class FakeMeasurer:
    """Answers from ``cost``; ``wrong`` configs are fast but wrong; ``retime`` can be overridden."""

    wrong: set[str] = dataclasses.field(default_factory=set)
    retimed: dict[str, float] = dataclasses.field(default_factory=dict)
    measured: list[TileConfig] = dataclasses.field(default_factory=list)
    anchored: list[tuple[str, TileConfig | None]] = dataclasses.field(default_factory=list)

    def measure(self, config: TileConfig, prune_above_ms: float | None = None) -> Measurement:
        self.measured.append(config)
        if config.key in self.wrong:
            return Measurement("wrong", compile_ms=1.0, max_error=1.0, error="injected wrong result")
        t = cost(config)
        return Measurement("ok", compile_ms=1.0, runs_ms=(t, t * 1.01, t * 0.99), max_error=1e-7)

    def retime(self, config: TileConfig, runs: int) -> list[float]:
        t = self.retimed.get(config.key, cost(config))
        return [t] * runs

    def anchor_runs(self, anchor: str, runs: int, config: TileConfig | None = None) -> list[float]:
        self.anchored.append((anchor, config if anchor == "tiled_dense" else None))
        return [100.0] * runs


def test_wrong_result_is_recorded_and_never_selected() -> None:
    from kernel.heuristic import heuristic_config

    space = SearchSpace(WORKLOAD, "xla")
    best = heuristic_config(WORKLOAD.pattern, "xla", "float32")
    assert cost(best) < 11  # close to the optimum: it would win if it were allowed to
    measurer = FakeMeasurer(wrong={best.key})
    result = run_search(space, measurer, SearchOptions(trials=40, seed=0))
    statuses = {t.config.key: t.measurement.status for t in result.trials}
    assert statuses.get(best.key) == "wrong"  # the heuristic warm start proposes it first
    assert result.best is not None and result.best.config.key != best.key
    assert all(c.key != best.key for c, _ in result.finalists)


def test_winner_is_the_best_median_of_the_retimed_finalists() -> None:
    space = SearchSpace(WORKLOAD, "xla")
    measurer = FakeMeasurer()
    first = run_search(space, measurer, SearchOptions(trials=30, seed=3, top_k=3))
    assert len(first.finalists) == 3
    # Make the third of the first search's finalists the fastest when re-timed.
    slow_at_first = first.finalists[2][0]
    measurer = FakeMeasurer(retimed={slow_at_first.key: 1.0})
    result = run_search(space, measurer, SearchOptions(trials=30, seed=3, top_k=3))
    assert result.best is not None and result.best.config.key == slow_at_first.key
    assert result.best_median_ms == 1.0
    # The finalists were re-timed in interleaved rounds: retime_rounds x retime_runs runs each.
    assert all(len(runs) == 10 for _, runs in result.finalists)
    assert [c.key for c in result.tied] == [slow_at_first.key]  # 1 ms against ~10: nothing tied with it


def test_a_tie_goes_to_less_padding_then_fewer_grid_steps() -> None:
    """Finalists within each other's noise: the winner is the one that does less work, not the one that
    happened to run fastest in the re-timing."""
    from kernel import candidates
    from kernel.cost import grid_steps

    space = SearchSpace(WORKLOAD, "xla")
    first = run_search(space, FakeMeasurer(), SearchOptions(trials=30, seed=3, top_k=3))
    configs = [c for c, _ in first.finalists]
    work = {c.key: (round(candidates.padding(WORKLOAD, c), 6), grid_steps(WORKLOAD.pattern, c, "xla")) for c in configs}
    most = max(configs, key=lambda c: work[c.key])
    assert work[most.key] > min(work.values())  # the finalists do differ in work: the rule has something to decide
    # Every finalist re-times within 0.4% of the others, and the one doing the most work is the fastest of them.
    retimed = {c.key: 10.0 if c.key == most.key else 10.0 * (1.002 + 0.001 * i) for i, c in enumerate(configs)}
    result = run_search(space, FakeMeasurer(retimed=retimed), SearchOptions(trials=30, seed=3, top_k=3))
    assert {c.key for c in result.tied} == set(retimed)
    assert result.best is not None
    least = min(work.values())
    expected = min((c for c in configs if work[c.key] == least), key=lambda c: retimed[c.key])
    assert result.best.config.key == expected.key != most.key


def test_the_winner_is_timed_beside_its_anchors() -> None:
    space = SearchSpace(WORKLOAD, "xla")
    measurer = FakeMeasurer()
    options = SearchOptions(trials=12, seed=1, retime_runs=3, anchor_processes=2, anchor_rounds=2)
    result = run_search(space, measurer, options)
    assert set(result.anchors) == {"dense", "tiled_dense"}
    # A measurer that cannot start a fresh process times all 2 x 2 rounds in its one.
    assert all(len(runs) == 12 for runs in result.anchors.values()) and len(result.best_runs_ms) == 12
    assert result.dense_ms == 100.0 and result.anchor_ms("tiled_dense") == 100.0 and result.anchor_processes == 1
    winner = result.best.config if result.best else None
    assert sorted(measurer.anchored, key=str) == sorted([("dense", None), ("tiled_dense", winner)] * 4, key=str)


@dataclasses.dataclass
class ProcessesMeasurer(FakeMeasurer):
    """A measurer whose processes differ: in process ``i`` the dense anchor takes ``dense_ms[i]``
    (what separates two measuring processes on a CPU); ``restart`` starts the next one."""

    dense_ms: tuple[float, ...] = (100.0, 110.0, 120.0)
    process: int = 0
    fail_restart_after: int | None = None
    short_dense_in: int | None = None  # the process whose dense anchor loses a round (a crashed child)
    dense_visits: int = 0

    def restart(self) -> None:
        if self.fail_restart_after is not None and self.process + 1 >= self.fail_restart_after:
            raise RuntimeError("measuring process failed to start")
        self.process += 1

    def anchor_runs(self, anchor: str, runs: int, config: TileConfig | None = None) -> list[float]:
        super().anchor_runs(anchor, runs, config)
        if anchor != "dense":
            return [100.0] * runs
        self.dense_visits += 1
        if self.process == self.short_dense_in and self.dense_visits % 2 == 0:
            return []
        return [self.dense_ms[self.process]] * runs


def test_the_winner_and_anchors_are_timed_in_fresh_processes_and_pooled() -> None:
    from autotune.search import anchor_rounds

    config = TileConfig(block_q=128, block_kv=128)
    winner_ms = cost(config)
    measurer = ProcessesMeasurer()
    options = SearchOptions(retime_runs=2, anchor_processes=3, anchor_rounds=2)
    runs, used = anchor_rounds(config, measurer, options)
    assert measurer.process == 2 and used == 3  # the current process, then two fresh ones
    assert {name: len(v) for name, v in runs.items()} == {"winner": 12, "dense": 12, "tiled_dense": 12}
    assert sorted(set(runs["dense"])) == [100.0, 110.0, 120.0]
    from autotune.compare import speedup

    over = speedup(runs["dense"], runs["winner"])
    assert over is not None
    # The spread reaches from the slowest process's speedup to the fastest's: a re-run in any one of
    # them lies inside it, which one process's rounds (all alike here) could not promise.
    assert over.p10 == pytest.approx(100.0 / winner_ms) and over.p90 == pytest.approx(120.0 / winner_ms)


def test_a_fresh_process_that_fails_to_start_ends_the_pooling() -> None:
    from autotune.search import anchor_rounds

    config = TileConfig(block_q=128, block_kv=128)
    measurer = ProcessesMeasurer(fail_restart_after=2)
    runs, used = anchor_rounds(config, measurer, SearchOptions(retime_runs=2, anchor_processes=3, anchor_rounds=2))
    assert measurer.process == 1 and used == 2 and sorted(set(runs["dense"])) == [100.0, 110.0]
    assert all(len(v) == 8 for v in runs.values())


def test_an_anchor_the_measurer_cannot_time_is_left_out_and_the_others_go_on() -> None:
    from autotune.search import anchor_rounds

    class NoTiledDense(ProcessesMeasurer):
        def anchor_runs(self, anchor: str, runs: int, config: TileConfig | None = None) -> list[float]:
            return [] if anchor == "tiled_dense" else super().anchor_runs(anchor, runs, config)

    config = TileConfig(block_q=128, block_kv=128)
    runs, used = anchor_rounds(
        config, NoTiledDense(), SearchOptions(retime_runs=2, anchor_processes=3, anchor_rounds=2)
    )
    assert used == 3 and {name: len(v) for name, v in runs.items()} == {"winner": 12, "dense": 12, "tiled_dense": 0}


def test_a_process_that_lost_runs_keeps_only_whole_pairs() -> None:
    from autotune.search import anchor_rounds

    config = TileConfig(block_q=128, block_kv=128)
    measurer = ProcessesMeasurer(short_dense_in=1)
    runs, _ = anchor_rounds(config, measurer, SearchOptions(retime_runs=2, anchor_processes=3, anchor_rounds=2))
    # In process 1 the dense anchor lost its second round: that round keeps no run of any candidate.
    assert all(len(v) == 4 + 2 + 4 for v in runs.values())


def test_heuristic_warm_start_and_seed_configs_come_first() -> None:
    space = SearchSpace(WORKLOAD, "xla")
    seed_config = TileConfig("naive", 64, 256, 0, "frame_major", "none", "all")
    measurer = FakeMeasurer()
    run_search(space, measurer, SearchOptions(trials=5, seed_configs=(seed_config,)))
    from kernel.heuristic import heuristic_config

    assert measurer.measured[0] == heuristic_config(WORKLOAD.pattern, "xla", "float32")
    assert measurer.measured[1] == seed_config


def test_a_config_the_gate_refuses_is_an_invalid_point_never_measured() -> None:
    """A TPU worker's gate says which configs the compiler refused (compile workers' verdicts): the
    search never measures them, counts them invalid, and tells the caller why, whatever samples them."""
    from kernel.heuristic import heuristic_config

    space = SearchSpace(WORKLOAD, "xla")
    heuristic = heuristic_config(WORKLOAD.pattern, "xla", "float32")
    refused = {heuristic.key} | {c.key for c in space.enumerate() if c.block_q == 128}
    asked: list[TileConfig] = []
    invalid: list[tuple[TileConfig, str]] = []

    def gate(config: TileConfig) -> str | None:
        asked.append(config)
        return "does not compile: smem" if config.key in refused else None

    measurer = FakeMeasurer()
    result = run_search(
        space, measurer, SearchOptions(trials=20, seed=1), gate=gate, on_invalid=lambda c, r: invalid.append((c, r))
    )
    assert len(result.trials) == 20 and not any(c.key in refused for c in measurer.measured)
    assert (heuristic, "does not compile: smem") in invalid  # the warm start was asked, and refused
    gated = [c for c, reason in invalid if reason == "does not compile: smem"]
    assert result.invalid >= len(invalid) and all(c.key in refused for c in gated)
    assert all(space.violation(c) is None for c in asked)  # asked only after the space's own rules
    assert len(asked) == 20 + len(gated)


def test_tpe_finds_the_optimum_of_a_smooth_cost() -> None:
    space = SearchSpace(WORKLOAD, "xla")
    result = run_search(space, FakeMeasurer(), SearchOptions(trials=40, seed=0))
    assert result.best is not None and result.best_median_ms == pytest.approx(10.0)


@pytest.mark.parametrize("sampler", ["tpe", "tpe-plain", "random"])
def test_samplers_run_on_tpu_tiled_spaces_where_some_params_name_no_config(sampler: str) -> None:
    """On the interpret (and tpu) space ``block_kv_compute`` is a dimension of its own, so samplers can
    propose one larger than ``block_kv``: no config at all. The search counts it invalid and goes on;
    every config measured is a valid one of the space."""
    wl = dataclasses.replace(
        WORKLOAD, backend="interpret", pattern=SparsityPattern(VideoLayout(4, 512), WORKLOAD.pattern.heads)
    )
    space = SearchSpace(wl, "interpret")
    for seed in range(3):
        measurer = FakeMeasurer()
        result = run_search(space, measurer, SearchOptions(trials=12, seed=seed, sampler=sampler, prune=False))
        assert len(result.trials) == 12
        assert all(space.violation(c) is None for c in measurer.measured)


@dataclasses.dataclass
class NoisyMeasurer(FakeMeasurer):
    """Re-times each config at ``retimed`` ms (default its cost) times a fixed cycle of +-10% noise."""

    calls: dict[str, int] = dataclasses.field(default_factory=dict)

    def retime(self, config: TileConfig, runs: int) -> list[float]:
        noise = (0.90, 1.08, 0.96, 1.10, 0.92, 1.04, 0.98, 1.06, 0.94, 1.02)
        t = self.retimed.get(config.key, cost(config))
        out = []
        for _ in range(runs):
            i = self.calls.get(config.key, 0)
            self.calls[config.key] = i + 1
            out.append(t * noise[i % len(noise)])
        return out


def test_finalists_tied_after_the_first_rounds_are_timed_more_before_work_breaks_the_tie() -> None:
    """Two finalists 6% apart in +-10% noise: 10 runs each cannot tell them apart, 30 can. The slower
    one does less work, so without the extra rounds the tie-break would pick it."""
    from kernel import candidates
    from kernel.cost import grid_steps

    space = SearchSpace(WORKLOAD, "xla")
    first = run_search(space, FakeMeasurer(), SearchOptions(trials=30, seed=3, top_k=2))
    a, b = (c for c, _ in first.finalists)
    work = {c.key: (round(candidates.padding(WORKLOAD, c), 6), grid_steps(WORKLOAD.pattern, c, "xla")) for c in (a, b)}
    assert work[a.key] != work[b.key]
    less, more = sorted((a, b), key=lambda c: work[c.key])
    retimed = {less.key: 10.6, more.key: 10.0}
    for resolve, winner, runs in ((0, less, 10), (10, more, 30)):
        options = SearchOptions(trials=30, seed=3, top_k=2, resolve_rounds=resolve)
        result = run_search(space, NoisyMeasurer(retimed=retimed), options)
        assert result.best is not None and result.best.config.key == winner.key, resolve
        assert all(len(r) == runs for _, r in result.finalists)
        assert len(result.tied) == (2 if resolve == 0 else 1)


@dataclasses.dataclass
class PlacementMeasurer(FakeMeasurer):
    """Re-times ``retimed`` configs at their own speed in every measuring process but the first, where
    all of them run alike: one process can hide a difference (or show one) that the next does not."""

    process: int = 0

    def restart(self) -> None:
        self.process += 1

    def retime(self, config: TileConfig, runs: int) -> list[float]:
        if self.process == 0 and config.key in self.retimed:
            return [min(self.retimed.values())] * runs
        return super().retime(config, runs)


def test_the_tied_finalists_extra_rounds_are_spread_over_fresh_processes() -> None:
    """Two finalists 6% apart, alike in the search's own process: the extra rounds in fresh processes
    show the difference, so the faster one wins; all rounds in one process would leave a tie that the
    other one's lesser work would take."""
    from kernel import candidates
    from kernel.cost import grid_steps

    space = SearchSpace(WORKLOAD, "xla")
    first = run_search(space, FakeMeasurer(), SearchOptions(trials=30, seed=3, top_k=2))
    a, b = (c for c, _ in first.finalists)
    work = {c.key: (round(candidates.padding(WORKLOAD, c), 6), grid_steps(WORKLOAD.pattern, c, "xla")) for c in (a, b)}
    less, more = sorted((a, b), key=lambda c: work[c.key])
    retimed = {less.key: 10.6, more.key: 10.0}
    for processes, winner in ((1, less), (3, more)):
        options = SearchOptions(
            trials=30, seed=3, top_k=2, retime_rounds=1, resolve_rounds=9, resolve_processes=processes
        )
        measurer = PlacementMeasurer(retimed=retimed)
        result = run_search(space, measurer, options)
        assert result.best is not None and result.best.config.key == winner.key, processes
        assert result.resolve_processes == processes
        # One round in the search's process, then the nine extra: all in it, or three in each of three.
        assert all(len(r) == 2 + 18 for _, r in result.finalists)
        assert measurer.process == (processes - 1) + 2  # fresh ones for the finalists, then two for the anchors


def test_the_space_counts_the_grid_steps_of_the_kernel_version_its_workload_names() -> None:
    """A table recorded on xla kernel version 1 is replayed with the steps version 1 walked (so the
    search's model and tie-breaks see the kernel that was timed); a new workload gets today's count."""
    from kernel.cost import grid_steps

    pattern = SparsityPattern(VideoLayout(8, 64, 64, "prefix"), (HeadPattern.spatial(0), HeadPattern.temporal(4)))
    today = Workload("cpu", "xla", "float32", 1, 64, pattern)
    recorded = dataclasses.replace(today, kernel_version="1")
    config = TileConfig("split", 64, 64, 0, "frame_major", "frame", "by_pattern")
    now, then = SearchSpace(today, "xla").grid_steps(config), SearchSpace(recorded, "xla").grid_steps(config)
    assert (now, then) == (grid_steps(pattern, config, "xla"), grid_steps(pattern, config, "xla", "1"))
    assert now < then  # text q-blocks no longer pad every row
    # A space on another backend than its workload's counts that backend's current kernel.
    assert SearchSpace(recorded, "interpret").grid_steps(config) == grid_steps(pattern, config, "interpret")
