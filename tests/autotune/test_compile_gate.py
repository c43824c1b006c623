"""The configs a search tries first compile for real TPU generations, and compute the right thing.

A search starts from the heuristic (its warm start) and its local-search neighbourhood
(one dimension one step away, as :mod:`autotune.samplers.local_search` walks it); those
configs are compiled here on v5e, v6e and TPU7x through libtpu's compile-only targets and,
being small, run in TPU interpret mode against the dense reference.

Compiles cost 0.1-1 s for these short sequences and 2-10 s for a preset's 512 x 512 tiles,
so the presets' heuristics are compiled on miniatures of the presets (their head patterns,
head_dim, dtype and text, three frames of 300 tokens): one per variant in the suite, all of
them x every generation with ``TILETUNE_COMPILE_PRESETS=1``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

from autotune.compile_gate import compile_gate
from autotune.space import ParamCoding, SearchSpace
from kernel.attention import sparse_attention
from kernel.config import TileConfig
from kernel.heuristic import heuristic_config
from kernel.layout import VideoLayout
from kernel.pattern import HeadPattern, SparsityPattern
from kernel.presets import PRESETS
from kernel.reference import TOLERANCE, reference_attention
from kernel.tpu_targets import libtpu_installed
from kernel.workload import Workload

pytestmark = pytest.mark.skipif(
    not libtpu_installed(), reason="libtpu (the TPU compiler) is not installed: pip install -e '.[tpu]'"
)
GENERATIONS = ("v5e", "v6e", "tpu7x")
VARIANTS = ("naive", "split", "compact")
# 4 frames x 40 tokens, one spatial and one temporal head: 160 tokens, shorter than one 256 tile.
SHORT = SparsityPattern(VideoLayout(4, 40), (HeadPattern.spatial(1), HeadPattern.temporal(2)))


def neighbourhood(space: SearchSpace, config: TileConfig) -> list[TileConfig]:
    """The valid configs one step from ``config``: a tile size to the next one up or down, a
    category to any other (the local search's first proposals around its centre)."""
    coding = ParamCoding(space)
    centre = coding.encode(config)
    assert centre is not None
    out = []
    for name, choices in coding.dims.items():
        if len(choices) < 2:
            continue
        if coding.is_ordinal(name):
            values: list[Any] = [j for j in (centre[name] - 1, centre[name] + 1) if 0 <= j < len(choices)]
        else:
            values = [c for c in choices if c != centre[name]]
        for value in values:
            try:
                neighbour = coding.decode({**centre, name: value})
            except ValueError:  # not a TileConfig (block_kv_compute wider than block_kv)
                continue
            if space.violation(neighbour) is None:
                out.append(neighbour)
    return out


def max_error(pattern: SparsityPattern, config: TileConfig, dtype: str, head_dim: int) -> float:
    rng = np.random.default_rng(1)
    shape = (1, pattern.num_heads, pattern.seq_len, head_dim)
    q, k, v = (jnp.asarray(rng.standard_normal(shape), jnp.float32).astype(dtype) for _ in range(3))
    out = np.asarray(sparse_attention(q, k, v, pattern, config, "interpret").astype(jnp.float32), np.float64)
    ref = reference_attention(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), pattern)
    return float(np.abs(out - ref).max())


def short_workload(dtype: str) -> Workload:
    return Workload("TPU v6 lite", "tpu", dtype, 1, 128, SHORT)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_short_heuristic_compiles_on_every_generation_and_is_exact(variant: str, dtype: str) -> None:
    workload = short_workload(dtype)
    config = dataclasses.replace(heuristic_config(SHORT, "tpu", dtype), variant=variant)
    assert config.block_q < 128  # the short-sequence q tile (sublane rule), not a 128-row one
    for generation in GENERATIONS:
        verdict = compile_gate(workload, config, generation)
        assert verdict.outcome.ok, f"{generation}: {verdict.outcome.error}"
        assert verdict.agree, verdict.estimate
    if dtype == "float32":  # the tighter tolerance; bf16 numerics are checked in test_exactness
        assert max_error(SHORT, config, dtype, 128) <= TOLERANCE[dtype]


def test_the_heuristic_neighbourhood_compiles_and_is_exact() -> None:
    """Every valid neighbour of the heuristic (the local search's first steps), each compiled for
    one generation in turn, then run in interpret mode against the reference (but for the other
    variants of the heuristic, which the test above runs)."""
    workload = short_workload("float32")
    space = SearchSpace(workload, "tpu")
    heuristic = heuristic_config(SHORT, "tpu", "float32")
    neighbours = neighbourhood(space, heuristic)
    assert len(neighbours) >= 6
    for i, config in enumerate(neighbours):
        verdict = compile_gate(workload, config, GENERATIONS[i % len(GENERATIONS)])
        assert verdict.outcome.ok, f"{config.describe()} on {GENERATIONS[i % 3]}: {verdict.outcome.error}"
        if config.variant == heuristic.variant:
            assert max_error(SHORT, config, "float32", 128) <= TOLERANCE["float32"], config.describe()


def miniature(name: str) -> tuple[Workload, TileConfig]:
    """A preset's heuristic TPU config (chosen for the real preset) and a small workload with the
    preset's head patterns, head_dim, dtype and text tokens to compile it on."""
    preset = PRESETS[name]
    config = heuristic_config(preset.pattern(), "tpu", preset.dtype)
    layout = VideoLayout(3, 300, preset.layout.text_tokens, preset.layout.text_position)
    small = dataclasses.replace(preset, layout=layout, latent_width=min(preset.latent_width, 20))
    return Workload(GENERATIONS[0], "tpu", preset.dtype, 1, preset.head_dim, small.pattern(2)), config


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_heuristic_compiles_in_every_variant(name: str) -> None:
    """Every preset's heuristic config in every variant, each variant on one of v5e, v6e and TPU7x
    (rotated by preset, so every variant meets every generation across the presets): 18 compiles
    of 512 x 512 tiles, seconds each. The whole matrix is the test below."""
    workload, config = miniature(name)
    shift = list(PRESETS).index(name)
    for i, variant in enumerate(VARIANTS):
        generation = GENERATIONS[(i + shift) % len(GENERATIONS)]
        verdict = compile_gate(workload, dataclasses.replace(config, variant=variant), generation)  # type: ignore[arg-type]
        assert verdict.outcome.ok, f"{variant} on {generation}: {verdict.outcome.error}"
        assert verdict.outcome.calls == 2


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("TILETUNE_COMPILE_PRESETS") != "1",
    reason="every preset x variant x generation takes minutes: set TILETUNE_COMPILE_PRESETS=1",
)
@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_heuristic_compiles_in_every_variant_on_every_generation(name: str) -> None:
    workload, config = miniature(name)
    for variant in VARIANTS:
        for generation in GENERATIONS:
            verdict = compile_gate(workload, dataclasses.replace(config, variant=variant), generation)  # type: ignore[arg-type]
            assert verdict.outcome.ok, f"{variant} on {generation}: {verdict.outcome.error}"
