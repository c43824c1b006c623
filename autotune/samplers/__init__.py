"""Samplers of the search, by name: :func:`make_sampler`.

- ``surrogate`` (default): :class:`~autotune.samplers.surrogate.SurrogateSampler`, the
  config a model of the measured trials (started from the family's model when the
  database knows one) predicts fastest, with a local step every second trial and
  TPE's proposal every third;
- ``tpe``: :class:`~autotune.samplers.local_search.LocalSearchSampler`,
  multivariate TPE interleaved with local steps (one-step neighbours) around the
  warm start and the best configs;
- ``tpe-plain``: multivariate TPE alone (both read each trial's ``infeasible``
  constraint, so failed and invalid regions are learned as infeasible);
- ``random``, ``grid``, ``brute`` (every point, in order), ``gp`` (Optuna's GP
  sampler; needs torch).

Every sampler proposes params in the coding of :class:`autotune.space.ParamCoding`;
the search, not the sampler, guarantees that no params are measured twice and no
invalid point is measured (one contract test runs over every sampler named here).
"""

from __future__ import annotations

import warnings
from typing import Any

import optuna

from autotune.samplers.local_search import LocalSearchSampler
from autotune.samplers.surrogate import SurrogateSampler
from autotune.space import ParamCoding, SearchSpace
from autotune.surrogate import Ridge

SAMPLERS = ("surrogate", "tpe", "tpe-plain", "random", "grid", "gp", "brute")
PENALTY_MS = 1e9  # objective of infeasible points (never compared with real times)

__all__ = ["PENALTY_MS", "SAMPLERS", "LocalSearchSampler", "SurrogateSampler", "make_sampler"]


class _AskTellGridSampler(optuna.samplers.GridSampler):
    """GridSampler without its Study.stop() at the end of the grid: stop() only works
    inside optimize(), and the ask-and-tell loop ends by itself when every point is seen."""

    def after_trial(self, study: optuna.Study, trial: Any, state: Any, values: Any) -> None:
        return None


def make_sampler(
    name: str, space: SearchSpace, seed: int, startup_trials: int, prior: Ridge | None = None
) -> optuna.samplers.BaseSampler:
    """The sampler called ``name`` (one of :data:`SAMPLERS`) for ``space``; ``prior`` (the family's
    model, :func:`autotune.surrogate.fit_prior`) steers ``surrogate`` and is ignored by the others."""
    if name == "surrogate":
        return SurrogateSampler(space, prior=prior, seed=seed, startup_trials=startup_trials, penalty=PENALTY_MS)
    if name in ("tpe", "tpe-plain"):
        tpe = optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=startup_trials)
        return tpe if name == "tpe-plain" else LocalSearchSampler(space, tpe, seed=seed, penalty=PENALTY_MS)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return _AskTellGridSampler(ParamCoding(space).grid(), seed=seed)
    if name == "brute":
        with warnings.catch_warnings():  # experimental since Optuna 3.1, stable enough for a plain sweep
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.BruteForceSampler(seed=seed)
    if name == "gp":
        try:
            import torch  # noqa: F401  # Optuna's GP sampler is built on torch
        except ImportError:
            raise ValueError("sampler 'gp' needs torch: pip install 'tiletune[gp]'") from None
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup_trials)
    raise ValueError(f"sampler must be one of {SAMPLERS}, got {name!r}")
