"""Lowering the Pallas kernel for TPU on any machine: the cheap gate before a compile.

``jax.jit(f).trace(...).lower(lowering_platforms=("tpu",))`` runs the Pallas
to Mosaic lowering without a TPU: illegal block shapes (the (8, 128) tiling
rule), unsupported primitives and SMEM/scalar-prefetch misuse are rejected in
milliseconds. Mosaic's own layout passes and the SMEM/VMEM allocation run only
in the real compile (:mod:`kernel.tpu_compile`, on any machine with libtpu), so
passing this gate is necessary, not sufficient.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp

from kernel.attention import head_groups, prepare_group
from kernel.config import TileConfig
from kernel.pallas_backend import pallas_block_sparse
from kernel.pattern import SparsityPattern


class TpuLoweringError(ValueError):
    """The config cannot be lowered for TPU; the message says why."""


def kernel_calls(
    pattern: SparsityPattern,
    config: TileConfig,
    *,
    batch: int = 1,
    head_dim: int = 128,
    dtype: str = "bfloat16",
    sharding: Any = None,
) -> Iterator[tuple[Callable[..., jax.Array], tuple[jax.ShapeDtypeStruct, ...]]]:
    """Each kernel call of ``config`` (one per head group) as a function of q, k, v and the
    abstract q, k, v it takes (placed, padded; on ``sharding`` when given, e.g. a
    compile-only TPU device)."""
    for heads in head_groups(pattern, config):
        placements, _, tables, params = prepare_group(pattern, heads, config)
        q_shape = (batch, len(heads), tables.num_q_blocks * tables.block_q, head_dim)
        kv_shape = (batch, len(heads), tables.num_kv_blocks * tables.block_kv, head_dim)
        q = jax.ShapeDtypeStruct(q_shape, jnp.dtype(dtype), sharding=sharding)
        kv = jax.ShapeDtypeStruct(kv_shape, jnp.dtype(dtype), sharding=sharding)

        def call(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
            return pallas_block_sparse(q, k, v, tables, placements, params, config)  # noqa: B023

        yield call, (q, kv, kv)


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message (compiler errors run to pages)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def lower_for_tpu(
    pattern: SparsityPattern,
    config: TileConfig,
    *,
    batch: int = 1,
    head_dim: int = 128,
    dtype: str = "bfloat16",
) -> list[str]:
    """Lower every kernel call of ``config`` for TPU; returns the StableHLO texts.

    Raises TpuLoweringError naming the broken rule (checked by TileConfig first,
    then by the Pallas TPU lowering itself).
    """
    try:
        config.check_tpu(dtype)
    except ValueError as exc:
        raise TpuLoweringError(str(exc)) from None
    texts = []
    for call, args in kernel_calls(pattern, config, batch=batch, head_dim=head_dim, dtype=dtype):
        try:
            lowered = jax.jit(call).trace(*args).lower(lowering_platforms=("tpu",))
        except Exception as exc:  # Mosaic reports rule violations as various exception types
            raise TpuLoweringError(f"TPU lowering failed for {config.describe()}: {first_line(exc)}") from exc
        texts.append(lowered.as_text())
    return texts
