"""Short sequences get a non-empty TPU space that holds their heuristic, and long ones keep theirs."""

from __future__ import annotations

import pytest

from autotune.space import SearchSpace
from kernel import candidates
from kernel.config import TPU_SUBLANES, TileConfig, short_q_tiles
from kernel.heuristic import heuristic_config
from kernel.layout import VideoLayout
from kernel.pattern import HeadPattern, SparsityPattern
from kernel.presets import PRESETS
from kernel.workload import Workload

SPATIAL_TEMPORAL = (HeadPattern.spatial(1), HeadPattern.temporal(2))
SMALL = {
    "4x40": SparsityPattern(VideoLayout(4, 40), SPATIAL_TEMPORAL),  # 160 tokens: 128-wide kv tiles pad 60%
    "3x50+7 prefix": SparsityPattern(VideoLayout(3, 50, 7, "prefix"), SPATIAL_TEMPORAL),
    "3x13": SparsityPattern(VideoLayout(3, 13), (HeadPattern.spatial(0),)),  # 39 tokens
    "1x100+30 suffix": SparsityPattern(VideoLayout(1, 100, 30, "suffix"), (HeadPattern.dense(),)),
    "6x33 sink": SparsityPattern(VideoLayout(6, 33), (HeadPattern.spatial(1, True), HeadPattern.temporal(3, True))),
}


def space_of(pattern: SparsityPattern, backend: str, dtype: str) -> SearchSpace:
    return SearchSpace(Workload("TPU v6 lite", backend, dtype, 1, 128, pattern), backend)


@pytest.mark.parametrize("backend", ["tpu", "interpret"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("name", list(SMALL))
def test_small_workloads_have_a_tpu_space_holding_their_heuristic(name: str, dtype: str, backend: str) -> None:
    pattern = SMALL[name]
    space = space_of(pattern, backend, dtype)
    valid = space.enumerate()
    assert valid, f"no valid {backend} config for {name}"
    heuristic = heuristic_config(pattern, backend, dtype)
    assert space.violation(heuristic) is None
    assert heuristic in valid
    # q tiles below a lane tile follow the sublane rule, and the heuristic uses one when 128 rows pad.
    assert min(c.block_q for c in valid) == TPU_SUBLANES[dtype]
    assert heuristic.block_q < 128


def test_the_4x40_space_admits_only_the_least_padding() -> None:
    """Every 128-wide kv tile pads 160 tokens to 256 (60%): those configs are the space, and a
    frame-aligned one (4 frames of 128 slots, 220%) is refused naming the bound."""
    pattern = SMALL["4x40"]
    space = space_of(pattern, "tpu", "bfloat16")
    assert {round(space.padding(c), 6) for c in space.enumerate()} == {0.6}
    aligned = TileConfig("compact", 32, 128, 0, "temporal_major", "frame")
    reason = space.violation(aligned)
    assert reason is not None and "the least any tile size of the grid pads" in reason


def test_short_q_tiles_only_when_a_lane_tile_pads_too_much() -> None:
    assert short_q_tiles(160, "bfloat16") == (16, 32, 64)
    assert short_q_tiles(160, "float32") == (8, 16, 32, 64)
    assert short_q_tiles(120, "bfloat16") == ()  # 128 rows pad 120 tokens by 7%
    assert short_q_tiles(32760, "bfloat16") == ()


@pytest.mark.parametrize("name", [n for n in PRESETS if n != "cpu-demo"])
def test_presets_keep_their_tpu_grid(name: str) -> None:
    """Long sequences: no q tile below 128 rows, and the 25% bound unchanged."""
    preset = PRESETS[name]
    workload = Workload("TPU v6 lite", "tpu", preset.dtype, 1, preset.head_dim, preset.pattern())
    dims = candidates.dimensions(workload, "tpu")
    assert dims["block_q"] == candidates.TPU_BLOCKS_Q
    assert candidates.padding_bound(workload, dims) == candidates.MAX_PADDING
