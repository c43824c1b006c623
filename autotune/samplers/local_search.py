"""The `tpe` strategy (the default before `surrogate`): TPE interleaved with local steps around the warm start
and the best configs.

Tile-size landscapes are rough globally (variant, layout and grouping change the
program) but mostly smooth locally: on every recorded table the best config is
one or two steps (a tile size one ordinal step up or down, or one categorical
switched) from a good one, while TPE alone tends to settle in a basin that
holds several near-best configs and samples around it. :class:`LocalSearchSampler`
wraps a base sampler (TPE) and alternates: every ``period``-th measured config
is proposed by the base sampler, the others by a local step, an unmeasured
valid neighbour (one dimension changed by one step) of a *centre*. The first
centre is the best warm-start config (the kernel's heuristic, or the tuned
config of a neighbour workload); a centre is kept until all its valid
neighbours are measured, then the best measured config with unmeasured
neighbours (among the ``beam`` best) becomes the next one. When none of them
has an unmeasured valid neighbour the base sampler proposes.

Why no descent-only phase: an earlier version took only local steps until a
local optimum was known. Where the warm start is far from the best (the
held-out ``suffix-sink`` table: three steps, each with a full neighbourhood to
measure) it took 29 trials to a config tied with the best, against 16 for plain
TPE; alternating from the start took 19, and kept the lead on the other decided
tables within a few trials (commit ``8fc312a`` has the figures, from tables since
re-recorded).

Everything the sampler decides is rebuilt on each ask from ``study.trials``:
which configs are measured or in flight (WAITING, RUNNING, COMPLETE), their
values, and the centre, stored as a trial system attribute. So it behaves the
same when several processes share one study through an RDB storage and when a
study is resumed; the only in-process state is a cache of the space's validity
rules, a pure function of the config.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from autotune.space import ParamCoding, SearchSpace

PROPOSAL_ATTR = "tiletune:proposal"  # trial system attr: "local" when the local step proposed the trial
CENTRE_ATTR = "tiletune:centre"  # trial system attr: the params whose neighbour the local step proposed

Key = tuple[Any, ...]


class LocalSearchSampler(optuna.samplers.BaseSampler):
    """``base`` (TPE) plus the local step described in the module docstring."""

    def __init__(
        self,
        space: SearchSpace,
        base: optuna.samplers.BaseSampler,
        *,
        seed: int = 0,
        period: int = 2,
        beam: int = 3,
        penalty: float = float("inf"),
    ) -> None:
        self._space = space
        self._coding = ParamCoding(space)
        self._base = base
        self._seed = seed
        self._period = max(1, period)
        self._beam = max(1, beam)
        self._penalty = penalty  # objective values at or above it are infeasible points
        self._varying = self._coding.varying
        self._valid: dict[Key, bool] = {}

    # ------------------------------------------------------------ delegation to the base sampler

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self._base.infer_relative_search_space(study, trial)

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        return self._base.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._base.before_trial(study, trial)

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        self._base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._base.reseed_rng()

    # ------------------------------------------------------------ the local step

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        local = self.local_proposal(study, trial, search_space)
        if local is None:
            return self._base.sample_relative(study, trial, search_space)
        proposal, centre = local
        study._storage.set_trial_system_attr(trial._trial_id, PROPOSAL_ATTR, "local")
        study._storage.set_trial_system_attr(trial._trial_id, CENTRE_ATTR, centre)
        return proposal

    def local_proposal(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """(params, centre) of the local step for ``trial``, or None when the base sampler proposes."""
        if any(n not in search_space for n in self._varying):
            return None  # no trial has finished yet: the relative space does not cover every dimension
        taken: set[Key] = set()
        scored: dict[Key, tuple[float, int, dict[str, Any]]] = {}  # feasible configs: (value, number, params)
        centre: dict[str, Any] | None = None
        for t in study._get_trials(deepcopy=False, use_cache=True):
            if t.number == trial.number:
                continue
            centre = t.system_attrs.get(CENTRE_ATTR, centre)
            params = self._coding.trial_params(t)
            if params is None:
                continue  # not a trial of this space (or one still being sampled)
            key = self._coding.key(params)
            taken.add(key)
            value = t.value if t.state == TrialState.COMPLETE else None
            if value is None or value >= self._penalty or any(c > 0 for c in t.constraints.values()):
                continue  # in flight, or infeasible
            if key not in scored or value < scored[key][0]:
                scored[key] = (value, t.number, dict(params))
        if not scored:
            return None
        if len(taken) % self._period == 0:
            return None  # the base sampler's turn
        ranked = [p for _, _, p in sorted(scored.values(), key=lambda s: (s[0], s[1]))[: self._beam]]
        rng = np.random.default_rng([self._seed, trial.number])
        for params in [centre, *ranked] if centre is not None else ranked:
            free = [
                p for p in self._coding.neighbours(params) if self._coding.key(p) not in taken and self._is_valid(p)
            ]
            if free:
                pick = free[int(rng.integers(len(free)))]
                return {n: pick[n] for n in search_space}, params
        return None

    def _is_valid(self, params: dict[str, Any]) -> bool:
        key = self._coding.key(params)
        if key not in self._valid:
            config = self._coding.try_decode(params)
            self._valid[key] = config is not None and self._space.violation(config) is None
        return self._valid[key]
