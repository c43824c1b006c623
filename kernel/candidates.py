"""The candidate grid of TileConfigs per backend, and the rules that make a point invalid.

Every rule is checked before any compile, so an invalid point is never measured:
 - tiling rules: on TPU (and in TPU interpret mode, which emulates it) block_q a
   multiple of the sublane count (8 for f32, 16 for bf16), block_kv and
   block_kv_compute multiples of 128 lanes, block_kv_compute dividing block_kv
   (:meth:`kernel.config.TileConfig.check_tpu`);
 - padding: frame alignment and rounding the sequence up to whole tiles may add
   at most ``max_padding`` (25%) extra tokens, or, when no tile size of the grid
   does (a short sequence), no more than the least any does (:func:`padding_bound`);
 - memory (TPU): the kernel's VMEM per grid step and its scalar-prefetched SMEM
   tables within the chip generation's budget (:mod:`kernel.budget`).
On TPU, q tiles below 128 rows join the grid for short sequences only
(:func:`kernel.config.short_q_tiles`). Choices that cannot matter are left out: ``layout`` only when some head is
temporal, ``head_grouping`` only with several distinct head patterns, and on the
``xla`` backend ``split`` (the same XLA program as ``compact``) and
``block_kv_compute`` (always block_kv; 0 in the grid).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator, Sequence
from math import lcm
from typing import Any

from kernel.budget import budget_violation
from kernel.config import HEAD_GROUPINGS, MAX_PADDING, TileConfig, short_q_tiles
from kernel.layout import VideoLayout
from kernel.placement import TokenPlacement, round_up
from kernel.workload import BACKENDS, Workload

XLA_BLOCKS = (32, 64, 128, 256, 512)
TPU_BLOCKS_Q = (128, 256, 512, 1024, 2048)
TPU_BLOCKS_KV = (128, 256, 512, 1024, 2048)
TPU_BLOCKS_KV_COMPUTE = (128, 256, 512, 1024)


def tpu_like(backend: str) -> bool:
    """``tpu`` and ``interpret`` (TPU interpret mode) follow the TPU's tiling rules."""
    return backend != "xla"


def dimensions(
    workload: Workload, backend: str, blocks_q: Sequence[int] = (), blocks_kv: Sequence[int] = ()
) -> dict[str, tuple[Any, ...]]:
    """The choices of each TileConfig field for ``workload`` on ``backend`` (default tile sizes
    per backend unless ``blocks_q`` / ``blocks_kv`` are given)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    pattern = workload.pattern
    temporal = any(h.kind == "temporal" for h in pattern.heads)
    several = len(pattern.classes()) > 1
    tpu = tpu_like(backend)
    return {
        "variant": ("naive", "split", "compact") if tpu else ("naive", "compact"),
        "block_q": tuple(blocks_q)
        or ((*short_q_tiles(pattern.seq_len, workload.dtype), *TPU_BLOCKS_Q) if tpu else XLA_BLOCKS),
        "block_kv": tuple(blocks_kv) or (TPU_BLOCKS_KV if tpu else XLA_BLOCKS),
        "block_kv_compute": TPU_BLOCKS_KV_COMPUTE if tpu else (0,),
        "layout": ("frame_major", "temporal_major") if temporal else ("frame_major",),
        "align": ("none", "frame"),
        "head_grouping": HEAD_GROUPINGS if several else ("by_pattern",),
    }


def config_from(params: dict[str, Any]) -> TileConfig:
    """A TileConfig from grid params (``block_kv_compute`` 0 or missing = block_kv)."""
    params = dict(params)
    if params.get("block_kv_compute", 0) in (0, None):
        params["block_kv_compute"] = params["block_kv"]
    return TileConfig(**params)


def params_of(config: TileConfig, backend: str) -> dict[str, Any]:
    """The grid params of a config (inverse of :func:`config_from`)."""
    params = config.to_dict()
    if not tpu_like(backend):
        params["block_kv_compute"] = 0
    return params


def grid(dims: dict[str, tuple[Any, ...]]) -> Iterator[TileConfig]:
    """Every point of the grid, valid or not (only ``block_kv_compute`` dividing ``block_kv``)."""
    names = list(dims)
    for values in itertools.product(*(dims[n] for n in names)):
        params = dict(zip(names, values, strict=True))
        if params["block_kv_compute"] and params["block_kv"] % params["block_kv_compute"]:
            continue
        yield config_from(params)


def padding(workload: Workload, config: TileConfig) -> float:
    """Extra slots over real tokens, as a fraction (frame alignment and tile rounding)."""
    return _layout_padding(workload.pattern.layout, config.block_q, config.block_kv, config.align_unit)


def _layout_padding(layout: VideoLayout, block_q: int, block_kv: int, align_unit: int) -> float:
    length = TokenPlacement.build(layout, "frame_major", align_unit).length
    slots = max(round_up(length, block_q), round_up(length, block_kv))
    return slots / layout.seq_len - 1.0


def padding_bound(workload: Workload, dims: dict[str, tuple[Any, ...]], max_padding: float = MAX_PADDING) -> float:
    """The padding a config of ``dims`` may add: ``max_padding``, or the least padding of any
    (block_q, block_kv, align) of the grid when none stays within it.

    A short sequence can have no tile size within the bound (160 tokens in 128-wide kv tiles
    pad by 60%, and kv tiles cannot be narrower on TPU); its space then holds the configs that
    pad least rather than nothing, so every workload can be tuned and its heuristic is a point
    of its space.
    """
    return _padding_bound(
        workload.pattern.layout,
        workload.dtype,
        dims["block_q"],
        dims["block_kv"],
        dims["align"],
        max_padding,
    )


@functools.lru_cache(maxsize=256)
def _padding_bound(
    layout: VideoLayout,
    dtype: str,
    blocks_q: tuple[int, ...],
    blocks_kv: tuple[int, ...],
    aligns: tuple[str, ...],
    max_padding: float,
) -> float:
    least = None
    for block_q, block_kv, align in itertools.product(blocks_q, blocks_kv, aligns):
        extra = _layout_padding(layout, block_q, block_kv, lcm(block_q, block_kv) if align == "frame" else 0)
        if extra <= max_padding:
            return max_padding
        least = extra if least is None else min(least, extra)
    return max_padding if least is None else least


def violation(
    workload: Workload,
    backend: str,
    config: TileConfig,
    dims: dict[str, tuple[Any, ...]],
    max_padding: float = MAX_PADDING,
) -> str | None:
    """Why ``config`` must not be measured for ``workload`` on ``backend``, or None."""
    tpu = tpu_like(backend)
    for name, choices in dims.items():
        value = getattr(config, name)
        if name == "block_kv_compute":
            if not tpu and value != config.block_kv:
                return "block_kv_compute: the xla backend computes whole kv tiles"
            if tpu and value not in choices:
                return f"block_kv_compute: {value} is not one of {choices}"
            continue
        if value not in choices:
            return f"{name}: {value!r} is not one of {choices}"

    def padding_violation() -> str | None:  # (after the tiling rules on TPU)
        if config.block_kv % config.block_kv_compute:
            return "block_kv_compute must divide block_kv"
        extra = padding(workload, config)
        bound = padding_bound(workload, dims, max_padding)
        if extra > bound + 1e-9:
            if bound > max_padding:
                return f"padding: {extra:.0%} extra tokens > {bound:.0%}, the least any tile size of the grid pads"
            return f"padding: {extra:.0%} extra tokens > {max_padding:.0%}"
        return None

    if tpu:
        return tpu_violation(workload, config, before_memory=padding_violation)
    return padding_violation()


def tpu_violation(
    workload: Workload,
    config: TileConfig,
    device_kind: str | None = None,
    *,
    before_memory: Callable[[], str | None] | None = None,
) -> str | None:
    """Why the estimates say ``config`` of ``workload`` cannot run on the TPU ``device_kind``
    (default the workload's), or None: the one estimate of TPU validity that the search
    space (:func:`violation`), the compile gate and ``tiletune bench compile`` share.

    In order: the TPU tiling rules (:meth:`TileConfig.check_tpu`, free), then the caller's
    ``before_memory`` check if any (the search space's padding rule, cheap), then the memory
    budget of :func:`kernel.budget.budget_violation` (VMEM, then SMEM, whose tables are
    built: the costly part). Memory reasons start with ``vmem`` or ``smem``.
    """
    try:
        config.check_tpu(workload.dtype)
    except ValueError as exc:
        return str(exc)
    if before_memory is not None and (reason := before_memory()) is not None:
        return reason
    return budget_violation(
        workload.pattern,
        config,
        device_kind=device_kind or workload.device_kind,
        head_dim=workload.head_dim,
        dtype=workload.dtype,
    )
