"""TileConfig: the tunable parameters of one sparse attention call.

Frozen and validated at construction (as splash attention's BlockSizes), so an
illegal config never reaches a compile. Hardware rules (TPU lane/sublane
multiples) are checked separately by :meth:`TileConfig.check_tpu`, because the
``xla`` and ``interpret`` backends accept any positive block size.
:meth:`TileConfig.check_usable` is the whole rule for running a config that came
from elsewhere (a server, a cache file) on one sequence, backend and dtype.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Mapping
from math import lcm
from typing import Any, Literal

Variant = Literal["naive", "split", "compact"]
Layout = Literal["frame_major", "temporal_major"]
Align = Literal["none", "frame"]
HeadGrouping = Literal["all", "by_pattern"]

VARIANTS: tuple[str, ...] = ("naive", "split", "compact")
LAYOUTS: tuple[str, ...] = ("frame_major", "temporal_major")
ALIGNS: tuple[str, ...] = ("none", "frame")
HEAD_GROUPINGS: tuple[str, ...] = ("all", "by_pattern")

# TPU vregs are 8 sublanes x 128 lanes of 32 bits; bf16 packs 16 sublanes.
TPU_LANES = 128
TPU_SUBLANES = {"float32": 8, "bfloat16": 16}
MAX_BLOCK = 1 << 16
# Extra slots (padding the sequence to whole tiles, frame alignment) a search admits, as a
# fraction of the real tokens, while some config stays within it.
MAX_PADDING = 0.25
# Backends that run the Pallas kernel, whose blocks Mosaic tiles: interpret mode emulates the TPU.
TPU_TILED_BACKENDS: tuple[str, ...] = ("tpu", "interpret")


def max_tile(seq_len: int) -> int:
    """The largest tile worth using on a sequence of ``seq_len`` tokens: the smallest power
    of two >= ``seq_len``, and at least 128 (one TPU lane tile).

    One such tile already holds the whole sequence; a larger one only adds padding
    slots, which are computed and masked like real tokens (a 65536 x 65536 tile on a
    256-token sequence makes XLA plan tens of GB of temporaries). Powers of two,
    because the tiles of the candidate grids and of the heuristic are powers of two:
    the smallest one that covers the sequence is the largest tile a search can pick,
    and the heuristic never picks above it.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    return max(TPU_LANES, 1 << (seq_len - 1).bit_length())


def short_q_tiles(seq_len: int, dtype: str, max_padding: float = MAX_PADDING) -> tuple[int, ...]:
    """q tiles below one lane tile (128 rows) worth trying on TPU for a sequence of ``seq_len``
    tokens: the powers of two from the sublane count of ``dtype`` (8 rows for f32, 16 for
    bf16) to 64, only when a 128-row tile alone pads the sequence by more than
    ``max_padding`` (4 frames of 40 tokens: 160 tokens in 256 rows). Longer sequences keep
    tiles of at least 128 rows, whose larger DMAs win there.

    The kv tiles cannot shrink below 128 (the lane width of the score tile), but the q
    tile can, so a short sequence does not have to compute mostly padding rows.
    """
    if -(-seq_len // TPU_LANES) * TPU_LANES <= seq_len * (1 + max_padding):
        return ()
    size, tiles = TPU_SUBLANES.get(dtype, 8), []
    while size < TPU_LANES:
        tiles.append(size)
        size *= 2
    return tuple(tiles)


def params_key(params: Mapping[str, Any]) -> str:
    """Stable hash of a config's params (``TileConfig.to_dict()``): "the same params" of a
    study, of a job's trial reservations and of a recorded table."""
    text = json.dumps(dict(params), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclasses.dataclass(frozen=True)
class TileConfig:
    """Block sizes and traversal choices of the block-sparse kernel.

    - ``variant``: ``naive`` visits every tile and masks every non-empty one;
      ``split`` visits every tile, skipping the mask on full tiles; ``compact``
      walks only the non-empty tiles (scalar-prefetched lists).
    - ``block_q`` / ``block_kv``: tile shape; ``block_kv_compute``: the kv
      sub-block processed per inner step (divides ``block_kv``; 0 = block_kv).
    - ``layout``: ``temporal_major`` permutes the tokens of temporal heads so
      their mask becomes a diagonal band; other heads stay frame-major.
    - ``align``: ``frame`` pads every frame to a multiple of lcm(block_q,
      block_kv) so frame boundaries fall on tile boundaries.
    - ``head_grouping``: ``all`` heads in one call (rows padded to the longest
      where a backend needs it) or one call per distinct head pattern.
    """

    variant: Variant = "compact"
    block_q: int = 128
    block_kv: int = 128
    block_kv_compute: int = 0
    layout: Layout = "temporal_major"
    align: Align = "none"
    head_grouping: HeadGrouping = "by_pattern"

    def __post_init__(self) -> None:
        for name, allowed in (
            ("variant", VARIANTS),
            ("layout", LAYOUTS),
            ("align", ALIGNS),
            ("head_grouping", HEAD_GROUPINGS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"TileConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        for name in ("block_q", "block_kv", "block_kv_compute"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"TileConfig.{name} must be an integer, got {value!r}")
        if self.block_kv_compute == 0:
            object.__setattr__(self, "block_kv_compute", self.block_kv)
        for name in ("block_q", "block_kv", "block_kv_compute"):
            value = getattr(self, name)
            if not 1 <= value <= MAX_BLOCK:
                raise ValueError(f"TileConfig.{name} must be in [1, {MAX_BLOCK}], got {value}")
        if self.block_kv % self.block_kv_compute:
            raise ValueError(
                f"TileConfig.block_kv_compute ({self.block_kv_compute}) must divide block_kv ({self.block_kv})"
            )

    def check_tpu(self, dtype: str = "float32") -> None:
        """Raise ValueError unless Mosaic can tile these blocks on a TPU."""
        sub = TPU_SUBLANES.get(dtype, 8)
        if self.block_q % sub:
            raise ValueError(
                f"TileConfig.block_q ({self.block_q}) must be a multiple of {sub} on TPU for {dtype} (sublane tiling)"
            )
        for name in ("block_kv", "block_kv_compute"):
            if getattr(self, name) % TPU_LANES:
                raise ValueError(
                    f"TileConfig.{name} ({getattr(self, name)}) must be a multiple of "
                    f"{TPU_LANES} on TPU (lane tiling of the score tile)"
                )

    def check_usable(self, seq_len: int, backend: str, dtype: str) -> None:
        """Raise ValueError, naming the broken rule, unless this config may run a sequence of
        ``seq_len`` tokens on ``backend`` in ``dtype``.

        - ``block_q`` and ``block_kv`` are at most :func:`max_tile` of ``seq_len``
          (``block_kv_compute`` divides ``block_kv``, so it is bounded too);
        - with ``align="frame"`` every frame is padded to a multiple of
          :attr:`align_unit`, lcm(block_q, block_kv): it is bounded the same way
          (q 2047 / kv 2048 would pad every frame to 4,192,256 slots);
        - on ``tpu`` and ``interpret`` the TPU tiling rules (:meth:`check_tpu`).

        The heuristic's configs pass, and so does every config of the default candidate
        grids (powers of two) that the search's padding rule admits. This is the check
        for a config that came from elsewhere (the service, a cache file) before it runs.
        """
        bound = max_tile(seq_len)
        for name in ("block_q", "block_kv"):
            if getattr(self, name) > bound:
                raise ValueError(
                    f"TileConfig.{name} ({getattr(self, name)}) must be <= {bound} for a sequence of {seq_len} "
                    "tokens (the smallest power of two >= the sequence, at least 128: one tile holds it all)"
                )
        if self.align_unit > bound:
            raise ValueError(
                f"TileConfig.align='frame' pads every frame to a multiple of lcm(block_q, block_kv) = "
                f"{self.align_unit}, which must be <= {bound} for a sequence of {seq_len} tokens"
            )
        if backend in TPU_TILED_BACKENDS:
            self.check_tpu(dtype)

    @property
    def align_unit(self) -> int:
        """Slots a frame is padded to a multiple of (0 = no alignment)."""
        if self.align == "none":
            return 0
        return lcm(self.block_q, self.block_kv)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @functools.cached_property  # frozen: computed once
    def key(self) -> str:
        """:func:`params_key` of this config."""
        return params_key(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TileConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"TileConfig: unknown field(s) {sorted(unknown)}")
        return cls(**data)

    def describe(self) -> str:
        text = f"{self.variant} q{self.block_q} kv{self.block_kv}"
        if self.block_kv_compute != self.block_kv:
            text += f"/{self.block_kv_compute}"
        return f"{text} {self.layout} align={self.align} {self.head_grouping}"
