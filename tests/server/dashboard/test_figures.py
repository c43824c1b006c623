"""Figure code: tile-map aggregation against the block tables, big workloads, and figures without data."""

from __future__ import annotations

import dataclasses

import hypothesis
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernel import attention, block_tables
from kernel.attention import prepare_group
from kernel.block_tables import EMPTY, FULL, PARTIAL
from kernel.config import TileConfig
from kernel.layout import MAX_SEQ_LEN, VideoLayout
from kernel.pattern import HeadPattern, SparsityPattern
from kernel.presets import get_preset
from kernel.workload import Workload
from server.dashboard import catalog, figures
from server.dashboard.figures import tile_map
from server.store.records import TrialPoint, TunedPoint, TuningRecord
from tests.images import png_size
from tests.kernel.strategies import patterns, tile_configs


def _tables(pattern: SparsityPattern, config: TileConfig):  # type: ignore[no-untyped-def]
    return prepare_group(pattern, list(range(pattern.num_heads)), config)[2]


@pytest.mark.parametrize("max_cells", [1000, 7, 3])
def test_tile_map_aggregates_the_block_table(max_cells: int) -> None:
    """Cells hold the fraction of full / partial tiles of the tiles they cover (ragged last cells included)."""
    pattern = SparsityPattern(VideoLayout(5, 37, 11, "prefix"), (HeadPattern.spatial(1, True), HeadPattern.temporal(4)))
    tables = _tables(pattern, TileConfig("compact", 8, 16, 0, "temporal_major", "none", "all"))
    for h in range(2):
        kinds = tables.kinds(h)
        tm = tile_map(tables.heads[h], tables.num_q_blocks, tables.num_kv_blocks, max_cells=max_cells)
        s = tm.cell
        assert s == max(1, -(-max(kinds.shape) // max_cells))
        assert tm.full.shape == (-(-kinds.shape[0] // s), -(-kinds.shape[1] // s))
        for i in range(tm.full.shape[0]):
            for j in range(tm.full.shape[1]):
                block = kinds[i * s : (i + 1) * s, j * s : (j + 1) * s]
                assert tm.full[i, j] == pytest.approx((block == FULL).mean())
                assert tm.partial[i, j] == pytest.approx((block == PARTIAL).mean())
        assert tm.counts == {
            "full": int((kinds == FULL).sum()),
            "partial": int((kinds == PARTIAL).sum()),
            "empty": int((kinds == EMPTY).sum()),
        }
        rgb = tm.rgb()
        assert rgb.shape == (*tm.full.shape, 3) and rgb.min() >= 0 and rgb.max() <= 1


def _record(wl: Workload, config: dict | None, trials: tuple[TrialPoint, ...] = ()) -> TuningRecord:
    tuned = TunedPoint(1, config, 32.8, 31.9, 34.0, 78.6, None) if config is not None else None
    return TuningRecord(wl.key, wl, trials, tuned)


def test_blockmap_of_wan_720p_is_aggregated() -> None:
    """591 x 591 tiles per head class: the map is built from the CSR tables and aggregated, not drawn tile by tile."""
    preset = get_preset("wan2.1-720p")
    wl = Workload("TPU v6 lite", "tpu", "bfloat16", 1, preset.head_dim, preset.pattern())
    config = TileConfig("compact", 128, 128, 0, "temporal_major", "none", "by_pattern")
    record = _record(wl, config.to_dict())
    classes = figures.head_class_maps(record, config)
    assert [d for d, _, _ in classes] == [p.describe() for p in wl.pattern.classes()]
    for describe, _, maps in classes:
        frame_major = maps["frame_major"]
        assert frame_major is not None
        assert frame_major.num_q_blocks == frame_major.num_kv_blocks == 591
        assert frame_major.cell == 4 and max(frame_major.full.shape) <= figures.MAX_CELLS
        assert (maps["temporal_major"] is None) == describe.startswith("spatial")
    fig = figures.render(record, "blockmap")
    assert png_size(fig.png) == catalog.blockmap_size(record) == (fig.width, fig.height)


def test_every_figure_renders_without_data() -> None:
    """A workload with no trials and no tuned config still gets four images (saying what is missing)."""
    preset = get_preset("cpu-demo")
    wl = Workload("cpu", "xla", "float32", 1, preset.head_dim, preset.pattern())
    record = _record(wl, None)
    assert record.winner()[1] == "heuristic (nothing tuned yet)"
    for name in figures.FIGURES:
        fig = figures.render(record, name)
        assert png_size(fig.png) == (fig.width, fig.height)


def test_only_failures_and_a_foreign_config() -> None:
    """Failed trials only, and a tuned config of another kernel version: figures render, the block map falls back."""
    preset = get_preset("cpu-demo")
    wl = Workload("cpu", "xla", "float32", 1, preset.head_dim, preset.pattern())
    params = TileConfig("naive", 64, 64, 0, "frame_major", "none", "all").to_dict()
    trials = tuple(
        TrialPoint(i, i, params, status, None, None, None, None, "boom", None)
        for i, status in enumerate(["failed", "crashed", "timeout", "invalid"])
    )
    record = _record(wl, {"variant": "compact", "block_q": 64, "tile_shape": "new"}, trials)
    assert record.winner()[1] == "heuristic (nothing tuned yet)"
    for name in figures.FIGURES:
        assert png_size(figures.render(record, name).png)
    with pytest.raises(ValueError, match="figure: unknown figure"):
        figures.render(record, "nope")


@pytest.mark.parametrize(
    ("kept", "title"),
    [
        (None, "(2.31-2.46x over p10-p90)"),  # 78.6 ms over the winner's own runs: 34.0 and 31.9 ms
        ({"dense": [2.2, 2.5], "tiled_dense": [1.1, 1.2]}, "(2.20-2.50x over p10-p90)"),
        ({"dense": [2.5, 2.7]}, "(2.40-2.70x over p10-p90)"),  # the ratio of medians (2.40) below the pairs' p10
    ],
)
def test_speedup_whiskers_are_the_kept_spread_of_paired_runs(kept: dict | None, title: str) -> None:
    """The winner's whiskers are the stored p10-p90 of its runs paired with dense's when the tuned config kept
    one (stretched to reach the bar, which is the ratio of the medians), else its own runs over dense's median."""
    preset = get_preset("cpu-demo")
    wl = Workload("cpu", "xla", "float32", 1, preset.head_dim, preset.pattern())
    config = TileConfig("compact", 64, 64, 0, "temporal_major", "none", "by_pattern").to_dict()
    tuned = TunedPoint(1, config, 32.8, 31.9, 34.0, 78.6, None, 40.0, kept)
    fig = figures.render(TuningRecord(wl.key, wl, (), tuned), "speedup")
    assert fig.title == f"winner 2.40x faster than dense {title}"


def test_kernel_does_not_import_matplotlib() -> None:
    """DESIGN.md: kernel is pure JAX + numpy."""
    import subprocess
    import sys

    code = (
        "import sys, kernel.attention, kernel.block_tables, kernel.presets, kernel.workload; "
        "sys.exit('matplotlib' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# ---------------------------------------------------------------- bounded block maps

MAX_CLASS_ROWS = catalog.MAX_CLASS_ROWS
BLOCKS = (1, 8, 16, 32, 128, 512, 2048)


@st.composite
def big_blockmaps(draw: st.DrawFn) -> tuple[TuningRecord, TileConfig]:
    """Workloads of up to MAX_SEQ_LEN (2^24) tokens, text included, and 64 head classes (what a worker or
    ``tiletune tune`` may store whatever the API's limits) at any legal tile sizes."""
    frames = draw(st.integers(1, 4096))
    tokens_per_frame = draw(st.integers(1, min(4096, MAX_SEQ_LEN // frames)))
    # The text fits in what the frames leave: 4096 x 4096 frames and one text token is one token too many.
    text = draw(st.integers(0, min(512, MAX_SEQ_LEN - frames * tokens_per_frame)))
    layout = VideoLayout(frames, tokens_per_frame, text, draw(st.sampled_from(["prefix", "suffix"])))
    kinds = draw(st.lists(st.sampled_from(["dense", "spatial", "temporal"]), min_size=1, max_size=64))
    heads = []
    for i, kind in enumerate(kinds):  # the window makes each head its own class
        sink = draw(st.booleans())
        if kind == "dense":
            heads.append(HeadPattern.dense(sink))
        elif kind == "spatial":
            heads.append(HeadPattern.spatial(min(i, frames - 1), sink))
        else:
            heads.append(HeadPattern.temporal(min(i, tokens_per_frame - 1), sink))
    pattern = SparsityPattern(layout, tuple(heads))
    config = TileConfig(
        "compact",
        draw(st.sampled_from(BLOCKS)),
        draw(st.sampled_from(BLOCKS)),
        0,
        draw(st.sampled_from(["frame_major", "temporal_major"])),
        draw(st.sampled_from(["none", "frame"])),
        "by_pattern",
    )
    wl = Workload("cpu", "xla", "float32", 1, 64, pattern)
    return _record(wl, config.to_dict()), config


@hypothesis.settings(max_examples=25, deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow])
@given(case=big_blockmaps())
def test_blockmap_work_is_bounded_before_it_starts(case: tuple[TuningRecord, TileConfig]) -> None:
    """Whatever the workload, the block map classifies at most TILETUNE_MAX_FIGURE_TILES tiles one by
    one, or coarse cells (at most MAX_CELLS^2 per panel), for at most MAX_CLASS_ROWS head classes.
    The bound holds before any table is built, whatever the sequence length or the tile sizes."""
    record, config = case
    max_tiles = getattr(figures, "DEFAULT_MAX_TILES", 1 << 22)
    allowed = max(max_tiles, 2 * MAX_CLASS_ROWS * figures.MAX_CELLS**2)
    classified = [0]
    real = block_tables.build_block_tables

    def counting(heads, placements, block_q, block_kv, q_len, kv_len):  # type: ignore[no-untyped-def]
        classified[0] += len(heads) * (q_len // block_q) * (kv_len // block_kv)
        assert classified[0] <= allowed, f"{classified[0]:,} tiles classified for one figure > {allowed:,}"
        return real(heads, placements, block_q, block_kv, q_len, kv_len)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(attention, "build_block_tables", counting)
        patch.setattr(figures, "build_block_tables", counting, raising=False)
        classes = figures.head_class_maps(record, config)
    assert len(classes) == min(len(record.workload.pattern.classes()), MAX_CLASS_ROWS)
    for _, _, maps in classes:
        for tm in maps.values():
            if tm is not None:
                assert max(tm.full.shape) <= figures.MAX_CELLS
                assert sum(tm.counts.values()) > 0


@hypothesis.settings(max_examples=40, deadline=None)
@given(pattern=patterns(max_heads=3, max_frames=6, max_per_frame=40), config=tile_configs(blocks=(8, 16, 32)))
def test_coarse_cells_agree_with_the_tiles_they_cover(pattern: SparsityPattern, config: TileConfig) -> None:
    """A coarse cell is full only when all its tiles are, empty exactly when all its tiles are, and
    otherwise mixed (some tile attended)."""
    config = dataclasses.replace(config, head_grouping="by_pattern")
    record = _record(Workload("cpu", "xla", "float32", 1, 64, pattern), config.to_dict())
    for max_cells in (3, 5):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(figures, "MAX_CELLS", max_cells)
            coarse = figures.head_class_maps(record, config, max_tiles=0)
        exact = figures.head_class_maps(record, config, max_tiles=1 << 30)
        for (_, _, c_maps), (_, heads, e_maps) in zip(coarse, exact, strict=True):
            for layout, cm in c_maps.items():
                em = e_maps[layout]
                if cm is None or em is None:
                    assert cm is None and em is None
                    continue
                assert cm.coarse and not em.coarse
                kinds = _tables_one(pattern, heads[0], dataclasses.replace(config, layout=layout))
                s = cm.cell
                assert cm.full.shape == (-(-kinds.shape[0] // s), -(-kinds.shape[1] // s))
                for i in range(cm.full.shape[0]):
                    for j in range(cm.full.shape[1]):
                        block = kinds[i * s : (i + 1) * s, j * s : (j + 1) * s]
                        if cm.full[i, j]:
                            assert (block == FULL).all()
                        elif cm.partial[i, j]:
                            # A cell cut short by the sequence's end also covers slots no tile does.
                            cut = (j + 1) * s > kinds.shape[1]
                            assert (block != EMPTY).any() and (cut or not (block == FULL).all())
                        else:
                            assert (block == EMPTY).all()


def _tables_one(pattern: SparsityPattern, head: int, config: TileConfig) -> np.ndarray:
    return prepare_group(pattern, [head], config)[2].kinds(0)


def test_a_huge_workload_draws_a_coarse_blockmap_quickly() -> None:
    """2^24 tokens of one dense head at 128 x 128 (17 billion tiles): a coarse map, and the title says so."""
    wl = Workload("cpu", "xla", "float32", 1, 64, SparsityPattern(VideoLayout(4096, 4096), (HeadPattern.dense(),)))
    config = TileConfig("compact", 128, 128, 0, "frame_major", "none", "by_pattern")
    drawn = figures.render(_record(wl, config.to_dict()), "blockmap", max_tiles=1 << 22)
    assert "coarse" in drawn.title and "TILETUNE_MAX_FIGURE_TILES" in drawn.title
    assert png_size(drawn.png) == catalog.blockmap_size(_record(wl, config.to_dict()))
