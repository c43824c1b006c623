"""A model of how a config's time depends on its tiles, fitted on measured trials.

The default search (:class:`autotune.samplers.surrogate.SurrogateSampler`) measures
next the config this model predicts fastest, refitting it on every trial; the
model of a *family* (:func:`fit_prior`, fitted on the trials the database holds
for other workloads of the workload's device kind, backend and family) is where
that fit starts, so what earlier tunes learned steers a new one from its first
trial and a far-off heuristic costs little.

What carries over between workloads is a config's time relative to the fastest
config of its own workload, so the target is ``log(median / fastest)`` per
workload, and the features describe a config in terms that mean the same at
every size (:func:`features`): its categorical choices, its tile sizes on a log
scale and relative to the frame, the padding it adds, the share of the
attention matrix its tiles cover and its grid steps over the fewest of the
workload's valid configs (:func:`kernel.cost.grid_steps`), with the variant's
interactions (a ``compact`` kernel pays per visited tile, ``naive`` per row).
A ridge regression on them is enough: fitted on seven shipped tables it ranks
the eighth's configs with a Spearman correlation of 0.7-0.9, and it is cheap to
refit on each ask.

Where no family's model is known, the fit starts from :func:`structural_prior`
instead of from nothing: what any tile kernel's time depends on before anything
is measured, the work its visited tiles do (masked and padded elements
included) and, more weakly, how many grid steps it takes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

import numpy as np

from autotune.space import SearchSpace
from kernel.config import ALIGNS, HEAD_GROUPINGS, LAYOUTS, VARIANTS, TileConfig
from kernel.workload import Workload

CATEGORIES: dict[str, tuple[str, ...]] = {
    "variant": VARIANTS,
    "layout": LAYOUTS,
    "align": ALIGNS,
    "head_grouping": HEAD_GROUPINGS,
}
RIDGE = 3.0  # pull of the weights towards the prior's (or zero): a few trials cannot overturn it
PRIOR_RIDGE = 1.0  # a family's model is fitted on hundreds of trials: a light pull towards zero
MIN_PRIOR_TRIALS = 20  # fewer ok trials of the family than this: no family's model (the structural prior)
# The structural prior's weights: log time ~ 1 x log(share of the attention matrix the visited tiles cover)
# + 0.25 x log(grid steps over the fewest). Work counts in full; a step's fixed cost is a fraction of it.
STRUCTURAL_WORK = 1.0
STRUCTURAL_STEPS = 0.25
_N_CATEGORIES = sum(len(v) for v in CATEGORIES.values())
_STEPS_COLUMN = 1 + _N_CATEGORIES + 7  # intercept, one-hot categories, the seven sizes and padding, then work
_WORK_COLUMN = _STEPS_COLUMN + 1


def features(space: SearchSpace, configs: Sequence[TileConfig]) -> np.ndarray:
    """One row per config (see the module docstring); the first column is the intercept."""
    pattern = space.pattern
    frame = pattern.layout.tokens_per_frame
    area = pattern.num_heads * float(pattern.seq_len) ** 2
    steps = np.array([space.grid_steps(c) for c in configs], dtype=float)
    fewest = min((space.grid_steps(c) for c in space.enumerate()), default=1)
    rows = []
    for config, n in zip(configs, steps, strict=True):
        # Column order is relied on by _STEPS_COLUMN and _WORK_COLUMN (structural_prior).
        onehot = [float(getattr(config, name) == v) for name, values in CATEGORIES.items() for v in values]
        lq, lk, lc = (math.log2(x) for x in (config.block_q, config.block_kv, config.block_kv_compute))
        sizes = [lq / 8, lk / 8, lc / 8, (lk - lc) / 4]
        numeric = [
            *sizes,
            math.log2(config.block_q / frame),
            math.log2(config.block_kv / frame),
            space.padding(config),
        ]
        work = [math.log(max(n, 1.0) / max(fewest, 1)), math.log(max(n, 1.0) * config.block_q * config.block_kv / area)]
        variant = onehot[: len(VARIANTS)]
        layout = onehot[len(VARIANTS) : len(VARIANTS) + len(LAYOUTS)]
        interactions = [a * b for a in variant for b in [*sizes, *work]] + [
            a * b for a in layout for b in [*sizes[:2], work[0]]
        ]
        rows.append([1.0, *onehot, *numeric, *work, *interactions, *(x * x for x in sizes)])
    return np.array(rows, dtype=float)


@dataclasses.dataclass(frozen=True)
class Ridge:
    """Linear weights over :func:`features`, predicting ``log(median / fastest)``."""

    weights: np.ndarray

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x @ self.weights)

    @classmethod
    def fit(cls, x: np.ndarray, y: np.ndarray, ridge: float, centre: Ridge | None = None) -> Ridge:
        """Least squares with a pull of ``ridge`` towards ``centre``'s weights (zero without one); the
        intercept is free, since a workload's own times sit at a level no other workload shares."""
        d = x.shape[1]
        c = centre.weights if centre is not None else np.zeros(d)
        pull = np.full(d, float(ridge))
        pull[0] = 1e-9
        w = np.linalg.solve(x.T @ x + np.diag(pull), x.T @ y + pull * c)
        return cls(w)


def structural_prior(width: int) -> Ridge:
    """The model a search starts from when the database knows no family's model: over :func:`features`
    (``width`` columns), a config's log time grows with the log of the share of the attention matrix its
    visited tiles cover (the work done, wasted work of masked and padded elements included) and, at a
    quarter of that weight, with the log of its grid steps over the fewest (each step's fixed cost).

    Both terms hold for any tile kernel on any backend and name no device, only where to look first; the fit
    on measured trials is pulled towards it as towards a family's model. Their weights are another matter:
    chosen on the twenty CPU tables shipped before it (0.15 and 0.25 on the steps about equal, 0.4 and 0
    worse; the README names the tables recorded after it and held out). On a TPU a grid step's fixed cost
    weighs more against a tile's work than on a CPU; a family's model, once the database has one, replaces
    this prior with measured weights."""
    weights = np.zeros(width)
    weights[_WORK_COLUMN] = STRUCTURAL_WORK
    weights[_STEPS_COLUMN] = STRUCTURAL_STEPS
    return Ridge(weights)


def step_halves(x: np.ndarray) -> np.ndarray:
    """For the rows of :func:`features` of a space's valid configs: 1 for a config with at least the median
    grid steps of the space over the fewest (the fine half: small tiles), 0 for the others (the coarse half).

    The structural prior predicts that fewer steps are never slower, which holds until a tile outgrows the
    device's fast memory; where that happens is the device's, so the search measures one config of each half
    before it trusts the prior's direction (:class:`autotune.samplers.surrogate.SurrogateSampler`)."""
    steps = x[:, _STEPS_COLUMN]
    return (steps >= np.median(steps)).astype(int) if len(steps) else np.zeros(0, dtype=int)


def fit_prior(trials: Iterable[tuple[Workload, TileConfig, float]], backend: str) -> Ridge | None:
    """The family's model: a ridge fitted on ``(workload, config, median_ms)`` of ok trials of other
    workloads of one family, each workload's times over its own fastest. None when there are fewer than
    :data:`MIN_PRIOR_TRIALS` usable trials (a model of a handful of points would steer more than it knows)."""
    by_workload: dict[str, tuple[Workload, dict[str, tuple[TileConfig, float]]]] = {}
    for workload, config, median_ms in trials:
        if not (median_ms > 0 and math.isfinite(median_ms)):
            continue
        _wl, seen = by_workload.setdefault(workload.key, (workload, {}))
        if config.key not in seen or median_ms < seen[config.key][1]:
            seen[config.key] = (config, median_ms)
    xs, ys = [], []
    for workload, seen in by_workload.values():
        space = SearchSpace(workload, backend)
        valid = [(c, m) for c, m in seen.values() if space.violation(c) is None]
        if len(valid) < 2:
            continue
        times = np.log([m for _, m in valid])
        xs.append(features(space, [c for c, _ in valid]))
        ys.append(times - times.min())
    if sum(len(y) for y in ys) < MIN_PRIOR_TRIALS:
        return None
    return Ridge.fit(np.vstack(xs), np.concatenate(ys), PRIOR_RIDGE)
