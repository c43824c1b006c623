"""Bad input gets a ValueError that names the problem."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from kernel.attention import sparse_attention
from kernel.config import TileConfig
from kernel.layout import VideoLayout
from kernel.pattern import HeadPattern, SparsityPattern

PATTERN = SparsityPattern(VideoLayout(2, 8), (HeadPattern.spatial(0), HeadPattern.temporal(1)))


def zeros(*shape: int) -> jnp.ndarray:
    return jnp.zeros(shape, jnp.float32)


@pytest.mark.parametrize(
    ("q", "k", "match"),
    [
        (zeros(1, 2, 16, 8), zeros(1, 2, 16, 4), "shapes must match"),
        (zeros(1, 2, 15, 8), zeros(1, 2, 15, 8), "sequence length 15 != the layout's seq_len 16"),
        (zeros(1, 3, 16, 8), zeros(1, 3, 16, 8), "3 heads but the pattern describes 2"),
        (zeros(16, 8), zeros(16, 8), r"must be \[batch, heads, seq, head_dim\]"),
        (jnp.zeros((2, 16, 8), jnp.int32), jnp.zeros((2, 16, 8), jnp.int32), "floating"),
    ],
)
def test_bad_tensors(q: jnp.ndarray, k: jnp.ndarray, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        sparse_attention(q, k, k, PATTERN, backend="xla")


def test_bad_backend_and_config() -> None:
    q = zeros(2, 16, 8)
    with pytest.raises(ValueError, match="backend must be one of"):
        sparse_attention(q, q, q, PATTERN, backend="gpu")
    with pytest.raises(ValueError, match="config must be a TileConfig"):
        sparse_attention(q, q, q, PATTERN, config={"block_q": 8}, backend="xla")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"block_q": 0}, r"block_q must be in \[1, 65536\]"),
        ({"block_kv": -128}, r"block_kv must be in \[1, 65536\]"),
        ({"block_kv": 256, "block_kv_compute": 96}, r"block_kv_compute \(96\) must divide block_kv \(256\)"),
        ({"block_q": 12.5}, "block_q must be an integer"),
        ({"variant": "fast"}, "variant must be one of"),
        ({"layout": "random"}, "layout must be one of"),
        ({"align": "tile"}, "align must be one of"),
        ({"head_grouping": "some"}, "head_grouping must be one of"),
    ],
)
def test_tile_config_rules(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TileConfig(**kwargs)


def test_tile_config_round_trip_and_unknown_field() -> None:
    config = TileConfig("split", 64, 256, 128, "frame_major", "frame", "all")
    assert TileConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['blocks'\]"):
        TileConfig.from_dict({"blocks": 3})


@pytest.mark.parametrize(
    ("head", "match"),
    [
        (HeadPattern.spatial(2), r"spatial window_frames=2 is out of range \[0, 1\]"),
        (HeadPattern.temporal(8), r"temporal window_positions=8 is out of range \[0, 7\]"),
        (HeadPattern.band(17), r"band tokens=17 is out of range \[1, 16\]"),
    ],
)
def test_pattern_window_out_of_range(head: HeadPattern, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SparsityPattern(VideoLayout(2, 8), (head,))


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: HeadPattern.spatial(-1), "window_frames must be >= 0"),
        (lambda: HeadPattern.band(0), "tokens must be >= 1"),
        (lambda: HeadPattern("causal"), "kind must be one of"),
        (lambda: VideoLayout(0, 8), "frames must be >= 1"),
        (lambda: VideoLayout(2, 0), "tokens_per_frame must be >= 1"),
        (lambda: VideoLayout(2, 8, -1), "text_tokens must be >= 0"),
        (lambda: VideoLayout(2, 8, 4, "middle"), "text_position must be one of"),
        (lambda: VideoLayout(4097, 4096), "exceeds the limit"),
        (lambda: SparsityPattern(VideoLayout(2, 8), ()), "at least one head"),
        (
            lambda: SparsityPattern.from_dict({"layout": {"frames": 2}, "heads": []}),
            "'frames' and 'tokens_per_frame' are required",
        ),
        (
            lambda: SparsityPattern.from_dict(
                {"layout": {"frames": 2, "tokens_per_frame": 4}, "heads": [{"kind": "spatial"}]}
            ),
            "field 'window_frames' is required",
        ),
    ],
)
def test_layout_and_pattern_rules(build, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=match):
        build()
