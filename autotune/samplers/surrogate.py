"""The default search strategy: measure next the config a model of the measured trials predicts fastest.

On each ask :class:`SurrogateSampler` fits :class:`autotune.surrogate.Ridge` on
the study's measured trials (``log`` of each config's median against the
fastest so far), pulled towards the family's model when the database knows
one (:func:`autotune.surrogate.fit_prior`), predicts every valid config of the
space that is neither measured nor in flight, perturbs each prediction by a
seeded Gaussian of ``noise`` (on the log scale: about 10%, the size of the
timing noise, so near-ties are explored rather than always broken the same way)
and proposes the lowest. Every ``local_every``-th trial (by number) it proposes
the lowest among the unmeasured one-step neighbours of the fastest config so far
instead (a tile size one step up or down, both tile sizes one step in the same
direction, or one categorical switched: :meth:`autotune.space.ParamCoding.neighbours`
with its diagonal, since time over ``block_q`` x ``block_kv`` has valleys along
it that single steps do not cross): a linear
model ranks regions well but misjudges single configs where one variant's times
swing with the tile sizes, and the neighbourhood of the best is where the tied
configs are. The warm start (the heuristic, the database's configs) is enqueued
before it by the search, as for every sampler.

Why a model rather than TPE with local steps (the earlier default, now ``tpe``):
TPE needs a dozen trials before its proposals beat random, and the local steps
only pay where the warm start is near the best. The model alone (commit 62e022c)
led on the eight tables it was chosen on but not on four tables recorded after
it: on suffix-spatial-bf16 without a warm start it kept measuring ``naive``
configs, whose times are flat, while the ``compact`` config next to its best
was the fastest. With the local step every second trial it reached a tied config
sooner on all four (``autotune/tables/README.md`` has the figures, and the tables
held out from this version).

Three hedges for a search with no family's model and for landscapes the features
describe badly: without a family's model the fit starts from
:func:`autotune.surrogate.structural_prior` (work done and grid steps; before it,
commit ``4a0514c`` started from nothing and spread its first three configs over
the space's extremes, the slowest tiles); until a config of each half of the
space's grid steps is taken (:func:`autotune.surrogate.step_halves`, a warm
start's config included), the proposal is the model's pick within the coarse
half, then within the fine one, since the prior's "fewer steps, less time" stops
holding once a tile outgrows the device's fast memory, and where that is differs
per device (on the CPU tables the fastest tiles are often the small ones); and
every ``tpe_every``-th trial (from the second on) is TPE's proposal
(multivariate, as ``tpe-plain``), which learns per dimension what the linear
model has to learn as interactions. ``autotune/tables/README.md`` names the tables
each version was chosen on and the ones recorded after it and held out.

Everything is rebuilt on each ask from ``study.trials`` (measured values, and
configs WAITING or RUNNING in other workers), so workers sharing one study
never propose a config another has taken, and a resumed study continues where
it stopped. Only the features of the space's valid configs are cached.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from autotune.samplers.local_search import CENTRE_ATTR, PROPOSAL_ATTR
from autotune.space import ParamCoding, SearchSpace
from autotune.surrogate import RIDGE, Ridge, features, step_halves, structural_prior

NOISE = 0.1  # sd of the perturbation of each log-time prediction
LOCAL_EVERY = 2  # every second trial: the best neighbour of the fastest config so far (0: never)
TPE_EVERY = 3  # trials 1, 4, 7, ...: TPE's proposal, once it has its startup trials (0: never)


class SurrogateSampler(optuna.samplers.BaseSampler):
    """The model-driven proposals described in the module docstring; ``prior`` is the family's model
    (None: the structural prior, and with ``halves`` a config of each half of the grid steps first)."""

    def __init__(
        self,
        space: SearchSpace,
        *,
        prior: Ridge | None = None,
        seed: int = 0,
        noise: float = NOISE,
        local_every: int = LOCAL_EVERY,
        tpe_every: int = TPE_EVERY,
        startup_trials: int = 8,
        penalty: float = float("inf"),
        halves: bool = True,
    ) -> None:
        self._space = space
        self._coding = ParamCoding(space)
        self._prior = prior
        self._seed = seed
        self._noise = noise
        self._local_every = local_every
        self._tpe_every = tpe_every
        self._tpe = optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=startup_trials)
        self._penalty = penalty  # objective values at or above it are infeasible points
        self._fallback = optuna.samplers.RandomSampler(seed=seed)
        self._varying = self._coding.varying
        self._halves = halves  # without a family's model: one config of each half of the steps first
        self._grid: tuple[list[dict[str, Any]], np.ndarray, dict[tuple[Any, ...], int]] | None = None

    def _valid_grid(self) -> tuple[list[dict[str, Any]], np.ndarray, dict[tuple[Any, ...], int]]:
        """Params, features and row index (by key) of every valid config of the space, computed once."""
        if self._grid is None:
            pairs = [(c, p) for c in self._space.enumerate() if (p := self._coding.encode(c)) is not None]
            params = [p for _, p in pairs]
            x = features(self._space, [c for c, _ in pairs]) if pairs else np.zeros((0, 1))
            self._grid = (params, x, {self._coding.key(p): i for i, p in enumerate(params)})
        return self._grid

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {n: d for n, d in self._coding.distributions().items() if n in self._varying}

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)

    def reseed_rng(self) -> None:
        self._fallback.reseed_rng()

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if self._tpe_every and trial.number % self._tpe_every == 1:
            tpe_space = self._tpe.infer_relative_search_space(study, trial)
            # Empty until TPE has its startup trials; a config TPE proposes that is taken or invalid is
            # left for the model's proposal, so this sampler never proposes a taken config.
            params = self._tpe.sample_relative(study, trial, tpe_space) if tpe_space else {}
            if params and self._is_free(study, trial, params):
                study._storage.set_trial_system_attr(trial._trial_id, PROPOSAL_ATTR, "tpe")
                return {n: params[n] for n in search_space if n in params}
        proposal = self.proposal(study, trial)
        if proposal is None:
            return {}
        params, centre = proposal
        if centre is not None:  # recorded as the local search's are: which trials were local steps, from where
            study._storage.set_trial_system_attr(trial._trial_id, PROPOSAL_ATTR, "local")
            study._storage.set_trial_system_attr(trial._trial_id, CENTRE_ATTR, centre)
        return {n: params[n] for n in search_space}

    def _is_free(self, study: optuna.Study, trial: FrozenTrial, params: dict[str, Any]) -> bool:
        """Whether ``params`` name a valid config that no other trial has taken (measured or in flight)."""
        full = {**{n: c[0] for n, c in self._coding.dims.items() if len(c) == 1}, **params}
        if any(n not in full for n in self._varying):
            return False
        _params, _x, row = self._valid_grid()
        if self._coding.key(full) not in row:
            return False
        states = (TrialState.WAITING, TrialState.RUNNING, TrialState.COMPLETE)
        for t in study._get_trials(deepcopy=False, use_cache=True, states=states):
            p = self._coding.trial_params(t) if t.number != trial.number else None
            if p is not None and self._coding.key(p) == self._coding.key(full):
                return False
        return True

    def proposal(self, study: optuna.Study, trial: FrozenTrial) -> tuple[dict[str, Any], dict[str, Any] | None] | None:
        """(params of the config to measure as ``trial``, the fastest config it neighbours when it is a local
        step, else None), or None when every valid config is taken."""
        params, x, row = self._valid_grid()
        taken = np.zeros(len(params), dtype=bool)
        measured: dict[int, float] = {}
        for t in study._get_trials(deepcopy=False, use_cache=True):
            if t.number == trial.number:
                continue
            p = self._coding.trial_params(t)
            if p is None:
                continue
            i = row.get(self._coding.key(p))
            if i is None:
                continue  # an invalid point: never proposed anyway
            if t.state in (TrialState.WAITING, TrialState.RUNNING, TrialState.COMPLETE):
                taken[i] = True
            value = t.value if t.state == TrialState.COMPLETE else None
            if value is None or value >= self._penalty or any(c > 0 for c in t.constraints.values()):
                continue
            measured[i] = min(value, measured.get(i, value))
        if taken.all():
            return None
        rng = np.random.default_rng([self._seed, trial.number])
        prior = self._prior or structural_prior(x.shape[1])
        if measured:
            idx = np.array(sorted(measured))
            y = np.log(np.maximum([measured[i] for i in idx], 1e-9))  # a 0 ms answer (a fake measurer) stays finite
            model = Ridge.fit(x[idx], y - y.min(), RIDGE, prior)
        else:
            model = prior
        score = model.predict(x) + self._noise * rng.standard_normal(len(params))
        score[taken] = np.inf
        if self._prior is None and self._halves:
            halves = step_halves(x)
            for half in (0, 1):  # the coarse half first: where the structural prior looks
                if (halves == half).any() and not (taken & (halves == half)).any():
                    score[halves != half] = np.inf
                    return dict(params[int(np.argmin(score))]), None
        centre = None
        if measured and self._local_every and trial.number % self._local_every == 0:
            fastest = params[min(measured, key=lambda i: measured[i])]
            rows = [row.get(self._coding.key(p)) for p in self._coding.neighbours(fastest, diagonal=True)]
            near = np.zeros(len(params), dtype=bool)
            near[[i for i in rows if i is not None]] = True  # neighbours outside the valid grid are not rows
            near &= ~taken
            if near.any():
                score[~near] = np.inf
                centre = dict(fastest)
        return dict(params[int(np.argmin(score))]), centre
