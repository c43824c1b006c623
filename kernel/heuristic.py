"""The heuristic default TileConfig, used when no tuned config is given.

Rules (each from the TPU study in DESIGN.md section 1 or from the CPU benches):
 - ``compact`` traversal: the grid only visits non-empty tiles (fastest variant).
 - temporal heads in ``temporal_major`` order: their mask becomes a diagonal band.
 - one call per head pattern: rows of one pattern have similar lengths, so no
   head pays for another's longer kv lists.
 - frame alignment when the padded sequence (frames and a text prefix rounded up
   to whole tiles) has at most 1/8 extra tokens: full tiles stay full instead of
   straddling a frame boundary.
 - tiles: 128 x 128 on the XLA backend (CPU caches); on TPU 512-row q tiles and
   512-wide kv tiles computed in 512-wide sub-blocks (large DMAs amortise the
   ~0.35 us per-step overhead); halved while rounding the sequence up to whole
   tiles would pad it by more than 1/8, down to the smallest tile the search
   space tries (32 on XLA; on TPU 128, and for the q tile of a short sequence
   the sublane count, see :func:`kernel.config.short_q_tiles`), so the heuristic
   is also its warm start. A short sequence whose every kv tile pads it by over
   the grid's 25% still finds its heuristic in the space: the space then admits
   the least padding any tile size gives.

A library client (autotune.client) replaces this by a tuned config; the kernel
never imports it.
"""

from __future__ import annotations

from math import lcm

from kernel.config import Align, Layout, TileConfig, short_q_tiles
from kernel.pattern import SparsityPattern
from kernel.placement import TokenPlacement, round_up

MAX_ALIGN_OVERHEAD = 0.125
MAX_TILE_PADDING = 0.125


def _tile(seq: int, largest: int, smallest: int) -> int:
    """The largest power-of-two tile in [smallest, largest] that pads ``seq`` by at most 1/8
    (the smallest one if none does)."""
    size = largest
    while size > smallest and round_up(seq, size) > seq * (1 + MAX_TILE_PADDING):
        size //= 2
    return size


def heuristic_config(pattern: SparsityPattern, backend: str = "xla", dtype: str = "float32") -> TileConfig:
    """A sane config for ``pattern`` on ``backend`` without any measurement."""
    seq = pattern.seq_len
    if backend == "xla":
        block_q = block_kv = _tile(seq, 128, 32)
    else:
        block_kv = _tile(seq, 512, 128)
        block_q = _tile(seq, 512, min(short_q_tiles(seq, dtype), default=128))
    layout: Layout = "temporal_major" if any(h.kind == "temporal" for h in pattern.heads) else "frame_major"
    unit = lcm(block_q, block_kv)
    # Alignment pads every frame, and a text prefix, to whole tiles: count all of it
    # (a one-token prefix padded to a 64-token tile is 63 slots of nothing).
    aligned = round_up(TokenPlacement.build(pattern.layout, "frame_major", unit).length, unit)
    align: Align = "frame" if aligned <= seq * (1 + MAX_ALIGN_OVERHEAD) else "none"
    return TileConfig(
        variant="compact",
        block_q=block_q,
        block_kv=block_kv,
        layout=layout,
        align=align,
        head_grouping="by_pattern",
    )
