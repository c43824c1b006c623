"""Grid steps count the tiles each backend really walks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from kernel.attention import head_groups, prepare_group
from kernel.config import TileConfig
from kernel.cost import grid_steps
from kernel.pallas_backend import compact_steps
from kernel.pattern import SparsityPattern
from tests.kernel.strategies import patterns, tile_configs


@settings(max_examples=30, deadline=None)
@given(patterns(), tile_configs())
def test_grid_steps_match_what_the_backends_walk(pattern: SparsityPattern, config: TileConfig) -> None:
    pallas = xla = 0
    for heads in head_groups(pattern, config):
        tables = prepare_group(pattern, heads, config)[2]
        if config.variant == "compact":
            pallas += compact_steps(tables)[0].shape[0]
        else:
            pallas += tables.num_heads * tables.num_q_blocks * tables.num_kv_blocks
        lists = (
            [tables.padded_lists()]
            if config.variant == "naive"
            else [
                tables.padded_lists(full=True),
                tables.padded_lists(full=False),
            ]
        )
        # The xla backend skips a list with no real entry; otherwise it walks every padded slot.
        xla += sum(kv.size for kv, _full, valid in lists if valid.any())
    assert grid_steps(pattern, config, "interpret") == grid_steps(pattern, config, "tpu") == pallas
    assert grid_steps(pattern, config, "xla") == xla


@pytest.mark.parametrize("variant", ["naive", "split", "compact"])
def test_compact_walks_fewer_steps_than_the_dense_grid(variant: str) -> None:
    from kernel.presets import get_preset

    pattern = get_preset("cpu-demo").pattern()
    config = TileConfig(variant, 128, 128, 0, "temporal_major", "frame", "by_pattern")
    dense_grid = grid_steps(pattern, TileConfig("naive", 128, 128, 0, "temporal_major", "frame", "by_pattern"), "tpu")
    steps = grid_steps(pattern, config, "tpu")
    assert (steps < dense_grid) == (variant == "compact")
