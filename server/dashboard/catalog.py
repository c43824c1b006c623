"""The figures of a workload by name, with their captions and pixel sizes, without drawing anything.

What the pages need to lay the figures out (the ``<img>`` sizes, the captions), kept apart
from :mod:`server.dashboard.figures` so that the server process, which only serves pages and
PNG bytes drawn by its children (:mod:`server.dashboard.renderer`), never imports matplotlib
or JAX. Every size is a function of the :class:`TuningRecord` alone, and the figures are drawn
at exactly these sizes.
"""

from __future__ import annotations

from server.store.records import TuningRecord

NAMES = ("history", "heatmap", "blockmap", "speedup")  # page order
CAPTIONS = {
    "history": "Search history: median time of every trial and the best so far; failures marked along the top.",
    "heatmap": "Best time per block_q x block_kv cell, per variant and layout (the other parameters at their best).",
    "blockmap": "Tiles of each head class at the winning tile sizes: empty, partial (masked) and full, "
    "with and without the temporal-major permutation.",
    "speedup": "The winner's speedup over dense attention (re-timed beside it; whiskers p10-p90), "
    "beside the fastest trials.",
}

HISTORY_SIZE = (900, 420)
SPEEDUP_SIZE = (900, 380)
HEATMAP_PANEL = (330, 300)
HEATMAP_EXTRA = (120, 70)  # colour bar, suptitle
BLOCKMAP_PANEL = (380, 380)
BLOCKMAP_EXTRA = (40, 90)
MAX_CLASS_ROWS = 16  # head classes drawn in a block map; the rest are counted in the title


def facets(record: TuningRecord) -> tuple[list[str], list[str]]:
    """The heatmap's panel rows (variants) and columns (layouts) among the recorded trials."""
    variants = sorted({str(t.params.get("variant")) for t in record.trials if t.params.get("variant")})
    layouts = sorted({str(t.params.get("layout")) for t in record.trials if t.params.get("layout")})
    return variants or ["-"], layouts or ["-"]


def heatmap_size(record: TuningRecord) -> tuple[int, int]:
    variants, layouts = facets(record)
    return (
        HEATMAP_PANEL[0] * len(layouts) + HEATMAP_EXTRA[0],
        HEATMAP_PANEL[1] * len(variants) + HEATMAP_EXTRA[1],
    )


def blockmap_size(record: TuningRecord) -> tuple[int, int]:
    classes = min(len(record.workload.pattern.classes()), MAX_CLASS_ROWS)
    return BLOCKMAP_PANEL[0] * 2 + BLOCKMAP_EXTRA[0], BLOCKMAP_PANEL[1] * classes + BLOCKMAP_EXTRA[1]


def sizes(record: TuningRecord) -> dict[str, tuple[int, int]]:
    """Pixel size of every figure of ``record``."""
    return {
        "history": HISTORY_SIZE,
        "heatmap": heatmap_size(record),
        "blockmap": blockmap_size(record),
        "speedup": SPEEDUP_SIZE,
    }
