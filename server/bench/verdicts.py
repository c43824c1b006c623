"""The default strategy against the others of ``bench search``, row by row, by medians and beyond the noise.

A row is one (table, warm start, neighbours) of a replay's report: :func:`head_to_head`
sets the default's median trials to a config tied with the fastest against the best
other strategy's, tests the seeds' figures against every other strategy's (so a
difference of a trial or two in the medians of 20 seeds is not read as a lead), and
says whether the default's regret at 20 trials keeps to :data:`REGRET_BOUND`, and if
not, whether its answers miss it beyond the recorded runs' noise. Reports saved with
``--json`` are judged the same way as live ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

from autotune.compare import difference
from autotune.search import SearchOptions

REGRET_BOUND = 1.03  # the bound on the default's regret at 20 trials: at most 3% over the fastest


def head_to_head(rows: Sequence[dict[str, Any]], default: str | None = None) -> list[dict[str, Any]]:
    """For each (table, warm start, neighbours) of ``rows`` (report summaries) that has ``default`` (the
    search's default strategy unless named) and at least one other strategy that ran: the default's median
    trials to tied (and its median regret at 20 trials) against the best other strategy's (fewest median
    trials, then more seeds reaching, then the lower median regret at 20), the margin (other minus default:
    above 0 the default is ahead) and a verdict, ``leads``, ``level`` or ``trails``. The issue's must-show
    compares this way against every strategy run beside it; ``level`` at 1 trial means the warm start itself
    is tied, a race no strategy can lead.

    A median of 20 seeds moves by a trial or two with the draw, so the verdict by medians is also given
    beyond that noise (``noise_verdict``, from the rows' per-seed figures; None for rows without them): the
    default's trials against each other strategy's, compared as run times are
    (:func:`autotune.compare.difference`: Mann-Whitney U at 95% and medians over 1% apart; a seed that
    never reached counts as the most trials). ``trails`` when any other strategy is reliably ahead (named in
    ``ahead_beyond_noise``), ``leads`` when the default is reliably ahead of every one, ``level`` otherwise
    (``within_noise`` names the strategies it cannot be told from); ``p_value`` is the test's against the
    best other strategy. Both judge the default harshly: one reliably better strategy among many makes it
    trail, and it leads only when it is reliably ahead of all of them.

    ``regret_20_verdict`` (:func:`regret_verdict`) says whether the default's median regret at 20 trials keeps
    to REGRET_BOUND, and where it does not, whether the seeds' answers miss it beyond the recorded runs' noise."""
    default = default or SearchOptions().sampler
    groups: dict[tuple[str, bool, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["table"], r["warm_start"], r.get("neighbours", 0)), []).append(r)
    out = []
    for (table, warm, _n), group in groups.items():
        mine = [r for r in group if r["strategy"] == default and not r.get("error")]
        others = [r for r in group if r["strategy"] != default and not r.get("error")]
        if not mine or not others:
            continue
        # Rows read back from --json say null where most seeds never reached (JSON has no infinity).
        best = min(
            others,
            key=lambda r: (
                _or_inf(r["median_trials_to_tied"]),
                -int(r["reached"].split("/")[0]),
                _or_inf(r["median_regret"]["20"]),
            ),
        )
        ours, theirs = _or_inf(mine[0]["median_trials_to_tied"]), _or_inf(best["median_trials_to_tied"])
        margin = theirs - ours if math.isfinite(ours) or math.isfinite(theirs) else 0.0
        out.append(
            {
                "table": table,
                "warm_start": warm,
                "default": default,
                "trials": ours,
                "regret_20": mine[0]["median_regret"]["20"],
                "regret_20_verdict": regret_verdict(mine[0]),
                "best_other": best["strategy"],
                "best_other_trials": theirs,
                "margin": margin,
                "verdict": "leads" if margin > 0 else "level" if margin == 0 else "trails",
                **_beyond_noise(mine[0], best, others),
            }
        )
    return out


def regret_verdict(row: dict[str, Any], budget: int = 20) -> str | None:
    """Whether a report row's median regret at ``budget`` trials keeps to REGRET_BOUND: ``within``, ``over,
    within noise`` (no more than half of the seeds' answers run reliably slower than the bound times the
    fastest, so the median seed's miss is not told apart from the runs' noise) or ``over, beyond noise``;
    None where the budget was not reached, or the row predates the per-seed test."""
    median = row["median_regret"].get(str(budget))
    if median is None:
        return None
    if median <= REGRET_BOUND:
        return "within"
    beyond = row.get("over_bound_beyond_noise", {}).get(str(budget))
    if beyond is None:
        return None
    seeds = int(row["reached"].split("/")[1])
    return "over, beyond noise" if 2 * beyond > seeds else "over, within noise"


def per_seed(row: dict[str, Any]) -> list[float] | None:
    """A report row's trials to tied per seed (a seed that did not reach: inf), None for a row without them."""
    seeds = row.get("trials_to_tied")
    return None if seeds is None else [math.inf if t is None else float(t) for t in seeds]


def _beyond_noise(mine: dict[str, Any], best: dict[str, Any], others: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The noise-aware half of a :func:`head_to_head` verdict (see there)."""
    ours = per_seed(mine)
    theirs = {r["strategy"]: per_seed(r) for r in others}
    if ours is None or any(t is None for t in theirs.values()):
        return {"noise_verdict": None, "p_value": None, "ahead_beyond_noise": [], "within_noise": []}
    diffs = {name: difference(*_misses_last(ours, cast(list[float], t))) for name, t in theirs.items()}
    ahead = [n for n, d in diffs.items() if d.real and d.ratio > 1.0]
    level = [n for n, d in diffs.items() if not d.real]
    return {
        "noise_verdict": "trails" if ahead else "level" if level else "leads",
        "p_value": diffs[best["strategy"]].p_value,
        "ahead_beyond_noise": ahead,
        "within_noise": level,
    }


def _misses_last(a: list[float], b: list[float]) -> tuple[list[float], list[float]]:
    """``a`` and ``b`` with every seed that did not reach (inf) set to one trial more than any seed of either
    took: the same ranks for the test, and a finite ratio of medians (two rows that never reached tie)."""
    cap = max((t for t in (*a, *b) if math.isfinite(t)), default=0.0) + 1.0
    return [t if math.isfinite(t) else cap for t in a], [t if math.isfinite(t) else cap for t in b]


def print_head_to_head(rows: Sequence[dict[str, Any]], out: Any) -> None:
    """:func:`head_to_head` of ``rows`` as a rich table and a count on ``out`` (nothing when it has no rows)."""
    from rich.table import Table

    verdicts = head_to_head(rows)
    if not verdicts:
        return
    noise = all(v["noise_verdict"] is not None for v in verdicts)
    extra = ("p", "beyond noise") if noise else ()
    t = Table(
        "table", "warm start", "default", "trials", "regret@20", "best other", "its trials", "margin", "verdict", *extra
    )
    for v in verdicts:
        cells = []
        if noise:
            cells = [f"{v['p_value']:.2g}", v["noise_verdict"] + _named(v["ahead_beyond_noise"] or v["within_noise"])]
        t.add_row(
            v["table"],
            "on" if v["warm_start"] else "off",
            v["default"],
            _trials(v["trials"]),
            regret_cell(v["regret_20"]) + (f" ({v['regret_20_verdict'].removeprefix('over, ')})" if _over(v) else ""),
            v["best_other"],
            _trials(v["best_other_trials"]),
            f"{v['margin']:+g}",  # +inf: only the default reached a tied config
            v["verdict"],
            *cells,
        )
    out.print(t)
    out.print(
        f"the default {_count(verdicts, 'verdict')} "
        "(median trials to tied against the best other strategy run beside it)"
    )
    if noise:
        out.print(
            f"beyond the seeds' noise it {_count(verdicts, 'noise_verdict')} (its trials per seed against each other "
            "strategy's: Mann-Whitney U, 95%; trails: one is reliably ahead, named; level: the ones it cannot be "
            "told from, named; leads: reliably ahead of all)"
        )
    judged = [v["regret_20_verdict"] for v in verdicts if v["regret_20_verdict"] is not None]
    if judged:
        counts = {k: judged.count(k) for k in ("within", "over, within noise", "over, beyond noise")}
        out.print(
            f"its regret@20 is at most {REGRET_BOUND - 1:.0%} over the fastest on {counts['within']} of {len(judged)} "
            f"rows, over it within the runs' noise on {counts['over, within noise']} and beyond it on "
            f"{counts['over, beyond noise']} (beyond: over half the seeds' answers run reliably slower than "
            f"{REGRET_BOUND:g}x the fastest, Mann-Whitney U on their recorded runs, 95%)"
        )


def _over(verdict: dict[str, Any]) -> bool:
    return str(verdict.get("regret_20_verdict")).startswith("over")


def _named(names: Sequence[str], most: int = 3) -> str:
    """The strategies a noise verdict names, as a cell suffix: the first ``most`` and how many more."""
    if not names:
        return ""
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return f" ({', '.join(names[:most])}{more})"


def _count(verdicts: Sequence[dict[str, Any]], field: str) -> str:
    count = {k: sum(v[field] == k for v in verdicts) for k in ("leads", "level", "trails")}
    return (
        f"leads on {count['leads']} of {len(verdicts)} rows, is level on {count['level']} and trails on "
        f"{count['trails']}"
    )


def _trials(value: float) -> str:
    return f"{value:g}" if math.isfinite(value) else "not reached"


def regret_cell(value: float | None) -> str:
    """A regret cell: '-' where the run's budget did not reach it, 'none ok' where no config measured ran."""
    if value is None:
        return "-"
    return f"{value:.3f}" if math.isfinite(value) else "none ok"


def _or_inf(value: float | None) -> float:
    return math.inf if value is None else value
