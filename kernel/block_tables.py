"""BlockTables: which (q-block, kv-block) tiles of each head are empty, partial or full.

Built structurally, never from a dense N x N mask. A contiguous range of slots
covers, in (frame, position) space, at most three rectangles (the tail of one
frame, whole frames, the head of another; or the same with positions and frames
swapped in temporal-major order) plus some text and some padding. Whether a
head's rule allows *some* or *all* pairs of two rectangles is interval
arithmetic on frame, position or frame-major token distances, so a tile is
classified in O(1) and a head in O(tiles) time. Memory is bounded by classifying
a chunk of q-blocks at a time and keeping only the non-empty tiles (CSR rows).
Heads that share a pattern and a placement share one table, and a head's table
is kept for reuse (:data:`TABLE_CACHE_BYTES`), bounded by the bytes of the
tables kept rather than by their number: one table of a long sequence can
weigh a thousand small ones.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Callable

import numpy as np

from kernel.pattern import KIND_CODES, HeadPattern
from kernel.placement import Segment, TokenPlacement

EMPTY, PARTIAL, FULL = 0, 1, 2
_CHUNK_PAIRS = 1 << 22  # rectangle pairs classified per numpy pass (bounds peak memory)
TABLE_CACHE_BYTES = 64 << 20  # head tables kept for reuse; a larger table is built and returned, never kept


@dataclasses.dataclass(frozen=True)
class HeadTable:
    """Non-empty tiles of one head in CSR form.

    Row ``i`` (q-block ``i``) owns ``kv_index[row_ptr[i]:row_ptr[i+1]]`` (ascending
    kv-block indices) and the matching ``is_full`` flags.
    """

    row_ptr: np.ndarray  # int64 [num_q_blocks + 1]
    kv_index: np.ndarray  # int32 [nnz]
    is_full: np.ndarray  # bool [nnz]

    @property
    def num_tiles(self) -> int:
        return int(self.kv_index.shape[0])

    @property
    def num_full(self) -> int:
        return int(self.is_full.sum())

    @property
    def nbytes(self) -> int:
        """Bytes of the table's arrays (what keeping it costs)."""
        return int(self.row_ptr.nbytes + self.kv_index.nbytes + self.is_full.nbytes)

    def row_lengths(self) -> np.ndarray:
        return np.diff(self.row_ptr)


@dataclasses.dataclass(frozen=True)
class BlockTables:
    """Per head: the non-empty kv blocks of every q block, full or partial."""

    block_q: int
    block_kv: int
    num_q_blocks: int
    num_kv_blocks: int
    heads: tuple[HeadTable, ...]

    @property
    def num_heads(self) -> int:
        return len(self.heads)

    def kinds(self, head: int) -> np.ndarray:
        """Dense [num_q_blocks, num_kv_blocks] int8 of EMPTY/PARTIAL/FULL (for small shapes)."""
        t = self.heads[head]
        out = np.zeros((self.num_q_blocks, self.num_kv_blocks), np.int8)
        rows = np.repeat(np.arange(self.num_q_blocks), t.row_lengths())
        out[rows, t.kv_index] = np.where(t.is_full, FULL, PARTIAL)
        return out

    def counts(self) -> dict[str, int]:
        total = self.num_heads * self.num_q_blocks * self.num_kv_blocks
        full = sum(t.num_full for t in self.heads)
        nonempty = sum(t.num_tiles for t in self.heads)
        return {"tiles": total, "full": full, "partial": nonempty - full, "empty": total - nonempty}

    def row_counts(self, full: bool | None = None) -> np.ndarray:
        """int64 [H, nq]: each row's count of full (``True``), partial (``False``) or all (``None``) tiles."""
        nq = self.num_q_blocks
        out = np.zeros((self.num_heads, nq), np.int64)
        for h, t in enumerate(self.heads):
            rows = np.repeat(np.arange(nq), t.row_lengths())
            out[h] = np.bincount(rows if full is None else rows[t.is_full == full], minlength=nq)
        return out

    def padded_lists(
        self, heads: list[int] | None = None, full: bool | None = None, q_blocks: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows padded to the longest: (kv_index [H,nq,L], is_full [H,nq,L], valid [H,nq,L]).

        ``full=True``/``False`` keeps only full/partial tiles; ``None`` keeps both.
        ``q_blocks`` keeps only those rows, in that order, padded to *their* longest.
        Padding entries repeat the row's last real kv block (so a TPU pipeline
        issues no new DMA for them) and have ``valid == False``.
        """
        heads = list(range(self.num_heads)) if heads is None else heads
        nq = self.num_q_blocks
        picked = np.arange(nq) if q_blocks is None else np.asarray(q_blocks, np.int64)
        position = np.full(nq, -1, np.int64)
        position[picked] = np.arange(picked.shape[0])
        n = picked.shape[0]
        per_head = []
        for h in heads:
            t = self.heads[h]
            keep = np.ones(t.num_tiles, bool) if full is None else (t.is_full == full)
            rows = position[np.repeat(np.arange(nq), t.row_lengths())]
            keep &= rows >= 0
            order = np.argsort(rows[keep], kind="stable")  # rows in ``q_blocks`` order, kv ascending within
            per_head.append((rows[keep][order], t.kv_index[keep][order], t.is_full[keep][order]))
        length = max([int(np.bincount(r, minlength=n).max(initial=0)) for r, _, _ in per_head] + [1])
        kv = np.zeros((len(heads), n, length), np.int32)
        flags = np.zeros((len(heads), n, length), bool)
        valid = np.zeros((len(heads), n, length), bool)
        for out_h, (rows, kv_index, is_full) in enumerate(per_head):
            counts = np.bincount(rows, minlength=n)
            starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
            col = np.arange(rows.shape[0]) - starts[rows]
            kv[out_h, rows, col] = kv_index
            flags[out_h, rows, col] = is_full
            valid[out_h, rows, col] = True
            last = np.where(counts > 0, kv[out_h, np.arange(n), np.maximum(counts - 1, 0)], 0)
            pad = ~valid[out_h]
            kv[out_h][pad] = np.broadcast_to(last[:, None], pad.shape)[pad]
        return kv, flags, valid


def build_block_tables(
    heads: list[HeadPattern],
    placements: list[TokenPlacement],
    block_q: int,
    block_kv: int,
    q_len: int,
    kv_len: int,
) -> BlockTables:
    """Classify every tile of every head; heads with equal (pattern, placement) share work."""
    if q_len % block_q or kv_len % block_kv:
        raise ValueError("q_len / kv_len must be multiples of block_q / block_kv")
    tables = tuple(
        _head_table(head, placement, block_q, block_kv, q_len, kv_len)
        for head, placement in zip(heads, placements, strict=True)
    )
    return BlockTables(block_q, block_kv, q_len // block_q, kv_len // block_kv, tables)


_TableKey = tuple[HeadPattern, TokenPlacement, int, int, int, int]


class _TableCache:
    """Memoises :func:`_build_head_table`: tables by their arguments, least recently used out
    once the kept tables' bytes pass ``max_bytes`` (thread-safe; ``cache_clear`` as functools')."""

    def __init__(self, build: Callable[..., HeadTable], max_bytes: int) -> None:
        self.build = build
        self.max_bytes = max_bytes
        self._tables: collections.OrderedDict[_TableKey, HeadTable] = collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __call__(
        self, head: HeadPattern, placement: TokenPlacement, block_q: int, block_kv: int, q_len: int, kv_len: int
    ) -> HeadTable:
        key = (head, placement, block_q, block_kv, q_len, kv_len)
        with self._lock:
            table = self._tables.get(key)
            if table is not None:
                self._tables.move_to_end(key)
                return table
        table = self.build(*key)  # outside the lock: other threads' hits do not wait for a build
        with self._lock:
            if table.nbytes <= self.max_bytes and key not in self._tables:
                self._tables[key] = table
                self._bytes += table.nbytes
                while self._bytes > self.max_bytes:
                    _, dropped = self._tables.popitem(last=False)
                    self._bytes -= dropped.nbytes
        return table

    @property
    def nbytes(self) -> int:
        """Bytes of the tables kept now (at most ``max_bytes``)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._tables)

    def cache_clear(self) -> None:
        with self._lock:
            self._tables.clear()
            self._bytes = 0


def _build_head_table(
    head: HeadPattern,
    placement: TokenPlacement,
    block_q: int,
    block_kv: int,
    q_len: int,
    kv_len: int,
) -> HeadTable:
    nq, nk = q_len // block_q, kv_len // block_kv
    kv_sum = _RangeSummary.of(placement, np.arange(nk) * block_kv, block_kv, sink=head.first_frame_sink).used()
    rect_pairs = kv_sum.ok.shape[1] * 3 * len(placement.segments)  # q ranges: at most 3 rectangles per segment
    chunk = max(1, _CHUNK_PAIRS // max(nk * rect_pairs, 1))
    row_lengths, kv_parts, full_parts = [], [], []
    for start in range(0, nq, chunk):
        rows = np.arange(start, min(nq, start + chunk))
        q_sum = _RangeSummary.of(placement, rows * block_q, block_q, sink=False).used()
        kinds = _classify(head, placement, q_sum, kv_sum, block_kv)
        r, c = np.nonzero(kinds)
        row_lengths.append(np.bincount(r, minlength=rows.shape[0]))
        kv_parts.append(c.astype(np.int32))
        full_parts.append(kinds[r, c] == FULL)
    row_ptr = np.concatenate([[0], np.cumsum(np.concatenate(row_lengths))]).astype(np.int64)
    return HeadTable(row_ptr, np.concatenate(kv_parts), np.concatenate(full_parts))


_head_table = _TableCache(_build_head_table, TABLE_CACHE_BYTES)


@dataclasses.dataclass
class _RangeSummary:
    """What the slot ranges ``[start, start+size)`` hold, one row per range.

    Rectangle arrays are [n, R]: frame interval [f_lo, f_hi] x position interval
    [p_lo, p_hi], ``ok`` marking real rectangles and ``sink`` marking frame-0
    rectangles that a sink head always attends.
    """

    text: np.ndarray  # [n] valid text tokens in range
    valid: np.ndarray  # [n] valid tokens (text + video)
    f_lo: np.ndarray
    f_hi: np.ndarray
    p_lo: np.ndarray
    p_hi: np.ndarray
    ok: np.ndarray
    sink: np.ndarray

    @classmethod
    def of(cls, pl: TokenPlacement, start: np.ndarray, size: int, sink: bool) -> _RangeSummary:
        lay = pl.layout
        start = start.astype(np.int64)
        end = start + size
        t0, t1 = pl.text_start, pl.text_start + lay.text_tokens
        text = np.clip(np.minimum(end, t1) - np.maximum(start, t0), 0, None)
        video = np.zeros_like(start)
        rects: list[tuple[np.ndarray, ...]] = []
        for seg in pl.segments:
            seg_video, seg_rects = _segment_rects(pl, seg, start, end)
            video = video + seg_video
            rects.append(seg_rects)
        f_lo, f_hi, p_lo, p_hi, ok = (np.concatenate([r[i] for r in rects], 1) for i in range(5))
        sink_ok = np.zeros_like(ok)
        if sink:
            # Split frame 0 off every rectangle: a sink head attends those keys always.
            rest_lo = np.maximum(f_lo, 1)
            rest_ok = ok & (rest_lo <= f_hi)
            sink_ok = ok & (f_lo == 0)
            zeros = np.zeros_like(f_lo)
            f_lo, f_hi = np.concatenate([rest_lo, zeros], 1), np.concatenate([f_hi, zeros], 1)
            p_lo, p_hi = np.concatenate([p_lo, p_lo], 1), np.concatenate([p_hi, p_hi], 1)
            ok = np.concatenate([rest_ok, sink_ok], 1)
            sink_ok = np.concatenate([np.zeros_like(sink_ok), sink_ok], 1)
        return cls(text, text + video, f_lo, f_hi, p_lo, p_hi, ok, sink_ok)

    def used(self) -> _RangeSummary:
        """Drop rectangle columns that no range uses (e.g. segments these ranges miss)."""
        keep = np.asarray(self.ok.any(axis=0))
        if keep.all():
            return self
        keep[np.argmax(keep)] = True  # keep one column so shapes stay 2-D
        return _RangeSummary(
            self.text,
            self.valid,
            *(x[:, keep] for x in (self.f_lo, self.f_hi, self.p_lo, self.p_hi, self.ok, self.sink)),
        )


def _segment_rects(
    pl: TokenPlacement, seg: Segment, start: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """Valid video tokens of each range inside ``seg`` and their three rectangles
    (f_lo, f_hi, p_lo, p_hi, ok), each [n, 3]: head, middle, tail of the range."""
    P = pl.layout.tokens_per_frame
    if seg.frame_major:
        majors, minors = seg.frames, P
    else:
        majors, minors = P, seg.frames
    stride = seg.stride
    origin = pl.video_start + seg.start
    a = np.clip(start - origin, 0, majors * stride)
    b = np.clip(end - origin, 0, majors * stride)

    def valid_below(x: np.ndarray) -> np.ndarray:
        return (x // stride) * minors + np.minimum(x % stride, minors)

    video = valid_below(b) - valid_below(a)
    has = b > a
    last = np.maximum(b - 1, 0)
    ma, mb = a // stride, last // stride
    ra, rb = a % stride, last % stride
    one = ma == mb
    # Three rectangles in (major, minor): head, middle, tail.
    maj_lo = np.stack([ma, ma + 1, mb], 1)
    maj_hi = np.stack([ma, mb - 1, mb], 1)
    min_lo = np.stack([ra, np.zeros_like(ra), np.zeros_like(ra)], 1)
    min_hi = np.stack(
        [
            np.where(one, np.minimum(rb, minors - 1), minors - 1),
            np.full_like(ra, minors - 1),
            np.minimum(rb, minors - 1),
        ],
        1,
    )
    ok = np.stack([has & (ra < minors), has & ~one & (mb - 1 >= ma + 1), has & ~one], 1)
    ok &= min_lo <= min_hi
    if seg.frame_major:
        return video, (maj_lo + seg.first_frame, maj_hi + seg.first_frame, min_lo, min_hi, ok)
    return video, (min_lo + seg.first_frame, min_hi + seg.first_frame, maj_lo, maj_hi, ok)


def _interval_distances(
    a_lo: np.ndarray, a_hi: np.ndarray, b_lo: np.ndarray, b_hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(min, max) of |x - y| over x in [a_lo, a_hi], y in [b_lo, b_hi]."""
    lo = np.maximum(0, np.maximum(b_lo - a_hi, a_lo - b_hi))
    hi = np.maximum(a_hi - b_lo, b_hi - a_lo)
    return lo, hi


def _classify(head: HeadPattern, pl: TokenPlacement, q: _RangeSummary, kv: _RangeSummary, block_kv: int) -> np.ndarray:
    """[len(q), len(kv)] int8 of EMPTY/PARTIAL/FULL."""

    # Broadcast to [nq, nk, Rq, Rk].
    def qx(x: np.ndarray) -> np.ndarray:
        return x[:, None, :, None]

    def kx(x: np.ndarray) -> np.ndarray:
        return x[None, :, None, :]

    pair_ok = qx(q.ok) & kx(kv.ok)
    kind = head.code
    if kind == KIND_CODES["dense"]:
        some = all_ = np.ones(pair_ok.shape, bool)
    else:
        if kind == KIND_CODES["spatial"]:
            lo, hi = _interval_distances(qx(q.f_lo), qx(q.f_hi), kx(kv.f_lo), kx(kv.f_hi))
            limit = head.window + 1
        elif kind == KIND_CODES["temporal"]:
            lo, hi = _interval_distances(qx(q.p_lo), qx(q.p_hi), kx(kv.p_lo), kx(kv.p_hi))
            limit = head.window + 1
        else:
            if len(pl.segments) != 1 or not pl.segments[0].frame_major:
                raise ValueError("band heads are only placed in frame-major order")
            per = pl.layout.tokens_per_frame
            lo, hi = _interval_distances(
                qx(q.f_lo * per + q.p_lo),
                qx(q.f_hi * per + q.p_hi),
                kx(kv.f_lo * per + kv.p_lo),
                kx(kv.f_hi * per + kv.p_hi),
            )
            limit = head.window
        some, all_ = lo < limit, hi < limit
        sink = kx(kv.sink)
        some, all_ = some | sink, all_ | sink
    video_some = (pair_ok & some).any(axis=(2, 3))
    video_all = (~pair_ok | all_).all(axis=(2, 3))
    q_text = (q.text > 0)[:, None]
    q_video = (q.valid > q.text)[:, None]
    k_text = (kv.text > 0)[None, :]
    k_valid = (kv.valid > 0)[None, :]
    some_pair = (q_text & k_valid) | (q_video & k_text) | video_some
    full = video_all & (kv.valid == block_kv)[None, :]
    out = np.where(some_pair, np.where(full, FULL, PARTIAL), EMPTY).astype(np.int8)
    out[~(q_text | q_video)[:, 0], :] = EMPTY
    return out
