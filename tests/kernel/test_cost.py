"""Grid steps count the tiles each backend really walks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from kernel.attention import head_groups, prepare_group
from kernel.config import TileConfig
from kernel.cost import grid_steps
from kernel.layout import VideoLayout
from kernel.pallas_backend import compact_steps
from kernel.pattern import HeadPattern, SparsityPattern
from kernel.xla_backend import scan_plan
from tests.kernel.strategies import patterns, tile_configs


@settings(max_examples=30, deadline=None)
@given(patterns(), tile_configs())
def test_grid_steps_match_what_the_backends_walk(pattern: SparsityPattern, config: TileConfig) -> None:
    pallas = xla = xla_1 = 0
    for heads in head_groups(pattern, config):
        tables = prepare_group(pattern, heads, config)[2]
        if config.variant == "compact":
            pallas += compact_steps(tables)[0].shape[0]
        else:
            pallas += tables.num_heads * tables.num_q_blocks * tables.num_kv_blocks
        walks = [None] if config.variant == "naive" else [True, False]
        # The backend scans exactly these lists, every padded slot of them.
        xla += sum(
            tables.padded_lists(full=scan.full, q_blocks=scan.q_blocks)[0].size
            for scan in scan_plan(tables, config.variant)
        )
        # Version 1 walked each list once, every row padded to the call's longest, and skipped an empty list.
        xla_1 += sum(kv.size for kv, _, valid in (tables.padded_lists(full=full) for full in walks) if valid.any())
    assert grid_steps(pattern, config, "interpret") == grid_steps(pattern, config, "tpu") == pallas
    assert grid_steps(pattern, config, "xla") == grid_steps(pattern, config, "xla", "2") == xla
    assert grid_steps(pattern, config, "xla", "1") == xla_1
    assert xla <= xla_1


def test_text_tokens_no_longer_pad_every_xla_row_to_every_kv_tile() -> None:
    """A q-block holding text reaches every kv block; in its own scan it pads no other row."""
    text = SparsityPattern(VideoLayout(8, 64, 64, "prefix"), (HeadPattern.spatial(0), HeadPattern.temporal(4)))
    plain = SparsityPattern(VideoLayout(8, 64), text.heads)
    config = TileConfig("split", 64, 64, 0, "frame_major", "frame", "by_pattern")
    assert grid_steps(text, config, "xla") < 0.5 * grid_steps(text, config, "xla", "1")
    assert grid_steps(plain, config, "xla") == grid_steps(plain, config, "xla", "1")


@pytest.mark.parametrize("variant", ["naive", "split", "compact"])
def test_compact_walks_fewer_steps_than_the_dense_grid(variant: str) -> None:
    from kernel.presets import get_preset

    pattern = get_preset("cpu-demo").pattern()
    config = TileConfig(variant, 128, 128, 0, "temporal_major", "frame", "by_pattern")
    dense_grid = grid_steps(pattern, TileConfig("naive", 128, 128, 0, "temporal_major", "frame", "by_pattern"), "tpu")
    steps = grid_steps(pattern, config, "tpu")
    assert (steps < dense_grid) == (variant == "compact")
