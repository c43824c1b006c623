"""What a config costs apart from its time: the tie-breakers between configs whose times are tied.

When two configs are within each other's noise, the one that pads the sequence
less and walks fewer grid steps is preferred: it does less work for the same
measured time, so it is the safer bet on a quieter machine or a larger batch.
Padding is :func:`kernel.candidates.padding`; grid steps are counted here from
the block tables, the way each backend walks them.
"""

from __future__ import annotations

import numpy as np

from kernel.attention import head_groups, prepare_group
from kernel.block_tables import BlockTables
from kernel.config import TileConfig
from kernel.pattern import SparsityPattern


def grid_steps(pattern: SparsityPattern, config: TileConfig, backend: str) -> int:
    """Tile visits of one batch element over all of ``config``'s kernel calls.

    - Pallas (``tpu``, ``interpret``): ``compact`` visits every non-empty tile once;
      ``naive`` and ``split`` run the dense grid (every tile, empty ones skipped inside).
    - ``xla``: every row walks its kv list padded to the longest row of the call, once
      for ``naive`` (full and partial tiles together), in two scans otherwise (full, partial).
    """
    total = 0
    for heads in head_groups(pattern, config):
        tables = prepare_group(pattern, heads, config)[2]
        if backend == "xla":
            if config.variant == "naive":
                total += _padded_row_steps(tables, None)
            else:
                total += _padded_row_steps(tables, True) + _padded_row_steps(tables, False)
        elif config.variant == "compact":
            total += max(1, sum(t.num_tiles for t in tables.heads))
        else:
            total += tables.num_heads * tables.num_q_blocks * tables.num_kv_blocks
    return total


def _padded_row_steps(tables: BlockTables, full: bool | None) -> int:
    """heads x q-blocks x the longest row's count of (full / partial / all) non-empty tiles."""
    nq = tables.num_q_blocks
    longest = 0
    for t in tables.heads:
        rows = np.repeat(np.arange(nq), t.row_lengths())
        keep = rows if full is None else rows[t.is_full == full]
        if keep.size:
            longest = max(longest, int(np.bincount(keep, minlength=nq).max()))
    return tables.num_heads * nq * longest
