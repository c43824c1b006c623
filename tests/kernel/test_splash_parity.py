"""Our kernel and JAX's splash attention (TPU interpret mode) agree on a shared mask."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from kernel.attention import sparse_attention
from kernel.config import TileConfig
from kernel.layout import VideoLayout
from kernel.pattern import HeadPattern, SparsityPattern
from kernel.reference import dense_mask
from tests.kernel.splash_compat import splash_attention_interpret


@pytest.mark.parametrize("backend", ["xla", "interpret"])
def test_outputs_equal_splash_attention(backend: str) -> None:
    pattern = SparsityPattern(
        VideoLayout(4, 56, 32, "suffix"),
        (HeadPattern.spatial(1, True), HeadPattern.temporal(3)),
    )
    assert pattern.seq_len == 256
    rng = np.random.default_rng(7)
    q, k, v = (jnp.asarray(rng.standard_normal((2, 256, 64)), jnp.float32) for _ in range(3))
    theirs = np.asarray(splash_attention_interpret(q, k, v, dense_mask(pattern), 128, 128))
    config = TileConfig("compact", 128, 128, 0, "temporal_major", "frame", "by_pattern")
    ours = np.asarray(sparse_attention(q, k, v, pattern, config, backend))
    assert np.abs(ours - theirs).max() <= 2e-5
