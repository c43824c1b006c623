"""Pictures of one workload's tuning, as PNG bytes: shared by ``tiletune report`` and the ``/ui`` pages.

- ``history``: time per trial and the best so far (Optuna's optimization-history
  plot on a study rebuilt in memory from the stored trials), failures and trials
  still being measured (``running``) marked;
- ``heatmap``: the best time per block_q x block_kv cell, one panel per
  variant x layout;
- ``blockmap``: which tiles of the pattern are empty, partial or full at the
  winning tile sizes, one row per head class (at most ``MAX_CLASS_ROWS``), with
  and without the temporal-major permutation; large maps are aggregated to at
  most ``MAX_CELLS`` cells per side (a cell's colour mixes the kinds of the
  tiles it holds), and the panel says so. The work is bounded before it starts:
  when the panels hold more than ``max_tiles`` tiles together, no per-tile table
  is built and each cell of n x n tiles is classified as one (the kernel's
  interval arithmetic at n times the tile sizes): full, empty, or mixed;
- ``speedup``: the winner's (re-timed) speedup over dense with its p10-p90
  spread, beside the fastest other trials.

Every figure renders from a :class:`TuningRecord` (plain data loaded once from
the database) at the pixel size :mod:`server.dashboard.catalog` gives, and always renders: missing data gives a
figure that says what is missing. Rendering holds one lock per process: pyplot
(which Optuna's plots use) keeps global state. The server draws in child
processes (:mod:`server.dashboard.renderer`), so the lock never makes one
figure wait for another's drawing.
"""

from __future__ import annotations

import dataclasses
import io
import math
import threading
import warnings
from collections.abc import Callable
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: render to memory only

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FuncFormatter

from kernel.attention import head_placement, prepare_group
from kernel.block_tables import FULL, PARTIAL, HeadTable, build_block_tables
from kernel.config import TileConfig
from kernel.pattern import HeadPattern
from kernel.placement import TokenPlacement, round_up
from server.dashboard.catalog import (
    HISTORY_SIZE,
    MAX_CLASS_ROWS,
    NAMES,
    SPEEDUP_SIZE,
    blockmap_size,
    facets,
    heatmap_size,
)
from server.store.records import TuningRecord

DPI = 100
MAX_CELLS = 160  # block-map cells per side; larger tile grids are aggregated
DEFAULT_MAX_TILES = 1 << 22  # tiles a block map classifies one by one (TILETUNE_MAX_FIGURE_TILES)
STATUS_STYLE = {  # marker, colour: one per non-ok status in the history
    "running": (">", "#1f77b4"),  # reserved by a worker, being measured now
    "pruned": ("o", "#7f7f7f"),
    "failed": ("X", "#d62728"),
    "invalid": ("|", "#9467bd"),
    "crashed": ("P", "#8c564b"),
    "timeout": ("v", "#e377c2"),
    "wrong": ("D", "#ff7f0e"),
}
KIND_COLOURS = {  # block-map tile kinds (RGB in [0, 1])
    "empty": (0.95, 0.95, 0.95),
    "partial": (0.949, 0.557, 0.169),
    "full": (0.306, 0.475, 0.655),
}
_RENDER_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class RenderedFigure:
    name: str
    png: bytes
    width: int
    height: int
    title: str


# ---------------------------------------------------------------- rendering


def _new_figure(width_px: int, height_px: int) -> Figure:
    # Half a pixel over: Agg truncates width*dpi, and n/100*100 is not always n in floating point.
    return Figure(figsize=((width_px + 0.5) / DPI, (height_px + 0.5) / DPI), dpi=DPI, layout="constrained")


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def _message(ax: Any, text: str) -> None:
    ax.set_axis_off()
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, fontsize=11, color="#555555")


# ---------------------------------------------------------------- history


def history_figure(record: TuningRecord) -> RenderedFigure:
    """Time per trial (in recorded order) and the best so far; failures marked along the top."""
    import optuna
    from optuna.visualization.matplotlib import plot_optimization_history

    width, height = HISTORY_SIZE
    ok = record.ok_trials()
    title = f"search history: {len(record.trials)} trials, {len(ok)} ok"
    if ok:
        title += f", best {min(t.median_ms or math.inf for t in ok):.4g} ms"
    if not ok:
        fig = _new_figure(width, height)
        _message(fig.add_subplot(), "no successful trial yet" if record.trials else "no trials recorded")
        fig.suptitle(title)
        return RenderedFigure("history", _png(fig), width, height, title)

    # Every stored trial becomes one trial of an in-memory study, in recorded order, so
    # Optuna's x axis (trial number) is the index into record.trials.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize")
    for t in record.trials:
        if t.status == "ok" and t.median_ms is not None:
            study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.COMPLETE, value=t.median_ms))
        elif t.status == "pruned":
            study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.PRUNED))
        else:
            study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL))
    with plt.style.context("default"), warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        ax = plot_optimization_history(study, target_name="median time (ms)")
        drawn = ax.figure
        assert isinstance(drawn, Figure)
        try:
            drawn.set_size_inches((width + 0.5) / DPI, (height + 0.5) / DPI)
            drawn.set_dpi(DPI)
            drawn.set_layout_engine("constrained")
            times = [t.median_ms for t in ok if t.median_ms]
            if max(times) / min(times) > 20:
                ax.set_yscale("log")
            for status, (marker, colour) in STATUS_STYLE.items():
                xs = [i for i, t in enumerate(record.trials) if t.status == status]
                if not xs:
                    continue
                if status == "pruned":
                    timed = [(i, m) for i in xs if (m := record.trials[i].median_ms) is not None]
                    if timed:
                        ax.scatter(
                            [i for i, _ in timed],
                            [m for _, m in timed],
                            marker=marker,
                            facecolors="none",
                            edgecolors=colour,
                            label=f"pruned ({len(xs)}; partial median)",
                            zorder=3,
                        )
                        continue
                ax.scatter(
                    xs,
                    [0.97] * len(xs),
                    marker=marker,
                    color=colour,
                    transform=ax.get_xaxis_transform(),
                    label=f"{status} ({len(xs)})",
                    clip_on=False,
                    zorder=3,
                )
            ax.set_xlabel("trial (in recorded order)")
            ax.set_title(title)
            ax.legend(loc="upper right", fontsize=8, ncols=2)
            png = _png(drawn)
        finally:
            plt.close(drawn)
    return RenderedFigure("history", png, width, height, title)


# ---------------------------------------------------------------- heatmap


def heatmap_figure(record: TuningRecord) -> RenderedFigure:
    """Best ok time per (block_q, block_kv), one panel per variant (rows) x layout (columns)."""
    width, height = heatmap_size(record)
    variants, layouts = facets(record)
    fig = _new_figure(width, height)
    title = "best time per tile size (ms; other parameters at their best)"
    fig.suptitle(
        title + "\nred box: winner   (n): pruned, partial median   x: measured, none ok   grey: not measured",
        fontsize=10,
    )
    sized = [
        t
        for t in record.trials
        if isinstance(t.params.get("block_q"), int) and isinstance(t.params.get("block_kv"), int)
    ]
    if not sized:
        _message(fig.add_subplot(), "no trials with tile sizes recorded")
        return RenderedFigure("heatmap", _png(fig), width, height, title)
    qs = sorted({int(t.params["block_q"]) for t in sized})
    kvs = sorted({int(t.params["block_kv"]) for t in sized})
    times = [t.median_ms for t in sized if t.status == "ok" and t.median_ms]
    norm = LogNorm(min(times), max(times) if max(times) > min(times) else min(times) * 1.01) if times else None
    winner, _ = record.winner()
    axes = fig.subplots(len(variants), len(layouts), squeeze=False, sharex=True, sharey=True)
    image = None
    for r, variant in enumerate(variants):
        for c, layout in enumerate(layouts):
            ax = axes[r][c]
            best = np.full((len(qs), len(kvs)), np.nan)
            pruned = np.full((len(qs), len(kvs)), np.nan)
            tried = np.zeros((len(qs), len(kvs)), int)
            for t in sized:
                if str(t.params.get("variant", "-")) != variant or str(t.params.get("layout", "-")) != layout:
                    continue
                i, j = qs.index(int(t.params["block_q"])), kvs.index(int(t.params["block_kv"]))
                if t.status == "running":
                    continue  # no result yet
                tried[i, j] += 1
                if t.status == "ok" and t.median_ms:
                    best[i, j] = np.fmin(best[i, j], t.median_ms)
                elif t.status == "pruned" and t.median_ms:
                    pruned[i, j] = np.fmin(pruned[i, j], t.median_ms)
            ax.set_facecolor("#eeeeee")  # never measured
            if norm is not None:
                image = ax.imshow(np.ma.masked_invalid(best), cmap="viridis_r", norm=norm, origin="lower")
            for i in range(len(qs)):
                for j in range(len(kvs)):
                    if not np.isnan(best[i, j]):
                        shade = norm(best[i, j]) if norm is not None else 0.0
                        colour = "black" if shade < 0.55 else "white"
                        ax.text(j, i, f"{best[i, j]:.3g}", ha="center", va="center", fontsize=7, color=colour)
                    elif not np.isnan(pruned[i, j]):
                        ax.text(j, i, f"({pruned[i, j]:.3g})", ha="center", va="center", fontsize=7, color="#666666")
                    elif tried[i, j]:
                        ax.text(j, i, "x", ha="center", va="center", fontsize=11, color="#d62728")
            if (
                winner.variant == variant
                and winner.layout == layout
                and winner.block_q in qs
                and winner.block_kv in kvs
            ):
                ax.add_patch(
                    Rectangle(
                        (kvs.index(winner.block_kv) - 0.5, qs.index(winner.block_q) - 0.5),
                        1,
                        1,
                        fill=False,
                        edgecolor="#d62728",
                        linewidth=2.5,
                    )
                )
            ax.set_xticks(range(len(kvs)), [str(k) for k in kvs], fontsize=8)
            ax.set_yticks(range(len(qs)), [str(q) for q in qs], fontsize=8)
            ax.set_xlim(-0.5, len(kvs) - 0.5)
            ax.set_ylim(-0.5, len(qs) - 0.5)
            ax.set_title(f"{variant} / {layout}", fontsize=9)
            if r == len(variants) - 1:
                ax.set_xlabel("block_kv")
            if c == 0:
                ax.set_ylabel("block_q")
    if image is not None:
        bar = fig.colorbar(image, ax=axes, shrink=0.8, label="median ms (log scale)")
        bar.ax.tick_params(labelsize=8, which="both")
        bar.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:.3g}"))
        bar.ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _pos: f"{v:.3g}"))
    return RenderedFigure("heatmap", _png(fig), width, height, title)


# ---------------------------------------------------------------- block map

LAYOUT_TITLES = {"frame_major": "frame-major (no permutation)", "temporal_major": "temporal-major (permuted)"}


@dataclasses.dataclass(frozen=True)
class TileMap:
    """A head's tile kinds, aggregated to at most ``MAX_CELLS`` per side.

    ``full``/``partial`` hold the fraction of each cell's tiles of that kind;
    ``cell`` tiles per side make one cell (1: no aggregation). A ``coarse`` map
    classified each cell as one: ``counts`` are then of cells, and a ``partial``
    cell holds a mix of tiles (full, partial or empty: not told apart).
    """

    full: np.ndarray
    partial: np.ndarray
    cell: int
    num_q_blocks: int
    num_kv_blocks: int
    counts: dict[str, int]
    coarse: bool = False

    def rgb(self) -> np.ndarray:
        empty = 1.0 - self.full - self.partial
        colours = {k: np.asarray(v) for k, v in KIND_COLOURS.items()}
        return (
            self.full[..., None] * colours["full"]
            + self.partial[..., None] * colours["partial"]
            + empty[..., None] * colours["empty"]
        )


def tile_map(table: HeadTable, num_q_blocks: int, num_kv_blocks: int, max_cells: int = MAX_CELLS) -> TileMap:
    """Aggregate a head's CSR table in O(non-empty tiles): no dense tile grid of a big workload is built."""
    cell = max(1, -(-max(num_q_blocks, num_kv_blocks) // max_cells))
    rows_out, cols_out = -(-num_q_blocks // cell), -(-num_kv_blocks // cell)
    rows = np.repeat(np.arange(num_q_blocks), table.row_lengths()) // cell
    cols = table.kv_index.astype(np.int64) // cell
    flat = rows * cols_out + cols
    size = rows_out * cols_out
    full = np.bincount(flat[table.is_full], minlength=size).astype(np.float64)
    partial = np.bincount(flat[~table.is_full], minlength=size).astype(np.float64)
    # Tiles per cell (the last row and column of cells may be cut short).
    q_span = np.minimum(cell, num_q_blocks - np.arange(rows_out) * cell)
    kv_span = np.minimum(cell, num_kv_blocks - np.arange(cols_out) * cell)
    per_cell = np.outer(q_span, kv_span).ravel().astype(np.float64)
    total = num_q_blocks * num_kv_blocks
    counts = {"full": table.num_full, "partial": table.num_tiles - table.num_full}
    counts["empty"] = total - counts["full"] - counts["partial"]
    return TileMap(
        (full / per_cell).reshape(rows_out, cols_out),
        (partial / per_cell).reshape(rows_out, cols_out),
        cell,
        num_q_blocks,
        num_kv_blocks,
        counts,
    )


def coarse_tile_map(
    head: HeadPattern,
    placement: TokenPlacement,
    config: TileConfig,
    q_len: int,
    kv_len: int,
    max_cells: int = MAX_CELLS,
) -> TileMap:
    """A head's map with each cell of n x n tiles classified as one tile of n times the tile sizes:
    O(cells) work and memory whatever the sequence length (slots past ``q_len`` / ``kv_len``
    are padding, which the kernel classifies empty)."""
    nq, nk = q_len // config.block_q, kv_len // config.block_kv
    cell = max(1, -(-max(nq, nk) // max_cells))
    big_q, big_kv = cell * config.block_q, cell * config.block_kv
    tables = build_block_tables([head], [placement], big_q, big_kv, round_up(q_len, big_q), round_up(kv_len, big_kv))
    table = tables.heads[0]
    rows, cols = tables.num_q_blocks, tables.num_kv_blocks
    flat_kinds = np.zeros(rows * cols, np.int8)
    flat = np.repeat(np.arange(rows), table.row_lengths()) * cols + table.kv_index
    flat_kinds[flat] = np.where(table.is_full, FULL, PARTIAL)
    kinds = flat_kinds.reshape(rows, cols)
    full, mixed = (kinds == FULL), (kinds == PARTIAL)
    counts = {"full": int(full.sum()), "partial": int(mixed.sum())}
    counts["empty"] = rows * cols - counts["full"] - counts["partial"]
    return TileMap(full.astype(np.float64), mixed.astype(np.float64), cell, nq, nk, counts, coarse=True)


def head_class_maps(
    record: TuningRecord, config: TileConfig, max_tiles: int = DEFAULT_MAX_TILES
) -> list[tuple[str, list[int], dict[str, TileMap | None]]]:
    """Per head class (the first ``MAX_CLASS_ROWS``): (description, heads, {layout: TileMap or None
    when the layout does not apply}). Exact maps when all panels together hold at most ``max_tiles``
    tiles, coarse ones (:func:`coarse_tile_map`) otherwise; the count is known before any table is built."""
    pattern = record.workload.pattern
    classes = list(pattern.classes().items())[:MAX_CLASS_ROWS]
    # Every head's slots span the frame-major geometry's length (prepare_group pads to it).
    geometry = TokenPlacement.build(pattern.layout, "frame_major", config.align_unit)
    q_len, kv_len = round_up(geometry.length, config.block_q), round_up(geometry.length, config.block_kv)
    panels = sum(2 if head.kind == "temporal" else 1 for head, _ in classes)
    exact = panels * (q_len // config.block_q) * (kv_len // config.block_kv) <= max_tiles
    out = []
    for head, heads in classes:
        maps: dict[str, TileMap | None] = {}
        for layout in ("frame_major", "temporal_major"):
            if layout == "temporal_major" and head.kind != "temporal":
                maps[layout] = None  # only temporal heads are permuted
                continue
            placed = dataclasses.replace(config, layout=layout)
            if exact:
                _, _, tables, _ = prepare_group(pattern, [heads[0]], placed)
                maps[layout] = tile_map(tables.heads[0], tables.num_q_blocks, tables.num_kv_blocks)
            else:
                placement = head_placement(head, placed, geometry)
                maps[layout] = coarse_tile_map(head, placement, placed, q_len, kv_len)
        out.append((head.describe(), heads, maps))
    return out


def blockmap_figure(record: TuningRecord, max_tiles: int = DEFAULT_MAX_TILES) -> RenderedFigure:
    """Empty / partial / full tiles of each head class at the winning tile sizes, both token orders
    (coarse cells when the panels hold more than ``max_tiles`` tiles)."""
    width, height = blockmap_size(record)
    config, source = record.winner()
    fig = _new_figure(width, height)
    title = f"tiles at q{config.block_q} x kv{config.block_kv}, align={config.align} ({source})"
    classes = head_class_maps(record, config, max_tiles)
    total = len(record.workload.pattern.classes())
    if total > len(classes):
        title += f"; the first {len(classes)} of {total} head classes"
    if any(tm is not None and tm.coarse for _, _, maps in classes for tm in maps.values()):
        title += f"\ncoarse: over {max_tiles:,} tiles (TILETUNE_MAX_FIGURE_TILES), each cell classified as one"
    fig.suptitle(title, fontsize=11)
    axes = fig.subplots(len(classes), 2, squeeze=False)
    for r, (describe, heads, maps) in enumerate(classes):
        for c, layout in enumerate(("frame_major", "temporal_major")):
            ax = axes[r][c]
            tm = maps[layout]
            label = LAYOUT_TITLES[layout] + (" <- winner" if layout == config.layout and tm is not None else "")
            if tm is None:
                _message(ax, f"{describe}\nnot permuted: only temporal heads\nuse the temporal-major order")
                continue
            ax.imshow(
                tm.rgb(),
                interpolation="nearest",
                extent=(0, tm.num_kv_blocks, tm.num_q_blocks, 0),
                aspect="auto",
            )
            cells = sum(tm.counts.values())
            shown = {"full": "full", "partial": "mixed" if tm.coarse else "partial", "empty": "empty"}
            share = ", ".join(f"{shown[k]} {tm.counts[k] / cells:.0%}" for k in shown)
            share += " of cells" if tm.coarse else ""
            ax.set_title(f"{describe} (heads {_ranges(heads)})\n{label}\n{share}", fontsize=8)
            if tm.coarse:
                cell_note = f"; cells of {tm.cell}x{tm.cell} tiles as one"
            elif tm.cell > 1:
                cell_note = f"; each cell = {tm.cell}x{tm.cell} tiles, colours mixed"
            else:
                cell_note = ""
            ax.set_xlabel(f"kv block (of {tm.num_kv_blocks}){cell_note}", fontsize=8)
            ax.set_ylabel(f"q block (of {tm.num_q_blocks})", fontsize=8)
            ax.tick_params(labelsize=7)
    coarse = any(tm is not None and tm.coarse for _, _, maps in classes for tm in maps.values())
    labels = {"full": "full", "partial": "partial (coarse cells: mixed)" if coarse else "partial", "empty": "empty"}
    fig.legend(
        handles=[Patch(facecolor=KIND_COLOURS[k], edgecolor="#999999", label=labels[k]) for k in labels],
        loc="outside lower center",
        ncols=3,
        fontsize=8,
    )
    return RenderedFigure("blockmap", _png(fig), width, height, title)


def _ranges(heads: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    parts: list[str] = []
    start = prev = heads[0]
    for h in [*heads[1:], None]:
        if h is not None and h == prev + 1:
            prev = h
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if h is not None:
            start = prev = h
    return ", ".join(parts)


# ---------------------------------------------------------------- speedup

SPEEDUP_OTHERS = 6


def speedup_figure(record: TuningRecord) -> RenderedFigure:
    """The winner's speedup over dense with its p10-p90 range (the stored spread of its runs paired with
    dense's when kept, else its runs over dense's median), beside the fastest other ok trials."""
    width, height = SPEEDUP_SIZE
    fig = _new_figure(width, height)
    ax = fig.add_subplot()
    tuned = record.tuned
    if tuned is None or not tuned.dense_ms or tuned.median_ms <= 0:
        title = "speedup over dense"
        _message(ax, "no tuned config yet" if tuned is None else "no dense timing recorded for this workload")
        fig.suptitle(title)
        return RenderedFigure("speedup", _png(fig), width, height, title)
    dense = tuned.dense_ms
    bars: list[tuple[str, float, float, float, bool]] = []  # label, median, p10, p90, winner

    def describe(config: dict[str, Any]) -> str:
        try:
            return TileConfig.from_dict(config).describe()
        except (TypeError, ValueError):
            return str(config)

    bars.append(
        (
            "winner (re-timed): " + describe(tuned.config),
            tuned.median_ms,
            tuned.p10_ms or tuned.median_ms,
            tuned.p90_ms or tuned.median_ms,
            True,
        )
    )
    order = {t.id: i for i, t in enumerate(record.trials)}  # the history's x axis
    others = sorted((t for t in record.ok_trials() if (t.median_ms or 0) > 0), key=lambda t: t.median_ms or math.inf)
    for t in [t for t in others if t.params != tuned.config][:SPEEDUP_OTHERS]:
        assert t.median_ms is not None
        bars.append(
            (
                f"#{order[t.id]}: " + describe(t.params),
                t.median_ms,
                t.p10_ms or t.median_ms,
                t.p90_ms or t.median_ms,
                False,
            )
        )
    ys = np.arange(len(bars))[::-1]
    speed = np.array([dense / m for _, m, _, _, _ in bars])
    low = np.array([dense / p90 for _, _, _, p90, _ in bars])  # slowest run -> smallest speedup
    high = np.array([dense / p10 for _, _, p10, _, _ in bars])
    paired = tuned.speedup_spread("dense")
    if paired is not None:  # the winner's own spread: each of its runs over the dense run beside it
        # The bar is the ratio of the medians, the whiskers percentiles of the ratios of pairs: the first
        # can fall outside the second when the spread is narrow, so the whiskers are stretched to reach it.
        low[0], high[0] = min(paired[0], speed[0]), max(paired[1], speed[0])
        whiskers = "whiskers: winner p10-p90 of runs paired with dense, others p10-p90 of their runs"
    else:
        whiskers = "whiskers: p10-p90 of the runs over dense's median"
    colours = ["#d62728" if w else "#4e79a7" for *_, w in bars]
    ax.barh(ys, speed, color=colours, alpha=0.85)
    ax.errorbar(speed, ys, xerr=[speed - low, high - speed], fmt="none", ecolor="black", capsize=4, linewidth=1)
    ax.axvline(1.0, color="#555555", linestyle="--", linewidth=1)
    ax.text(1.0, 0.01, " dense", transform=ax.get_xaxis_transform(), fontsize=8, color="#555555")
    for y, s, lo, hi in zip(ys, speed, low, high, strict=True):
        ax.text(hi, y, f"  {s:.2f}x ({lo:.2f}-{hi:.2f})", va="center", fontsize=8)
    ax.set_yticks(ys, [label for label, *_ in bars], fontsize=8)
    ax.set_xlabel(f"speedup over dense ({dense:.4g} ms); {whiskers}", fontsize=9)
    ax.set_xlim(0, max(max(high) * 1.4, 1.5))
    title = f"winner {speed[0]:.2f}x faster than dense ({low[0]:.2f}-{high[0]:.2f}x over p10-p90)"
    ax.set_title(f"{title}\n{tuned.median_ms:.4g} ms vs dense {dense:.4g} ms; #n: trial in recorded order", fontsize=10)
    return RenderedFigure("speedup", _png(fig), width, height, title)


# ---------------------------------------------------------------- registry

FIGURES: dict[str, Callable[[TuningRecord], RenderedFigure]] = {
    "history": history_figure,
    "heatmap": heatmap_figure,
    "blockmap": blockmap_figure,
    "speedup": speedup_figure,
}
assert tuple(FIGURES) == NAMES


def render(record: TuningRecord, name: str, *, max_tiles: int = DEFAULT_MAX_TILES) -> RenderedFigure:
    """One figure by name (``FIGURES``; ``max_tiles`` bounds the block map's work); one figure at a
    time per process."""
    if name not in FIGURES:
        raise ValueError(f"figure: unknown figure {name!r}; one of {', '.join(FIGURES)}")
    with _RENDER_LOCK:
        if name == "blockmap":
            return blockmap_figure(record, max_tiles)
        return FIGURES[name](record)
