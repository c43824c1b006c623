"""The ``xla`` backend: block tables executed by plain jnp/XLA.

Every (head, q-block) row of a scan is processed in parallel; a ``lax.scan``
walks the rows' kv-block lists (padded to the longest row of the scan) with an
online softmax. Full tiles and partial tiles are separate walks: the full-tile
walk does no masking work at all, the partial-tile walk builds each tile's mask
from slot indices (:mod:`kernel.tile_mask`). ``naive`` masks every non-empty
tile in one walk, as the study's first sparse variant does.

A walk splits its q-blocks into at most :data:`MAX_SCAN_GROUPS` scans by list
length (:func:`scan_plan`), so a few long rows do not pad every row to their
length. Text tokens make exactly such rows: a q-block holding text reaches
every kv block, and with one scan per walk (kernel version 1) every row of a
text workload walked every kv tile.

This is the timed objective on machines without an accelerator: its cost
really depends on the tile sizes (matmul shapes, gather volume, padding).
"""

from __future__ import annotations

import dataclasses
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
MAX_SCAN_GROUPS = 3  # scans per walk at most: each is one more sequential loop to compile and run
SCAN_SLACK = 0.1  # the fewest scans whose padded steps are within this share of the fewest possible


@dataclasses.dataclass(frozen=True)
class Scan:
    """One ``lax.scan``: the rows of ``q_blocks`` (all heads) walk ``length`` steps of one list.

    ``full`` picks the list (``True`` full tiles, ``False`` partial, ``None`` both).
    """

    full: bool | None
    q_blocks: np.ndarray  # int64, ascending
    length: int

    @property
    def masked(self) -> bool:
        """Whether the scan builds tile masks: a list holding partial tiles needs them."""
        return self.full is not True

    def steps(self, num_heads: int) -> int:
        return num_heads * int(self.q_blocks.shape[0]) * self.length


def scan_plan(tables: BlockTables, variant: str) -> tuple[Scan, ...]:
    """The scans the backend runs for one call: per walk, q-blocks grouped by list length.

    Scans with nothing to walk are left out. :func:`kernel.cost.grid_steps` counts these.
    """
    walks = [None] if variant == "naive" else [True, False]
    plan = []
    for full in walks:
        counts = tables.row_counts(full).max(axis=0)  # a q-block walks its longest head's list
        for q_blocks, length in length_groups(counts):
            plan.append(Scan(full, q_blocks, length))
    return tuple(plan)


def length_groups(counts: np.ndarray) -> list[tuple[np.ndarray, int]]:
    """Rows (indices into ``counts``) split into at most :data:`MAX_SCAN_GROUPS` groups
    of similar length, each padded to its longest: as (rows ascending, longest) with
    longest > 0.

    Groups are contiguous runs of the rows sorted by count, cut where the count
    changes; the split minimises the padded steps, and the fewest groups within
    :data:`SCAN_SLACK` of that minimum are kept. One group is every row in order.
    """
    n = int(counts.shape[0])
    if n == 0 or int(counts.max()) == 0:
        return []
    order = np.argsort(counts, kind="stable")
    ordered = counts[order]
    # A group [a, b) of the sorted rows pads to ordered[b - 1]; cuts only pay where the count rises.
    cuts = [0, *(int(i) for i in np.flatnonzero(np.diff(ordered)) + 1), n]
    cut = np.array(cuts, np.float64)
    top = np.array([0, *(int(ordered[b - 1]) for b in cuts[1:])], np.float64)  # top[j]: longest row before cut j
    m = len(cuts)
    # cost[k][j]: fewest padded steps covering the rows before cut j with k + 1 groups; back[k][j]: the last cut
    cost = np.full((MAX_SCAN_GROUPS, m), np.inf)
    back = np.zeros((MAX_SCAN_GROUPS, m), np.int64)
    cost[0, 1:] = cut[1:] * top[1:]
    for k in range(1, MAX_SCAN_GROUPS):
        for j in range(2, m):
            options = cost[k - 1, 1:j] + (cut[j] - cut[1:j]) * top[j]
            back[k, j] = 1 + int(np.argmin(options))
            cost[k, j] = options[back[k, j] - 1]
    total = cost[:, m - 1]
    k = int(np.flatnonzero(total <= total.min() * (1 + SCAN_SLACK))[0])
    if k == 0:
        return [(np.arange(n), int(ordered[-1]))]
    bounds, j = [], m - 1
    for level in range(k, -1, -1):
        i = int(back[level, j])
        bounds.append((cuts[i], cuts[j], int(top[j])))
        j = i
    return [(np.sort(order[a:b]), length) for a, b, length in reversed(bounds) if length > 0]


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

    def run(state: tuple[jax.Array, ...], scan: Scan) -> tuple[jax.Array, ...]:
        kv_index, _, valid = tables.padded_lists(full=scan.full, q_blocks=scan.q_blocks)
        rows = None if scan.q_blocks.shape[0] == nq else jnp.asarray(scan.q_blocks)
        qs = qb if rows is None else qb[:, :, rows]
        slots = q_slot if rows is None else q_slot[rows]
        masked = scan.masked

        def step(carry: tuple[jax.Array, ...], xs: tuple[jax.Array, jax.Array]) -> tuple[tuple[jax.Array, ...], None]:
            m, l, acc = carry
            idx, ok = xs  # [H, rows]
            gather = idx[None, :, :, None, None]
            kg = jnp.take_along_axis(kb, gather, axis=2)
            vg = jnp.take_along_axis(vb, gather, axis=2)
            s = jnp.einsum("bhiqd,bhikd->bhiqk", qs, kg, precision=precision, preferred_element_type=jnp.float32)
            if masked:
                kv_slot = idx[:, :, None, None] * bkv + jnp.arange(bkv, dtype=jnp.int32)
                mask = tile_mask(placements, slots[None], kv_slot, *params)
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
        if rows is None:
            state, _ = jax.lax.scan(step, state, xs)
            return state
        part, _ = jax.lax.scan(step, tuple(x[:, :, rows] for x in state), xs)
        return tuple(x.at[:, :, rows].set(y) for x, y in zip(state, part, strict=True))

    state: tuple[jax.Array, ...] = (
        jnp.full((B, H, nq, bq), MASK_VALUE, jnp.float32),
        jnp.zeros((B, H, nq, bq), jnp.float32),
        jnp.zeros((B, H, nq, bq, D), jnp.float32),
    )
    for scan in scan_plan(tables, config.variant):
        state = run(state, scan)
    _, l, acc = state
    out = jnp.where(l[..., None] > 0, acc / jnp.where(l > 0, l, 1.0)[..., None], 0.0)
    return out.reshape(B, H, Nq, D).astype(q.dtype)
