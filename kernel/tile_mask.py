"""The element mask of a partial tile, computed from slot indices and head parameters.

Shared by the XLA backend and the Pallas kernel: no stored mask is ever read;
each partial tile decodes its slots (one integer division each) and applies the
head's rule. Head parameters are Python ints when a call serves one pattern
(the rule is specialised at trace time) or arrays / SMEM scalars otherwise.
"""

from __future__ import annotations

from typing import Any

from kernel.pattern import video_allows
from kernel.placement import TokenPlacement


def tile_mask(
    geometry: TokenPlacement,
    q_slot: Any,
    kv_slot: Any,
    kind: Any,
    window: Any,
    sink: Any,
    temporal: Any,
) -> Any:
    """Boolean mask (broadcast of q_slot and kv_slot): may query slot attend key slot.

    A padding key is never attended. Padding queries get an arbitrary row (their
    output is dropped).
    """
    q_text, q_video, qf, qp = geometry.decode(q_slot, temporal)
    k_text, k_video, kf, kp = geometry.decode(kv_slot, temporal)
    rule = video_allows(kind, window, sink, qf, qp, kf, kp, geometry.layout.tokens_per_frame)
    return (k_text | k_video) & (q_text | k_text | (q_video & k_video & rule))
