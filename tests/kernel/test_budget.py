"""The SMEM and VMEM estimates against what the TPU compiler was measured to need (kernel/budget.py,
kernel.pallas_backend.vmem_bytes).

Pure estimates, no libtpu: each case states the compiler's verdict on it (jax 0.10.2, libtpu
0.0.42.1, compile-only targets); tests/kernel/test_tpu_compile.py compiles two SMEM cases for real
(a VMEM case takes 20-70 s to compile, too slow for the suite).
"""

from __future__ import annotations

import pytest

from kernel.attention import head_groups, prepare_group
from kernel.budget import SMEM_BUDGET_BYTES, budget_violation
from kernel.config import TileConfig
from kernel.layout import VideoLayout
from kernel.pallas_backend import scalar_prefetch_bytes
from kernel.pattern import HeadPattern, SparsityPattern
from kernel.presets import PRESETS

KINDS = ("TPU v4", "TPU v5 lite", "TPU v5", "TPU v6 lite", "TPU7x")
# 92,600 tokens, one head: naive q128 x kv256 has a 724 x 362 tile table of 1,048,352 bytes.
JUST_UNDER = SparsityPattern(VideoLayout(4, 23150), (HeadPattern.spatial(1),))
JUST_UNDER_CONFIG = TileConfig("naive", 128, 256, 128)
# 65,400 tokens: naive q128 x kv128 over one head has a 511 x 511 table of 1,044,484 bytes (3 KiB
# left once rounded up to 512 bytes); over two heads q256 x kv128 has 2 x 256 x 511 (1,046,528).
TIGHT_ONE = SparsityPattern(VideoLayout(4, 16350), (HeadPattern.spatial(1),))
TIGHT_TWO = SparsityPattern(VideoLayout(4, 16350), (HeadPattern.spatial(1), HeadPattern.spatial(1)))


def smem_verdict(pattern: SparsityPattern, config: TileConfig, kind: str) -> str | None:
    return budget_violation(pattern, config, device_kind=kind, head_dim=128, dtype="bfloat16")


def raw_table_bytes(pattern: SparsityPattern, config: TileConfig) -> int:
    """What the estimate counted before the compiler's rounding and reserve (largest call)."""
    return max(
        scalar_prefetch_bytes(*prepare_group(pattern, heads, config)[2:], config.variant)
        for heads in head_groups(pattern, config)
    )


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("variant", ["naive", "split"])
def test_tables_just_under_1_mib_are_refused(kind: str, variant: str) -> None:
    """1,048,352 + 16 bytes of tables: under 1 MiB, so the estimate called it valid, but every
    generation refused it: "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory
    in memory space smem. Used 1.00M of 1.00M smem. Exceeded smem capacity by 1.6K."."""
    config = TileConfig(variant, 128, 256, 128)  # type: ignore[arg-type]
    assert raw_table_bytes(JUST_UNDER, config) == 1_048_368 <= SMEM_BUDGET_BYTES
    reason = smem_verdict(JUST_UNDER, config, kind)
    assert reason is not None and reason.startswith("smem"), reason


@pytest.mark.parametrize("kind", KINDS)
def test_three_kib_left_after_rounding_fits_everywhere(kind: str) -> None:
    """1,044,484 + 16 bytes (3,072 left once each array is rounded up to 512 bytes) compiled on all
    five generations: the reserve is not larger than the compiler needs."""
    assert smem_verdict(TIGHT_ONE, TileConfig("naive", 128, 128, 128), kind) is None


@pytest.mark.parametrize(("kind", "fits"), [(k, k == "TPU v4") for k in KINDS])
def test_one_and_a_half_kib_left_fits_only_v4(kind: str, fits: bool) -> None:
    """1,046,528 + 32 bytes (1,536 left after rounding) compiled on v4 only; v5e, v5p, v6e and
    TPU7x refused it: "Ran out of memory in memory space smem. ... Exceeded smem capacity by 1.4K."."""
    reason = smem_verdict(TIGHT_TWO, TileConfig("naive", 256, 128, 128), kind)
    assert (reason is None) == fits, reason


@pytest.mark.parametrize("kind", KINDS)
def test_the_tightest_preset_config_that_compiled_still_fits(kind: str) -> None:
    """wan2.1-480p compact q128 kv128 align=frame by_pattern: the least SMEM to spare of any preset
    config (3,584 bytes after rounding); it compiled on v5e, v6e and TPU7x."""
    config = TileConfig("compact", 128, 128, 128, "frame_major", "frame", "by_pattern")
    assert smem_verdict(PRESETS["wan2.1-480p"].pattern(), config, kind) is None


def vmem_verdict(config: TileConfig, kind: str, dtype: str, head_dim: int) -> str | None:
    return budget_violation(JUST_UNDER, config, device_kind=kind, head_dim=head_dim, dtype=dtype)


@pytest.mark.parametrize(
    ("kind", "config", "dtype", "head_dim", "asked"),
    [
        # estimated 13.0 MiB by one sub-block's score tiles; the compiler (wan2.1-720p's heads):
        # "Scoped allocation with size 17.57M and limit 16.00M exceeded scoped vmem limit"
        ("TPU v5 lite", TileConfig("split", 2048, 2048, 256), "bfloat16", 128, "17.57M"),
        # a 64-wide head pads to 128 lanes: the same 17.57M (cogvideox1.5's heads)
        ("TPU v5 lite", TileConfig("split", 2048, 2048, 256), "bfloat16", 64, "17.57M"),
        # f32 grows with the unrolled sub-blocks: estimated 9.5 MiB, asked 62.11M (cpu-demo's heads)
        ("TPU v5 lite", TileConfig("split", 2048, 2048, 128), "float32", 64, "62.11M"),
        ("TPU v5 lite", TileConfig("split", 2048, 1024, 256), "float32", 64, "27.09M"),
        # estimated 18.5 MiB under v6e's 32; "Scoped allocation with size 33.32M and limit 32.00M"
        ("TPU v6 lite", TileConfig("split", 2048, 2048, 512), "float32", 64, "33.32M"),
    ],
)
def test_tiles_the_compiler_found_too_big_for_vmem_are_refused(
    kind: str, config: TileConfig, dtype: str, head_dim: int, asked: str
) -> None:
    reason = vmem_verdict(config, kind, dtype, head_dim)
    assert reason is not None and reason.startswith("vmem"), f"the compiler asked for {asked}: {reason}"


@pytest.mark.parametrize(
    ("kind", "config", "dtype", "head_dim"),
    [
        # the largest tiles that compiled for these limits (every variant, wan2.1-720p's heads)
        ("TPU v6 lite", TileConfig("compact", 2048, 2048, 1024), "bfloat16", 128),
        ("TPU7x", TileConfig("naive", 2048, 2048, 1024), "bfloat16", 128),
        ("TPU v5 lite", TileConfig("naive", 1024, 1024, 1024), "bfloat16", 128),
    ],
)
def test_tiles_that_compiled_near_the_vmem_limit_fit(kind: str, config: TileConfig, dtype: str, head_dim: int) -> None:
    assert vmem_verdict(config, kind, dtype, head_dim) is None
