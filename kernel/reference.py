"""Dense references: the ground truth every kernel variant is checked against.

``dense_mask`` builds the N x N mask from token coordinates -- only for small
shapes (tests). ``reference_attention`` computes masked softmax attention in
float64 numpy, either for every query row or for a sample of rows
(``rows=...``), which costs O(rows x N) and works at 75K tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernel.pattern import SparsityPattern, video_allows

DENSE_MASK_LIMIT = 16384  # a dense mask beyond this is a mistake (1 GiB of bools per head)
# Largest max-abs error against reference_attention that still counts as exact, per input dtype:
# float32 keeps f32 accumulation end to end; bfloat16 rounds q/k/v and the probabilities.
TOLERANCE: dict[str, float] = {"float32": 2e-5, "bfloat16": 2e-2}


def mask_rows(pattern: SparsityPattern, head: int, rows: np.ndarray) -> np.ndarray:
    """Mask [len(rows), seq_len] of head ``head`` for the given query rows (model order)."""
    lay = pattern.layout
    hp = pattern.heads[head]
    is_text, frame, position = lay.token_coords()
    rows = np.asarray(rows)
    rule = video_allows(
        hp.code,
        hp.window,
        int(hp.first_frame_sink),
        frame[rows][:, None],
        position[rows][:, None],
        frame[None, :],
        position[None, :],
        lay.tokens_per_frame,
    )
    return rule | is_text[rows][:, None] | is_text[None, :]


def dense_mask(pattern: SparsityPattern) -> np.ndarray:
    """[heads, N, N] boolean mask; refuses sequences longer than DENSE_MASK_LIMIT."""
    n = pattern.seq_len
    if n > DENSE_MASK_LIMIT:
        raise ValueError(f"dense_mask: seq_len {n} > {DENSE_MASK_LIMIT}; use sampled rows")
    rows = np.arange(n)
    return np.stack([mask_rows(pattern, h, rows) for h in range(pattern.num_heads)])


def mask_density(pattern: SparsityPattern) -> float:
    """Fraction of allowed (query, key) pairs over all heads, counted in closed form."""
    lay = pattern.layout
    n, v, t, F, P = lay.seq_len, lay.video_tokens, lay.text_tokens, lay.frames, lay.tokens_per_frame

    def near(centres: np.ndarray, lo: int, hi: int, radius: int) -> np.ndarray:
        """How many integers in [lo, hi] lie within ``radius`` of each centre."""
        return np.clip(np.minimum(centres + radius, hi) - np.maximum(centres - radius, lo) + 1, 0, None)

    total = 0.0
    for hp in pattern.heads:
        w = hp.window
        frames, positions, tokens = np.arange(F), np.arange(P), np.arange(v)
        if hp.kind == "dense":
            pairs, sink_extra = float(v) * v, 0.0
        elif hp.kind == "spatial":
            pairs = float(near(frames, 0, F - 1, w).sum()) * P * P
            sink_extra = float((frames > w).sum()) * P * P
        elif hp.kind == "temporal":
            pairs = float(near(positions, 0, P - 1, w).sum()) * F * F
            sink_extra = float((P - near(positions, 0, P - 1, w)).sum()) * F
        else:
            pairs = float(near(tokens, 0, v - 1, w - 1).sum())
            sink_extra = float((P - near(tokens, 0, P - 1, w - 1)).sum())
        if hp.first_frame_sink:
            pairs += sink_extra
        total += pairs + 2.0 * t * n - float(t) * t
    return total / (pattern.num_heads * float(n) * n)


def reference_attention(q: Any, k: Any, v: Any, pattern: SparsityPattern, rows: np.ndarray | None = None) -> np.ndarray:
    """Masked softmax(q k^T) v in float64, no scaling; q/k/v [B, H, N, D] or [H, N, D].

    With ``rows`` only those query rows are computed (shape [..., len(rows), D]).
    """
    qa, ka, va = (np.asarray(x, np.float64) for x in (q, k, v))
    squeeze = qa.ndim == 3
    if squeeze:
        qa, ka, va = qa[None], ka[None], va[None]
    n = pattern.seq_len
    rows = np.arange(n) if rows is None else np.asarray(rows)
    out = np.empty((*qa.shape[:2], rows.shape[0], qa.shape[-1]))
    for h in range(qa.shape[1]):
        mask = mask_rows(pattern, h, rows)
        s = np.einsum("bqd,bkd->bqk", qa[:, h, rows], ka[:, h])
        s = np.where(mask[None], s, -np.inf)
        s -= s.max(axis=-1, keepdims=True)
        p = np.exp(s)
        out[:, h] = np.einsum("bqk,bkd->bqd", p / p.sum(-1, keepdims=True), va[:, h])
    return out[0] if squeeze else out


def dense_attention(q: Any, k: Any, v: Any) -> Any:
    """The dense anchor of benchmarks: ``jax.nn.dot_product_attention`` on [B, H, N, D]
    inputs, unscaled like :func:`kernel.attention.sparse_attention`."""
    import jax

    t = (0, 2, 1, 3)  # dot_product_attention wants [B, N, H, D]
    return jax.nn.dot_product_attention(q.transpose(t), k.transpose(t), v.transpose(t), scale=1.0).transpose(t)
