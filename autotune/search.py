"""The search: an Optuna study over the search space, measured through a supervisor.

Per job one study (ask-and-tell, so invalid points are never measured):
 - samplers: ``tpe`` (default: :class:`autotune.strategy.LocalSearchSampler`, a
   best-improvement descent from the warm start over one-step neighbours, then
   multivariate TPE interleaved with local steps around the best configs),
   ``tpe-plain`` (multivariate TPE alone; both read the trials' constraint, so
   failed and invalid regions are learned as infeasible), ``random``, ``grid``,
   ``gp`` (Optuna's GP sampler; needs torch) and ``brute`` (every point, in order);
 - warm start: the kernel's heuristic config and any given seed configs are
   enqueued first (``enqueue_trial``);
 - the same params are never measured twice: a repeated proposal is answered
   from the study's own record, and after a run of proposals that measure
   nothing an unmeasured valid point is enqueued, so the budget buys new data;
 - a config whose first runs are ``prune_factor`` x slower than the best so far
   stops early (``pruned``);
 - at the end the top ``top_k`` configs are re-timed in interleaved rounds and
   the winner is the best median of those runs, with its spread.
A fast but wrong config is infeasible and can never win.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import optuna

from autotune.measure import Measurement, config_key
from autotune.space import SearchSpace
from autotune.strategy import LocalSearchSampler
from kernel.config import TileConfig
from kernel.heuristic import heuristic_config

SAMPLERS = ("tpe", "tpe-plain", "random", "grid", "gp", "brute")
PENALTY_MS = 1e9  # objective of infeasible points (never compared with real times)
MAX_STALE_ASKS = 25


class Measurer(Protocol):
    def measure(self, config: TileConfig, prune_above_ms: float | None = None) -> Measurement: ...
    def retime(self, config: TileConfig, runs: int) -> list[float]: ...
    def dense_ms(self, repeats: int = 5) -> float | None: ...


class Coordinator(Protocol):
    """The shared book-keeping of a search that several processes run on one study
    (the tuning workers of one job): the budget, who measures what, when to stop.

    ``reserve`` answers ``("go", None)`` (measure it), ``("known", m)`` (measured
    already, possibly by another worker: its measurement), ``("busy", None)``
    (another worker is measuring it), ``("full", None)`` (the budget is spent) or
    ``("stop", None)`` (stop now: the job was cancelled or lost, or the worker is
    shutting down). ``complete`` records a measured trial and returns False when
    the result could not be kept (the worker lost the job): the search stops.
    """

    def measured(self) -> dict[str, Measurement]: ...
    def reserve(self, config: TileConfig, number: int) -> tuple[str, Measurement | None]: ...
    def complete(self, trial: TrialResult) -> bool: ...
    def invalid(self, config: TileConfig, reason: str) -> None: ...
    def stopping(self) -> bool: ...


@dataclasses.dataclass
class SearchOptions:
    trials: int = 40  # measured configs (invalid and repeated proposals do not count)
    sampler: str = "tpe"
    seed: int = 0
    timeout_s: float | None = None  # whole-search time budget
    top_k: int = 3
    retime_rounds: int = 4
    retime_runs: int = 2
    prune: bool = True
    prune_factor: float = 2.0
    seed_configs: tuple[TileConfig, ...] = ()
    warm_start: bool = True
    startup_trials: int = 8


@dataclasses.dataclass
class TrialResult:
    number: int
    config: TileConfig
    measurement: Measurement


@dataclasses.dataclass
class SearchResult:
    trials: list[TrialResult]
    best: TrialResult | None
    best_runs_ms: tuple[float, ...] = ()
    finalists: list[tuple[TileConfig, tuple[float, ...]]] = dataclasses.field(default_factory=list)
    dense_ms: float | None = None
    invalid: int = 0
    repeated: int = 0

    @property
    def best_median_ms(self) -> float | None:
        return float(np.median(self.best_runs_ms)) if self.best_runs_ms else None

    @property
    def best_spread(self) -> float | None:
        if not self.best_runs_ms:
            return None
        runs = np.asarray(self.best_runs_ms)
        return float((np.percentile(runs, 90) - np.percentile(runs, 10)) / np.median(runs))

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.trials:
            out[t.measurement.status] = out.get(t.measurement.status, 0) + 1
        return out


class ParamCoding:
    """How configs look to the sampler: tile sizes as ordinal indices into their sorted
    choices (so TPE and GP can exploit that neighbouring sizes perform alike), the rest
    as categories."""

    ORDINAL = ("block_q", "block_kv", "block_kv_compute")

    def __init__(self, space: SearchSpace) -> None:
        self.space = space
        self.dims = {k: tuple(sorted(v)) if k in self.ORDINAL else tuple(v) for k, v in space.dimensions().items()}

    def is_ordinal(self, name: str) -> bool:
        return name in self.ORDINAL and len(self.dims[name]) > 1

    def distributions(self) -> dict[str, optuna.distributions.BaseDistribution]:
        out: dict[str, optuna.distributions.BaseDistribution] = {}
        for name, choices in self.dims.items():
            if self.is_ordinal(name):
                out[name] = optuna.distributions.IntDistribution(0, len(choices) - 1)
            else:
                out[name] = optuna.distributions.CategoricalDistribution(list(choices))
        return out

    def grid(self) -> dict[str, list[Any]]:
        return {k: list(range(len(v))) if self.is_ordinal(k) else list(v) for k, v in self.dims.items()}

    def decode(self, params: dict[str, Any]) -> TileConfig:
        values = {k: self.dims[k][int(v)] if self.is_ordinal(k) else v for k, v in params.items()}
        return self.space.config_from(values)

    def encode(self, config: TileConfig) -> dict[str, Any] | None:
        """Sampler params of ``config``, or None if it lies outside the dimensions."""
        params = self.space.params_of(config)
        out: dict[str, Any] = {}
        for name, choices in self.dims.items():
            if params[name] not in choices:
                return None
            out[name] = choices.index(params[name]) if self.is_ordinal(name) else params[name]
        return out


class _AskTellGridSampler(optuna.samplers.GridSampler):
    """GridSampler without its Study.stop() at the end of the grid: stop() only works
    inside optimize(), and the ask-and-tell loop ends by itself when every point is seen."""

    def after_trial(self, study: optuna.Study, trial: Any, state: Any, values: Any) -> None:
        return None


def make_sampler(name: str, space: SearchSpace, seed: int, startup_trials: int) -> optuna.samplers.BaseSampler:
    """TPE and GP read each trial's ``infeasible`` constraint (set by :func:`_tell`); ``tpe``
    is TPE wrapped in the local search of :mod:`autotune.strategy`, ``tpe-plain`` TPE alone."""
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


def run_search(
    space: SearchSpace,
    measurer: Measurer,
    options: SearchOptions | None = None,
    *,
    storage: Any = None,
    study_name: str | None = None,
    on_trial: Callable[[TrialResult, SearchResult], None] | None = None,
    on_invalid: Callable[[TileConfig, str], None] | None = None,
    coordinator: Coordinator | None = None,
    finalize: bool = True,
) -> SearchResult:
    """Search ``space`` with ``measurer``; ``on_trial`` sees every measured trial as it finishes.

    Alone, the search measures ``options.trials`` new configs. With a
    ``coordinator`` (workers sharing one job's study in ``storage``) the
    coordinator decides: the budget is the job's, configs measured by any worker
    are never measured again, and the search ends when the coordinator says so.
    ``finalize=False`` skips re-timing the top configs (a job's finalizer re-times
    the finalists of every worker, see :func:`pick_winner`).
    """
    o = options or SearchOptions()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    coding = ParamCoding(space)
    distributions = coding.distributions()
    study = optuna.create_study(
        direction="minimize",
        sampler=make_sampler(o.sampler, space, o.seed, o.startup_trials),
        storage=storage,
        study_name=study_name,
        load_if_exists=study_name is not None,
    )
    if o.warm_start and o.sampler not in ("grid", "brute"):
        warm = [heuristic_config(space.pattern, space.backend, space.workload.dtype), *o.seed_configs]
        for config in warm:
            encoded = coding.encode(config)
            if encoded is not None:
                study.enqueue_trial(encoded, skip_if_exists=True)

    result = SearchResult(trials=[], best=None)
    known: dict[str, tuple[float, bool]] = {}
    unmeasured = {config_key(c): c for c in space.enumerate()}
    best_ms: float | None = None
    if coordinator is not None:  # a resumed or shared job: what is measured stays measured
        for key, m in coordinator.measured().items():
            known[key] = _objective(m)
            unmeasured.pop(key, None)
            if m.status == "ok" and m.median_ms is not None and (best_ms is None or m.median_ms < best_ms):
                best_ms = m.median_ms
    deadline = time.monotonic() + o.timeout_s if o.timeout_s else None
    budget = min(o.trials, len(unmeasured))
    rng = np.random.default_rng(o.seed)
    stale = 0  # asks in a row that measured nothing
    while coordinator is not None or len(result.trials) < budget:
        if deadline is not None and time.monotonic() > deadline:
            break
        if coordinator is not None and (coordinator.stopping() or not unmeasured):
            break
        if stale >= MAX_STALE_ASKS:
            # The sampler keeps proposing known or invalid points: measure an
            # unmeasured valid one instead, so the budget is spent on new data.
            keys = sorted(unmeasured)
            pick = unmeasured[keys[int(rng.integers(len(keys)))]]
            encoded = coding.encode(pick)
            assert encoded is not None
            study.enqueue_trial(encoded)
            stale = 0
        trial = study.ask(distributions)
        config = coding.decode(trial.params)
        key = config_key(config)
        if key in known:
            value, feasible = known[key]
            result.repeated += 1
            stale += 1
            _tell(study, trial, value, feasible)
            continue
        reason = space.violation(config)
        if reason is not None:
            known[key] = (PENALTY_MS, False)
            result.invalid += 1
            stale += 1
            _tell(study, trial, PENALTY_MS, False)
            if coordinator is not None:
                coordinator.invalid(config, reason)
            if on_invalid is not None:
                on_invalid(config, reason)
            continue
        if coordinator is not None:
            verdict, elsewhere = coordinator.reserve(config, trial.number)
            if verdict in ("full", "stop"):
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                break
            if verdict == "busy":  # another worker measures it right now
                unmeasured.pop(key, None)
                stale += 1
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                continue
            if verdict == "known" and elsewhere is not None:
                known[key] = _objective(elsewhere)
                unmeasured.pop(key, None)
                result.repeated += 1
                stale += 1
                _tell(study, trial, *known[key])
                continue
        stale = 0
        unmeasured.pop(key, None)
        prune_above = best_ms * o.prune_factor if (o.prune and best_ms is not None) else None
        try:
            measurement = measurer.measure(config, prune_above)
        except BaseException:  # abandoned (or interrupted): the asked trial must not stay RUNNING in the study
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            raise
        value, feasible = known[key] = _objective(measurement)
        _tell(study, trial, value, feasible)
        record = TrialResult(trial.number, config, measurement)
        if coordinator is not None and not coordinator.complete(record):
            break
        result.trials.append(record)
        if measurement.status == "ok" and (best_ms is None or value < best_ms):
            best_ms = value
            result.best = record
        if on_trial is not None:
            on_trial(record, result)
    if finalize:
        pick_winner(result, measurer, o)
    return result


def _objective(m: Measurement) -> tuple[float, bool]:
    """(value, feasible) told to the sampler: pruned configs keep their partial median."""
    feasible = m.status in ("ok", "pruned") and m.median_ms is not None
    return (float(m.median_ms) if feasible and m.median_ms is not None else PENALTY_MS), feasible


def _tell(study: optuna.Study, trial: optuna.Trial, value: float, feasible: bool) -> None:
    trial.set_constraint("infeasible", 0.0 if feasible else 1.0)
    study.tell(trial, value)


def pick_winner(result: SearchResult, measurer: Measurer, o: SearchOptions) -> None:
    """Re-time the top ``o.top_k`` ok trials of ``result`` in interleaved rounds; the best
    median wins (``result.best``, with its runs in ``result.best_runs_ms``)."""
    ok = sorted((t for t in result.trials if t.measurement.status == "ok"), key=lambda t: t.measurement.median_ms or 0)
    finalists = ok[: max(1, o.top_k)]
    if not finalists:
        result.best = None
        return
    runs: dict[int, list[float]] = {t.number: [] for t in finalists}
    for _ in range(o.retime_rounds):
        for t in finalists:
            runs[t.number] += measurer.retime(t.config, o.retime_runs)
    scored = [(float(np.median(runs[t.number])) if runs[t.number] else float("inf"), t) for t in finalists]
    scored.sort(key=lambda pair: pair[0])
    result.finalists = [(t.config, tuple(runs[t.number])) for _, t in scored]
    result.best = scored[0][1]
    result.best_runs_ms = tuple(runs[result.best.number]) or result.best.measurement.runs_ms
