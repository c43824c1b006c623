"""The default strategy's model (autotune.surrogate) and its sampler (autotune.samplers.surrogate):
the family's model carries over to another workload of the family, the sampler proposes what the
model predicts fastest, never a config measured or in flight, and rebuilds everything from the study."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import optuna

from autotune.replay import TABLES, RecordedTable, bundled_table
from autotune.samplers import PENALTY_MS
from autotune.samplers.local_search import CENTRE_ATTR, PROPOSAL_ATTR
from autotune.samplers.surrogate import SurrogateSampler
from autotune.search import SearchOptions, run_search
from autotune.space import ParamCoding, SearchSpace
from autotune.surrogate import MIN_PRIOR_TRIALS, Ridge, features, fit_prior, structural_prior
from kernel.config import TileConfig
from kernel.cost import grid_steps

from .test_search import WORKLOAD, FakeMeasurer


def _ok(table: RecordedTable) -> list[tuple[TileConfig, float]]:
    return [(c, m.median_ms) for c, m in table.entries.values() if m.status == "ok" and m.median_ms is not None]


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def test_the_features_of_a_config_do_not_depend_on_which_other_configs_are_described() -> None:
    space = SearchSpace(WORKLOAD, "xla")
    configs = space.enumerate()
    whole = features(space, configs)
    assert whole.shape[0] == len(configs) and np.all(whole[:, 0] == 1.0)
    assert np.allclose(features(space, configs[3:7]), whole[3:7])
    assert len({tuple(row) for row in whole}) == len(configs)  # every config is told apart


def test_a_ridge_without_a_centre_recovers_a_linear_law_and_with_one_stays_near_it_on_few_points() -> None:
    rng = np.random.default_rng(0)
    x = np.hstack([np.ones((200, 1)), rng.normal(size=(200, 4))])
    truth = np.array([0.5, 1.0, -2.0, 0.0, 3.0])
    fitted = Ridge.fit(x, x @ truth, ridge=1e-6)
    assert np.allclose(fitted.weights, truth, atol=1e-4)
    # Two points cannot overturn a centre: the fit keeps the centre's slopes where the points say nothing.
    centre = Ridge(truth)
    few = Ridge.fit(x[:2], x[:2] @ truth + 5.0, ridge=3.0, centre=centre)
    assert np.allclose(few.weights[1:], truth[1:], atol=0.2)  # the free intercept took the shift
    assert abs(few.weights[0] - (truth[0] + 5.0)) < 0.5


def test_the_family_model_of_one_table_ranks_another_workload_of_its_family() -> None:
    """Fitted on small-mixed's configs only, the model orders cpu-demo's (same family, 4x the tokens,
    never seen): the carry-over the default's start relies on."""
    small, demo = (RecordedTable.load(bundled_table(n)) for n in ("small-mixed.xla.json", "cpu-demo.xla.json"))
    prior = fit_prior([(small.workload, c, m) for c, m in _ok(small)], "xla")
    assert prior is not None
    configs, medians = zip(*_ok(demo), strict=True)
    predicted = prior.predict(features(demo.space(), list(configs)))
    assert _spearman(predicted, np.log(medians)) > 0.6


def test_a_family_model_needs_enough_valid_finite_trials() -> None:
    small = RecordedTable.load(bundled_table("small-mixed.xla.json"))
    ok = _ok(small)
    few = [(small.workload, c, m) for c, m in ok[: MIN_PRIOR_TRIALS - 1]]
    assert fit_prior(few, "xla") is None
    bad = [math.inf, 0.0, -1.0, math.nan] * 13
    junk = [(small.workload, c, b) for (c, _), b in zip(ok[:52], bad, strict=True)]
    assert fit_prior(junk + few, "xla") is None  # non-finite and non-positive times are not trials
    assert fit_prior([(small.workload, c, m) for c, m in ok[:MIN_PRIOR_TRIALS]], "xla") is not None


def _study(space: SearchSpace, tmp_path: Any, trials: int, **options: Any) -> tuple[str, list[Any]]:
    storage = f"sqlite:///{tmp_path / 's.db'}"
    run_search(space, FakeMeasurer(), SearchOptions(trials=trials, **options), storage=storage, study_name="s")
    return storage, optuna.load_study(study_name="s", storage=storage).trials


def _pending(study: optuna.Study) -> Any:
    """A new trial with no params yet, as a worker's ask creates it (study.ask would pop an enqueued one)."""
    return study._storage.get_trial(study._storage.create_new_trial(study._study_id))


def test_the_sampler_proposes_valid_configs_never_measured_nor_in_flight_and_the_same_from_any_process(
    tmp_path: Any,
) -> None:
    space = SearchSpace(WORKLOAD, "xla", max_padding=0.1)
    coding = ParamCoding(space)
    storage, trials = _study(space, tmp_path, 25, seed=3)
    keys = [coding.decode(t.params).key for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(keys) == len(set(keys)) == 25
    assert all(space.violation(coding.decode(t.params)) is None for t in trials)
    study = optuna.load_study(study_name="s", storage=storage)
    frozen = _pending(study)
    first = SurrogateSampler(space, seed=3, penalty=PENALTY_MS).proposal(study, frozen)
    again = SurrogateSampler(space, seed=3, penalty=PENALTY_MS).proposal(study, frozen)
    assert first is not None and first == again
    assert coding.decode(first[0]).key not in keys
    study.enqueue_trial(first[0])  # another worker took it
    study = optuna.load_study(study_name="s", storage=storage)
    second = SurrogateSampler(space, seed=3, penalty=PENALTY_MS).proposal(study, _pending(study))
    assert second is not None and second[0] != first[0]


def test_without_measurements_the_first_proposal_is_the_family_models_fastest(tmp_path: Any) -> None:
    """A prior that knows one config is fastest makes it the first measured when there is no warm start."""
    space = SearchSpace(WORKLOAD, "xla")
    configs = space.enumerate()
    x = features(space, configs)
    target = len(configs) // 2
    y = np.full(len(configs), 1.0)
    y[target] = 0.0
    prior = Ridge.fit(x, y, ridge=1e-6)
    assert int(np.argmin(prior.predict(x))) == target  # the planted law is representable
    storage = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(storage=storage, study_name="s")
    proposal = SurrogateSampler(space, prior=prior, noise=0.0).proposal(study, _pending(study))
    assert proposal is not None and ParamCoding(space).decode(proposal[0]) == configs[target]


def test_a_space_with_every_config_taken_leaves_the_proposal_to_the_search(tmp_path: Any) -> None:
    space = SearchSpace(WORKLOAD, "xla", blocks_q=(128,), blocks_kv=(64, 128))  # 32 configs: each one is a trial
    size = len(space.enumerate())
    storage, trials = _study(space, tmp_path, size + 5, seed=1)
    assert len({t.number for t in trials if t.state == optuna.trial.TrialState.COMPLETE}) >= size
    study = optuna.load_study(study_name="s", storage=storage)
    assert SurrogateSampler(space, penalty=PENALTY_MS).proposal(study, _pending(study)) is None


def test_the_family_model_reaches_the_sampler_through_search_options_with_the_warm_start() -> None:
    """``SearchOptions.prior`` is part of the warm start: with it, the config the planted prior calls fastest
    is measured right after the heuristic; with the warm start off, the prior is not used."""
    space = SearchSpace(WORKLOAD, "xla")
    configs = space.enumerate()
    x = features(space, configs)
    prior = Ridge(np.random.default_rng(1).normal(size=x.shape[1]) * 5)  # a law planted at random
    predicted = np.sort(prior.predict(x))
    assert predicted[1] - predicted[0] > 0.3  # a clear favourite: three times the sampler's perturbation
    target = configs[int(np.argmin(prior.predict(x)))]
    for seed in range(3):
        warm = run_search(space, FakeMeasurer(), SearchOptions(trials=2, seed=seed, prior=prior), finalize=False)
        assert warm.trials[1].config == target
        cold = SearchOptions(trials=2, seed=seed, prior=prior, warm_start=False)
        assert target not in [t.config for t in run_search(space, FakeMeasurer(), cold, finalize=False).trials]


def test_every_second_trial_is_the_models_pick_among_the_one_step_neighbours_of_the_fastest(tmp_path: Any) -> None:
    """One dimension one step away, or both tile sizes one step in the same direction (the diagonal)."""
    space = SearchSpace(WORKLOAD, "xla")
    coding = ParamCoding(space)
    _storage, trials = _study(space, tmp_path, 30, seed=2)
    local = [t for t in trials if t.system_attrs.get(PROPOSAL_ATTR) == "local"]
    assert len(local) >= 5 and all(t.number % 2 == 0 for t in local)
    for t in local:
        before = [u for u in trials if u.number < t.number and u.state == optuna.trial.TrialState.COMPLETE]
        fastest = min((u for u in before if u.value is not None and u.value < PENALTY_MS), key=lambda u: u.value)
        centre = {**coding.trial_params(fastest)}  # type: ignore[dict-item]
        assert t.system_attrs[CENTRE_ATTR] == centre
        changed = [n for n in coding.varying if centre[n] != t.params[n]]
        if changed == ["block_q", "block_kv"]:
            assert t.params["block_q"] - centre["block_q"] == t.params["block_kv"] - centre["block_kv"] in (-1, 1)
            continue
        assert len(changed) == 1, (centre, t.params)
        n = changed[0]
        assert not coding.is_ordinal(n) or abs(centre[n] - t.params[n]) == 1
        assert coding.decode(t.params).key not in {coding.decode(u.params).key for u in before}


def test_when_every_single_step_from_the_fastest_is_measured_the_local_step_takes_the_tile_diagonal(
    tmp_path: Any,
) -> None:
    """The diagonal (block_q and block_kv one step down, or both up) is a neighbour of the local step: with the
    fastest config's single-step neighbours all measured slower, the local step still stays next to it."""
    space = SearchSpace(WORKLOAD, "xla")
    coding = ParamCoding(space)
    grid = {coding.key(p): p for c in space.enumerate() if (p := coding.encode(c)) is not None}

    def diagonals(p: dict[str, Any]) -> list[dict[str, Any]]:
        return [q for q in coding.neighbours(p, diagonal=True) if q not in coding.neighbours(p)]

    centre = next(p for p in grid.values() if len([d for d in diagonals(p) if coding.key(d) in grid]) == 2)
    q, kv = centre["block_q"], centre["block_kv"]
    assert diagonals(centre) == [
        {**centre, "block_q": q - 1, "block_kv": kv - 1},
        {**centre, "block_q": q + 1, "block_kv": kv + 1},
    ]
    edge = next(p for p in grid.values() if p["block_q"] == 0 and p["block_kv"] > 0)
    assert diagonals(edge) == [{**edge, "block_q": 1, "block_kv": edge["block_kv"] + 1}]  # none below the grid

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="s")
    distributions = coding.distributions()
    slower = [p for p in coding.neighbours(centre) if coding.key(p) in grid]
    for params, value in [(centre, 1.0), *((p, 2.0) for p in slower)]:
        full = {n: params[n] for n in distributions}
        study.add_trial(optuna.trial.create_trial(params=full, distributions=distributions, value=value))
    if len(study.trials) % 2:  # the local step is an even-numbered trial's
        far = next(p for k, p in grid.items() if p not in (centre, *slower, *diagonals(centre)))
        study.add_trial(
            optuna.trial.create_trial(params={n: far[n] for n in distributions}, distributions=distributions, value=3.0)
        )
    proposal = SurrogateSampler(space, seed=0, penalty=PENALTY_MS, halves=False).proposal(study, _pending(study))
    assert proposal is not None
    params, from_centre = proposal
    assert from_centre == centre
    assert params in diagonals(centre)


def test_every_third_trial_from_the_second_is_tpes_once_it_has_its_startup_trials(tmp_path: Any) -> None:
    """TPE's turns (trials 1, 4, 7, ...) start after its startup trials, are recorded as such, and never
    name a config taken before them (the sampler falls back to its model when TPE's pick is taken)."""
    space = SearchSpace(WORKLOAD, "xla")
    coding = ParamCoding(space)
    _storage, trials = _study(space, tmp_path, 40, seed=5, startup_trials=8)
    tpe = [t for t in trials if t.system_attrs.get(PROPOSAL_ATTR) == "tpe"]
    # Few: on this landscape TPE mostly names configs already taken, and the model proposes instead.
    assert len(tpe) >= 1 and all(t.number % 3 == 1 for t in tpe)
    assert min(t.number for t in tpe) >= 8  # TPE proposes nothing before 8 trials are complete
    for t in tpe:
        earlier = {coding.decode(u.params).key for u in trials if u.number < t.number}
        assert coding.decode(t.params).key not in earlier


def test_the_structural_prior_weighs_the_work_of_the_visited_tiles_and_a_quarter_of_the_grid_steps() -> None:
    """Its prediction, written out from the kernel's step count and the tile sizes (not from the features)."""
    table = RecordedTable.load(bundled_table("text-prefix-spatial.xla.json"))
    space = table.space()
    configs = space.enumerate()
    pattern = space.pattern
    # The table was recorded on xla kernel version 1: the prior counts the steps that version walked.
    assert space.workload.kernel_version == "1"
    steps = np.array([grid_steps(pattern, c, space.backend, "1") for c in configs], dtype=float)
    share = steps * np.array([c.block_q * c.block_kv for c in configs]) / (pattern.num_heads * pattern.seq_len**2)
    expected = np.log(share) + 0.25 * np.log(steps / steps.min())
    x = features(space, configs)
    assert np.allclose(structural_prior(x.shape[1]).predict(x), expected)


# Shipped tables whose recorded medians the structural prior ranks at a Spearman correlation of 0.2 or
# less, with why each is known. Strict, like test_strategy's KNOWN_MISSES: a table that joins or leaves
# this set fails the test until it is written down here.
KNOWN_WEAK_PRIOR = {
    "spatial-prefix-hd32-bf16.v2.xla.json": "held out, version 2: -0.087",
    "spatial-suffix-hd32-b2-bf16.v2.xla.json": "held out, version 2: -0.098",
    "spatial-sink-prefix-12k-f32.xla.json": "held out: 0.055",
    "spatial-sink-prefix-12k-f32.v2.xla.json": "held out, version 2: 0.145 (its version-1 twin above)",
    "spatial-suffix-8k-f32.v2.xla.json": "held out, version 2: 0.145",
}


def test_the_structural_prior_ranks_the_recorded_configs_of_most_shipped_tables() -> None:
    """Before anything is measured it is the search's whole knowledge: it has to rank real configs better
    than chance. Over the shipped tables its Spearman correlation with the recorded medians is above 0.2 on
    all but the few named in KNOWN_WEAK_PRIOR (it is a prior; the fit on measured trials corrects it).

    Until 2026-12-07 the bar was "at most three tables", set on the twenty the prior was chosen on
    (``88ae6b6``); the held-out tables recorded since brought a fourth, and the last one re-recorded on version
    2 a fifth (all five are spatial-only); the prior stays frozen for them, so they are named instead of the
    count being raised."""
    rhos = {}
    for path in sorted(TABLES.glob("*.xla.json")):
        table = RecordedTable.load(path)
        space = table.space()
        configs, medians = zip(*_ok(table), strict=True)
        x = features(space, list(configs))
        rhos[path.name] = _spearman(structural_prior(x.shape[1]).predict(x), np.log(medians))
    assert len(rhos) >= 20
    assert np.median(list(rhos.values())) > 0.5
    weak = {name: round(r, 2) for name, r in rhos.items() if r <= 0.2}
    assert set(weak) == set(KNOWN_WEAK_PRIOR), weak


def test_without_a_warm_start_or_a_family_model_the_first_config_is_the_structural_priors_pick(
    tmp_path: Any,
) -> None:
    """Noise off: the first proposal is the config the structural prior predicts fastest; a family's model,
    when known, replaces it."""
    space = SearchSpace(WORKLOAD, "xla")
    configs = space.enumerate()
    x = features(space, configs)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="s")
    coding = ParamCoding(space)
    first = SurrogateSampler(space, seed=0, noise=0.0, penalty=PENALTY_MS).proposal(study, _pending(study))
    assert first is not None
    predicted = structural_prior(x.shape[1]).predict(x)
    row = {c.key: i for i, c in enumerate(configs)}
    assert predicted[row[coding.decode(first[0]).key]] == predicted.min()
    family = Ridge(-structural_prior(x.shape[1]).weights)  # a family's model that disagrees entirely
    steered = SurrogateSampler(space, prior=family, seed=0, noise=0.0, penalty=PENALTY_MS).proposal(
        study, _pending(study)
    )
    assert steered is not None
    assert predicted[row[coding.decode(steered[0]).key]] == predicted.max()


def test_without_a_family_model_one_config_of_each_half_of_the_grid_steps_is_measured_first(tmp_path: Any) -> None:
    """The structural prior only knows that fewer steps cost less: before it is trusted, the coarse half (fewer
    grid steps than the space's median) and the fine half each get one config, the prior's pick within it,
    the coarse first; a warm start's config counts for its half. A family's model knows the device: no halves."""
    space = SearchSpace(WORKLOAD, "xla")
    coding = ParamCoding(space)
    configs = space.enumerate()
    x = features(space, configs)
    steps = np.array([grid_steps(space.pattern, c, space.backend) for c in configs], dtype=float)
    fine = {c.key for c, n in zip(configs, steps, strict=True) if n >= np.median(steps)}
    assert 0 < len(fine) < len(configs)
    predicted = dict(zip((c.key for c in configs), structural_prior(x.shape[1]).predict(x), strict=True))

    def measured(seed: int, **options: Any) -> list[str]:
        result = run_search(space, FakeMeasurer(), SearchOptions(trials=2, seed=seed, **options), finalize=False)
        return [t.config.key for t in result.trials]

    for seed in range(3):
        coarse_pick, fine_pick = measured(seed, warm_start=False)
        assert coarse_pick not in fine and fine_pick in fine
        best_fine = min(predicted[k] for k in fine)
        assert predicted[fine_pick] < best_fine + 0.5  # the prior's pick within the half, up to the noise
    heuristic, after = measured(0)
    assert (heuristic in fine) != (after in fine)  # the warm start's half is covered: the other one next
    # A family's model (here the structural prior's law itself) is trusted from the start: after the coarse
    # half's pick, the next is its best among the rest, wherever it lies (on this space: the coarse half).
    law = structural_prior(x.shape[1])
    order = sorted(configs, key=lambda c: predicted[c.key])
    assert order[0].key not in fine and order[1].key not in fine
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="s")
    params = coding.encode(order[0])
    assert params is not None
    distributions = {n: d for n, d in coding.distributions().items() if n in params}
    study.add_trial(optuna.trial.create_trial(params=params, distributions=distributions, value=1.0))
    for prior, expected_fine in ((law, False), (None, True)):
        proposal = SurrogateSampler(space, prior=prior, seed=0, noise=0.0, penalty=PENALTY_MS).proposal(
            study, _pending(study)
        )
        assert proposal is not None
        assert (coding.decode(proposal[0]).key in fine) == expected_fine
