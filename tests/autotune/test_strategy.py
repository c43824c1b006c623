"""The search strategies: ``tpe``'s local step (autotune.samplers.local_search) proposes unmeasured valid
one-step neighbours, starting at the warm start, and its state lives in the study; the default
(``surrogate``, autotune.samplers.surrogate) proposes what its model predicts fastest, never a config
measured or in flight, and on every committed table its regret after 20 trials is at most 3% (but on the
held-out tables it is known to miss on, KNOWN_MISSES) and never over 3% beyond the recorded runs' noise."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.replay import TABLES as TABLES_DIR
from autotune.replay import RecordedTable, ReplayMeasurer
from autotune.samplers import PENALTY_MS
from autotune.samplers.local_search import CENTRE_ATTR, PROPOSAL_ATTR, LocalSearchSampler
from autotune.search import SearchOptions, run_search
from autotune.space import ParamCoding, SearchSpace
from kernel.heuristic import heuristic_config
from server.bench.search import regret_beyond

from .test_search import WORKLOAD, FakeMeasurer

TABLES = sorted(TABLES_DIR.glob("*.xla.json"))
BUDGET = 20
MAX_REGRET = 0.03
# Held-out tables on which the frozen default misses the target over seeds 0-4. Kept in the test, expected to
# fail (strictly: a pass means the figure moved and this entry and autotune/tables/README.md need updating),
# never fitted away: the strategy is not changed for a table held out from it. The noise-aware half of the
# test is not expected to fail on them.
KNOWN_MISSES = {
    "dense-temporal-suffix-b2-bf16.xla.json": "held out from 84e901f (eleventh round): three of seeds 0-4 end on "
    "a config 3.8% over the fastest (median 1.038); over the replay's 20 seeds the median is 1.012",
}


def _steps(coding: ParamCoding, a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    return [(n, a[n], b[n]) for n in coding.dims if a[n] != b[n]]


def _is_neighbour(coding: ParamCoding, a: dict[str, Any], b: dict[str, Any]) -> bool:
    steps = _steps(coding, a, b)
    if len(steps) != 1:
        return False
    name, x, y = steps[0]
    return not coding.is_ordinal(name) or abs(int(x) - int(y)) == 1


def test_the_local_step_starts_at_the_warm_start_and_only_steps_to_unmeasured_valid_neighbours(tmp_path: Any) -> None:
    space = SearchSpace(WORKLOAD, "xla", max_padding=0.1)
    coding = ParamCoding(space)
    storage = f"sqlite:///{tmp_path / 's.db'}"
    run_search(space, FakeMeasurer(), SearchOptions(trials=30, seed=4, sampler="tpe"), storage=storage, study_name="s")
    trials = optuna.load_study(study_name="s", storage=storage).trials
    local = [t for t in trials if t.system_attrs.get(PROPOSAL_ATTR) == "local"]
    assert local, "the local step proposed nothing"
    heuristic = coding.encode(heuristic_config(WORKLOAD.pattern, "xla", "float32"))
    assert trials[0].params == heuristic and local[0].system_attrs[CENTRE_ATTR] == heuristic
    for t in local:
        assert _is_neighbour(coding, t.system_attrs[CENTRE_ATTR], t.params)
        assert space.violation(coding.decode(t.params)) is None
        earlier = {coding.decode(u.params).key for u in trials if u.number < t.number}
        assert coding.decode(t.params).key not in earlier


def test_the_local_step_is_rebuilt_from_the_study_and_skips_trials_in_flight(tmp_path: Any) -> None:
    """A second process (a fresh sampler on the loaded study) proposes what the first would,
    and neither proposes a config another worker has enqueued."""
    space = SearchSpace(WORKLOAD, "xla")
    coding = ParamCoding(space)
    storage = f"sqlite:///{tmp_path / 's.db'}"
    run_search(space, FakeMeasurer(), SearchOptions(trials=6, seed=1, sampler="tpe"), storage=storage, study_name="s")
    search_space = {n: d for n, d in coding.distributions().items() if not d.single()}

    def proposal(study: optuna.Study) -> Any:
        # A new trial with no params yet, as a worker's ask creates it (study.ask would pop the enqueued one).
        frozen = study._storage.get_trial(study._storage.create_new_trial(study._study_id))
        # A long period keeps the base sampler's turns out of the way: this test is about the local step.
        tpe = optuna.samplers.TPESampler(seed=1, multivariate=True)
        sampler = LocalSearchSampler(space, tpe, seed=1, penalty=PENALTY_MS, period=1000)
        again = LocalSearchSampler(space, optuna.samplers.RandomSampler(), seed=1, penalty=PENALTY_MS, period=1000)
        first, second = (
            sampler.local_proposal(study, frozen, search_space),
            again.local_proposal(study, frozen, search_space),
        )
        assert first == second
        return first

    study = optuna.load_study(study_name="s", storage=storage)
    first = proposal(study)
    assert first is not None  # a local step around the best config so far
    params, _ = first
    study.enqueue_trial(params)  # another worker took it
    second = proposal(optuna.load_study(study_name="s", storage=storage))
    assert second is not None and second[0] != params


def test_every_known_miss_names_a_shipped_table() -> None:
    assert set(KNOWN_MISSES) <= {p.name for p in TABLES}


@pytest.mark.parametrize("path", TABLES, ids=[p.name for p in TABLES])
def test_default_strategy_regret_at_20_trials_is_at_most_3pct_on_every_table(path: Path) -> None:
    """The issue's target on every committed table, held-out ones included: after 20 measured
    trials the best config found has a recorded median at most 3% over the table's fastest, for
    the median of seeds 0-4 (the replay backend is deterministic). The closest is the ninth held-out
    round's spatial-suffix-8k-f32, at 1.0276 (every seed ends on the same config, tied with the fastest);
    before it mixed-prefix-3k-bf16, at 1.0202. Five seeds are fewer than the replay's twenty: over
    twenty, prefix-temporal-band-3k-f32 ends at 1.053 with the warm start (autotune/tables/README.md says more),
    and the reverse holds on the eleventh round's dense-temporal-suffix-b2-bf16 (KNOWN_MISSES, an expected
    failure, strictly).

    First, on every table without exception: no more than two of the five seeds' answers run reliably
    slower than 1.03x the fastest (bench search's test, :func:`server.bench.search.regret_beyond`), so the
    median seed never misses 3% beyond the recorded runs' noise. Over all tables at most two seeds do
    (temporal-sink-16k-bf16, whose median is 1.000); on the known miss none does."""
    table = RecordedTable.load(path)
    fastest = table.best[1].median_ms
    assert fastest is not None
    regrets, beyond = [], []
    for seed in range(5):
        options = SearchOptions(trials=BUDGET, seed=seed, prune=False)
        result = run_search(table.space(), ReplayMeasurer(table), options, finalize=False)
        ok = [t for t in result.trials if t.measurement.status == "ok" and t.measurement.median_ms is not None]
        answer = min(ok, key=lambda t: t.measurement.median_ms or 0.0)
        regrets.append((answer.measurement.median_ms or 0.0) / fastest)
        beyond.append(regret_beyond(table, answer.config.key, 1 + MAX_REGRET))
    assert 2 * sum(beyond) < len(beyond), f"answers over 3% beyond the runs' noise per seed: {beyond}"
    within = statistics.median(regrets) <= 1 + MAX_REGRET
    if path.name in KNOWN_MISSES:
        assert not within, f"a known miss now meets the target ({regrets}): update KNOWN_MISSES and the README"
        pytest.xfail(KNOWN_MISSES[path.name])
    assert within, f"regret@{BUDGET} per seed: {regrets}"
