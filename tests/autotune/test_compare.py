"""Which differences between run sets are real, and interleaved rounds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autotune.compare import (
    MIN_EFFECT,
    difference,
    drift,
    exceeds,
    interleaved,
    interleaved_over_processes,
    normalised_by_round,
    pooled,
    round_factors,
    slower,
    speedup,
    tied_set,
)


def runs(median: float, spread: float, n: int, seed: int) -> list[float]:
    """Skewed run times around ``median`` (lognormal: interference only ever adds time)."""
    rng = np.random.default_rng(seed)
    return list(median * np.exp(rng.normal(0.0, spread, n)))


@settings(max_examples=40, deadline=None)
@given(st.floats(0.1, 100.0), st.floats(0.01, 0.3), st.integers(10, 40), st.integers(0, 10**6))
def test_the_same_distribution_is_a_tie(median: float, spread: float, n: int, seed: int) -> None:
    a, b = runs(median, spread, n, seed), runs(median, spread, n, seed + 1)
    # Two samples of one distribution differ "for real" only by a false positive of the test (5%),
    # and then only when their medians also drift more than 1% apart.
    d = difference(a, b)
    assert not d.real or abs(d.ratio - 1.0) > MIN_EFFECT


@pytest.mark.parametrize("seed", range(20))
def test_a_clear_difference_is_real_and_a_tiny_one_is_not(seed: int) -> None:
    fast, slow = runs(10.0, 0.05, 20, seed), runs(13.0, 0.05, 20, seed + 100)
    assert slower(slow, fast) and not slower(fast, slow)
    # 0.5% apart: significant with enough runs, but below the effect a user could see.
    near = [x * 1.005 for x in fast]
    assert not slower(near, fast)


def test_runs_exceed_a_factor_of_others_only_beyond_their_noise() -> None:
    """bench search's regret bound, on 10 runs each as a recorded table holds: 10% slower with the runs
    within 5% of their median is over 1.03x beyond the noise, 2% slower is not over it, and 12% slower
    with the runs spread 40% (a noisy table's next-fastest config) is over 1.03x by the medians only."""
    pattern = [(i * 7) % 11 - 5 for i in range(10)]  # -5..5 in a fixed shuffled order
    fastest = [10.0 * (1 + 0.01 * u) for u in pattern]  # +-5%
    assert exceeds([x * 1.10 for x in fastest], fastest, 1.03)
    assert not exceeds([x * 1.02 for x in fastest], fastest, 1.03)
    assert not exceeds(fastest, [x * 1.06 for x in fastest], 1.03)  # faster: never over
    noisy = [10.0 * (1 + 0.04 * u) for u in pattern]  # +-20%
    next_noisy = [11.2 * (1 + 0.04 * u) for u in reversed(pattern)]
    assert np.median(next_noisy) / np.median(noisy) == pytest.approx(1.12)
    assert not exceeds(next_noisy, noisy, 1.03)
    # No MIN_EFFECT on top of the factor: 0.5% over 1.03x with runs 0.05% apart is beyond the noise,
    # though slower() would call 0.5% too small to matter.
    tight = [10.0 * (1 + 0.0001 * u) for u in pattern]
    over = [x * 1.03 * 1.005 for x in tight]
    assert exceeds(over, tight, 1.03) and not slower(over, [x * 1.03 for x in tight])


def test_too_few_runs_never_separate() -> None:
    assert not slower([10.0, 10.0], [1.0, 1.0])
    assert slower([10.0 + i * 0.01 for i in range(8)], [1.0 + i * 0.01 for i in range(8)])


def test_tied_set_holds_the_fastest_and_everything_not_reliably_slower() -> None:
    group = {
        "a": runs(10.0, 0.05, 20, 1),
        "b": runs(10.02, 0.05, 20, 2),  # within noise of a
        "c": runs(14.0, 0.05, 20, 3),  # clearly slower
        "d": [],  # never measured
    }
    tied = tied_set(group)
    assert tied[0] in ("a", "b") and set(tied) == {"a", "b"}


def test_interleaved_visits_every_candidate_once_per_round_in_fresh_orders() -> None:
    visits: list[str] = []

    def visit(k: str) -> list[float]:
        visits.append(k)
        return [float(len(visits))]

    out = interleaved(["x", "y", "z"], visit, rounds=30, seed=4)
    assert [sorted(visits[i : i + 3]) for i in range(0, 90, 3)] == [["x", "y", "z"]] * 30
    assert len({tuple(visits[i : i + 3]) for i in range(0, 90, 3)}) > 1  # the order changes between rounds
    assert {k: len(v) for k, v in out.items()} == {"x": 30, "y": 30, "z": 30}


def test_round_factors_show_a_step_in_the_machines_speed() -> None:
    """Three rounds fast, then seven 25% slower for every candidate alike (as when another VM wakes on
    the host): each round's factor is its run over the candidate's median, whatever the candidate's speed."""
    speeds = {"a": 1.0, "b": 3.0, "c": 10.0, "d": 0.5}
    step = [0.8] * 3 + [1.0] * 7
    factors = round_factors({k: [v * f for f in step] for k, v in speeds.items()})
    assert factors == pytest.approx(step)
    assert drift(factors) == pytest.approx(0.25)
    # Noise that is not tied to a round cancels out in the median over candidates.
    rng = np.random.default_rng(3)
    steady = {k: list(v * np.exp(rng.normal(0.0, 0.1, 10))) for k, v in {f"c{i}": i + 1.0 for i in range(200)}.items()}
    assert drift(round_factors(steady)) < 0.05
    # Candidates missing a round do not count; too little to say anything is an empty list and no drift.
    assert round_factors({"a": [1.0, 2.0], "b": [2.0, 4.0], "c": [5.0]}) == pytest.approx([2 / 3, 4 / 3])
    assert round_factors({"a": [1.0] * 10}) == [] and round_factors({"a": [1.0], "b": [2.0]}) == []
    assert drift([]) == 0.0


def test_runs_normalised_by_round_lose_the_step_and_keep_the_spread_within_rounds() -> None:
    """Divided by their round's factor, runs taken through a step in the machine's speed are what they would
    have been without it: a candidate whose runs only moved with the step becomes flat, one that also varied
    within the rounds keeps that variation; a candidate missing a round is left as it was."""
    step = [0.8] * 3 + [1.0] * 7
    within = [1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0, 1.0, 1.2, 0.8]
    runs = {"a": [2.0 * f for f in step], "b": [5.0 * f for f in step]}
    runs["c"] = [3.0 * f * w for f, w in zip(step, within, strict=True)]
    runs["short"] = [7.0, 8.0]
    out = normalised_by_round(runs)
    assert out["a"] == pytest.approx([2.0] * 10) and out["b"] == pytest.approx([5.0] * 10)
    assert out["c"] == pytest.approx([3.0 * w for w in within])
    assert out["short"] == [7.0, 8.0]
    assert normalised_by_round({"a": [1.0, 2.0]}) == {"a": [1.0, 2.0]}  # one candidate: no factors, runs as given


def test_speedup_pairs_runs_taken_side_by_side() -> None:
    """A drift that slows both sides of each pair alike leaves the paired ratio exact, where a ratio of
    medians of unpaired runs would not know which runs belong together."""
    winner = [1.0, 2.0, 4.0, 1.0, 2.0, 4.0, 1.0, 2.0, 4.0, 1.0]  # the machine's load changes between rounds
    anchor = [5 * w for w in winner]
    s = speedup(anchor, winner)
    assert s is not None and (s.median, s.p10, s.p90) == pytest.approx((5.0, 5.0, 5.0))
    noisy = speedup([5.0, 6.0, 4.0, 5.5, 4.5, 5.0, 6.0, 4.0, 5.5, 4.5], [1.0] * 10)
    assert noisy is not None and noisy.p10 < noisy.median < noisy.p90 and noisy.median == pytest.approx(5.0)
    assert speedup([], [1.0]) is None and speedup([1.0], [0.0]) is None
    assert str(speedup([3.0, 3.0], [1.0, 1.0])) == "3.00x (p10-p90 3.00-3.00)"


def test_rounds_over_processes_restart_between_processes_and_pool_in_order() -> None:
    process = {"n": 0}
    seen: list[tuple[int, str]] = []

    def visit(k: str) -> list[tuple[int, str]]:
        seen.append((process["n"], k))
        return [(process["n"], k)]

    def restart() -> None:
        process["n"] += 1

    per_process = interleaved_over_processes(["a", "b", "c"], visit, 4, 3, restart, seed=1)
    assert process["n"] == 2 and len(per_process) == 3
    for p, runs in enumerate(per_process):
        # Every candidate is visited `rounds` times in each process, by that process only.
        assert runs == {k: [(p, k)] * 4 for k in "abc"}
    assert [p for p, _ in seen] == sorted(p for p, _ in seen)  # a process's rounds are done before the next
    assert pooled(per_process) == {k: [(p, k) for p in range(3) for _ in range(4)] for k in "abc"}


def test_rounds_over_processes_without_a_restart_are_all_taken_in_one() -> None:
    per_process = interleaved_over_processes(["a", "b"], lambda k: [k], 2, 3, None)
    assert per_process == [{"a": ["a"] * 6, "b": ["b"] * 6}]


@pytest.mark.parametrize("error", [RuntimeError("no device"), TimeoutError("no answer")])
def test_a_fresh_process_that_fails_to_start_ends_the_pooling_with_what_was_timed(error: Exception) -> None:
    starts = {"n": 0}

    def restart() -> None:
        starts["n"] += 1
        if starts["n"] == 2:
            raise error

    per_process = interleaved_over_processes(["a", "b"], lambda k: [k], 2, 4, restart)
    assert starts["n"] == 2 and len(per_process) == 2
    assert pooled(per_process) == {"a": ["a"] * 4, "b": ["b"] * 4}
