"""Head patterns and SparsityPattern: which video tokens each head attends to.

Every rule here is bidirectional. Text tokens (when the layout has any) attend to
everything and are attended by everything; the rules below only decide
video-to-video pairs. ``first_frame_sink`` additionally lets every query attend
every key of frame 0.

The rule is written once, in :func:`video_allows`, with plain array operators so
the same code runs on numpy arrays (reference, block tables), on jnp arrays (the
XLA backend) and inside the Pallas kernel (partial tiles).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Sequence
from typing import Any, Literal

from kernel.layout import VideoLayout

PatternKind = Literal["dense", "spatial", "temporal", "band"]

# Integer codes used where the kind has to live in an array (kernel scalars).
KIND_CODES: dict[str, int] = {"dense": 0, "spatial": 1, "temporal": 2, "band": 3}
_WINDOW_FIELD: dict[str, str | None] = {
    "dense": None,
    "spatial": "window_frames",
    "temporal": "window_positions",
    "band": "tokens",
}


@dataclasses.dataclass(frozen=True)
class HeadPattern:
    """The sparsity rule of one head.

    Use the constructors: :meth:`spatial`, :meth:`temporal`, :meth:`dense`,
    :meth:`band`. ``window`` means ``window_frames`` for spatial heads,
    ``window_positions`` for temporal heads and ``tokens`` for band heads.
    """

    kind: PatternKind
    window: int = 0
    first_frame_sink: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KIND_CODES:
            raise ValueError(f"HeadPattern.kind must be one of {sorted(KIND_CODES)}, got {self.kind!r}")
        if isinstance(self.window, bool) or not isinstance(self.window, int):
            raise ValueError(f"HeadPattern.window must be an integer, got {self.window!r}")
        if not isinstance(self.first_frame_sink, bool):
            raise ValueError(f"HeadPattern.first_frame_sink must be a bool, got {self.first_frame_sink!r}")
        field = _WINDOW_FIELD[self.kind]
        if self.kind == "dense" and self.window != 0:
            raise ValueError("HeadPattern: a dense head takes no window")
        if self.kind == "band" and self.window < 1:
            raise ValueError(f"HeadPattern.band: tokens must be >= 1, got {self.window}")
        if self.kind in ("spatial", "temporal") and self.window < 0:
            raise ValueError(f"HeadPattern.{self.kind}: {field} must be >= 0, got {self.window}")

    @classmethod
    def spatial(cls, window_frames: int = 0, first_frame_sink: bool = False) -> HeadPattern:
        """Query (f, p) attends key (f', p') iff |f - f'| <= window_frames."""
        return cls("spatial", window_frames, first_frame_sink)

    @classmethod
    def temporal(cls, window_positions: int = 0, first_frame_sink: bool = False) -> HeadPattern:
        """Query (f, p) attends key (f', p') iff |p - p'| <= window_positions."""
        return cls("temporal", window_positions, first_frame_sink)

    @classmethod
    def dense(cls, first_frame_sink: bool = False) -> HeadPattern:
        return cls("dense", 0, first_frame_sink)

    @classmethod
    def band(cls, tokens: int, first_frame_sink: bool = False) -> HeadPattern:
        """SVG's exact spatial form: |i - j| < tokens in frame-major video order."""
        return cls("band", tokens, first_frame_sink)

    @property
    def code(self) -> int:
        return KIND_CODES[self.kind]

    def check_against(self, layout: VideoLayout, where: str = "head") -> None:
        """Raise ValueError when the window does not fit the layout."""
        limits = {
            "spatial": (0, layout.frames - 1),
            "temporal": (0, layout.tokens_per_frame - 1),
            "band": (1, layout.video_tokens),
        }
        if self.kind in limits:
            lo, hi = limits[self.kind]
            if not lo <= self.window <= hi:
                raise ValueError(
                    f"{where}: {self.kind} {_WINDOW_FIELD[self.kind]}={self.window} is out of "
                    f"range [{lo}, {hi}] for a layout of {layout.frames} frames x "
                    f"{layout.tokens_per_frame} tokens (a wider window is a dense head)"
                )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        field = _WINDOW_FIELD[self.kind]
        if field is not None:
            out[field] = int(self.window)
        out["first_frame_sink"] = bool(self.first_frame_sink)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HeadPattern:
        if not isinstance(data, dict):
            raise ValueError(f"head pattern must be an object, got {type(data).__name__}")
        kind = data.get("kind")
        if kind not in KIND_CODES:
            raise ValueError(f"head pattern: kind must be one of {sorted(KIND_CODES)}, got {kind!r}")
        field = _WINDOW_FIELD[kind]
        allowed = {"kind", "first_frame_sink"} | ({field} if field else set())
        unknown = set(data) - allowed
        if unknown:
            raise ValueError(f"head pattern ({kind}): unknown field(s) {sorted(unknown)}")
        if field is not None and field not in data:
            raise ValueError(f"head pattern ({kind}): field {field!r} is required")
        window = data.get(field, 0) if field else 0
        return cls(kind, window, data.get("first_frame_sink", False))

    def describe(self) -> str:
        field = _WINDOW_FIELD[self.kind]
        text = self.kind if field is None else f"{self.kind}({field}={self.window})"
        return text + ("+sink" if self.first_frame_sink else "")


def video_allows(kind: Any, window: Any, sink: Any, fq: Any, pq: Any, fk: Any, pk: Any, tokens_per_frame: int) -> Any:
    """Whether video query (fq, pq) may attend video key (fk, pk).

    ``kind``/``window``/``sink`` are either Python ints (one known head: the rule
    is specialised at trace time) or arrays/traced scalars (a data-driven rule for
    heads that share one kernel call). Coordinates may be numpy or jnp arrays that
    broadcast together. Only operators are used so every array library works.
    """
    if isinstance(kind, int):
        if kind == KIND_CODES["dense"]:
            ok = (fq == fq) | (fk == fk)  # all-true, in the broadcast shape
        elif kind == KIND_CODES["spatial"]:
            ok = abs(fq - fk) <= window
        elif kind == KIND_CODES["temporal"]:
            ok = abs(pq - pk) <= window
        else:
            ok = abs((fq * tokens_per_frame + pq) - (fk * tokens_per_frame + pk)) < window
        return (ok | (fk == 0)) if sink else ok
    ok = (
        (kind == KIND_CODES["dense"])
        | ((kind == KIND_CODES["spatial"]) & (abs(fq - fk) <= window))
        | ((kind == KIND_CODES["temporal"]) & (abs(pq - pk) <= window))
        | ((kind == KIND_CODES["band"]) & (abs((fq * tokens_per_frame + pq) - (fk * tokens_per_frame + pk)) < window))
    )
    return ok | ((sink != 0) & (fk == 0))


@dataclasses.dataclass(frozen=True)
class SparsityPattern:
    """A VideoLayout and one HeadPattern per head (``heads[h]`` is head ``h``)."""

    layout: VideoLayout
    heads: tuple[HeadPattern, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.layout, VideoLayout):
            raise ValueError("SparsityPattern.layout must be a VideoLayout")
        heads = tuple(self.heads)
        object.__setattr__(self, "heads", heads)
        if not heads:
            raise ValueError("SparsityPattern.heads must name at least one head")
        for h, head in enumerate(heads):
            if not isinstance(head, HeadPattern):
                raise ValueError(f"SparsityPattern.heads[{h}] must be a HeadPattern")
            head.check_against(self.layout, where=f"SparsityPattern.heads[{h}]")

    @classmethod
    def uniform(cls, layout: VideoLayout, head: HeadPattern, num_heads: int) -> SparsityPattern:
        return cls(layout, (head,) * num_heads)

    @classmethod
    def grouped(cls, layout: VideoLayout, groups: Sequence[tuple[HeadPattern, int]]) -> SparsityPattern:
        """Build from (pattern, count) groups, heads numbered group after group."""
        heads: list[HeadPattern] = []
        for head, count in groups:
            heads.extend([head] * count)
        return cls(layout, tuple(heads))

    @property
    def num_heads(self) -> int:
        return len(self.heads)

    @property
    def seq_len(self) -> int:
        return self.layout.seq_len

    def classes(self) -> dict[HeadPattern, list[int]]:
        """Distinct head patterns -> the heads that use them (first-seen order)."""
        out: dict[HeadPattern, list[int]] = {}
        for h, head in enumerate(self.heads):
            out.setdefault(head, []).append(h)
        return out

    def canonical(self) -> dict[str, Any]:
        """The canonical JSON-able form; equal patterns give equal forms."""
        return {"layout": self.layout.to_dict(), "heads": [h.to_dict() for h in self.heads]}

    def to_json(self) -> str:
        return json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))

    @functools.cached_property  # frozen: computed once (a lookup asks for it several times)
    def pattern_hash(self) -> str:
        """Stable hash of the canonical JSON (independent of key order on input)."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:32]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SparsityPattern:
        if not isinstance(data, dict):
            raise ValueError("sparsity pattern must be an object with 'layout' and 'heads'")
        unknown = set(data) - {"layout", "heads"}
        if unknown:
            raise ValueError(f"sparsity pattern: unknown field(s) {sorted(unknown)}")
        if not isinstance(data.get("layout"), dict):
            raise ValueError("sparsity pattern: field 'layout' must be an object")
        heads = data.get("heads")
        if not isinstance(heads, list):
            raise ValueError("sparsity pattern: field 'heads' must be a list")
        return cls(VideoLayout.from_dict(data["layout"]), tuple(HeadPattern.from_dict(h) for h in heads))

    @classmethod
    def from_json(cls, text: str) -> SparsityPattern:
        return cls.from_dict(json.loads(text))

    def describe(self) -> str:
        lay = self.layout
        text = f"{lay.frames}x{lay.tokens_per_frame}"
        if lay.text_tokens:
            text += f"+{lay.text_tokens} text {lay.text_position}"
        groups = ", ".join(f"{len(hs)}x {p.describe()}" for p, hs in self.classes().items())
        return f"{text}; heads: {groups}"
