"""Hypothesis strategies for small layouts, patterns and tile configs."""

from __future__ import annotations

from hypothesis import strategies as st

from kernel.config import TileConfig
from kernel.layout import VideoLayout
from kernel.pattern import HeadPattern, SparsityPattern


@st.composite
def layouts(draw: st.DrawFn, max_frames: int = 4, max_per_frame: int = 24, max_text: int = 12) -> VideoLayout:
    return VideoLayout(
        draw(st.integers(1, max_frames)),
        draw(st.integers(1, max_per_frame)),
        draw(st.integers(0, max_text)),
        draw(st.sampled_from(["prefix", "suffix"])),
    )


@st.composite
def head_patterns(draw: st.DrawFn, layout: VideoLayout) -> HeadPattern:
    kind = draw(st.sampled_from(["dense", "spatial", "temporal", "band"]))
    sink = draw(st.booleans())
    if kind == "dense":
        return HeadPattern.dense(sink)
    if kind == "spatial":
        return HeadPattern.spatial(draw(st.integers(0, layout.frames - 1)), sink)
    if kind == "temporal":
        return HeadPattern.temporal(draw(st.integers(0, layout.tokens_per_frame - 1)), sink)
    return HeadPattern.band(draw(st.integers(1, layout.video_tokens)), sink)


@st.composite
def patterns(draw: st.DrawFn, max_heads: int = 3, **layout_kw: int) -> SparsityPattern:
    layout = draw(layouts(**layout_kw))
    n = draw(st.integers(1, max_heads))
    return SparsityPattern(layout, tuple(draw(head_patterns(layout)) for _ in range(n)))


@st.composite
def tile_configs(draw: st.DrawFn, blocks: tuple[int, ...] = (8, 16, 32)) -> TileConfig:
    block_kv = draw(st.sampled_from(blocks))
    return TileConfig(
        variant=draw(st.sampled_from(["naive", "split", "compact"])),
        block_q=draw(st.sampled_from(blocks)),
        block_kv=block_kv,
        block_kv_compute=draw(st.sampled_from([d for d in blocks if block_kv % d == 0])),
        layout=draw(st.sampled_from(["frame_major", "temporal_major"])),
        align=draw(st.sampled_from(["none", "frame"])),
        head_grouping=draw(st.sampled_from(["all", "by_pattern"])),
    )
