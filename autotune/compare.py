"""Deciding between measured candidates: interleaved rounds, and which differences are real.

Run times on a shared machine drift (other work, frequency, caches), so figures
that are compared are measured in *interleaved rounds*: every round visits every
candidate once, in a fresh random order, so a drift touches all of them alike
(:func:`interleaved`).

Two sets of runs differ only when both tests agree:
 - a two-sided Mann-Whitney U test rejects "same distribution" at ``ALPHA``
   (95% confidence; no normality assumed: run times are skewed by interference);
 - the medians differ by more than ``MIN_EFFECT`` (1%), a difference no user sees
   and no machine reproduces.
Otherwise they are *tied*. The *tied set* of a group is every candidate not
reliably slower than the one with the fastest median (:func:`tied_set`): a search
has succeeded once it measured any member, and a winner is picked among them by
what does not need a clock (less padding, fewer grid steps).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import TypeVar

import numpy as np
from scipy.stats import mannwhitneyu

ALPHA = 0.05
MIN_EFFECT = 0.01
MIN_RUNS = 5  # fewer runs cannot show a difference at ALPHA with this test: the sets are tied
DRIFT_ABOVE = 0.10  # rounds whose speeds span more than this (slowest over fastest, minus 1): say so

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclasses.dataclass(frozen=True)
class Difference:
    """How runs ``a`` compare with runs ``b``."""

    ratio: float  # median(a) / median(b)
    p_value: float  # two-sided Mann-Whitney U; 1.0 when either side has too few runs

    @property
    def real(self) -> bool:
        """Whether the difference is beyond the noise (significant and larger than MIN_EFFECT)."""
        return self.p_value < ALPHA and abs(self.ratio - 1.0) > MIN_EFFECT


def difference(a: Sequence[float], b: Sequence[float]) -> Difference:
    """Compare two sets of run times (ms), or of any positive figure measured repeatedly (``bench search``
    compares strategies' trials to tied over seeds this way)."""
    if len(a) == 0 or len(b) == 0:
        raise ValueError("difference: both sides need runs")
    ratio = float(np.median(a) / np.median(b)) if np.median(b) > 0 else float("inf")
    if min(len(a), len(b)) < MIN_RUNS or (np.ptp(a) == 0 and np.ptp(b) == 0 and np.median(a) == np.median(b)):
        return Difference(ratio, 1.0)
    return Difference(ratio, float(mannwhitneyu(a, b, alternative="two-sided").pvalue))


def slower(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether runs ``a`` are reliably slower than runs ``b``."""
    d = difference(a, b)
    return d.real and d.ratio > 1.0


def exceeds(a: Sequence[float], b: Sequence[float], factor: float) -> bool:
    """Whether runs ``a`` are reliably more than ``factor`` times runs ``b``: ``a``'s median above
    ``factor`` times ``b``'s, and the Mann-Whitney U test of :func:`difference` telling ``a`` from ``b``
    scaled by ``factor`` at ``ALPHA``. ``factor`` is the effect that matters (``bench search``'s 3% bound
    on regret), so MIN_EFFECT is not added on top of it."""
    d = difference(a, [factor * x for x in b])
    return d.p_value < ALPHA and d.ratio > 1.0


def tied_set(runs: Mapping[K, Sequence[float]]) -> list[K]:
    """The candidates not reliably slower than the one with the fastest median, fastest first."""
    usable = {k: v for k, v in runs.items() if len(v)}
    if not usable:
        return []
    order = sorted(usable, key=lambda k: float(np.median(usable[k])))
    best = usable[order[0]]
    return [k for k in order if not slower(usable[k], best)]


def round_factors(runs: Mapping[K, Sequence[float]]) -> list[float]:
    """How fast each :func:`interleaved` round ran against the others: for each round, the median over
    the candidates of the run taken in it over that candidate's median (1.0: a typical round; 1.2: one
    where everything ran 20% slower). Only candidates with a run in every round count; empty when fewer
    than two of them or fewer than two rounds.

    Interleaving keeps a drift of the machine's speed (another VM on the host, a clock change) out of
    the comparisons, since every round visits every candidate; it still widens each candidate's runs,
    so fewer differences pass the test and the tied set grows. This is how to see that it happened."""
    rounds = max((len(v) for v in runs.values()), default=0)
    full = [np.asarray(v, dtype=float) for v in runs.values() if len(v) == rounds]
    if rounds < 2 or len(full) < 2:
        return []
    relative = np.stack([v / np.median(v) for v in full])
    return [float(f) for f in np.median(relative, axis=0)]


def normalised_by_round(runs: Mapping[K, Sequence[float]]) -> dict[K, list[float]]:
    """``runs`` with each run divided by its round's factor (:func:`round_factors`): a drift of the
    machine's speed between rounds taken out of each candidate's spread, leaving the spread it had
    within the rounds. A candidate without a run in every round keeps its runs (no factor lines up with
    them), and so does every candidate when there are no factors."""
    factors = round_factors(runs)
    return {
        k: [r / f for r, f in zip(v, factors, strict=True)] if factors and len(v) == len(factors) else list(v)
        for k, v in runs.items()
    }


def drift(factors: Sequence[float]) -> float:
    """The span of :func:`round_factors`: the slowest round over the fastest, minus 1 (0.0 without)."""
    return max(factors) / min(factors) - 1.0 if factors and min(factors) > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class Speedup:
    """``numerator`` over ``denominator`` for runs taken side by side: the ratio of each pair of runs
    taken in the same round at the same position, summarised by its median and 10th-90th percentiles,
    so a speedup is stated with its own spread rather than as a ratio of two medians."""

    median: float
    p10: float
    p90: float

    def __str__(self) -> str:
        return f"{self.median:.2f}x (p10-p90 {self.p10:.2f}-{self.p90:.2f})"


def speedup(numerator: Sequence[float], denominator: Sequence[float]) -> Speedup | None:
    """The speedup of the ``denominator`` runs over the ``numerator`` runs, pair by pair (see
    :class:`Speedup`); None without pairs. Both must come from the same :func:`interleaved` rounds."""
    n = min(len(numerator), len(denominator))
    if n == 0 or min(denominator[:n]) <= 0:
        return None
    ratios = np.asarray(numerator[:n], dtype=float) / np.asarray(denominator[:n], dtype=float)
    p10, median, p90 = np.percentile(ratios, [10, 50, 90])
    return Speedup(float(median), float(p10), float(p90))


def interleaved(
    candidates: Iterable[K], visit: Callable[[K], Sequence[V]], rounds: int, seed: int = 0
) -> dict[K, list[V]]:
    """``rounds`` rounds; each visits every candidate once, in a fresh random order. ``visit(k)``
    returns the results of one visit (run times, or whole runs of a benchmark); the result
    holds every one of each candidate, in the order they were taken."""
    keys = list(dict.fromkeys(candidates))
    runs: dict[K, list[V]] = {k: [] for k in keys}
    rng = random.Random(seed)
    for _ in range(rounds):
        order = keys[:]
        rng.shuffle(order)
        for k in order:
            runs[k].extend(visit(k))
    return runs


def measuring_processes(processes: int, restart: Callable[[], None] | None) -> Iterator[int]:
    """Yield 0, 1, ... for each measuring process to time in: the current one first, then
    ``restart()`` before each fresh one, up to ``processes`` in all (one without ``restart``: a
    measurer that cannot start a fresh process). A fresh process that fails to start
    (RuntimeError, TimeoutError) ends the sequence: the caller keeps what it timed so far."""
    for p in range(max(1, processes) if restart is not None else 1):
        if p and restart is not None:
            try:
                restart()
            except (RuntimeError, TimeoutError):
                return
        yield p


def interleaved_over_processes(
    candidates: Iterable[K],
    visit: Callable[[K], Sequence[V]],
    rounds: int,
    processes: int,
    restart: Callable[[], None] | None,
    seed: int = 0,
) -> list[dict[K, list[V]]]:
    """:func:`interleaved` rounds in each of ``processes`` measuring processes
    (:func:`measuring_processes`): ``rounds`` in the current one, then as many in each fresh one.
    One list of runs per process.

    A config's speed moves a little from one measuring process to the next: on cpu-demo, eight
    fresh processes named three different configs the fastest, and 7 of their 48 verdicts on six
    configs 0-3% apart disagreed with the verdict on all eight pooled; of the verdicts on three
    processes pooled, 19 of 336 did (autotune/tables/README.md). Pooled runs decide what a re-run
    sees. Without ``restart`` every round is taken in the current one."""
    keys = list(dict.fromkeys(candidates))
    if restart is None:
        return [interleaved(keys, visit, rounds * max(1, processes), seed)]
    return [interleaved(keys, visit, rounds, seed + p) for p in measuring_processes(processes, restart)]


def pooled(per_process: Sequence[Mapping[K, Sequence[V]]]) -> dict[K, list[V]]:
    """The runs of each candidate over every process of :func:`interleaved_over_processes`."""
    out: dict[K, list[V]] = {}
    for runs in per_process:
        for k, v in runs.items():
            out.setdefault(k, []).extend(v)
    return out
