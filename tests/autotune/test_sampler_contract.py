"""One contract, run over every sampler tiletune offers (``autotune.samplers.SAMPLERS``):

- no params are measured twice in one search;
- no invalid point of the space is ever measured (invalid proposals are reported, unmeasured);
- failures are values: a config whose measurement fails is a recorded trial with its status,
  it counts toward the budget, and the search goes on to spend the whole budget.

A sampler added to ``SAMPLERS`` is covered without touching this file.
"""

from __future__ import annotations

import dataclasses

import pytest

from autotune.measure import Measurement
from autotune.samplers import SAMPLERS
from autotune.search import SearchOptions, run_search
from autotune.space import SearchSpace
from kernel.config import TileConfig
from kernel.heuristic import heuristic_config

from .test_search import WORKLOAD, cost

BUDGET = 40


@dataclasses.dataclass
class FailingMeasurer:
    """Answers from the synthetic cost, except: 64-row q tiles fail to compile, and the
    heuristic (always proposed first) is fast but wrong."""

    wrong: str
    measured: list[TileConfig] = dataclasses.field(default_factory=list)

    def measure(self, config: TileConfig, prune_above_ms: float | None = None) -> Measurement:
        self.measured.append(config)
        if config.block_q == 64:
            return Measurement("failed", error="compile error: injected")
        if config.key == self.wrong:
            return Measurement("wrong", compile_ms=1.0, max_error=1.0, error="injected wrong result")
        t = cost(config)
        return Measurement("ok", compile_ms=1.0, runs_ms=(t, t), max_error=0.0)

    def retime(self, config: TileConfig, runs: int) -> list[float]:
        return [cost(config)] * runs

    def anchor_runs(self, anchor: str, runs: int, config: TileConfig | None = None) -> list[float]:
        return [100.0] * runs


def _sampler(name: str) -> str:
    if name == "gp":
        pytest.importorskip("torch", reason="the gp sampler needs torch (pip install 'tiletune[gp]')")
    return name


@pytest.mark.parametrize("name", SAMPLERS)
def test_sampler_contract(name: str) -> None:
    space = SearchSpace(WORKLOAD, "xla", max_padding=0.1)
    # Frames of 128 tokens aligned to 256 or 512 tiles pad far over 10%: the space has invalid points.
    assert any(space.violation(c) for c in space.candidates())
    heuristic = heuristic_config(WORKLOAD.pattern, "xla", WORKLOAD.dtype)
    measurer = FailingMeasurer(wrong=heuristic.key)
    invalid: list[tuple[TileConfig, str]] = []
    result = run_search(
        space,
        measurer,
        SearchOptions(trials=BUDGET, sampler=_sampler(name), seed=3),
        on_invalid=lambda config, reason: invalid.append((config, reason)),
    )
    keys = [c.key for c in measurer.measured]
    assert len(keys) == len(set(keys)), "params measured twice"
    assert [space.violation(c) for c in measurer.measured] == [None] * len(keys), "an invalid point was measured"
    assert all(space.violation(c) is not None for c, _ in invalid)
    assert not {c.key for c, _ in invalid} & set(keys)
    assert len(result.trials) == BUDGET == len(keys), "failures must not end the search early"
    statuses = {t.config.key: t.measurement.status for t in result.trials}
    assert {statuses[c.key] for c in measurer.measured if c.block_q == 64} <= {"failed"}
    if heuristic.key in statuses:  # every sampler but grid and brute starts from the heuristic
        assert statuses[heuristic.key] == "wrong"
    assert result.best is not None and result.best.measurement.status == "ok"
    assert result.best.config.key != heuristic.key and result.best.config.block_q != 64
