"""The Pallas kernel lowers for TPU on this CPU machine, and illegal shapes are rejected."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from kernel.attention import NoTpuDeviceError, prepare_group, sparse_attention
from kernel.config import TileConfig
from kernel.layout import VideoLayout
from kernel.lowering import TpuLoweringError, lower_for_tpu
from kernel.pallas_backend import pallas_block_sparse
from kernel.pattern import HeadPattern, SparsityPattern
from kernel.presets import get_preset

MIXED = SparsityPattern(VideoLayout(4, 300, 40, "prefix"), (HeadPattern.spatial(1, True), HeadPattern.temporal(6)))


@pytest.mark.parametrize("variant", ["naive", "split", "compact"])
@pytest.mark.parametrize(("grouping", "dtype"), [("all", "bfloat16"), ("by_pattern", "float32")])
def test_valid_configs_lower_for_tpu(variant: str, grouping: str, dtype: str) -> None:
    config = TileConfig(variant, 128, 256, 128, "temporal_major", "frame", grouping)  # type: ignore[arg-type]
    texts = lower_for_tpu(MIXED, config, head_dim=128, dtype=dtype)
    assert len(texts) == (1 if grouping == "all" else 2)
    assert all("tpu_custom_call" in t for t in texts)


def test_real_preset_lowers_for_tpu() -> None:
    """wan2.1-480p: 32,760 tokens, frames of 1560 tokens that no multiple of 128 divides."""
    preset = get_preset("wan2.1-480p")
    config = TileConfig("compact", 512, 512, 256, "temporal_major", "none", "by_pattern")
    assert len(lower_for_tpu(preset.pattern(), config, head_dim=preset.head_dim)) == 2


@pytest.mark.parametrize(
    ("config", "rule"),
    [
        (TileConfig("compact", 128, 100, 0), "block_kv (100) must be a multiple of 128"),
        (TileConfig("split", 128, 256, 64), "block_kv_compute (64) must be a multiple of 128"),
        (TileConfig("naive", 60, 128, 0), "block_q (60) must be a multiple of 16"),
    ],
)
def test_illegal_block_shape_rejected_with_rule(config: TileConfig, rule: str) -> None:
    with pytest.raises(TpuLoweringError, match=rule.replace("(", r"\(").replace(")", r"\)")):
        lower_for_tpu(MIXED, config, dtype="bfloat16")


def test_mosaic_itself_rejects_an_illegal_block_shape() -> None:
    """Bypassing TileConfig.check_tpu, the Pallas TPU lowering still refuses (8, 128) violations."""
    config = TileConfig("compact", 100, 128, 0, "temporal_major", "none", "all")
    placements, _, tables, params = prepare_group(MIXED, [0, 1], config)
    q = jax.ShapeDtypeStruct((1, 2, tables.num_q_blocks * 100, 128), jnp.float32)
    kv = jax.ShapeDtypeStruct((1, 2, tables.num_kv_blocks * 128, 128), jnp.float32)

    def call(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return pallas_block_sparse(q, k, v, tables, placements, params, config)

    with pytest.raises(ValueError, match="divisible by 8 and 128"):
        jax.jit(call).trace(q, kv, kv).lower(lowering_platforms=("tpu",))


def test_tpu_backend_without_tpu_is_a_clear_error() -> None:
    """It names what this machine can do for TPU (compile) and what needs the device (run, time)."""
    q = jnp.zeros((2, MIXED.seq_len, 8))
    with pytest.raises(NoTpuDeviceError, match="runs the kernel on a TPU device") as caught:
        sparse_attention(q, q, q, MIXED, backend="tpu")
    assert "compiling for TPU works here without one" in str(caught.value)
    assert caught.value.platform == "cpu"
