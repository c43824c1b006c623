"""The element mask of a partial tile, computed from slot indices and head parameters.

Shared by the XLA backend and the Pallas kernel: no stored mask is ever read;
each partial tile decodes its slots (one integer division each) and applies the
head's rule. Head parameters are Python ints when a call serves one pattern
(the rule is specialised at trace time) or arrays / SMEM scalars otherwise.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernel.pattern import video_allows
from kernel.placement import TokenPlacement, decode_any


def static_head_params(head_params: np.ndarray) -> tuple[int, ...] | None:
    """The shared (kind, window, sink, placement) when every head of a call has the same
    parameters, as Python ints so the rule is specialised at trace time; else None."""
    if (head_params == head_params[0]).all():
        return tuple(int(x) for x in head_params[0])
    return None


def tile_mask(
    placements: tuple[TokenPlacement, ...],
    q_slot: Any,
    kv_slot: Any,
    kind: Any,
    window: Any,
    sink: Any,
    placement: Any,
) -> Any:
    """Boolean mask (broadcast of q_slot and kv_slot): may query slot attend key slot.

    ``placements`` are the distinct placements of the call and ``placement`` the
    head's index into them. A padding key is never attended. Padding queries get
    an arbitrary row (their output is dropped).
    """
    q_text, q_video, qf, qp = decode_any(placements, q_slot, placement)
    k_text, k_video, kf, kp = decode_any(placements, kv_slot, placement)
    rule = video_allows(kind, window, sink, qf, qp, kf, kp, placements[0].layout.tokens_per_frame)
    return (k_text | k_video) & (q_text | k_text | (q_video & k_video & rule))
