"""Figure code: tile-map aggregation against the block tables, big workloads, and figures without data."""

from __future__ import annotations

import pytest

from kernel.attention import prepare_group
from kernel.block_tables import EMPTY, FULL, PARTIAL
from kernel.config import TileConfig
from kernel.layout import VideoLayout
from kernel.pattern import HeadPattern, SparsityPattern
from kernel.presets import get_preset
from kernel.workload import Workload
from server.dashboard import figures
from server.dashboard.figures import tile_map
from server.store.records import TrialPoint, TunedPoint, TuningRecord
from tests.images import png_size


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
    assert png_size(fig.png) == figures.blockmap_size(record) == (fig.width, fig.height)


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


def test_kernel_does_not_import_matplotlib() -> None:
    """DESIGN.md: kernel is pure JAX + numpy."""
    import subprocess
    import sys

    code = (
        "import sys, kernel.attention, kernel.block_tables, kernel.presets, kernel.workload; "
        "sys.exit('matplotlib' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
