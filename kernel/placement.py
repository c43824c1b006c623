"""Token placement: where each token of a head sits in the kernel's sequence.

The kernel does not see the model's token order directly. A placement decides
 - the order of the video tokens: ``frame_major`` (the model's order, token
   (f, p) at ``f*P + p``) or ``temporal_major`` (token (f, p) at ``p*F + f``,
   which turns a temporal head's mask into a band around the diagonal);
 - for temporal heads with a first-frame sink, ``sink_first``: frame 0 stays a
   contiguous block ahead of the temporal-major frames 1..F-1. Otherwise the
   sink keys would be scattered every F slots and touch every kv tile, making
   every tile of such a head partial;
 - the frame stride: with ``align="frame"`` every frame is padded to a multiple
   of the alignment unit so frame boundaries fall on tile boundaries (and a text
   prefix is padded the same way so the video starts on a tile boundary).
Padding slots hold zeros, are never attended, and their outputs are dropped.

The video region is a list of :class:`Segment` s, each frame-major or
temporal-major; a slot decodes to (is_text, is_video, frame, position) with one
truncating division per segment, using operators only so numpy, jnp and the
Pallas kernel share :meth:`TokenPlacement.decode`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from kernel.layout import VideoLayout

TokenOrder = Literal["frame_major", "temporal_major"]
TOKEN_ORDERS: tuple[str, ...] = ("frame_major", "temporal_major")


def round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


@dataclasses.dataclass(frozen=True)
class Segment:
    """Frames ``[first_frame, first_frame + frames)`` placed from slot ``start`` (video-relative).

    Frame-major: (f, p) at ``start + (f - first_frame) * stride + p`` (stride >= P).
    Temporal-major: (f, p) at ``start + p * frames + (f - first_frame)``.
    """

    start: int
    first_frame: int
    frames: int
    frame_major: bool
    stride: int

    def slots(self, tokens_per_frame: int) -> int:
        return self.frames * self.stride if self.frame_major else tokens_per_frame * self.frames


@dataclasses.dataclass(frozen=True)
class TokenPlacement:
    """Placement of one layout's tokens in slots ``[0, length)``."""

    layout: VideoLayout
    order: TokenOrder = "frame_major"
    frame_stride: int = 0  # slots per frame -- >= tokens_per_frame
    text_stride: int = 0  # slots reserved for a text prefix -- >= text_tokens
    sink_first: bool = False  # temporal_major only: frame 0 first, contiguous

    def __post_init__(self) -> None:
        lay = self.layout
        if self.order not in TOKEN_ORDERS:
            raise ValueError(f"order must be one of {TOKEN_ORDERS}, got {self.order!r}")
        if self.frame_stride == 0:
            object.__setattr__(self, "frame_stride", lay.tokens_per_frame)
        if self.text_stride == 0 and lay.text_position == "prefix":
            object.__setattr__(self, "text_stride", lay.text_tokens)
        if self.frame_stride < lay.tokens_per_frame:
            raise ValueError("frame_stride must be >= tokens_per_frame")
        if lay.text_position == "prefix" and self.text_stride < lay.text_tokens:
            raise ValueError("text_stride must be >= text_tokens")
        if lay.text_position == "suffix" and self.text_stride != 0:
            raise ValueError("text_stride only applies to a text prefix")
        if self.sink_first and self.order != "temporal_major":
            raise ValueError("sink_first only applies to the temporal_major order")

    @classmethod
    def build(
        cls, layout: VideoLayout, order: TokenOrder, align_unit: int = 0, sink_first: bool = False
    ) -> TokenPlacement:
        """Placement with frames (and a text prefix) padded to ``align_unit``."""
        if align_unit <= 0:
            return cls(layout, order, sink_first=sink_first)
        prefix = layout.text_position == "prefix"
        text_stride = round_up(layout.text_tokens, align_unit) if prefix else 0
        return cls(layout, order, round_up(layout.tokens_per_frame, align_unit), text_stride, sink_first)

    @functools.cached_property
    def segments(self) -> tuple[Segment, ...]:
        F = self.layout.frames
        if self.order == "frame_major":
            return (Segment(0, 0, F, True, self.frame_stride),)
        if not self.sink_first:
            return (Segment(0, 0, F, False, F),)
        first = Segment(0, 0, 1, True, self.frame_stride)
        return (first,) if F == 1 else (first, Segment(self.frame_stride, 1, F - 1, False, F - 1))

    @property
    def video_start(self) -> int:
        return self.text_stride

    @property
    def video_slots(self) -> int:
        return self.layout.frames * self.frame_stride

    @property
    def text_start(self) -> int:
        return 0 if self.layout.text_position == "prefix" else self.video_start + self.video_slots

    @property
    def length(self) -> int:
        """Number of slots before padding to a block multiple."""
        lay = self.layout
        return self.text_stride + self.video_slots + (lay.text_tokens if lay.text_position == "suffix" else 0)

    def decode(self, slot: Any) -> tuple[Any, Any, Any, Any]:
        """slot -> (is_text, is_video, frame, position), with operators only.

        Frame and position of non-video slots are garbage and must be masked by
        the caller (truncating division of negative offsets included).
        """
        lay = self.layout
        P = lay.tokens_per_frame
        v = slot - self.video_start
        is_video: Any = None
        frame: Any = None
        position: Any = None
        for seg in self.segments:
            local = v - seg.start
            major, minor = _divmod_trunc(local, seg.stride)
            if seg.frame_major:
                f, p = major + seg.first_frame, minor
                inside = (local >= 0) & (local < seg.slots(P)) & (minor < P)
            else:
                f, p = minor + seg.first_frame, major
                inside = (local >= 0) & (local < seg.slots(P))
            if is_video is None:
                is_video, frame, position = inside, f, p
            else:
                frame, position = _where(inside, f, frame), _where(inside, p, position)
                is_video = is_video | inside
        is_text = (slot >= self.text_start) & (slot < self.text_start + lay.text_tokens)
        return is_text, is_video, frame, position

    def token_slots(self) -> np.ndarray:
        """For each token of the model's order, the slot it occupies."""
        lay = self.layout
        is_text, frame, position = lay.token_coords()
        slots = self.text_start + np.arange(lay.seq_len) - lay.text_start
        for seg in self.segments:
            mine = ~is_text & (frame >= seg.first_frame) & (frame < seg.first_frame + seg.frames)
            rel = frame - seg.first_frame
            local = rel * seg.stride + position if seg.frame_major else position * seg.frames + rel
            slots = np.where(mine, self.video_start + seg.start + local, slots)
        return slots.astype(np.int32)

    def slot_tokens(self, padded_length: int) -> np.ndarray:
        """For each of ``padded_length`` slots, its token index or -1 (padding)."""
        if padded_length < self.length:
            raise ValueError("padded_length must cover the placement")
        out = np.full(padded_length, -1, np.int32)
        out[self.token_slots()] = np.arange(self.layout.seq_len, dtype=np.int32)
        return out


def decode_any(placements: tuple[TokenPlacement, ...], slot: Any, code: Any) -> tuple[Any, Any, Any, Any]:
    """Decode with ``placements[code]``; ``code`` may be a traced / array value.

    Heads of one kernel call may be placed differently (only their video order
    differs); a data-driven code selects per head. A Python int decodes once.
    """
    if isinstance(code, int):
        return placements[code].decode(slot)
    decoded = [p.decode(slot) for p in placements]
    is_text, is_video, frame, position = decoded[0]
    for i in range(1, len(decoded)):
        chosen = code == i
        # Boolean results are chosen with logic, not a select: Mosaic cannot legalize
        # ``arith.select`` on i1 vectors (the compile for TPU fails though the lowering passes).
        is_text = (chosen & decoded[i][0]) | (~chosen & is_text)
        is_video = (chosen & decoded[i][1]) | (~chosen & is_video)
        frame, position = _where(chosen, decoded[i][2], frame), _where(chosen, decoded[i][3], position)
    return is_text, is_video, frame, position


def _where(cond: Any, a: Any, b: Any) -> Any:
    if isinstance(cond, np.ndarray | np.bool_ | bool) and isinstance(a, np.ndarray | np.integer | int):
        return np.where(cond, a, b)
    return jnp.where(cond, a, b)


def _divmod_trunc(x: Any, d: int) -> tuple[Any, Any]:
    """Truncating (C-style) divmod: ``lax.div`` is what lowers for TPU vectors."""
    if isinstance(x, np.ndarray | np.integer | int):
        q = np.sign(x) * (np.abs(x) // d)
    else:
        q = jax.lax.div(x, jnp.asarray(d, dtype=x.dtype))
    return q, x - q * d
