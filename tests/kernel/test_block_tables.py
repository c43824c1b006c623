"""Structural block tables against brute force, against splash attention, and at full scale."""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.attention import head_groups, prepare_group
from kernel.block_tables import FULL, PARTIAL, HeadTable, _head_table, build_block_tables
from kernel.config import TileConfig
from kernel.layout import VideoLayout
from kernel.pattern import HeadPattern, SparsityPattern
from kernel.placement import TokenPlacement, round_up
from kernel.presets import get_preset
from kernel.reference import dense_mask
from tests.kernel.splash_compat import splash_block_kinds
from tests.kernel.strategies import head_patterns, layouts


def brute_force_kinds(mask: np.ndarray, slots: np.ndarray, bq: int, bkv: int, nq: int, nk: int) -> np.ndarray:
    """Classify tiles of a placed mask: only valid queries count; padding keys break fullness."""
    out = np.zeros((nq, nk), np.int8)
    for i in range(nq):
        qs = slots[i * bq : (i + 1) * bq]
        qs = qs[qs >= 0]
        if qs.size == 0:
            continue
        for j in range(nk):
            ks = slots[j * bkv : (j + 1) * bkv]
            sub = np.zeros((qs.size, bkv), bool)
            sub[:, ks >= 0] = mask[np.ix_(qs, ks[ks >= 0])]
            out[i, j] = 0 if not sub.any() else (FULL if sub.all() else PARTIAL)
    return out


@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    bq=st.integers(1, 9),
    bkv=st.integers(1, 9),
    order=st.sampled_from(["frame_major", "temporal_major", "temporal_major_sink_first"]),
    align=st.booleans(),
)
def test_classification_equals_brute_force(data: st.DataObject, bq: int, bkv: int, order: str, align: bool) -> None:
    layout = data.draw(layouts(max_frames=4, max_per_frame=12, max_text=6))
    head = data.draw(head_patterns(layout))
    if head.kind == "band":
        order = "frame_major"
    sink_first = order.endswith("_sink_first")
    placement = TokenPlacement.build(
        layout,
        order.removesuffix("_sink_first"),  # type: ignore[arg-type]
        int(np.lcm(bq, bkv)) if align else 0,
        sink_first=sink_first,
    )
    q_len, kv_len = round_up(placement.length, bq), round_up(placement.length, bkv)
    tables = build_block_tables([head], [placement], bq, bkv, q_len, kv_len)
    mask = dense_mask(SparsityPattern(layout, (head,)))[0]
    slots = placement.slot_tokens(max(q_len, kv_len))
    expected = brute_force_kinds(mask, slots, bq, bkv, q_len // bq, kv_len // bkv)
    np.testing.assert_array_equal(tables.kinds(0), expected)


def test_padded_lists_hold_every_tile_once() -> None:
    layout = VideoLayout(4, 10, 3, "prefix")
    pattern = SparsityPattern(layout, (HeadPattern.spatial(1), HeadPattern.temporal(2)))
    _, _, tables, _ = prepare_group(pattern, [0, 1], TileConfig("compact", 8, 8, 0, "temporal_major", "frame", "all"))
    for full in (None, True, False):
        kv, flags, valid = tables.padded_lists(full=full)
        for h in range(2):
            kinds = tables.kinds(h)
            want = {
                (i, j)
                for i, j in zip(*np.nonzero(kinds), strict=False)
                if full is None or (kinds[i, j] == FULL) == full
            }
            got = {(i, int(kv[h, i, c])) for i, c in zip(*np.nonzero(valid[h]), strict=False)}
            assert got == want
            assert all(
                flags[h, i, c] == (kinds[i, kv[h, i, c]] == FULL) for i, c in zip(*np.nonzero(valid[h]), strict=False)
            )


SPLASH_CASES = [
    (VideoLayout(4, 16), (HeadPattern.spatial(1), HeadPattern.temporal(3), HeadPattern.band(20)), 16, 32),
    (VideoLayout(4, 16, 32, "prefix"), (HeadPattern.spatial(0, True), HeadPattern.dense()), 32, 16),
    (VideoLayout(8, 12, 32, "suffix"), (HeadPattern.temporal(0), HeadPattern.spatial(2, True)), 8, 64),
    (VideoLayout(6, 20), (HeadPattern.temporal(4, True), HeadPattern.band(33)), 24, 40),
]


@pytest.mark.parametrize(("layout", "heads", "bq", "bkv"), SPLASH_CASES)
def test_classification_equals_splash_mask_info(
    layout: VideoLayout, heads: tuple[HeadPattern, ...], bq: int, bkv: int
) -> None:
    """Where splash accepts the shape (blocks divide the sequence), its mask info agrees."""
    pattern = SparsityPattern(layout, heads)
    assert pattern.seq_len % bq == 0 and pattern.seq_len % bkv == 0
    config = TileConfig("compact", bq, bkv, 0, "frame_major", "none", "all")
    _, _, tables, _ = prepare_group(pattern, list(range(len(heads))), config)
    ours = np.stack([tables.kinds(h) for h in range(len(heads))])
    np.testing.assert_array_equal(ours, splash_block_kinds(dense_mask(pattern), bq, bkv))


def test_wan_720p_tables_are_structural_and_small() -> None:
    """40 heads at 75,600 tokens: no N x N mask (5.7 GB) is built; peak memory stays bounded."""
    preset = get_preset("wan2.1-720p")
    pattern = preset.pattern(preset.heads)
    config = TileConfig("compact", 128, 128, 0, "temporal_major", "frame", "all")
    _head_table.cache_clear()
    tracemalloc.start()
    _, _, tables, _ = prepare_group(pattern, list(range(pattern.num_heads)), config)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    _head_table.cache_clear()
    assert peak < 500 * 2**20
    counts = tables.counts()
    assert counts["tiles"] == 40 * tables.num_q_blocks * tables.num_kv_blocks
    assert counts["empty"] > 0 and counts["full"] > 0
    # Spatial heads with a sink: every row visits frame 0 and its own neighbourhood only.
    spatial = [h for h, p in enumerate(pattern.heads) if p.kind == "spatial"]
    assert tables.heads[spatial[0]].row_lengths().max() <= 4 * -(-3712 // 128) + 2


def test_heads_with_equal_patterns_share_one_table() -> None:
    layout = VideoLayout(3, 50)
    pattern = SparsityPattern(layout, (HeadPattern.temporal(3),) * 4 + (HeadPattern.spatial(1),))
    config = TileConfig("compact", 32, 32, 0, "temporal_major", "frame", "all")
    for heads in head_groups(pattern, config):
        _, _, tables, _ = prepare_group(pattern, heads, config)
        assert tables.heads[0] is tables.heads[1]
        assert tables.heads[0] is not tables.heads[4]


def _table_bytes(table: HeadTable) -> int:
    return sum(a.nbytes for a in (table.row_ptr, table.kv_index, table.is_full))


@settings(max_examples=12, deadline=None)
@given(
    q_blocks=st.lists(st.integers(64, 640), min_size=3, max_size=8, unique=True),
    budget_kib=st.sampled_from([512, 1024, 3072]),
)
def test_head_table_cache_is_bounded_by_bytes(q_blocks: list[int], budget_kib: int) -> None:
    """Tables built and dropped by the caller stay in memory only up to the cache's byte budget
    (a count of entries bounds nothing: one table of a long sequence weighs a thousand small ones)."""
    block = 8
    dense = HeadPattern.dense()
    budget = budget_kib << 10
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_head_table, "max_bytes", budget, raising=False)
        warm = TokenPlacement.build(VideoLayout(1, 4 * block), "frame_major")
        build_block_tables([dense], [warm], block, block, 4 * block, 4 * block)  # one-time allocations
        _head_table.cache_clear()
        gc.collect()
        tracemalloc.start()
        try:
            kept = None
            for n in q_blocks:  # dense heads: every one of the n x n tiles is stored (about 5 n^2 bytes)
                placement = TokenPlacement.build(VideoLayout(1, n * block), "frame_major")
                tables = build_block_tables([dense], [placement], block, block, n * block, n * block)
                kept = (tables.heads[0], placement, n)
            last, placement, n = kept
            retained_last = _table_bytes(last)
            del tables, last, kept
            gc.collect()
            retained, _ = tracemalloc.get_traced_memory()
            again = build_block_tables([dense], [placement], block, block, n * block, n * block).heads[0]
        finally:
            tracemalloc.stop()
            _head_table.cache_clear()
    assert retained <= budget + (64 << 10), f"{retained} bytes kept > the {budget}-byte budget"
    if retained_last <= budget:  # the newest table that fits is still a cache hit
        assert _table_bytes(again) == retained_last
