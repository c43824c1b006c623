"""``sparse_attention``: the public entry point of the kernel package.

It validates its inputs, picks the config (given, else the installed config
resolver, else the heuristic), places each group of heads (temporal-major
permutation, frame alignment, padding to block multiples), runs the chosen
backend on the structurally built block tables, and puts the output back in the
model's token order. Host-side preparation depends only on shapes, pattern and
config, so the function can be called under ``jax.jit``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernel.block_tables import BlockTables, build_block_tables
from kernel.config import TileConfig
from kernel.heuristic import heuristic_config
from kernel.pattern import HeadPattern, SparsityPattern
from kernel.placement import TokenPlacement, round_up
from kernel.workload import BACKENDS

# What a caller may ask for: a concrete backend, or "auto" (tpu on a TPU, else xla).
BACKEND_CHOICES: tuple[str, ...] = ("auto", *BACKENDS)

ConfigResolver = Callable[[SparsityPattern, tuple[int, ...], str, str], TileConfig | None]
_resolver: ConfigResolver | None = None


def set_config_resolver(resolver: ConfigResolver | None) -> None:
    """Install the function that supplies a config when the caller gives none.

    ``resolver(pattern, qkv_shape, backend, dtype)`` returns a TileConfig or None
    (None falls back to the heuristic). The tiletune client installs one; the
    kernel itself never imports the client.
    """
    global _resolver
    _resolver = resolver


class NoTpuDeviceError(ValueError):
    """``backend='tpu'`` on a machine without a TPU: the kernel can be compiled for TPU here
    (:mod:`kernel.tpu_compile`), but running and timing it needs the device."""

    def __init__(self, platform: str) -> None:
        self.platform = platform
        super().__init__(
            f"backend='tpu' runs the kernel on a TPU device and this machine has {platform!r}; "
            "compiling for TPU works here without one (kernel.tpu_compile), running and timing need the device; "
            "use 'interpret' for correctness or 'xla' for timing"
        )


def resolve_backend(backend: str, platform: str | None = None) -> str:
    """The concrete backend of ``backend`` on ``platform`` (default: this process's
    ``jax.default_backend()``, which initialises JAX's backends)."""
    if backend not in BACKEND_CHOICES:
        raise ValueError(f"backend must be one of {BACKEND_CHOICES}, got {backend!r}")
    platform = platform or jax.default_backend()
    if backend == "auto":
        return "tpu" if platform == "tpu" else "xla"
    if backend == "tpu" and platform != "tpu":
        raise NoTpuDeviceError(platform)
    return backend


@functools.lru_cache(maxsize=512)
def _slot_maps(placement: TokenPlacement, padded: int) -> tuple[np.ndarray, np.ndarray]:
    """(slot -> token or -1 over ``padded`` slots, token -> slot)."""
    return placement.slot_tokens(padded), placement.token_slots()


def head_placement(head: HeadPattern, config: TileConfig, geometry: TokenPlacement) -> TokenPlacement:
    """Only temporal heads are permuted; every other rule is local in frame-major order.

    A temporal head with a first-frame sink keeps frame 0 contiguous (``sink_first``).
    """
    if config.layout == "temporal_major" and head.kind == "temporal":
        return dataclasses.replace(geometry, order="temporal_major", sink_first=head.first_frame_sink)
    return geometry


def head_groups(pattern: SparsityPattern, config: TileConfig) -> list[list[int]]:
    """Heads that share one kernel call."""
    if config.head_grouping == "all":
        return [list(range(pattern.num_heads))]
    return list(pattern.classes().values())


def prepare_group(
    pattern: SparsityPattern, heads: list[int], config: TileConfig
) -> tuple[tuple[TokenPlacement, ...], list[TokenPlacement], BlockTables, np.ndarray]:
    """(distinct placements, per-head placements, block tables, head parameters) of one call.

    Head parameters are int32 [H, 4]: kind code, window, sink, and the index of
    the head's placement among the distinct ones.
    """
    geometry = TokenPlacement.build(pattern.layout, "frame_major", config.align_unit)
    placements = [head_placement(pattern.heads[h], config, geometry) for h in heads]
    distinct = tuple(dict.fromkeys(placements))
    q_len = round_up(geometry.length, config.block_q)
    kv_len = round_up(geometry.length, config.block_kv)
    tables = build_block_tables(
        [pattern.heads[h] for h in heads], placements, config.block_q, config.block_kv, q_len, kv_len
    )
    params = np.array(
        [
            [
                pattern.heads[h].code,
                pattern.heads[h].window,
                int(pattern.heads[h].first_frame_sink),
                distinct.index(p),
            ]
            for h, p in zip(heads, placements, strict=True)
        ],
        np.int32,
    )
    return distinct, placements, tables, params


def _place(x: jax.Array, placements: list[TokenPlacement], length: int) -> jax.Array:
    """[B, H, N, D] in model order -> [B, H, length, D] in slot order, zero padding."""
    maps = [_slot_maps(p, length)[0] for p in placements]
    if all(m is maps[0] for m in maps) or all(p == placements[0] for p in placements):
        idx = maps[0]
        out = jnp.take(x, jnp.asarray(np.maximum(idx, 0)), axis=2)
        return jnp.where(jnp.asarray(idx >= 0)[None, None, :, None], out, 0)
    idx = np.stack(maps)
    out = jnp.take_along_axis(x, jnp.asarray(np.maximum(idx, 0))[None, :, :, None], axis=2)
    return jnp.where(jnp.asarray(idx >= 0)[None, :, :, None], out, 0)


def _unplace(out: jax.Array, placements: list[TokenPlacement], length: int) -> jax.Array:
    idx = np.stack([_slot_maps(p, length)[1] for p in placements])
    if (idx == idx[0]).all():
        return jnp.take(out, jnp.asarray(idx[0]), axis=2)
    return jnp.take_along_axis(out, jnp.asarray(idx)[None, :, :, None], axis=2)


def check_inputs(q: Any, k: Any, v: Any, pattern: SparsityPattern) -> None:
    """Raise ValueError naming the problem with q/k/v against the pattern."""
    if not isinstance(pattern, SparsityPattern):
        raise ValueError(f"pattern must be a SparsityPattern, got {type(pattern).__name__}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not hasattr(x, "shape") or len(x.shape) not in (3, 4):
            raise ValueError(f"{name} must be [batch, heads, seq, head_dim] or [heads, seq, head_dim]")
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"{name} must be a floating array, got {x.dtype}")
    if not q.shape == k.shape == v.shape:
        raise ValueError(f"q, k, v shapes must match: q{tuple(q.shape)} k{tuple(k.shape)} v{tuple(v.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k, v dtypes must match: {q.dtype}, {k.dtype}, {v.dtype}")
    heads, seq = q.shape[-3], q.shape[-2]
    if seq != pattern.seq_len:
        raise ValueError(
            f"sequence length {seq} != the layout's seq_len {pattern.seq_len} (frames*tokens_per_frame + text_tokens)"
        )
    if heads != pattern.num_heads:
        raise ValueError(f"q has {heads} heads but the pattern describes {pattern.num_heads}")
    if q.shape[-1] < 1:
        raise ValueError("head_dim must be >= 1")


def sparse_attention(
    q: Any,
    k: Any,
    v: Any,
    pattern: SparsityPattern,
    config: TileConfig | None = None,
    backend: str = "auto",
) -> jax.Array:
    """Block-sparse softmax(q k^T) v under ``pattern``; no 1/sqrt(d) scaling is applied.

    q, k, v: ``[batch, heads, seq, head_dim]`` or ``[heads, seq, head_dim]``.
    ``backend``: ``tpu`` (Pallas/Mosaic), ``interpret`` (the same kernel in TPU
    interpret mode, correctness only), ``xla`` (block tables in jnp), or
    ``auto`` (tpu on a TPU, else xla). ``config=None`` asks the installed
    resolver, then falls back to :func:`kernel.heuristic.heuristic_config`.
    """
    check_inputs(q, k, v, pattern)
    backend = resolve_backend(backend)
    dtype = jnp.dtype(q.dtype).name
    if config is None and _resolver is not None:
        config = _resolver(pattern, tuple(q.shape), backend, dtype)
    if config is None:
        config = heuristic_config(pattern, backend, dtype)
    if not isinstance(config, TileConfig):
        raise ValueError(f"config must be a TileConfig, got {type(config).__name__}")
    if backend == "tpu":
        config.check_tpu(dtype)
    squeeze = len(q.shape) == 3
    if squeeze:
        q, k, v = q[None], k[None], v[None]
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)

    outputs, order = [], []
    for heads in head_groups(pattern, config):
        distinct, placements, tables, params = prepare_group(pattern, heads, config)
        q_len = tables.num_q_blocks * tables.block_q
        kv_len = tables.num_kv_blocks * tables.block_kv
        sel = jnp.asarray(heads) if len(heads) != pattern.num_heads else None
        qg, kg, vg = (x if sel is None else jnp.take(x, sel, axis=1) for x in (q, k, v))
        qp = _place(qg, placements, q_len)
        kp, vp = _place(kg, placements, kv_len), _place(vg, placements, kv_len)
        if backend == "xla":
            from kernel.xla_backend import xla_block_sparse

            out = xla_block_sparse(qp, kp, vp, tables, distinct, params, config)
        else:
            from kernel.pallas_backend import pallas_block_sparse

            out = pallas_block_sparse(qp, kp, vp, tables, distinct, params, config, interpret=backend == "interpret")
        outputs.append(_unplace(out, placements, q_len))
        order.extend(heads)
    out = outputs[0] if len(outputs) == 1 else jnp.concatenate(outputs, axis=1)
    if order != list(range(pattern.num_heads)):
        out = jnp.take(out, jnp.asarray(np.argsort(order)), axis=1)
    return out[0] if squeeze else out
