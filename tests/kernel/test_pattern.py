"""Canonical form and hash of patterns, the permutation, presets, the reference mask."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kernel.layout import VideoLayout
from kernel.pattern import HeadPattern, SparsityPattern
from kernel.placement import TokenPlacement
from kernel.presets import PRESETS, get_preset
from kernel.reference import dense_mask, mask_density, mask_rows, reference_attention
from kernel.workload import BACKENDS, KERNEL_VERSIONS, Workload
from tests.kernel.strategies import patterns


def literal_allows(layout: VideoLayout, head: HeadPattern, i: int, j: int) -> bool:
    """DESIGN.md section 3, written out token by token (independent of kernel.pattern)."""

    def coords(t: int) -> tuple[bool, int, int]:
        v = t - (layout.text_tokens if layout.text_position == "prefix" else 0)
        if v < 0 or v >= layout.frames * layout.tokens_per_frame:
            return True, -1, -1
        return False, v // layout.tokens_per_frame, v % layout.tokens_per_frame

    ti, fi, pi = coords(i)
    tj, fj, pj = coords(j)
    if ti or tj:
        return True
    if head.first_frame_sink and fj == 0:
        return True
    if head.kind == "dense":
        return True
    if head.kind == "spatial":
        return abs(fi - fj) <= head.window
    if head.kind == "temporal":
        return abs(pi - pj) <= head.window
    return abs((fi * layout.tokens_per_frame + pi) - (fj * layout.tokens_per_frame + pj)) < head.window


@settings(max_examples=60, deadline=None)
@given(pattern=patterns(max_frames=3, max_per_frame=6, max_text=3))
def test_mask_matches_literal_rules_and_density(pattern: SparsityPattern) -> None:
    mask = dense_mask(pattern)
    n = pattern.seq_len
    for h, head in enumerate(pattern.heads):
        want = np.array([[literal_allows(pattern.layout, head, i, j) for j in range(n)] for i in range(n)])
        np.testing.assert_array_equal(mask[h], want)
    assert mask_density(pattern) == pytest.approx(mask.mean(), abs=1e-12)


def test_canonical_json_and_hash_ignore_key_order() -> None:
    a = SparsityPattern.from_json(
        '{"layout": {"frames": 3, "tokens_per_frame": 5, "text_tokens": 2, "text_position": "prefix"},'
        ' "heads": [{"kind": "spatial", "window_frames": 1, "first_frame_sink": true}]}'
    )
    b = SparsityPattern.from_json(
        '{"heads": [{"first_frame_sink": true, "window_frames": 1, "kind": "spatial"}],'
        ' "layout": {"text_position": "prefix", "text_tokens": 2, "tokens_per_frame": 5, "frames": 3}}'
    )
    assert a == b and a.pattern_hash == b.pattern_hash and a.to_json() == b.to_json()
    assert SparsityPattern.from_json(a.to_json()) == a
    c = SparsityPattern(a.layout, (HeadPattern.spatial(0, True),))
    assert c.pattern_hash != a.pattern_hash
    assert json.loads(a.to_json())["heads"][0] == {"kind": "spatial", "window_frames": 1, "first_frame_sink": True}


def test_a_workload_key_moves_only_with_its_own_backends_kernel_version() -> None:
    """Each backend has its kernel version: bumping the xla backend's (xla 2, scans by list length) re-keys
    xla results only; the Pallas backends' keys are the ones every earlier release stored."""
    preset = get_preset("cpu-demo")

    def key(device: str, backend: str, **kw: str) -> str:
        return Workload(device, backend, "bfloat16", 1, preset.head_dim, preset.pattern(), **kw).key

    assert key("TPU v6 lite", "tpu") == "eeb8a3945d1a2399a1c3275c281ad659"  # computed by the release before xla 2
    assert key("cpu", "interpret") == "6093996fc3e101e95dad06e9485ed93e"
    assert key("cpu", "xla", kernel_version="1") == "f47533ab9d49a18a118cb8e02dd6e613"
    assert key("cpu", "xla") != key("cpu", "xla", kernel_version="1")
    assert {
        b: Workload("cpu", b, "float32", 1, 8, preset.pattern()).kernel_version for b in BACKENDS
    } == KERNEL_VERSIONS
    spec = {"device_kind": "cpu", "backend": "xla", "dtype": "float32", "batch": 1, "preset": "cpu-demo"}
    assert Workload.from_dict(spec).kernel_version == KERNEL_VERSIONS["xla"]
    assert Workload.from_dict({**spec, "kernel_version": "1"}).kernel_version == "1"


def test_hash_is_stable_across_releases() -> None:
    """Stored configs are keyed by this hash: changing it orphans every tuned result."""
    pattern = get_preset("cpu-demo").pattern()
    canonical = (
        '{"heads":[{"first_frame_sink":false,"kind":"spatial","window_frames":1},'
        + ",".join(['{"first_frame_sink":false,"kind":"temporal","window_positions":32}'] * 3)
        + '],"layout":{"frames":8,"text_position":"suffix","text_tokens":0,"tokens_per_frame":512}}'
    )
    assert pattern.to_json() == canonical
    assert pattern.pattern_hash == hashlib.sha256(canonical.encode()).hexdigest()[:32]


@settings(max_examples=50, deadline=None)
@given(pattern=patterns(max_heads=1))
def test_temporal_major_permutation_and_inverse(pattern: SparsityPattern) -> None:
    lay = pattern.layout
    placement = TokenPlacement.build(lay, "temporal_major")
    slots = placement.token_slots()
    is_text, frame, position = lay.token_coords()
    video = ~is_text
    np.testing.assert_array_equal(slots[video], placement.video_start + position[video] * lay.frames + frame[video])
    np.testing.assert_array_equal(slots[is_text], np.flatnonzero(is_text) - lay.text_start + placement.text_start)
    inverse = placement.slot_tokens(placement.length)
    np.testing.assert_array_equal(inverse[slots], np.arange(lay.seq_len))
    # Under the permutation a temporal head's mask is a band: each row's allowed slots are contiguous.
    if pattern.heads[0].kind == "temporal" and not pattern.heads[0].first_frame_sink and lay.text_tokens == 0:
        permuted = dense_mask(pattern)[0][np.ix_(inverse, inverse)]
        for row in permuted:
            idx = np.flatnonzero(row)
            assert idx.max() - idx.min() + 1 == idx.size


@settings(max_examples=50, deadline=None)
@given(pattern=patterns(max_heads=1), align=st.sampled_from([0, 8]))
def test_sink_first_placement_round_trip(pattern: SparsityPattern, align: int) -> None:
    """Frame 0 stays contiguous ahead of the temporal-major frames 1..F-1."""
    lay = pattern.layout
    placement = TokenPlacement.build(lay, "temporal_major", align, sink_first=True)
    slots = placement.token_slots()
    is_text, frame, position = lay.token_coords()
    first = ~is_text & (frame == 0)
    np.testing.assert_array_equal(slots[first], placement.video_start + position[first])
    rest = ~is_text & (frame > 0)
    expected = placement.video_start + placement.frame_stride + position[rest] * (lay.frames - 1) + frame[rest] - 1
    np.testing.assert_array_equal(slots[rest], expected)
    inverse = placement.slot_tokens(placement.length)
    np.testing.assert_array_equal(inverse[slots], np.arange(lay.seq_len))
    text, video, f, p = placement.decode(np.arange(placement.length))
    np.testing.assert_array_equal(np.flatnonzero(video | text), np.sort(slots))
    np.testing.assert_array_equal(f[slots[~is_text]], frame[~is_text])
    np.testing.assert_array_equal(p[slots[~is_text]], position[~is_text])


def test_presets_have_real_shapes_and_head_mix() -> None:
    expected = {
        "wan2.1-720p": 75600,
        "wan2.1-480p": 32760,
        "hunyuan-720p": 33 * 3600 + 256,
        "cogvideox1.5": 11 * 4080 + 226,
        "cogvideox-5b": 13 * 1350 + 226,
        "cpu-demo": 4096,
    }
    assert {name: p.layout.seq_len for name, p in PRESETS.items()} == expected
    for preset in PRESETS.values():
        pattern = preset.pattern(preset.heads)
        kinds = [h.kind for h in pattern.heads]
        assert kinds.count("spatial") == max(1, round(preset.heads / 3))
        assert kinds.count("temporal") == preset.heads - kinds.count("spatial")
    assert get_preset("wan2.1-720p").pattern().heads[0].first_frame_sink
    with pytest.raises(ValueError, match="unknown preset 'wan3'"):
        get_preset("wan3")


def test_sampled_reference_equals_dense_reference_rows() -> None:
    pattern = SparsityPattern(VideoLayout(3, 7, 4, "suffix"), (HeadPattern.temporal(1, True), HeadPattern.band(5)))
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 2, pattern.seq_len, 4)) for _ in range(3))
    rows = np.array([0, 5, 11, 24])
    np.testing.assert_allclose(
        reference_attention(q, k, v, pattern, rows=rows), reference_attention(q, k, v, pattern)[:, :, rows]
    )
    np.testing.assert_array_equal(mask_rows(pattern, 1, rows), dense_mask(pattern)[1][rows])


@settings(max_examples=60, deadline=None)
@given(
    pattern=patterns(max_frames=6, max_per_frame=400, max_text=300),
    backend=st.sampled_from(["xla", "tpu"]),
    dtype=st.sampled_from(["float32", "bfloat16"]),
)
# Found by hypothesis: aligning a one-token text prefix to a 64-token tile padded the whole sequence 34%.
@example(
    pattern=SparsityPattern(VideoLayout(1, 285, 1, "prefix"), (HeadPattern.dense(),)), backend="xla", dtype="float32"
)
def test_heuristic_config_is_inside_the_search_space(pattern: SparsityPattern, backend: str, dtype: str) -> None:
    """The heuristic is the search's warm start: it must be a point the search may measure, short
    sequences included (whose every tile pads past the 25% bound)."""
    from autotune.space import SearchSpace
    from kernel.heuristic import heuristic_config
    from kernel.workload import Workload

    config = heuristic_config(pattern, backend, dtype)
    space = SearchSpace(Workload("TPU v6 lite" if backend == "tpu" else "cpu", backend, dtype, 1, 64, pattern), backend)
    assert space.violation(config) is None
