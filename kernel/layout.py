"""VideoLayout: how a video diffusion transformer lays out its tokens.

A sequence holds ``frames * tokens_per_frame`` video tokens in frame-major order
(video token ``i`` is frame ``i // P``, position ``i % P``) and ``text_tokens``
text tokens placed before (``prefix``) or after (``suffix``) the video.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import numpy as np

TextPosition = Literal["prefix", "suffix"]
TEXT_POSITIONS: tuple[str, ...] = ("prefix", "suffix")

# Beyond this a layout is a typo, not a model: 2**24 tokens already exceeds any
# video model's context, and int32 tile arithmetic stays far from overflow.
MAX_SEQ_LEN = 1 << 24


@dataclasses.dataclass(frozen=True)
class VideoLayout:
    """Shape of one attention sequence: ``frames x tokens_per_frame`` + text."""

    frames: int
    tokens_per_frame: int
    text_tokens: int = 0
    text_position: TextPosition = "suffix"

    def __post_init__(self) -> None:
        for name in ("frames", "tokens_per_frame", "text_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise ValueError(f"VideoLayout.{name} must be an integer, got {value!r}")
        if self.frames < 1:
            raise ValueError(f"VideoLayout.frames must be >= 1, got {self.frames}")
        if self.tokens_per_frame < 1:
            raise ValueError(f"VideoLayout.tokens_per_frame must be >= 1, got {self.tokens_per_frame}")
        if self.text_tokens < 0:
            raise ValueError(f"VideoLayout.text_tokens must be >= 0, got {self.text_tokens}")
        if self.text_position not in TEXT_POSITIONS:
            raise ValueError(f"VideoLayout.text_position must be one of {TEXT_POSITIONS}, got {self.text_position!r}")
        if self.seq_len > MAX_SEQ_LEN:
            raise ValueError(
                f"VideoLayout.seq_len = frames*tokens_per_frame + text_tokens = {self.seq_len} "
                f"exceeds the limit of {MAX_SEQ_LEN} tokens"
            )

    @property
    def video_tokens(self) -> int:
        return self.frames * self.tokens_per_frame

    @property
    def seq_len(self) -> int:
        return self.video_tokens + self.text_tokens

    @property
    def video_start(self) -> int:
        """Index of the first video token in the model's own token order."""
        return self.text_tokens if self.text_position == "prefix" else 0

    @property
    def text_start(self) -> int:
        return 0 if self.text_position == "prefix" else self.video_tokens

    def token_coords(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per token of the model's order: (is_text, frame, position); -1 for text."""
        idx = np.arange(self.seq_len, dtype=np.int64)
        v = idx - self.video_start
        is_text = (v < 0) | (v >= self.video_tokens)
        frame = np.where(is_text, -1, v // self.tokens_per_frame)
        position = np.where(is_text, -1, v % self.tokens_per_frame)
        return is_text, frame, position

    def to_dict(self) -> dict[str, Any]:
        return {
            "frames": int(self.frames),
            "tokens_per_frame": int(self.tokens_per_frame),
            "text_tokens": int(self.text_tokens),
            "text_position": self.text_position,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VideoLayout:
        known = {"frames", "tokens_per_frame", "text_tokens", "text_position"}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"VideoLayout: unknown field(s) {sorted(unknown)}")
        if "frames" not in data or "tokens_per_frame" not in data:
            raise ValueError("VideoLayout: fields 'frames' and 'tokens_per_frame' are required")
        return cls(**data)
