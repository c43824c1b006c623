"""Every variant x backend x pattern kind is exact against the float64 dense reference."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.attention import head_groups, prepare_group, sparse_attention
from kernel.config import TileConfig
from kernel.layout import VideoLayout
from kernel.pattern import HeadPattern, SparsityPattern
from kernel.reference import reference_attention
from kernel.xla_backend import scan_plan
from tests.kernel.strategies import patterns, tile_configs

TOL = {"float32": 2e-5, "bfloat16": 2e-2}


def qkv(
    pattern: SparsityPattern, batch: int = 1, head_dim: int = 16, seed: int = 0, dtype: str = "float32"
) -> tuple[jnp.ndarray, ...]:
    rng = np.random.default_rng(seed)
    shape = (batch, pattern.num_heads, pattern.seq_len, head_dim)
    return tuple(jnp.asarray(rng.standard_normal(shape), jnp.float32).astype(dtype) for _ in range(3))


def max_error(pattern: SparsityPattern, config: TileConfig, backend: str, dtype: str = "float32", **kw: int) -> float:
    q, k, v = qkv(pattern, dtype=dtype, **kw)
    out = np.asarray(sparse_attention(q, k, v, pattern, config, backend).astype(jnp.float32), np.float64)
    ref = reference_attention(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), pattern)
    assert out.shape == ref.shape
    return float(np.abs(out - ref).max())


P13 = VideoLayout(3, 13)  # 13 tokens per frame: not a multiple of 8 nor of any block
CASES = {
    "spatial-odd-frame": (
        SparsityPattern(P13, (HeadPattern.spatial(1), HeadPattern.spatial(0))),
        "frame_major",
        "none",
    ),
    "spatial-sink-aligned": (SparsityPattern(P13, (HeadPattern.spatial(0, True),)), "frame_major", "frame"),
    "temporal-no-permutation": (SparsityPattern(P13, (HeadPattern.temporal(2),)), "frame_major", "none"),
    "temporal-permuted": (SparsityPattern(P13, (HeadPattern.temporal(2),)), "temporal_major", "none"),
    "temporal-permuted-sink-aligned": (
        SparsityPattern(P13, (HeadPattern.temporal(1, True),)),
        "temporal_major",
        "frame",
    ),
    "dense-text-prefix": (
        SparsityPattern(VideoLayout(2, 12, 7, "prefix"), (HeadPattern.dense(),)),
        "frame_major",
        "frame",
    ),
    "band-text-suffix": (
        SparsityPattern(VideoLayout(3, 10, 5, "suffix"), (HeadPattern.band(14),)),
        "frame_major",
        "none",
    ),
    "mixed-heads-text-prefix": (
        SparsityPattern(
            VideoLayout(3, 11, 6, "prefix"),
            (HeadPattern.spatial(1), HeadPattern.temporal(1), HeadPattern.dense(), HeadPattern.band(9, True)),
        ),
        "temporal_major",
        "frame",
    ),
}


@pytest.mark.parametrize("backend", ["xla", "interpret"])
@pytest.mark.parametrize("variant", ["naive", "split", "compact"])
@pytest.mark.parametrize("case", list(CASES))
def test_matrix_exact(case: str, variant: str, backend: str) -> None:
    pattern, layout, align = CASES[case]
    grouping = "all" if case.startswith("mixed") else "by_pattern"
    config = TileConfig(variant, 16, 32, 16, layout, align, grouping)
    assert max_error(pattern, config, backend) <= TOL["float32"]


@pytest.mark.parametrize("backend", ["xla", "interpret"])
@pytest.mark.parametrize("variant", ["naive", "compact"])
def test_bfloat16_exact(variant: str, backend: str) -> None:
    pattern, _, _ = CASES["mixed-heads-text-prefix"]
    config = TileConfig(variant, 16, 32, 0, "temporal_major", "frame", "by_pattern")
    assert max_error(pattern, config, backend, dtype="bfloat16") <= TOL["bfloat16"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("variant", ["naive", "split", "compact"])
def test_xla_exact_when_a_walk_splits_into_scans(variant: str, dtype: str) -> None:
    """Text q-blocks reach every kv block: their rows get their own scan, the rest theirs."""
    pattern = SparsityPattern(VideoLayout(6, 16, 16, "prefix"), (HeadPattern.spatial(0), HeadPattern.temporal(1, True)))
    config = TileConfig(variant, 16, 16, 0, "frame_major", "frame", "by_pattern")
    plans = [scan_plan(prepare_group(pattern, heads, config)[2], variant) for heads in head_groups(pattern, config)]
    assert any(len(plan) > len({scan.full for scan in plan}) for plan in plans), "no walk split: nothing new tested"
    assert max_error(pattern, config, "xla", dtype=dtype, batch=2) <= TOL[dtype]


# 30 generated layouts a run (each a compile): hypothesis draws new ones every run, so coverage
# accumulates across CI runs while the suite stays within its 10 minutes on 2 cores.
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pattern=patterns(), config=tile_configs(), batch=st.integers(1, 2))
def test_xla_exact_on_generated_layouts(pattern: SparsityPattern, config: TileConfig, batch: int) -> None:
    assert max_error(pattern, config, "xla", batch=batch) <= TOL["float32"]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pattern=patterns(max_heads=2, max_per_frame=12, max_text=6), config=tile_configs(blocks=(8, 16)))
def test_interpret_exact_on_generated_layouts(pattern: SparsityPattern, config: TileConfig) -> None:
    assert max_error(pattern, config, "interpret") <= TOL["float32"]


def test_unbatched_input_and_heuristic_default() -> None:
    pattern = CASES["mixed-heads-text-prefix"][0]
    q, k, v = (x[0] for x in qkv(pattern))
    out = np.asarray(sparse_attention(q, k, v, pattern, backend="xla"))
    assert out.shape == q.shape
    assert np.abs(out - reference_attention(q, k, v, pattern)).max() <= TOL["float32"]


def test_large_shape_against_sampled_rows() -> None:
    """A frame size no power of two divides, checked on sampled rows without a dense mask."""
    layout = VideoLayout(5, 1560, 226, "prefix")
    pattern = SparsityPattern(layout, (HeadPattern.spatial(1), HeadPattern.temporal(52)))
    q, k, v = qkv(pattern, head_dim=32)
    config = TileConfig("compact", 256, 256, 0, "temporal_major", "frame", "by_pattern")
    out = np.asarray(sparse_attention(q, k, v, pattern, config, "xla"), np.float64)
    rows = np.random.default_rng(1).choice(pattern.seq_len, 64, replace=False)
    assert np.abs(out[:, :, rows] - reference_attention(q, k, v, pattern, rows=rows)).max() <= TOL["float32"]
