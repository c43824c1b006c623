"""Compiling ahead: the order compile workers use, the supervised compiling processes, and the
search's look-ahead that lets a device time one config while the next ones compile."""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future

import pytest

from autotune.compile_pool import CompileChild, compile_order
from autotune.pipeline import ReplayedDevice, model_ms
from autotune.search import SearchOptions, run_search
from autotune.space import SearchSpace
from kernel.config import TileConfig
from kernel.heuristic import heuristic_config
from kernel.layout import VideoLayout
from kernel.pattern import HeadPattern, SparsityPattern
from kernel.tpu_compile import CompileOutcome
from kernel.tpu_targets import libtpu_installed
from kernel.workload import Workload

needs_libtpu = pytest.mark.skipif(
    not libtpu_installed(), reason="libtpu (the TPU compiler) is not installed: pip install -e '.[tpu]'"
)
# Small enough that one compile takes well under a second.
WORKLOAD = Workload(
    "TPU v5 lite",
    "tpu",
    "bfloat16",
    1,
    128,
    SparsityPattern(VideoLayout(4, 256), (HeadPattern.spatial(1), HeadPattern.temporal(8))),
)


def test_compile_order_puts_warm_starts_first_then_their_neighbourhood() -> None:
    space = SearchSpace(WORKLOAD, "tpu")
    heuristic = heuristic_config(WORKLOAD.pattern, "tpu", WORKLOAD.dtype)
    far = max(space.enumerate(), key=lambda c: (c.block_q, c.block_kv))
    order = compile_order(space, [heuristic, far, heuristic], seed=3)
    assert order[:2] == [heuristic, far]
    assert sorted(c.key for c in order) == sorted(c.key for c in space.enumerate())  # every valid config, once
    dims = space.dimensions()

    def distance(a: TileConfig, b: TileConfig) -> int:
        pa, pb = space.params_of(a), space.params_of(b)
        return sum(abs(dims[n].index(pa[n]) - dims[n].index(pb[n])) for n in dims)

    nearest = [min(distance(c, heuristic), distance(c, far)) for c in order[2:]]
    assert nearest == sorted(nearest) and nearest[0] == 1
    assert compile_order(space, [heuristic], seed=3) != compile_order(space, [heuristic], seed=4)  # ties: seeded


@dataclasses.dataclass
class FakePool:
    """Compiles nothing: records what was submitted, and when (as the count of measures so far)."""

    submitted: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    device: ReplayedDevice | None = None

    def submit(self, config: TileConfig) -> Future[CompileOutcome]:
        measured = len(self.device.log.compiles) if self.device else 0
        self.submitted.append((config.key, measured))
        future: Future[CompileOutcome] = Future()
        future.set_result(CompileOutcome(WORKLOAD.device_kind, True, 0.0, 1))
        return future


@pytest.mark.parametrize("lookahead", [0, 2])
def test_the_search_proposes_lookahead_configs_ahead_of_the_one_measured(lookahead: int) -> None:
    pool = FakePool()
    device = ReplayedDevice(WORKLOAD, pool, runs=1, device_scale=0.0)  # type: ignore[arg-type]
    pool.device = device
    space = SearchSpace(WORKLOAD, "tpu")
    options = SearchOptions(trials=10, seed=2, lookahead=lookahead, prune=False)
    result = run_search(space, device, options, finalize=False)
    measured = [t.config.key for t in result.trials]
    assert len(measured) == len(set(measured)) == 10  # the budget, nothing measured twice
    submitted = [key for key, _ in pool.submitted]
    assert sorted(submitted) == sorted(measured)  # nothing compiled that was not measured
    for key, measures_before in pool.submitted:
        # a config's compile starts `lookahead` measurements before its own (0: just before it)
        assert measures_before == max(0, measured.index(key) - lookahead)


def test_the_device_model_grows_with_the_work_of_a_config() -> None:
    space = SearchSpace(WORKLOAD, "tpu")
    compact = {c.key: model_ms(WORKLOAD, c) for c in space.enumerate() if c.variant == "compact"}
    naive = {
        c.key: model_ms(WORKLOAD, dataclasses.replace(c, variant="naive"))
        for c in space.enumerate()
        if c.variant == "compact"
    }
    assert all(naive[k] >= compact[k] for k in compact)  # the dense grid visits empty tiles too
    assert any(naive[k] > compact[k] for k in compact)


@needs_libtpu
def test_a_hung_compile_is_a_timeout_and_its_process_is_replaced() -> None:
    heuristic = heuristic_config(WORKLOAD.pattern, "tpu", WORKLOAD.dtype)
    with CompileChild(WORKLOAD, "TPU v5 lite", timeout_s=120) as child:
        first = child.compile(heuristic)
        assert first.ok and first.calls >= 1 and first.memory and first.device_kind == "TPU v5 lite", first
        child.call_timeout_s = 0.01
        hung = child.compile(heuristic)  # no compile answers in 10 ms: killed, recorded, replaced
        assert hung.cause == "timeout" and not hung.ok and child.restarts == 1
        child.call_timeout_s = 120
        assert child.compile(heuristic).ok
