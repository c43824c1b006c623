"""The ``xla`` backend: block tables executed by plain jnp/XLA.

Every (head, q-block) row is processed in parallel; a ``lax.scan`` walks the
rows' kv-block lists (padded to the longest row of the call) with an online
softmax. Full tiles and partial tiles are two separate scans: the full-tile scan
does no masking work at all, the partial-tile scan builds each tile's mask from
slot indices (:mod:`kernel.tile_mask`). ``naive`` masks every non-empty tile in
one scan, as the study's first sparse variant does.

This is the timed objective on machines without an accelerator: its cost
really depends on the tile sizes (matmul shapes, gather volume, padding).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernel.block_tables import BlockTables
from kernel.config import TileConfig
from kernel.placement import TokenPlacement
from kernel.tile_mask import static_head_params, tile_mask

# As in splash attention: a finite "minus infinity" keeps exp() NaN-free on
# rows whose first visited tiles are fully masked.
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)


def xla_block_sparse(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    tables: BlockTables,
    placements: tuple[TokenPlacement, ...],
    head_params: np.ndarray,
    config: TileConfig,
) -> jax.Array:
    """Attention over placed, padded q [B,H,Nq,D], k/v [B,H,Nk,D] -> [B,H,Nq,D].

    ``head_params`` is int32 [H, 4]: (kind code, window, sink, placement index).
    """
    B, H, Nq, D = q.shape
    bq, bkv = tables.block_q, tables.block_kv
    nq, nk = tables.num_q_blocks, tables.num_kv_blocks
    qb = q.reshape(B, H, nq, bq, D)
    kb = k.reshape(B, H, nk, bkv, D)
    vb = v.reshape(B, H, nk, bkv, D)
    precision = jax.lax.Precision.HIGHEST if q.dtype == jnp.float32 else None

    static = static_head_params(head_params)
    params: Sequence[Any] = (
        static if static is not None else [jnp.asarray(head_params[:, i]).reshape(H, 1, 1, 1) for i in range(4)]
    )
    q_slot = (jnp.arange(nq, dtype=jnp.int32) * bq)[:, None, None] + jnp.arange(bq, dtype=jnp.int32)[None, :, None]

    def walk(state: tuple[jax.Array, ...], lists: tuple[np.ndarray, np.ndarray], masked: bool) -> tuple[jax.Array, ...]:
        kv_index, valid = lists
        if kv_index.shape[-1] == 0 or not valid.any():
            return state

        def step(carry: tuple[jax.Array, ...], xs: tuple[jax.Array, jax.Array]) -> tuple[tuple[jax.Array, ...], None]:
            m, l, acc = carry
            idx, ok = xs  # [H, nq]
            gather = idx[None, :, :, None, None]
            kg = jnp.take_along_axis(kb, gather, axis=2)
            vg = jnp.take_along_axis(vb, gather, axis=2)
            s = jnp.einsum("bhiqd,bhikd->bhiqk", qb, kg, precision=precision, preferred_element_type=jnp.float32)
            if masked:
                kv_slot = idx[:, :, None, None] * bkv + jnp.arange(bkv, dtype=jnp.int32)
                mask = tile_mask(placements, q_slot[None], kv_slot, *params)
                s = jnp.where(mask[None], s, MASK_VALUE)
            m_new = jnp.maximum(m, s.max(axis=-1))
            alpha = jnp.exp(m - m_new)
            p = jnp.exp(s - m_new[..., None])
            l_new = alpha * l + p.sum(axis=-1)
            pv = jnp.einsum(
                "bhiqk,bhikd->bhiqd", p.astype(v.dtype), vg, precision=precision, preferred_element_type=jnp.float32
            )
            acc_new = alpha[..., None] * acc + pv
            keep = ok[None, :, :, None]
            return (
                jnp.where(keep, m_new, m),
                jnp.where(keep, l_new, l),
                jnp.where(keep[..., None], acc_new, acc),
            ), None

        xs = (jnp.asarray(np.moveaxis(kv_index, -1, 0)), jnp.asarray(np.moveaxis(valid, -1, 0)))
        state, _ = jax.lax.scan(step, state, xs)
        return state

    state: tuple[jax.Array, ...] = (
        jnp.full((B, H, nq, bq), MASK_VALUE, jnp.float32),
        jnp.zeros((B, H, nq, bq), jnp.float32),
        jnp.zeros((B, H, nq, bq, D), jnp.float32),
    )
    if config.variant == "naive":
        kv_index, _, valid = tables.padded_lists()
        state = walk(state, (kv_index, valid), masked=True)
    else:
        full_index, _, full_valid = tables.padded_lists(full=True)
        part_index, _, part_valid = tables.padded_lists(full=False)
        state = walk(state, (full_index, full_valid), masked=False)
        state = walk(state, (part_index, part_valid), masked=True)
    _, l, acc = state
    out = jnp.where(l[..., None] > 0, acc / jnp.where(l > 0, l, 1.0)[..., None], 0.0)
    return out.reshape(B, H, Nq, D).astype(q.dtype)
