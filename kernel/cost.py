"""What a config costs apart from its time: the tie-breakers between configs whose times are tied.

When two configs are within each other's noise, the one that pads the sequence
less and walks fewer grid steps is preferred: it does less work for the same
measured time, so it is the safer bet on a quieter machine or a larger batch.
Padding is :func:`kernel.candidates.padding`; grid steps are counted here from
the block tables, the way each backend walks them.
"""

from __future__ import annotations

from kernel.attention import head_groups, prepare_group
from kernel.block_tables import BlockTables
from kernel.config import TileConfig
from kernel.pattern import SparsityPattern
from kernel.workload import KERNEL_VERSIONS
from kernel.xla_backend import scan_plan


def grid_steps(pattern: SparsityPattern, config: TileConfig, backend: str, kernel_version: str | None = None) -> int:
    """Tile visits of one batch element over all of ``config``'s kernel calls.

    - Pallas (``tpu``, ``interpret``): ``compact`` visits every non-empty tile once;
      ``naive`` and ``split`` run the dense grid (every tile, empty ones skipped inside).
    - ``xla``: the scans of :func:`kernel.xla_backend.scan_plan`, each row padded to its
      scan's longest. ``kernel_version`` (default: the backend's current one) counts what
      that version walked: ``xla`` version 1 ran one scan per walk, every row padded to
      the call's longest, and tables recorded on it are replayed with that count.
    """
    version = kernel_version or KERNEL_VERSIONS[backend]
    total = 0
    for heads in head_groups(pattern, config):
        tables = prepare_group(pattern, heads, config)[2]
        if backend == "xla" and version == "1":
            if config.variant == "naive":
                total += _padded_row_steps(tables, None)
            else:
                total += _padded_row_steps(tables, True) + _padded_row_steps(tables, False)
        elif backend == "xla":
            total += sum(scan.steps(tables.num_heads) for scan in scan_plan(tables, config.variant))
        elif config.variant == "compact":
            total += max(1, sum(t.num_tiles for t in tables.heads))
        else:
            total += tables.num_heads * tables.num_q_blocks * tables.num_kv_blocks
    return total


def _padded_row_steps(tables: BlockTables, full: bool | None) -> int:
    """heads x q-blocks x the longest row's count of (full / partial / all) non-empty tiles."""
    return tables.num_heads * tables.num_q_blocks * int(tables.row_counts(full).max(initial=0))
