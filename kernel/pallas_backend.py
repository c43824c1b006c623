"""The Pallas TPU kernel: ``naive``, ``split`` and ``compact`` block-sparse attention.

- ``naive`` and ``split`` run a dense grid (batch, head, q-block, kv-block);
  a scalar-prefetched table of tile kinds lets empty tiles skip all compute
  (``pl.when``). ``naive`` masks every visited tile; ``split`` masks only
  partial tiles. Their table costs SMEM in proportion to all tiles.
- ``compact`` runs a grid (batch, step) over one flattened list of the
  non-empty tiles of every head and q-block (scalar-prefetched: packed row id
  and packed kv index + full flag). No grid step is spent on an empty tile, and
  heads with different patterns share the list without padding to a dense grid.
  Consecutive steps of one row keep the output block resident; the first step
  of a row initialises the online-softmax state and the last one writes it.

Partial tiles build their mask from ``iota`` and the head's parameters
(:mod:`kernel.tile_mask`), never from a stored mask. Within a kv tile the kernel
walks ``block_kv_compute``-wide sub-blocks, so the score tile held in vregs
stays small while DMAs stay large.

On a CPU this kernel runs in TPU interpret mode (correctness only) and lowers
for TPU with ``lowering_platforms=("tpu",)``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernel.block_tables import BlockTables
from kernel.config import TileConfig
from kernel.placement import TokenPlacement
from kernel.tile_mask import static_head_params, tile_mask
from kernel.xla_backend import MASK_VALUE

HEAD_PARAMS = 4  # kind code, window, sink, placement index
TPU_LANES = 128  # a (rows, 1) f32 scratch occupies a whole 128-lane row of VMEM per sublane


def vmem_bytes(block_q: int, block_kv: int, block_kv_compute: int, head_dim: int, itemsize: int) -> int:
    """VMEM one grid step of :func:`pallas_block_sparse` needs, from its BlockSpecs, its scratch
    and what Mosaic was measured to allocate for its temporaries.

    - the q, k, v input blocks and the output block, each double-buffered by the pipeline, with
      ``head_dim`` padded to whole 128-lane rows (a 64-wide head uses as much VMEM as a 128-wide
      one: measured, the same scoped allocation for both);
    - the f32 online-softmax scratch (m and l lane-padded, the accumulator);
    - the temporaries of the ``block_kv // block_kv_compute`` sub-blocks, which the kernel unrolls.
      Measured with jax 0.10.2 / libtpu 0.0.42.1 (compile-only v5e and v6e, whose errors give
      "Scoped allocation with size X": see :mod:`kernel.budget`), they do not fit one sub-block's
      score tiles: bf16 q2048 x kv2048 asked for 16.2-17.6 MiB with sub-blocks of 128, 256 or 512
      (3 score tiles of one sub-block: 10-13 MiB in all), and f32, whose dots run at HIGHEST
      precision, grows with the number of sub-blocks: q2048 x kv2048 asked 30.6 (v6e 33.3), 39.7 and
      62.1 MiB with 4, 8 and 16 sub-blocks, q2048 x kv1024 21.2 and 27.1 MiB with 2 and 4. So bf16
      charges at least 3 bytes per element of the whole q x kv tile, and f32 one score tile plus
      five lane-padded f32 columns of ``block_q`` rows per sub-block (and one more), never less
      than the three score tiles of one sub-block. Every measured overflow is above this, and
      every measured config under it compiled.
    """
    lanes = -(-head_dim // TPU_LANES) * TPU_LANES
    blocks = (2 * (block_q + 2 * block_kv) + 2 * block_q) * lanes * itemsize
    scratch = 2 * block_q * TPU_LANES * 4 + block_q * lanes * 4
    score = block_q * block_kv_compute * 4
    if itemsize == 4:
        column, sub_blocks = block_q * TPU_LANES * 4, block_kv // block_kv_compute
        temporaries = max(3 * score, score + (1 + 5 * sub_blocks) * column)
    else:
        temporaries = max(3 * score, 3 * block_q * block_kv)
    return blocks + scratch + temporaries


def scalar_prefetch(tables: BlockTables, head_params: np.ndarray, variant: str) -> tuple[np.ndarray, ...]:
    """The int32 arrays the kernel scalar-prefetches into SMEM, in call order.

    ``compact``: the step list (row ids, kv index * 2 + full flag) and the head
    parameters; ``naive``/``split``: the kind of every tile of the dense grid and
    the head parameters.
    """
    params = np.ascontiguousarray(head_params.reshape(-1), np.int32)
    if variant == "compact":
        step_row, step_kv = compact_steps(tables)
        return step_row, step_kv, params
    kinds = np.stack([tables.kinds(h) for h in range(tables.num_heads)]).astype(np.int32).reshape(-1)
    return kinds, params


def scalar_prefetch_sizes(tables: BlockTables, head_params: np.ndarray, variant: str) -> tuple[int, ...]:
    """``tuple(a.nbytes for a in scalar_prefetch(...))`` without building the arrays (the dense
    grid's table of a long sequence is large; the budget check asks for thousands of configs)."""
    params = head_params.size * 4
    if variant == "compact":
        steps = max(1, sum(t.num_tiles for t in tables.heads))
        return steps * 4, steps * 4, params
    return tables.num_heads * tables.num_q_blocks * tables.num_kv_blocks * 4, params


def scalar_prefetch_bytes(tables: BlockTables, head_params: np.ndarray, variant: str) -> int:
    """``sum(a.nbytes for a in scalar_prefetch(...))`` without building the arrays."""
    return sum(scalar_prefetch_sizes(tables, head_params, variant))


def compact_steps(tables: BlockTables) -> tuple[np.ndarray, np.ndarray]:
    """The ``compact`` grid: (row id = head*nq + q-block, kv-block*2 + is_full) per step."""
    nq = tables.num_q_blocks
    rows, kvs = [], []
    for h, t in enumerate(tables.heads):
        rows.append(h * nq + np.repeat(np.arange(nq, dtype=np.int64), t.row_lengths()))
        kvs.append(t.kv_index.astype(np.int64) * 2 + t.is_full)
    row = np.concatenate(rows)
    if row.size == 0:  # only possible for an all-padding call; keep the grid non-empty
        return np.zeros(1, np.int32), np.zeros(1, np.int32)
    return row.astype(np.int32), np.concatenate(kvs).astype(np.int32)


def pallas_block_sparse(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    tables: BlockTables,
    placements: tuple[TokenPlacement, ...],
    head_params: np.ndarray,
    config: TileConfig,
    interpret: bool = False,
) -> jax.Array:
    """Attention over placed, padded q [B,H,Nq,D], k/v [B,H,Nk,D] -> [B,H,Nq,D]."""
    B, H, _Nq, D = q.shape
    bq, bkv, bkvc = tables.block_q, tables.block_kv, config.block_kv_compute
    nq, nk = tables.num_q_blocks, tables.num_kv_blocks
    static_params = static_head_params(head_params)
    prefetch = tuple(jnp.asarray(a) for a in scalar_prefetch(tables, head_params, config.variant))
    f32_dot = q.dtype == jnp.float32
    precision = jax.lax.Precision.HIGHEST if f32_dot else None

    def params_for(h: Any, hp_ref: Any) -> tuple[Any, ...]:
        if static_params is not None:
            return static_params
        return tuple(hp_ref[h * HEAD_PARAMS + i] for i in range(HEAD_PARAMS))

    def update(
        q_ref: Any,
        k_ref: Any,
        v_ref: Any,
        m_sc: Any,
        l_sc: Any,
        acc_sc: Any,
        qi: Any,
        ki: Any,
        params: tuple[Any, ...] | None,
    ) -> None:
        """Online-softmax update with one kv tile; ``params=None`` means a full tile."""
        qv = q_ref[0, 0]
        for c in range(bkv // bkvc):
            kv = k_ref[0, 0, pl.ds(c * bkvc, bkvc), :]
            vv = v_ref[0, 0, pl.ds(c * bkvc, bkvc), :]
            s = jax.lax.dot_general(
                qv, kv, (((1,), (1,)), ((), ())), precision=precision, preferred_element_type=jnp.float32
            )
            if params is not None:
                q_slot = qi * bq + jax.lax.broadcasted_iota(jnp.int32, (bq, bkvc), 0)
                kv_slot = ki * bkv + c * bkvc + jax.lax.broadcasted_iota(jnp.int32, (bq, bkvc), 1)
                s = jnp.where(tile_mask(placements, q_slot, kv_slot, *params), s, MASK_VALUE)
            m_prev = m_sc[...]
            m_new = jnp.maximum(m_prev, s.max(axis=-1, keepdims=True))
            alpha = jnp.exp(m_prev - m_new)
            p = jnp.exp(s - m_new)
            l_sc[...] = alpha * l_sc[...] + p.sum(axis=-1, keepdims=True)
            pv = jax.lax.dot_general(
                p.astype(vv.dtype),
                vv,
                (((1,), (0,)), ((), ())),
                precision=precision,
                preferred_element_type=jnp.float32,
            )
            acc_sc[...] = alpha * acc_sc[...] + pv
            m_sc[...] = m_new

    def init(m_sc: Any, l_sc: Any, acc_sc: Any) -> None:
        m_sc[...] = jnp.full(m_sc.shape, MASK_VALUE, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

    def finish(o_ref: Any, l_sc: Any, acc_sc: Any) -> None:
        l = l_sc[...]
        o_ref[0, 0] = (acc_sc[...] / jnp.where(l > 0, l, 1.0)).astype(o_ref.dtype)

    scratch = [
        pltpu.VMEM((bq, 1), jnp.float32),
        pltpu.VMEM((bq, 1), jnp.float32),
        pltpu.VMEM((bq, D), jnp.float32),
    ]

    if config.variant == "compact":
        num_steps = int(prefetch[0].shape[0])

        def compact_kernel(
            row_ref: Any,
            kvw_ref: Any,
            hp_ref: Any,
            q_ref: Any,
            k_ref: Any,
            v_ref: Any,
            o_ref: Any,
            m_sc: Any,
            l_sc: Any,
            acc_sc: Any,
        ) -> None:
            s = pl.program_id(1)
            row = row_ref[s]
            kvw = kvw_ref[s]
            first = (s == 0) | (row_ref[jnp.maximum(s - 1, 0)] != row)
            last = (s == num_steps - 1) | (row_ref[jnp.minimum(s + 1, num_steps - 1)] != row)
            h = jax.lax.div(row, nq)
            qi = row - h * nq
            ki = jax.lax.div(kvw, 2)
            is_full = (kvw - ki * 2) == 1

            @pl.when(first)
            def _() -> None:
                init(m_sc, l_sc, acc_sc)

            @pl.when(is_full)
            def _() -> None:
                update(q_ref, k_ref, v_ref, m_sc, l_sc, acc_sc, qi, ki, None)

            @pl.when(jnp.logical_not(is_full))
            def _() -> None:
                update(q_ref, k_ref, v_ref, m_sc, l_sc, acc_sc, qi, ki, params_for(h, hp_ref))

            @pl.when(last)
            def _() -> None:
                finish(o_ref, l_sc, acc_sc)

        def q_map(b: Any, s: Any, row_ref: Any, kvw_ref: Any, hp_ref: Any) -> tuple[Any, ...]:
            h = jax.lax.div(row_ref[s], nq)
            return (b, h, row_ref[s] - h * nq, 0)

        def kv_map(b: Any, s: Any, row_ref: Any, kvw_ref: Any, hp_ref: Any) -> tuple[Any, ...]:
            return (b, jax.lax.div(row_ref[s], nq), jax.lax.div(kvw_ref[s], 2), 0)

        grid_spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=3,
            grid=(B, num_steps),
            in_specs=[
                pl.BlockSpec((1, 1, bq, D), q_map),
                pl.BlockSpec((1, 1, bkv, D), kv_map),
                pl.BlockSpec((1, 1, bkv, D), kv_map),
            ],
            out_specs=pl.BlockSpec((1, 1, bq, D), q_map),
            scratch_shapes=scratch,
        )
        semantics: tuple[Any, ...] = ("parallel", "arbitrary")
        kernel_fn: Any = compact_kernel
    else:
        masked_full = config.variant == "naive"

        def dense_grid_kernel(
            kind_ref: Any,
            hp_ref: Any,
            q_ref: Any,
            k_ref: Any,
            v_ref: Any,
            o_ref: Any,
            m_sc: Any,
            l_sc: Any,
            acc_sc: Any,
        ) -> None:
            h, qi, ki = pl.program_id(1), pl.program_id(2), pl.program_id(3)
            kind = kind_ref[(h * nq + qi) * nk + ki]

            @pl.when(ki == 0)
            def _() -> None:
                init(m_sc, l_sc, acc_sc)

            if masked_full:

                @pl.when(kind != 0)
                def _() -> None:
                    update(q_ref, k_ref, v_ref, m_sc, l_sc, acc_sc, qi, ki, params_for(h, hp_ref))
            else:

                @pl.when(kind == 2)
                def _() -> None:
                    update(q_ref, k_ref, v_ref, m_sc, l_sc, acc_sc, qi, ki, None)

                @pl.when(kind == 1)
                def _() -> None:
                    update(q_ref, k_ref, v_ref, m_sc, l_sc, acc_sc, qi, ki, params_for(h, hp_ref))

            @pl.when(ki == nk - 1)
            def _() -> None:
                finish(o_ref, l_sc, acc_sc)

        grid_spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(B, H, nq, nk),
            in_specs=[
                pl.BlockSpec((1, 1, bq, D), lambda b, h, i, j, *_: (b, h, i, 0)),
                pl.BlockSpec((1, 1, bkv, D), lambda b, h, i, j, *_: (b, h, j, 0)),
                pl.BlockSpec((1, 1, bkv, D), lambda b, h, i, j, *_: (b, h, j, 0)),
            ],
            out_specs=pl.BlockSpec((1, 1, bq, D), lambda b, h, i, j, *_: (b, h, i, 0)),
            scratch_shapes=scratch,
        )
        semantics = ("parallel", "parallel", "parallel", "arbitrary")
        kernel_fn = dense_grid_kernel

    call = pl.pallas_call(
        kernel_fn,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=semantics),
        interpret=pltpu.InterpretParams() if interpret else False,
        name=f"tiletune_{config.variant}",
    )
    return call(*prefetch, q, k, v)
