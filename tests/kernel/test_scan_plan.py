"""The xla backend's scan plan: every non-empty tile walked once, rows grouped by list length."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.attention import head_groups, prepare_group
from kernel.config import TileConfig
from kernel.pattern import SparsityPattern
from kernel.xla_backend import MAX_SCAN_GROUPS, SCAN_SLACK, length_groups, scan_plan
from tests.kernel.strategies import patterns, tile_configs


def padded_steps(counts: np.ndarray, groups: list[np.ndarray]) -> int:
    return sum(len(g) * int(counts[g].max()) for g in groups)


def fewest_steps(counts: np.ndarray, groups: int) -> int:
    """Brute force: the fewest padded steps of any split of the rows into ``groups`` non-empty sets."""
    n = len(counts)
    best = None
    for labels in itertools.product(range(groups), repeat=n):
        if len(set(labels)) != groups:
            continue
        split = [np.flatnonzero(np.array(labels) == g) for g in range(groups)]
        steps = padded_steps(counts, split)
        best = steps if best is None else min(best, steps)
    assert best is not None
    return best


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 12), min_size=1, max_size=7))
def test_length_groups_are_the_fewest_scans_within_the_slack_of_the_fewest_steps(values: list[int]) -> None:
    counts = np.array(values)
    groups = length_groups(counts)
    if counts.max() == 0:
        assert groups == []
        return
    rows = [g for g, _ in groups]
    for g, length in groups:
        assert length == counts[g].max() > 0
        assert (np.diff(g) > 0).all()
    taken = np.concatenate(rows)
    assert len(set(taken.tolist())) == len(taken), "a row is in two scans"
    assert set(np.flatnonzero(counts > 0).tolist()) <= set(taken.tolist()), "a row with tiles is in no scan"
    # Compared with any split at all (not only contiguous runs of the sorted rows), by brute force:
    usable = [fewest_steps(counts, k) for k in range(1, min(MAX_SCAN_GROUPS, len(counts)) + 1)]
    steps = padded_steps(counts, rows)
    assert steps <= min(usable) * (1 + SCAN_SLACK)
    # No fewer scans would have done: every smaller count of groups is beyond the slack.
    fewer = len(groups) - 1 + (len(taken) < len(counts))  # a dropped all-empty group was one of the scans
    assert all(s > min(usable) * (1 + SCAN_SLACK) for s in usable[:fewer])


@settings(max_examples=30, deadline=None)
@given(patterns(), tile_configs())
def test_every_non_empty_tile_is_walked_once_in_its_list(pattern: SparsityPattern, config: TileConfig) -> None:
    for heads in head_groups(pattern, config):
        tables = prepare_group(pattern, heads, config)[2]
        walked: dict[bool | None, list[tuple[int, int, int]]] = {}
        for scan in scan_plan(tables, config.variant):
            kv, full, valid = tables.padded_lists(full=scan.full, q_blocks=scan.q_blocks)
            assert kv.shape == (tables.num_heads, len(scan.q_blocks), scan.length)
            assert scan.masked == (scan.full is not True)
            if scan.full is not None:
                assert (full[valid] == scan.full).all()
            h, r, c = np.nonzero(valid)
            walked.setdefault(scan.full, []).extend(
                zip(h.tolist(), scan.q_blocks[r].tolist(), kv[h, r, c].tolist(), strict=True)
            )
        for which in walked:
            expected = []
            for h, t in enumerate(tables.heads):
                rows = np.repeat(np.arange(tables.num_q_blocks), t.row_lengths())
                keep = np.ones(t.num_tiles, bool) if which is None else t.is_full == which
                expected.extend(zip([h] * int(keep.sum()), rows[keep].tolist(), t.kv_index[keep].tolist(), strict=True))
            assert sorted(walked[which]) == sorted(expected)
            assert len(set(walked[which])) == len(walked[which])
        assert set(walked) <= ({None} if config.variant == "naive" else {True, False})
