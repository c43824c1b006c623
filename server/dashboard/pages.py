"""HTML pages of tuning results: the ``/ui`` dashboard's pages and the ``tiletune report`` file.

Jinja2 templates in ``server/dashboard/templates`` with autoescaping on (workload specs,
device kinds and error texts are data, never markup). The workload page and
the report share one body (``_workload_body.html``); only where the figures
come from differs (URLs served on request, or PNG files beside the report).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

import jinja2

from autotune.compare import Speedup
from kernel.config import TileConfig
from kernel.presets import PRESETS
from kernel.workload import Workload
from server.dashboard.catalog import CAPTIONS, NAMES
from server.store.records import TrialPoint, TuningRecord

ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("server.dashboard", "templates"),
    autoescape=jinja2.select_autoescape(["html"], default_for_string=True),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _when(value: dt.datetime | None) -> str:
    if value is None:
        return "-"
    if value.tzinfo is None:  # SQLite returns naive datetimes; they are stored in UTC
        value = value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


ENV.filters.update(ms=_ms, when=_when)


def render(template: str, **context: Any) -> str:
    return ENV.get_template(template).render(**context)


def describe_config(config: dict[str, Any]) -> str:
    try:
        return TileConfig.from_dict(config).describe()
    except (TypeError, ValueError):  # stored by another kernel version
        return ", ".join(f"{k}={v}" for k, v in sorted(config.items()))


def preset_of(workload: Workload) -> str | None:
    """The preset whose pattern (at this head count) the workload uses, if any."""
    pattern = workload.pattern
    for preset in PRESETS.values():
        if preset.layout == pattern.layout and preset.pattern(pattern.num_heads) == pattern:
            return preset.name
    return None


def workload_summary(record: TuningRecord) -> dict[str, Any]:
    wl = record.workload
    tuned = record.tuned
    counts = Counter(t.status for t in record.trials)
    return {
        "key": record.key,
        "device_kind": wl.device_kind,
        "backend": wl.backend,
        "dtype": wl.dtype,
        "batch": wl.batch,
        "head_dim": wl.head_dim,
        "heads": wl.heads,
        "seq_len": wl.pattern.seq_len,
        "pattern": wl.pattern.describe(),
        "preset": preset_of(wl),
        "trial_count": len(record.trials),
        "status_counts": dict(sorted(counts.items(), key=lambda kv: (kv[0] != "ok", kv[0]))),
        "tuned": None if tuned is None else {"describe": describe_config(tuned.config), **tuned_timing(tuned)},
    }


def speedup_text(ratio: float | None, kept: Any) -> str:
    """A stored speedup as the CLI prints it: the ratio of the medians with the p10-p90 of the pairs
    of runs taken side by side when the tuned config kept it ("14.11x (p10-p90 13.66-14.78)"), the bare
    ratio for a config stored without it, "-" when that anchor was not timed."""
    if ratio is None:
        return "-"
    if kept is not None and len(kept) == 2:
        return str(Speedup(ratio, float(kept[0]), float(kept[1])))
    return f"{ratio:.2f}x"


def tuned_timing(tuned: Any) -> dict[str, Any]:
    """The timing fields of a tuned config (a stored row or a :class:`TunedPoint`) that the pages show,
    the speedups over both named anchors with their kept spread."""
    kept = tuned.speedup_p10_p90 or {}
    return {
        "median_ms": tuned.median_ms,
        "p10_ms": tuned.p10_ms,
        "p90_ms": tuned.p90_ms,
        "dense_ms": tuned.dense_ms,
        "tiled_dense_ms": tuned.tiled_dense_ms,
        "speedup": tuned.speedup,
        "speedup_dense": speedup_text(tuned.speedup, kept.get("dense")),
        "speedup_tiled_dense": speedup_text(tuned.speedup_vs_tiled_dense, kept.get("tiled_dense")),
        "created_at": tuned.created_at,
    }


def trial_rows(trials: list[TrialPoint]) -> list[dict[str, Any]]:
    return [
        {
            "number": t.number,
            "status": t.status,
            "config": describe_config(t.params),
            "median_ms": t.median_ms,
            "p10_ms": t.p10_ms,
            "p90_ms": t.p90_ms,
            "compile_ms": t.compile_ms,
            "error": (t.error[:300] + "...") if t.error and len(t.error) > 300 else t.error,
            "created_at": t.created_at,
        }
        for t in trials
    ]


def figure_entries(src: dict[str, str], sizes: dict[str, tuple[int, int]] | None = None) -> list[dict[str, Any]]:
    """The figures in page order with their sources (and pixel sizes when known)."""
    out = []
    for name in NAMES:
        width, height = (sizes or {}).get(name, (None, None))
        out.append({"name": name, "src": src[name], "caption": CAPTIONS[name], "width": width, "height": height})
    return out
