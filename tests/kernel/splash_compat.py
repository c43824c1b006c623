"""Test helper: thin wrappers around JAX's own splash attention (jax==0.10.2).

Splash attention ships inside jax at
``jax.experimental.pallas.ops.tpu.splash_attention``. Tests use these wrappers as
an independent reference for our block-sparse kernel:

* :func:`splash_block_kinds` exposes splash's own block classification
  (empty / partial / full) of a dense mask, taken from the ``block_mask`` field
  of the ``MaskInfo`` built by ``splash_attention_mask_info.process_mask``.
* :func:`splash_attention_interpret` runs splash's forward MHA kernel in Pallas
  TPU interpret mode on the CPU.

Constraints of this splash version (checked against its sources):

* ``block_q`` must divide ``seq_q`` and ``block_kv`` must divide ``seq_kv``
  (``process_mask`` raises ``ValueError`` otherwise).
* The forward kernel additionally needs ``block_kv`` to be a multiple of 128
  (``block_kv_compute % NUM_LANES``); ``block_q`` has no such rule in interpret
  mode. Mask-info processing alone accepts any dividing block sizes.
* Splash does not scale ``q``: the kernel computes ``softmax(q @ k^T) @ v``.
* Rows with no allowed key give undefined output in splash (NaN, or a uniform
  average over masked keys), so :func:`splash_attention_interpret` rejects them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_kernel as splash_kernel,
)
from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_mask as splash_mask,
)
from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_mask_info as splash_mask_info,
)

__all__ = ["splash_attention_interpret", "splash_block_kinds"]

#: Block kind codes used by splash's ``MaskInfo.block_mask``.
EMPTY_BLOCK = 0
PARTIAL_BLOCK = 1
FULL_BLOCK = 2


def _as_mask(mask: np.ndarray) -> np.ndarray:
    """Validate a dense [heads, seq_q, seq_kv] boolean mask and return a private copy."""
    arr = np.asarray(mask)
    if arr.dtype != np.bool_:
        raise ValueError(f"mask must be a boolean array, got dtype {arr.dtype}")
    if arr.ndim != 3:
        raise ValueError(f"mask must be 3-D [heads, seq_q, seq_kv], got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise ValueError("mask must have at least one head")
    # Copy: splash's process_mask is lru_cached and hashes the array bytes, so
    # later in-place edits of the caller's array must not reach the cached masks.
    return np.array(arr, dtype=np.bool_, copy=True, order="C")


def _check_block_sizes(block_q: int, block_kv: int) -> None:
    """Reject non-positive block sizes (splash would fail with ZeroDivisionError)."""
    for name, value in (("block_q", block_q), ("block_kv", block_kv)):
        if int(value) != value or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _multi_head_mask(mask: np.ndarray) -> splash_mask.MultiHeadMask:
    """Wrap a dense [heads, seq_q, seq_kv] bool array as splash's MultiHeadMask."""
    return splash_mask.MultiHeadMask(tuple(splash_mask.NumpyMask(m) for m in mask))


def splash_block_kinds(mask: np.ndarray, block_q: int, block_kv: int) -> np.ndarray:
    """Return splash's own block classification of ``mask``.

    Args:
      mask: bool [heads, seq_q, seq_kv]; True means the query may attend the key.
      block_q: query block size; must divide seq_q.
      block_kv: key/value block size; must divide seq_kv.

    Returns:
      int8 [heads, seq_q // block_q, seq_kv // block_kv] with 0 = empty block,
      1 = partial block, 2 = full block, read from the forward ``MaskInfo.block_mask``
      computed by ``splash_attention_mask_info.process_mask`` (no grid shrinking,
      single head shard), broadcast back to one row per head when splash shares
      one block mask across heads with identical masks.

    Raises:
      ValueError: if the mask is not a 3-D bool array or splash rejects the block
        sizes (e.g. they do not divide the sequence lengths).
    """
    dense = _as_mask(mask)
    _check_block_sizes(block_q, block_kv)
    heads, seq_q, seq_kv = dense.shape
    try:
        mask_info, _ = splash_mask_info.process_mask(
            _multi_head_mask(dense),
            (int(block_q), int(block_kv)),
            downcast_smem_data=True,
            head_shards=1,
            q_seq_shards=1,
            shrink_grid=False,
        )
    except ZeroDivisionError as exc:  # pragma: no cover - guarded above
        raise ValueError(str(exc)) from exc
    block_mask = np.asarray(mask_info.block_mask)
    full_shape = (heads, seq_q // block_q, seq_kv // block_kv)
    if block_mask.shape[1:] != full_shape[1:] or block_mask.shape[0] not in (1, heads):
        raise AssertionError(f"unexpected splash block_mask shape {block_mask.shape}, wanted {full_shape}")
    # One row per head (copy: process_mask results are cached and shared).
    return np.array(np.broadcast_to(block_mask, full_shape), dtype=np.int8)


def splash_attention_interpret(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: np.ndarray,
    block_q: int,
    block_kv: int,
) -> jax.Array:
    """Run splash attention's forward MHA kernel in Pallas TPU interpret mode on CPU.

    Computes, per head, ``softmax(where(mask, q @ k^T, -inf)) @ v`` with no
    ``1/sqrt(head_dim)`` scaling (splash never scales ``q``, so none is applied).

    Args:
      q: float32 [heads, seq_q, head_dim].
      k: float32 [heads, seq_kv, head_dim].
      v: float32 [heads, seq_kv, head_dim_v].
      mask: bool [heads, seq_q, seq_kv]; True means the query may attend the key.
      block_q: query block size; must divide seq_q.
      block_kv: key/value block size; must divide seq_kv and be a multiple of 128.

    Returns:
      float32 [heads, seq_q, head_dim_v] attention output.

    Raises:
      ValueError: on inconsistent shapes, a fully masked query row (splash's
        output is undefined there), or block sizes splash rejects.
    """
    dense = _as_mask(mask)
    _check_block_sizes(block_q, block_kv)
    q = jnp.asarray(q, dtype=jnp.float32)
    k = jnp.asarray(k, dtype=jnp.float32)
    v = jnp.asarray(v, dtype=jnp.float32)
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise ValueError(f"q, k, v must be 3-D [heads, seq, head_dim], got {q.shape}, {k.shape}, {v.shape}")
    heads, seq_q, seq_kv = dense.shape
    if q.shape[:2] != (heads, seq_q):
        raise ValueError(f"q shape {q.shape} does not match mask shape {dense.shape}")
    if k.shape != (heads, seq_kv, q.shape[2]):
        raise ValueError(f"k shape {k.shape} does not match q {q.shape} / mask {dense.shape}")
    if v.shape[:2] != (heads, seq_kv):
        raise ValueError(f"v shape {v.shape} does not match mask shape {dense.shape}")
    empty_rows = ~dense.any(axis=-1)
    if empty_rows.any():
        h, row = np.argwhere(empty_rows)[0]
        raise ValueError(
            f"mask has {int(empty_rows.sum())} fully masked query row(s) (first: head {h}, "
            f"row {row}); splash attention's output is undefined for them"
        )

    block_sizes = splash_kernel.BlockSizes(block_q=int(block_q), block_kv=int(block_kv), block_kv_compute=int(block_kv))
    kernel = splash_kernel.make_splash_mha_single_device(
        _multi_head_mask(dense),
        block_sizes=block_sizes,
        interpret=pltpu.InterpretParams(),  # Pallas TPU interpret mode (CPU).
    )
    # f32 matmuls are already exact on CPU; pin it so a global setting cannot lower it.
    with jax.default_matmul_precision("highest"):
        return kernel(q, k, v)
