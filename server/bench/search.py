"""``tiletune bench search``: search strategies replayed on recorded exhaustive tables, side by side.

``--record`` measures a table (:func:`autotune.replay.record_table`). ``--replay``
runs every strategy with several seeds on each table and scores the sequence of
configs each one measured:

- *trials to tied*: how many measured trials until the first config of the
  table's tied set (the configs statistically tied with the fastest, from the
  recorded runs: :meth:`RecordedTable.tied_with_best`). Reaching the one config
  that happened to record fastest is luck when a dozen others are within its noise;
- *regret at N*: the true (recorded) median of the answer after N measured trials
  (the fastest config measured so far) over the fastest of the table: 1.0 means
  no regret, at budgets 10, 20 and 40. A regret over :data:`REGRET_BOUND` can
  sit inside the runs' own noise (on a table whose configs' runs spread 30-40%,
  the next-fastest config may read 1.12x and still be tied with the fastest),
  so each seed's answer is also tested against the bound: does it run reliably
  slower than 1.03 times the fastest (:func:`autotune.compare.exceeds`)?

Strategies: tiletune's samplers (:data:`autotune.samplers.SAMPLERS`, run through
the search itself on the ``replay`` backend) and, with the ``peers`` extra,
Kernel Tuner's strategies (``kt:<name>``) in its own simulation mode on a cache
converted from the same table. The warm start is a switch every strategy gets
alike: with it, the kernel's heuristic config is the first one measured (tiletune
enqueues it; for a peer it is prepended to its sequence); without it, ``random``
is plain random.

Kernel Tuner's figures can depend on the order each parameter's values are listed
in (:data:`PEER_ORDERS`): it numbers the configs of the space by that listing, and
``diff_evo`` measures its first population in an order set by those numbers, not
by its draw. On dense-band-f32 without the warm start (20 seeds) its median trials
to tied are 2 with the values listed ascending, 39.5 with each list reversed (a
mirror image of the same space, which its mutation and crossover treat alike) and
19 shuffled: the ascending listing happens to number tied configs where that
order reaches them first. ``peer_order`` shows how much of a peer's figure is its
listing; the default, ``listed``, is the ascending order a user would write.
``shuffled`` also breaks the order of the tile sizes that neighbourhood-based
strategies walk, so ``reversed`` is the fairer second look.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import random
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from autotune.compare import DRIFT_ABOVE, drift, exceeds
from autotune.replay import RecordedTable, ReplayMeasurer
from autotune.samplers import SAMPLERS
from autotune.search import SearchOptions, run_search
from autotune.surrogate import Ridge, fit_prior
from kernel.config import TileConfig
from kernel.heuristic import heuristic_config
from kernel.workload import Workload
from server.bench.verdicts import REGRET_BOUND, per_seed, print_head_to_head, regret_cell

BUDGETS = (10, 20, 40)
# How each parameter's values are listed to Kernel Tuner: ascending sizes and categories in the space's
# order, each list reversed, or each list in an order drawn from the run's seed.
PEER_ORDERS = ("listed", "reversed", "shuffled")
# Which runs the tied test reads: as recorded (every shipped figure), or each divided by its round's factor
# (RecordedTable.tied_with_best), for tables whose rounds ran at different speeds.
TIED_RULES = ("recorded", "normalised")
DATABASE_TRIALS = 40  # trials a tune leaves in the database: the default budget of ``tiletune tune``
PEER_PREFIX = "kt:"
# Kernel Tuner's strategies that run in simulation mode on a discrete space, and that "kt:all" means.
PEER_STRATEGIES = (
    "random_sample",
    "bayes_opt",
    "genetic_algorithm",
    "greedy_ils",
    "greedy_mls",
    "mls",
    "simulated_annealing",
    "diff_evo",
    "pso",
    "firefly_algorithm",
    "dual_annealing",
    "basinhopping",
)


def strategies(names: Sequence[str]) -> list[str]:
    """The strategies named (``kt:all`` expands to every peer strategy); ValueError naming an unknown one."""
    out: list[str] = []
    for name in names:
        if name == f"{PEER_PREFIX}all":
            out += [PEER_PREFIX + s for s in PEER_STRATEGIES]
        elif name in SAMPLERS or (name.startswith(PEER_PREFIX) and name[len(PEER_PREFIX) :] in PEER_STRATEGIES):
            out.append(name)
        else:
            known = [*SAMPLERS, *(PEER_PREFIX + s for s in PEER_STRATEGIES), f"{PEER_PREFIX}all"]
            raise ValueError(f"--sampler: unknown strategy {name!r}; choose from {', '.join(known)}")
    if any(s.startswith(PEER_PREFIX) for s in out):
        try:
            import kernel_tuner  # noqa: F401
        except ImportError:
            raise ValueError("kt:* strategies need Kernel Tuner: pip install 'tiletune[peers]'") from None
    return list(dict.fromkeys(out))


def replay_versions() -> dict[str, str | None]:
    """Versions of the packages a replay's figures depend on (None: not installed): Optuna (tiletune's
    samplers), numpy, scipy (Kernel Tuner's dual_annealing and basinhopping are scipy's, its Latin hypercube
    too) and Kernel Tuner. The same seeds on the same tables can give a peer other figures under other
    versions: Kernel Tuner's dual_annealing took 15.5 median trials on temporal-suffix-bf16 without the warm
    start in one environment and 17.5 in another, at the same commit of this code."""
    from importlib import metadata

    out: dict[str, str | None] = {}
    for dist in ("optuna", "numpy", "scipy", "kernel_tuner"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def measured_sequence(
    table: RecordedTable,
    strategy: str,
    seed: int,
    budget: int,
    warm_start: bool,
    neighbours: Sequence[TileConfig] = (),
    prior: Ridge | None = None,
    peer_order: str = "listed",
) -> list[str]:
    """The keys of the configs ``strategy`` measures on ``table``, in order, without repeats, at most ``budget``.
    With ``warm_start``, the heuristic comes first, then ``neighbours`` (the tuned configs of nearby workloads
    a database would offer, :func:`server.worker.tune.warm_start_configs`), for every strategy alike, and
    ``prior`` (the family's model, :func:`family_prior`) steers the samplers that use one (``surrogate``);
    ``peer_order`` (one of :data:`PEER_ORDERS`) is how a peer sees each parameter's values listed."""
    seeds = tuple(neighbours) if warm_start else ()
    if strategy.startswith(PEER_PREFIX):
        keys = _peer_sequence(table, strategy[len(PEER_PREFIX) :], seed, budget, peer_order)
        if warm_start:
            keys = [heuristic_key(table), *(c.key for c in seeds), *keys]
        return list(dict.fromkeys(k for k in keys if k is not None))[:budget]
    measurer = ReplayMeasurer(table)
    options = SearchOptions(
        trials=budget,
        sampler=strategy,
        seed=seed,
        prune=False,
        warm_start=warm_start,
        seed_configs=seeds,
        prior=prior,
    )
    run_search(table.space(), measurer, options, finalize=False)
    return list(dict.fromkeys(measurer.measured))[:budget]


def heuristic_key(table: RecordedTable) -> str | None:
    """The table key of the kernel's heuristic config (None when it lies outside the table's space)."""
    wl = table.workload
    key = heuristic_config(wl.pattern, table.backend, wl.dtype).key
    return key if key in table.entries else None


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun`` as the subject of a sentence: "1 config is", "9 other configs are"."""
    return f"{n} {noun} is" if n == 1 else f"{n} {noun}s are"


def recorded_summary(table: RecordedTable) -> str:
    """What `bench search --record` says of a table it saved: its fastest config and how many others are
    tied with it (the tied set counts the fastest itself, so a set of one is "no other")."""
    config, best = table.best
    others = len(table.tied_with_best() - {config.key})
    tied = "no other config is" if others == 0 else counted(others, "other config")
    return f"best {config.describe()} {best.median_ms:.3f} ms; {tied} tied with it"


def drift_note(table: RecordedTable) -> str | None:
    """A sentence saying the machine's speed moved while ``table`` was timed, when its rounds span more
    than :data:`autotune.compare.DRIFT_ABOVE` (:meth:`RecordedTable.round_factors`); None otherwise.

    The comparisons stay fair (every round timed every config), but each config's runs are wider, so the
    tied set is larger and the table tells fewer configs apart: a search reaches "tied" sooner on it."""
    factors = table.round_factors()
    span = drift(factors)
    if span <= DRIFT_ABOVE:
        return None
    rounds = " ".join(f"{f:.2f}" for f in factors)
    return (
        f"the machine's speed moved while this table was timed: its rounds ran {span:.0%} apart (each round's "
        f"median run over the config's median, round by round: {rounds}). Every round timed every config, so "
        f"the comparisons stay fair, but the runs are wider and {counted(len(table.tied_with_best()), 'config')} tied "
        "with the fastest; recorded while the machine holds steady, it would tell more configs apart"
    )


@dataclasses.dataclass
class Scores:
    """One strategy on one table, one run per seed."""

    table: str
    strategy: str
    warm_start: bool
    size: int
    tied: int  # size of the table's tied set
    trials_to_tied: list[float]  # per seed; inf when not reached within the budget
    regret: dict[int, list[float]]  # budget -> per seed, for the BUDGETS the run's budget covers
    # budget -> per seed: whether the answer runs reliably slower than REGRET_BOUND x the fastest (regret_beyond)
    over_bound: dict[int, list[bool]] = dataclasses.field(default_factory=dict)
    neighbours: int = 0  # tuned neighbours' configs measured after the heuristic
    prior: bool = False  # whether the family's model steered the strategy
    peer_order: str | None = None  # a peer's listing of each parameter's values (PEER_ORDERS); None: not a peer
    tied_rule: str = "recorded"  # which runs the tied set was taken from (TIED_RULES)
    error: str | None = None  # why a peer failed on this table (its figures are then absent), None: it ran

    def summary(self) -> dict[str, Any]:
        """One report row: what ran where, then its figures, or the peer's error instead of them."""
        row: dict[str, Any] = {
            "table": self.table,
            "strategy": self.strategy,
            "warm_start": self.warm_start,
            "neighbours": self.neighbours,
            "family_model": self.prior,
            "peer_order": self.peer_order,
            "table_size": self.size,
            "tied_set": self.tied,
            "tied_rule": self.tied_rule,
        }
        if self.error is not None:
            return {**row, "error": self.error}
        reached = [t for t in self.trials_to_tied if math.isfinite(t)]
        return {
            **row,
            "median_trials_to_tied": float(np.median(self.trials_to_tied)),
            "reached": f"{len(reached)}/{len(self.trials_to_tied)}",
            # Per seed (null: not reached), so whether two strategies' medians differ beyond the seeds' own
            # spread can be tested from the report (head_to_head), not only read off two medians.
            "trials_to_tied": [t if math.isfinite(t) else None for t in self.trials_to_tied],
            # null at a budget the run did not reach (--budget below it on a larger table): not measured
            "median_regret": {str(b): float(np.median(v)) if (v := self.regret.get(b)) else None for b in BUDGETS},
            "max_regret": {str(b): float(np.max(v)) if (v := self.regret.get(b)) else None for b in BUDGETS},
            # How many seeds' answers miss REGRET_BOUND beyond the runs' noise (null: budget not reached).
            "over_bound_beyond_noise": {str(b): sum(o) if (o := self.over_bound.get(b)) else None for b in BUDGETS},
        }


def answers(table: RecordedTable, keys: Sequence[str]) -> dict[int, str | None]:
    """The answer of one measured sequence after each of BUDGETS trials: the key of the config with the
    fastest recorded median among them (None when none of them ran)."""
    out: dict[int, str | None] = {}
    for b in BUDGETS:
        ok = [k for k in keys[:b] if (m := table.entries[k][1]).status == "ok" and m.median_ms is not None]
        out[b] = min(ok, key=lambda k: table.entries[k][1].median_ms or math.inf) if ok else None
    return out


def score(
    table: RecordedTable, keys: Sequence[str], tied: set[str], answered: dict[int, str | None] | None = None
) -> tuple[float, dict[int, float]]:
    """(trials to the first tied config, regret at each of BUDGETS) of one measured sequence; ``answered``:
    its :func:`answers`, when the caller has them already."""
    best = table.best[1].median_ms or math.inf
    hit = next((i + 1 for i, k in enumerate(keys) if k in tied), math.inf)
    regret = {
        b: (table.entries[k][1].median_ms or math.inf) / best if k is not None else math.inf
        for b, k in (answered or answers(table, keys)).items()
    }
    return float(hit), regret


def regret_beyond(table: RecordedTable, key: str | None, bound: float = REGRET_BOUND) -> bool:
    """Whether the answer ``key`` runs reliably slower than ``bound`` times the table's fastest config, from
    their recorded runs (:func:`autotune.compare.exceeds`): a regret over ``bound`` that is not is within the
    runs' noise. No answer (no config measured in the budget ran) misses by any measure: True; an answer
    of a table without runs cannot be told apart from the fastest: False."""
    if key is None:
        return True
    best_runs, runs = table.best[1].runs_ms, table.entries[key][1].runs_ms
    return bool(best_runs and runs) and exceeds(runs, best_runs, bound)


def _kin(table: RecordedTable, other: RecordedTable) -> bool:
    """Whether a database holding ``other``'s tunes would learn from them for ``table``: another table of
    its family, recorded on the same version of the backend's kernel."""
    mine, theirs = table.workload, other.workload
    return other is not table and (theirs.family, theirs.kernel_version) == (mine.family, mine.kernel_version)


def neighbour_bests(table: RecordedTable, others: Sequence[RecordedTable]) -> list[TileConfig]:
    """The fastest config of each of ``others`` of ``table``'s family and kernel version that ``table`` holds:
    what a database holding them as tuned workloads offers as warm starts (one outside this table's space is
    left out)."""
    bests = [o.best[0] for o in others if _kin(table, o)]
    return list({c.key: c for c in bests if c.key in table.entries}.values())


def family_prior(table: RecordedTable, others: Sequence[RecordedTable]) -> Ridge | None:
    """The family's model a database holding tunes of ``others`` would give ``table``: :func:`fit_prior` on
    the ok trials a default search of :data:`DATABASE_TRIALS` trials (seed 0, no prior) measures on each
    other table of ``table``'s family and kernel version, as :func:`server.worker.tune.family_prior` fits it
    on a database's trials. Not the whole of those tables: a tune leaves its trials in the database, not an
    exhaustive table."""
    trials: list[tuple[Workload, TileConfig, float]] = []
    for other in others:
        if not _kin(table, other):
            continue
        options = SearchOptions(trials=DATABASE_TRIALS, seed=0, prune=False)
        result = run_search(other.space(), ReplayMeasurer(other), options, finalize=False)
        trials += [
            (other.workload, t.config, t.measurement.median_ms)
            for t in result.trials
            if t.measurement.status == "ok" and t.measurement.median_ms is not None
        ]
    return fit_prior(trials, table.backend)


def replay(
    table: RecordedTable,
    name: str,
    strategy: str,
    seeds: int,
    budget: int | None = None,
    warm_start: bool = True,
    neighbours: Sequence[TileConfig] = (),
    prior: Ridge | None = None,
    peer_order: str = "listed",
    tied_rule: str = "recorded",
) -> Scores:
    """Run ``strategy`` with seeds 0..``seeds``-1 on ``table``, each measuring at most ``budget`` configs
    (default: the largest of BUDGETS, capped by the table); ``neighbours`` join the warm start, and ``prior``
    (the family's model) with it; ``peer_order`` is how a peer sees the values listed (:data:`PEER_ORDERS`);
    ``tied_rule`` which runs the tied set is taken from (:data:`TIED_RULES`)."""
    # A bad argument is the caller's error, not a peer's failure on this table.
    check_choice("peer order", peer_order, PEER_ORDERS)
    check_choice("tied rule", tied_rule, TIED_RULES)
    budget = min(budget or max(BUDGETS), len(table.entries))
    # The regret at N trials is only known for N within the budget, or when the budget measured the whole table.
    covered = [b for b in BUDGETS if b <= budget or budget == len(table.entries)]
    tied = table.tied_with_best(normalised=tied_rule == "normalised")
    scores = Scores(name, strategy, warm_start, len(table.entries), len(tied), [], {b: [] for b in covered})
    scores.over_bound = {b: [] for b in covered}  # as the regret: the BUDGETS the run's budget covers
    beyond: dict[str | None, bool] = {}  # answer -> regret_beyond: seeds often end on the same config
    scores.tied_rule = tied_rule
    scores.neighbours = len(neighbours) if warm_start else 0
    scores.prior = warm_start and prior is not None and strategy == "surrogate"
    scores.peer_order = peer_order if strategy.startswith(PEER_PREFIX) else None
    for seed in range(seeds):
        try:
            sequence = measured_sequence(table, strategy, seed, budget, warm_start, neighbours, prior, peer_order)
        except Exception as exc:  # a peer's own bug on one table must not end a long comparison; ours must
            if not strategy.startswith(PEER_PREFIX):
                raise
            scores.error = f"seed {seed}: {type(exc).__name__}: {exc}"
            scores.trials_to_tied.clear()
            scores.regret = {b: [] for b in covered}
            scores.over_bound = {b: [] for b in covered}
            break
        answered = answers(table, sequence)
        hit, regret = score(table, sequence, tied, answered)
        scores.trials_to_tied.append(hit)
        for b in covered:
            scores.regret[b].append(regret[b])
            if answered[b] not in beyond:
                beyond[answered[b]] = regret_beyond(table, answered[b])
            scores.over_bound[b].append(beyond[answered[b]])
    return scores


def check_choice(what: str, value: str, choices: Sequence[str]) -> None:
    """ValueError naming ``choices`` when ``value`` (a ``what``: "peer order", "tied rule") is not one of them."""
    if value not in choices:
        raise ValueError(f"{what} must be one of {', '.join(choices)}, got {value!r}")


def _peer_sequence(
    table: RecordedTable, strategy: str, seed: int, budget: int, order: str = "listed"
) -> list[str | None]:
    """Kernel Tuner's ``strategy`` in simulation mode on a cache converted from ``table``, each parameter's
    values listed in ``order`` (:data:`PEER_ORDERS`): the table keys of the configs it evaluated, in order
    (repeats included; failed configs are results too)."""
    import kernel_tuner

    space = table.space()
    dims = space.dimensions()
    if order == "reversed":
        dims = {n: tuple(reversed(v)) for n, v in dims.items()}
    elif order == "shuffled":
        draw = np.random.default_rng([seed, len(table.entries)])
        dims = {n: tuple(v[i] for i in draw.permutation(len(v))) for n, v in dims.items()}
    else:
        check_choice("peer order", order, PEER_ORDERS)
    names = list(dims)
    by_values: dict[tuple[Any, ...], str] = {}
    cache: dict[str, dict[str, Any]] = {}
    for key, (config, m) in table.entries.items():
        params = space.params_of(config)
        values = tuple(params[n] for n in names)
        by_values[values] = key
        entry: dict[str, Any] = {n: params[n] for n in names}
        if m.status == "ok" and m.median_ms is not None:
            entry.update(time=m.median_ms, times=list(m.runs_ms))
        else:
            entry["time"] = "RuntimeFailedConfig"
        cache[",".join(str(v) for v in values)] = entry
    document = {
        "device_name": table.device_kind,
        "kernel_name": "tiletune",
        "problem_size": [table.workload.pattern.seq_len],
        "tune_params_keys": names,
        "tune_params": {n: list(v) for n, v in dims.items()},
        "objective": "time",
        "cache": cache,
    }
    with tempfile.TemporaryDirectory(prefix="tiletune-kt-") as tmp:
        path = Path(tmp) / "cache.json"
        path.write_text(json.dumps(document))
        random.seed(seed)
        np.random.seed(seed)
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(io.StringIO()),
            _seeded_latin_hypercube(seed),
            _whole_space_latin_hypercube(),
        ):
            warnings.simplefilter("ignore")
            results, _env = kernel_tuner.tune_cache(
                str(path), strategy=strategy, strategy_options={"max_fevals": budget}, quiet=True, verbose=False
            )
    return [by_values.get(tuple(r[n] for n in names)) for r in results]


@contextlib.contextmanager
def _seeded_latin_hypercube(seed: int) -> Iterator[None]:
    """Kernel Tuner draws its Latin hypercube samples (``diff_evo``'s and ``bayes_opt``'s first population)
    from scipy's ``LatinHypercube`` without a seed, i.e. from fresh OS entropy, so seeding ``random`` and
    ``numpy`` does not fix them and a peer's run could not be repeated. Inside this block every
    ``LatinHypercube`` made without an ``rng`` draws from one generator seeded with ``seed``."""
    import kernel_tuner.strategies.bayes_opt as bayes_opt
    import scipy.stats.qmc as qmc

    original = qmc.LatinHypercube
    rng = np.random.default_rng(seed)

    class Seeded(original):  # type: ignore[misc, valid-type]
        def __init__(self, d: int, **kwargs: Any) -> None:
            if kwargs.get("rng") is None and kwargs.get("seed") is None:
                kwargs.pop("seed", None)
                kwargs["rng"] = rng
            super().__init__(d, **kwargs)

    qmc.LatinHypercube = Seeded
    bayes_opt.LatinHypercube = Seeded
    try:
        yield
    finally:
        qmc.LatinHypercube = original
        bayes_opt.LatinHypercube = original


@contextlib.contextmanager
def _whole_space_latin_hypercube() -> Iterator[None]:
    """Kernel Tuner 1.5.0 asks for ``np.shuffle`` (no such function) when a Latin hypercube sample is as large
    as the whole space, so ``diff_evo`` (population 16 x the tunable parameters) fails on a space of exactly
    that many configs: spatial-w3-f32 has 80 configs and 5 tunable parameters. Its authors fixed it after that
    release (KernelTuner/kernel_tuner#400: ``np.random.permutation(size).tolist()``); inside this block that
    one case is answered as the fix answers it, from ``numpy``'s global generator, which :func:`_peer_sequence`
    seeds. Every other sample is Kernel Tuner's own."""
    from kernel_tuner.searchspace import Searchspace

    original = Searchspace.get_LHS_sample_indices

    def get_lhs_sample_indices(self: Any, num_samples: int) -> list[int]:
        if num_samples == self.size:
            return [int(i) for i in np.random.permutation(self.size)]
        return cast(list[int], original(self, num_samples))

    Searchspace.get_LHS_sample_indices = get_lhs_sample_indices
    try:
        yield
    finally:
        Searchspace.get_LHS_sample_indices = original


def _strategy(row: dict[str, Any]) -> str:
    """The strategy cell of a report row: a peer listed in another order than ascending says so."""
    order = row.get("peer_order")
    return f"{row['strategy']} ({order})" if order and order != "listed" else row["strategy"]


def _start(row: dict[str, Any]) -> str:
    """The warm-start cell of a report row: off, on, or on with the neighbours it measured and the family's model."""
    if not row["warm_start"]:
        return "off"
    start = f"on + {row['neighbours']} neighbour(s)" if row.get("neighbours") else "on"
    return start + " + family model" if row.get("family_model") else start


def print_search_report(rows: list[dict[str, Any]], out: Any) -> None:
    """The replay summaries as a rich table on ``out`` (a rich Console)."""
    from rich.markup import escape
    from rich.table import Table

    t = Table(
        "table",
        "size",
        "tied",
        "strategy",
        "warm start",
        "median trials to tied",
        "reached",
        *[f"regret@{b}" for b in BUDGETS],
    )
    for r in rows:
        if r.get("error"):
            cells = [f"failed: {escape(r['error'])}", "-", *["-" for _ in BUDGETS]]  # an error is text, not markup
            t.add_row(r["table"], str(r["table_size"]), str(r["tied_set"]), _strategy(r), _start(r), *cells)
            continue
        trials = r["median_trials_to_tied"]
        t.add_row(
            r["table"],
            str(r["table_size"]),
            str(r["tied_set"]),
            _strategy(r),
            _start(r),
            _trials_cell(trials, per_seed(r)),
            r["reached"],
            *[regret_cell(r["median_regret"][str(b)]) for b in BUDGETS],
        )
    out.print(t)
    out.print(
        "tied: configs statistically tied with the table's fastest (Mann-Whitney, 95%, over 1%); trials to tied: "
        "median over seeds of measured trials until one of them (in brackets the seeds' 25th-75th percentiles, "
        "'never': past the budget); regret@N: median over seeds of the recorded "
        "median of the best config measured in N trials over the table's fastest (1.000 = no regret; '-': N is "
        "past the budget)"
    )
    if any(r.get("tied_rule") == "normalised" for r in rows):
        out.print("tied sets taken from each run divided by its round's factor (--tied normalised)")
    versions = rows[0].get("versions") if rows else None
    if versions:
        out.print("replayed with " + ", ".join(f"{k} {v}" for k, v in versions.items() if v is not None))
    print_head_to_head(rows, out)


def _trials_cell(median: float, per_seed: list[float] | None) -> str:
    """A report row's median trials to tied with its seeds' interquartile range (sample values, not
    interpolated, so a quartile past the budget reads 'never' rather than an interpolated infinity)."""
    text = f"{median:.1f}" if math.isfinite(median) else "not reached"
    if not per_seed:
        return text
    quartiles = (float(np.percentile(per_seed, q, method="inverted_cdf")) for q in (25, 75))
    return f"{text} ({'-'.join(f'{q:g}' if math.isfinite(q) else 'never' for q in quartiles)})"
