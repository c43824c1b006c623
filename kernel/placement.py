"""Token placement: where each token of a head sits in the kernel's sequence.

The kernel does not see the model's token order directly. A placement decides
 - the order of the video tokens: ``frame_major`` (the model's order, token
   (f, p) at ``f*P + p``) or ``temporal_major`` (token (f, p) at ``p*F + f``,
   which turns a temporal head's mask into a band around the diagonal);
 - the frame stride: with ``align="frame"`` every frame is padded to a multiple
   of the alignment unit so frame boundaries fall on tile boundaries (and a text
   prefix is padded the same way so the video starts on a tile boundary).
Padding slots hold zeros, are never attended, and their outputs are dropped.

Slot ``x`` of the placed sequence decodes to (is_text, is_video, frame, position)
with one integer division; :meth:`TokenPlacement.decode` does it with operators
only, so numpy, jnp and the Pallas kernel share it.
"""

from __future__ import annotations

import dataclasses
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
class TokenPlacement:
    """Placement of one layout's tokens in slots ``[0, length)``."""

    layout: VideoLayout
    order: TokenOrder = "frame_major"
    frame_stride: int = 0  # slots per frame (frame_major) -- >= tokens_per_frame
    text_stride: int = 0  # slots reserved for a text prefix -- >= text_tokens

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

    @classmethod
    def build(cls, layout: VideoLayout, order: TokenOrder, align_unit: int = 0) -> TokenPlacement:
        """Placement with frames (and a text prefix) padded to ``align_unit``."""
        if align_unit <= 0:
            return cls(layout, order)
        text_stride = round_up(layout.text_tokens, align_unit) if layout.text_position == "prefix" else 0
        return cls(layout, order, round_up(layout.tokens_per_frame, align_unit), text_stride)

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

    @property
    def minor_stride(self) -> int:
        """Divisor that splits a video slot into (major, minor) coordinates."""
        return self.frame_stride if self.order == "frame_major" else self.layout.frames

    def decode(self, slot: Any, temporal: Any = None) -> tuple[Any, Any, Any, Any]:
        """slot -> (is_text, is_video, frame, position), with operators only.

        ``temporal`` overrides the order: a Python bool, or an array / traced
        scalar when heads of one kernel call are placed in different orders (all
        placements of one call share strides, only the order differs). Frame and
        position of non-video slots are garbage and must be masked by the caller.
        """
        lay = self.layout
        if temporal is None:
            temporal = self.order == "temporal_major"
        v = slot - self.video_start
        if isinstance(temporal, bool):
            stride = lay.frames if temporal else self.frame_stride
            major, minor = _divmod_trunc(v, stride)
            frame, position = (minor, major) if temporal else (major, minor)
            used = lay.video_tokens if temporal else self.video_slots
            is_video = (v >= 0) & (v < used) & (minor < (lay.frames if temporal else lay.tokens_per_frame))
        else:
            stride_arr = temporal * lay.frames + (1 - temporal) * self.frame_stride
            major = _div_trunc_by(v, stride_arr)
            minor = v - major * stride_arr
            frame = temporal * minor + (1 - temporal) * major
            position = temporal * major + (1 - temporal) * minor
            used = temporal * lay.video_tokens + (1 - temporal) * self.video_slots
            minors = temporal * lay.frames + (1 - temporal) * lay.tokens_per_frame
            is_video = (v >= 0) & (v < used) & (minor < minors)
        is_text = (slot >= self.text_start) & (slot < self.text_start + lay.text_tokens)
        return is_text, is_video, frame, position

    def token_slots(self) -> np.ndarray:
        """For each token of the model's order, the slot it occupies."""
        lay = self.layout
        is_text, frame, position = lay.token_coords()
        t = np.arange(lay.seq_len) - lay.text_start
        if self.order == "frame_major":
            video_slot = self.video_start + frame * self.frame_stride + position
        else:
            video_slot = self.video_start + position * lay.frames + frame
        return np.where(is_text, self.text_start + t, video_slot).astype(np.int32)

    def slot_tokens(self, padded_length: int) -> np.ndarray:
        """For each of ``padded_length`` slots, its token index or -1 (padding)."""
        if padded_length < self.length:
            raise ValueError("padded_length must cover the placement")
        out = np.full(padded_length, -1, np.int32)
        out[self.token_slots()] = np.arange(self.layout.seq_len, dtype=np.int32)
        return out


def _div_trunc_by(x: Any, d: Any) -> Any:
    """Truncating division by a per-element divisor (numpy or jnp)."""
    if isinstance(x, np.ndarray | np.integer | int):
        return np.sign(x) * (np.abs(x) // d)
    x, d = jnp.broadcast_arrays(x, jnp.asarray(d, dtype=x.dtype))
    return jax.lax.div(x, d)


def _divmod_trunc(x: Any, d: int) -> tuple[Any, Any]:
    """Truncating (C-style) divmod: ``lax.div`` is what lowers for TPU vectors."""
    if isinstance(x, np.ndarray | np.integer | int):
        q = np.sign(x) * (np.abs(x) // d)
    else:
        q = jax.lax.div(x, jnp.asarray(d, dtype=x.dtype))
    return q, x - q * d
