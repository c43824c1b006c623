"""The search: an Optuna study over the search space, measured through a supervisor.

Per job one study (ask-and-tell, so invalid points are never measured):
 - samplers by name (:mod:`autotune.samplers`; ``surrogate`` by default);
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

import collections
import dataclasses
import math
import random
import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np
import optuna

from autotune.compare import (
    Speedup,
    interleaved,
    interleaved_over_processes,
    measuring_processes,
    pooled,
    speedup,
    tied_set,
)
from autotune.host_load import OtherLoad
from autotune.measure import ANCHORS, Measurement, RunStats
from autotune.samplers import PENALTY_MS, make_sampler
from autotune.space import ParamCoding, SearchSpace
from autotune.surrogate import Ridge
from kernel.config import TileConfig
from kernel.heuristic import heuristic_config

MAX_STALE_ASKS = 25


class Measurer(Protocol):
    def measure(self, config: TileConfig, prune_above_ms: float | None = None) -> Measurement: ...
    def retime(self, config: TileConfig, runs: int) -> list[float]: ...
    def anchor_runs(self, anchor: str, runs: int, config: TileConfig | None = None) -> list[float]: ...


@runtime_checkable
class Restartable(Protocol):
    """A measurer that can replace its measuring process by a fresh one
    (:class:`autotune.supervisor.Supervisor`): the winner's speedups are pooled over processes."""

    def restart(self) -> None: ...


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
    sampler: str = "surrogate"
    seed: int = 0
    timeout_s: float | None = None  # whole-search time budget
    top_k: int = 3
    retime_rounds: int = 5  # interleaved rounds of the finalists (the winner and its anchors: anchor_rounds)
    retime_runs: int = 2  # runs per visit: retime_rounds x retime_runs runs each (10: enough for the tests)
    # The winner and its anchors: anchor_rounds interleaved rounds in each of anchor_processes measuring
    # processes (the current one, then fresh ones, where the measurer can start them; otherwise all rounds
    # in one). A speedup moves from one process to the next by more than its rounds vary within one, so
    # the spread a user is shown pools the processes (README "Tuning").
    anchor_processes: int = 3
    anchor_rounds: int = 3
    # Finalists still tied after retime_rounds get this many more rounds before the tie is decided by work:
    # 10 runs each cannot tell apart configs 8% apart in 10% noise (cpu-demo, autotune/tables/README.md). 0: none.
    resolve_rounds: int = 10
    # ... spread over this many measuring processes (the search's, then fresh ones, where the measurer can
    # start them): a 1-2% difference one process shows can be gone in the next (autotune.compare).
    resolve_processes: int = 3
    prune: bool = True
    prune_factor: float = 2.0
    seed_configs: tuple[TileConfig, ...] = ()
    warm_start: bool = True
    # The family's model (autotune.surrogate.fit_prior on the database's trials of other workloads of the
    # family): where the ``surrogate`` sampler's model starts. Part of the warm start.
    prior: Ridge | None = None
    startup_trials: int = 8
    # Configs proposed ahead of the one being measured, handed to a measurer that can prepare them
    # (``prefetch``: compile while the device times the current one). 0: propose, then measure.
    lookahead: int = 0


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
    tied: list[TileConfig] = dataclasses.field(default_factory=list)  # finalists tied with the fastest
    anchors: dict[str, tuple[float, ...]] = dataclasses.field(default_factory=dict)  # timed beside the winner
    invalid: int = 0
    repeated: int = 0
    # Cores other programs kept busy while the winner and its anchors were timed (autotune.host_load).
    others_cores: float | None = None
    anchor_processes: int = 0  # measuring processes the winner and its anchors were timed in
    resolve_processes: int = 0  # measuring processes the tied finalists' extra rounds were taken in (0: none)

    @property
    def dense_ms(self) -> float | None:
        """Median of the library's dense attention, timed in the rounds of the winner."""
        return self.anchor_ms("dense")

    def anchor_ms(self, anchor: str) -> float | None:
        stats = RunStats.of(self.anchors.get(anchor, ()))
        return stats.median_ms if stats else None

    def speedup(self, anchor: str) -> Speedup | None:
        """The winner's speedup over ``anchor``, pair by pair over the rounds they were timed in."""
        return speedup(self.anchors.get(anchor, ()), self.best_runs_ms)

    def speedup_p10_p90(self) -> dict[str, list[float]]:
        """``{anchor: [p10, p90]}`` of :meth:`speedup` for each anchor timed: the spread a tuned config keeps."""
        return {name: [s.p10, s.p90] for name in ANCHORS if (s := self.speedup(name)) is not None}

    @property
    def best_stats(self) -> RunStats | None:
        """Statistics of the winner's re-timed runs."""
        return RunStats.of(self.best_runs_ms)

    @property
    def best_median_ms(self) -> float | None:
        stats = self.best_stats
        return stats.median_ms if stats else None

    @property
    def best_spread(self) -> float | None:
        stats = self.best_stats
        return stats.spread if stats else None

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.trials:
            out[t.measurement.status] = out.get(t.measurement.status, 0) + 1
        return out


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
    gate: Callable[[TileConfig], str | None] | None = None,
) -> SearchResult:
    """Search ``space`` with ``measurer``; ``on_trial`` sees every measured trial as it finishes.

    Alone, the search measures ``options.trials`` new configs. With a
    ``coordinator`` (workers sharing one job's study in ``storage``) the
    coordinator decides: the budget is the job's, configs measured by any worker
    are never measured again, and the search ends when the coordinator says so.
    ``finalize=False`` skips re-timing the top configs (a job's finalizer re-times
    the finalists of every worker, see :func:`pick_winner`). ``gate`` is asked after
    the space's own rules, for each new config, why it must not be measured (None: it
    may): a TPU worker's gate answers from the verdicts of compile workers, so a config
    the compiler is known to refuse is an invalid point, never a compile on the device.
    """
    options = options or SearchOptions()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    coding = ParamCoding(space)
    distributions = coding.distributions()
    study = optuna.create_study(
        direction="minimize",
        sampler=make_sampler(
            options.sampler, space, options.seed, options.startup_trials, options.prior if options.warm_start else None
        ),
        storage=storage,
        study_name=study_name,
        load_if_exists=study_name is not None,
    )
    if options.warm_start and options.sampler not in ("grid", "brute"):
        warm = [heuristic_config(space.pattern, space.backend, space.workload.dtype), *options.seed_configs]
        for config in warm:
            encoded = coding.encode(config)
            if encoded is not None:
                study.enqueue_trial(encoded, skip_if_exists=True)

    result = SearchResult(trials=[], best=None)
    known: dict[str, tuple[float, bool]] = {}
    unmeasured = {c.key: c for c in space.enumerate()}
    best_ms: float | None = None
    if coordinator is not None:  # a resumed or shared job: what is measured stays measured
        for key, m in coordinator.measured().items():
            known[key] = _objective(m)
            unmeasured.pop(key, None)
            if m.status == "ok" and m.median_ms is not None and (best_ms is None or m.median_ms < best_ms):
                best_ms = m.median_ms
    deadline = time.monotonic() + options.timeout_s if options.timeout_s else None
    budget = min(options.trials, len(unmeasured))
    rng = np.random.default_rng(options.seed)
    stale = 0  # asks in a row that measured nothing
    # Proposed and reserved, not yet measured: with ``options.lookahead`` > 0 the next configs are
    # proposed while the current one is measured, and a prefetching measurer prepares them.
    pending: collections.deque[tuple[optuna.Trial, TileConfig]] = collections.deque()
    # A measurer that can prepare a config before it is asked to measure it has ``prefetch(config)``.
    prefetch = getattr(measurer, "prefetch", None) if options.lookahead > 0 else None
    proposing = True

    def propose() -> tuple[optuna.Trial, TileConfig] | str:
        """One new config to measure, or why not: "skip" (ask again) or "stop" (propose no more)."""
        nonlocal stale
        if stale >= MAX_STALE_ASKS:
            # The sampler keeps proposing known or invalid points: measure an
            # unmeasured valid one instead, so the budget is spent on new data.
            keys = sorted(unmeasured)
            if not keys:
                return "stop"
            pick = unmeasured[keys[int(rng.integers(len(keys)))]]
            encoded = coding.encode(pick)
            assert encoded is not None
            study.enqueue_trial(encoded)
            stale = 0
        trial = study.ask(distributions)
        decoded = coding.try_decode(trial.params)
        if decoded is None:  # no config at all: infeasible, and nothing to record
            result.invalid += 1
            stale += 1
            _tell(study, trial, PENALTY_MS, False)
            return "skip"
        config = decoded
        key = config.key
        if key in known:
            value, feasible = known[key]
            result.repeated += 1
            stale += 1
            _tell(study, trial, value, feasible)
            return "skip"
        if any(c.key == key for _, c in pending):  # proposed ahead already: it will be measured
            result.repeated += 1
            stale += 1
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            return "skip"
        reason = space.violation(config)
        if reason is None and gate is not None:
            reason = gate(config)
        if reason is not None:
            known[key] = (PENALTY_MS, False)
            unmeasured.pop(key, None)
            result.invalid += 1
            stale += 1
            _tell(study, trial, PENALTY_MS, False)
            if coordinator is not None:
                coordinator.invalid(config, reason)
            if on_invalid is not None:
                on_invalid(config, reason)
            return "skip"
        if coordinator is not None:
            verdict, elsewhere = coordinator.reserve(config, trial.number)
            if verdict in ("full", "stop"):
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                return "stop"
            if verdict == "busy":  # another worker measures it right now
                unmeasured.pop(key, None)
                stale += 1
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                return "skip"
            if verdict == "known" and elsewhere is not None:
                known[key] = _objective(elsewhere)
                unmeasured.pop(key, None)
                result.repeated += 1
                stale += 1
                _tell(study, trial, *known[key])
                return "skip"
        stale = 0
        unmeasured.pop(key, None)
        return trial, config

    def enough() -> bool:
        """Whether to propose no more: the time, the coordinator, or the budget says so."""
        if deadline is not None and time.monotonic() > deadline:
            return True
        if coordinator is not None:
            return coordinator.stopping() or not unmeasured
        return len(result.trials) + len(pending) >= budget

    try:
        while True:
            while proposing and len(pending) <= options.lookahead:
                if enough():
                    proposing = False
                else:
                    proposed = propose()
                    if proposed == "stop":
                        proposing = False
                    elif not isinstance(proposed, str):
                        pending.append(proposed)
                        if prefetch is not None:
                            prefetch(proposed[1])
            if not pending or (coordinator is not None and coordinator.stopping()):
                break
            trial, config = pending.popleft()
            prune_above = best_ms * options.prune_factor if (options.prune and best_ms is not None) else None
            try:
                measurement = measurer.measure(config, prune_above)
            except BaseException:  # abandoned (or interrupted): the asked trial must not stay RUNNING in the study
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                raise
            value, feasible = known[config.key] = _objective(measurement)
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
    finally:
        for trial, _ in pending:  # proposed ahead and never measured: not RUNNING forever in the study
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
    if finalize:
        pick_winner(result, measurer, options, space)
    return result


def _objective(m: Measurement) -> tuple[float, bool]:
    """(value, feasible) told to the sampler: pruned configs keep their partial median."""
    feasible = m.status in ("ok", "pruned") and m.median_ms is not None
    return (float(m.median_ms) if feasible and m.median_ms is not None else PENALTY_MS), feasible


def _tell(study: optuna.Study, trial: optuna.Trial, value: float, feasible: bool) -> None:
    trial.set_constraint("infeasible", 0.0 if feasible else 1.0)
    study.tell(trial, value)


def pick_winner(result: SearchResult, measurer: Measurer, options: SearchOptions, space: SearchSpace) -> None:
    """Choose the winner of ``result`` by a statistical comparison, and time it beside its anchors.

    1. The top ``options.top_k`` ok trials (by their first median) are re-timed in
       interleaved rounds (:func:`autotune.compare.interleaved`).
    2. The finalists tied with the fastest (:func:`autotune.compare.tied_set`) get
       ``options.resolve_rounds`` more rounds, spread over ``options.resolve_processes``
       measuring processes (:func:`autotune.compare.interleaved_over_processes`: what one
       process alone calls a 1-2% difference, another may not), and are compared once
       more on all their runs; those still tied are ranked by less padding, then fewer
       grid steps, then median: a tie is decided by the work a config does, not by
       which one happened to run faster this time.
    3. The winner and its anchors (the library's dense attention, and the same
       backend's tiled dense at the winner's tiles) are timed in interleaved rounds:
       ``result.best_runs_ms`` and ``result.anchors``, so the speedup a user is shown
       comes from runs taken side by side. The rounds are split over
       ``options.anchor_processes`` measuring processes (:func:`anchor_rounds`), so its
       spread covers what separates one process from the next, which a re-run would
       see. ``result.others_cores`` says how busy the machine was meanwhile (a load
       skews a speedup over dense: autotune.host_load).
    """
    ok = sorted((t for t in result.trials if t.measurement.status == "ok"), key=lambda t: t.measurement.median_ms or 0)
    finalists = ok[: max(1, options.top_k)]
    if not finalists:
        result.best = None
        return
    by_number = {t.number: t for t in finalists}

    def retime(number: int) -> list[float]:
        return measurer.retime(by_number[number].config, options.retime_runs)

    runs = interleaved(by_number, retime, options.retime_rounds, options.seed)
    tied_numbers = tied_set(runs)
    if len(tied_numbers) > 1 and options.resolve_rounds > 0:
        # One more look, at the tied ones only, then one decision on all their runs.
        restart = measurer.restart if isinstance(measurer, Restartable) else None
        processes = max(1, options.resolve_processes) if restart is not None else 1
        each = math.ceil(options.resolve_rounds / processes)
        per_process = interleaved_over_processes(tied_numbers, retime, each, processes, restart, options.seed + 2)
        for n, extra in pooled(per_process).items():
            runs[n].extend(extra)
        result.resolve_processes = len(per_process)
        tied_numbers = tied_set({n: runs[n] for n in tied_numbers})
    tied = [by_number[n] for n in tied_numbers] or finalists

    def cost(t: TrialResult) -> tuple[float, int, float]:
        stats = RunStats.of(runs[t.number])
        steps = space.grid_steps(t.config)
        return (round(space.padding(t.config), 6), steps, stats.median_ms if stats else float("inf"))

    winner = min(tied, key=cost)
    result.best = winner
    result.tied = [t.config for t in tied]
    result.finalists = [(t.config, tuple(runs[t.number])) for t in finalists]
    with OtherLoad() as load:
        anchored, result.anchor_processes = anchor_rounds(winner.config, measurer, options)
    result.others_cores = load.cores
    result.best_runs_ms = tuple(anchored["winner"]) or tuple(runs[winner.number]) or winner.measurement.runs_ms
    result.anchors = {name: tuple(v) for name, v in anchored.items() if name != "winner" and v}


def anchor_rounds(config: TileConfig, measurer: Measurer, options: SearchOptions) -> tuple[dict[str, list[float]], int]:
    """``config`` ("winner") and its anchors ("dense", "tiled_dense") timed in
    ``anchor_processes x anchor_rounds`` interleaved rounds of ``retime_runs`` runs: ``anchor_rounds``
    in the measurer's current process, then as many in each fresh one it starts (a :class:`Restartable`
    measurer; any other times them all in one). Runs at the same index of two candidates were taken in
    the same round, as :func:`autotune.compare.speedup` pairs them: a round in which a candidate lost
    runs (its child crashed or hung) keeps as many of each as that one has. A candidate that returns no
    runs before it ever returned any is one the measurer cannot time (a recorded table without that
    anchor): it is left out, the others go on. A fresh process that fails to start ends the pooling
    with what was timed. Returns the runs by name (empty for one left out) and the processes used."""
    restart = measurer.restart if isinstance(measurer, Restartable) else None
    rounds = max(1, options.anchor_rounds) * (1 if restart is not None else max(1, options.anchor_processes))

    def visit(name: str) -> list[float]:
        if name == "winner":
            return measurer.retime(config, options.retime_runs)
        return measurer.anchor_runs(name, options.retime_runs, config)

    visiting = ["winner", *ANCHORS]
    kept: dict[str, list[float]] = {name: [] for name in visiting}
    order = random.Random(options.seed + 1)
    used = 0
    for _ in measuring_processes(options.anchor_processes, restart):
        used += 1
        for _ in range(rounds):
            runs = interleaved(list(visiting), visit, 1, order.randrange(2**32))
            for name in [n for n in visiting if not runs[n] and not kept[n]]:
                visiting.remove(name)  # never timed yet: one the measurer cannot time (a table without it)
                del runs[name]
            if "winner" not in visiting:
                return {name: [] for name in kept}, used
            whole = min(len(v) for v in runs.values())
            for name, v in runs.items():
                kept[name].extend(v[:whole])
    return kept, used
