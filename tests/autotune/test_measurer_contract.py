"""One contract, run over every measurer a search can be given:

- ``in-process``: :class:`autotune.measure.WorkloadBench` on this process's device;
- ``in-process-ahead``: the same, with the search proposing two configs ahead that it
  compiles in a background thread (``prefetch``, what a TPU worker does);
- ``supervised``: :class:`autotune.supervisor.Supervisor`, the same in a child process;
- ``replay``: :class:`autotune.replay.ReplayMeasurer` on a recorded table;
- ``worker``: what a tuning worker measures with (``Worker.measurer``: the replay of its
  table, which a lost job can abandon).

With each, a search measures no params twice and no invalid point; a config whose
measurement fails (a wrong result, a crashed child, a config the table lacks) comes
back as a Measurement with its status and error, is recorded as a trial, and the
search goes on; ``retime`` and ``anchor_runs`` answer for a measured config (a live measurer times the
anchors; a replay answers what its table recorded, which may be nothing).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autotune.measure import STATUSES, Measurement, MeasureOptions, WorkloadBench
from autotune.replay import RecordedTable, ReplayMeasurer, bundled_table
from autotune.search import SearchOptions, run_search
from autotune.space import SearchSpace
from autotune.supervisor import Supervisor
from kernel.config import TileConfig
from kernel.heuristic import heuristic_config
from kernel.layout import VideoLayout
from kernel.pattern import HeadPattern, SparsityPattern
from kernel.workload import Workload
from server.worker.worker import Worker, WorkerOptions

# Small enough to compile and time in a second per config on the CPU.
LIVE = Workload(
    "cpu",
    "xla",
    "float32",
    1,
    16,
    SparsityPattern(VideoLayout(2, 64), (HeadPattern.spatial(0), HeadPattern.temporal(2))),
)
OPTIONS = MeasureOptions(repeats=2, min_time_s=0.0, check_rows=16)


@dataclasses.dataclass
class Case:
    space: SearchSpace
    measurer: Any  # entered as a context manager
    failing: TileConfig  # the heuristic: the warm start's first proposal
    failure: str  # its expected status
    trials: int


class Spy:
    """Forwards to a measurer and keeps every config it was asked to measure."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.measured: list[TileConfig] = []
        self.prefetched: list[TileConfig] = []

    def measure(self, config: TileConfig, prune_above_ms: float | None = None) -> Measurement:
        self.measured.append(config)
        return self.inner.measure(config, prune_above_ms)

    def retime(self, config: TileConfig, runs: int) -> list[float]:
        return list(self.inner.retime(config, runs))

    def prefetch(self, config: TileConfig) -> None:
        self.prefetched.append(config)
        if hasattr(self.inner, "prefetch"):
            self.inner.prefetch(config)

    def anchor_runs(self, anchor: str, runs: int, config: TileConfig | None = None) -> list[float]:
        return list(self.inner.anchor_runs(anchor, runs, config))


def _table_without(config: TileConfig, tmp_path: Path) -> tuple[RecordedTable, Path]:
    """The shipped small-mixed table with ``config`` left out (so measuring it fails)."""
    table = RecordedTable.load(bundled_table("small-mixed.xla.json"))
    assert table.entries.pop(config.key, None) is not None
    path = tmp_path / "table.json"
    table.save(path)
    return table, path


@contextlib.contextmanager
def _case(kind: str, tmp_path: Path) -> Iterator[Case]:
    if kind in ("in-process", "in-process-ahead", "supervised"):
        space = SearchSpace(LIVE, "xla", blocks_q=(64, 128), blocks_kv=(64, 128))
        heuristic = heuristic_config(LIVE.pattern, "xla", LIVE.dtype)
        if kind.startswith("in-process"):
            bench = WorkloadBench(LIVE, "xla", OPTIONS, inject={heuristic.key: "wrong"})
            yield Case(space, contextlib.nullcontext(bench), heuristic, "wrong", 3)
        else:
            supervisor = Supervisor(LIVE, "xla", OPTIONS, trial_timeout_s=120, inject={heuristic.key: "crash"})
            yield Case(space, supervisor, heuristic, "crashed", 3)
        return
    recorded = RecordedTable.load(bundled_table("small-mixed.xla.json"))
    heuristic = heuristic_config(recorded.workload.pattern, recorded.backend, recorded.workload.dtype)
    table, path = _table_without(heuristic, tmp_path)
    if kind == "replay":
        yield Case(table.space(), ReplayMeasurer(table), heuristic, "failed", 12)
        return
    worker = Worker(
        WorkerOptions(f"sqlite:///{tmp_path / 'worker.db'}", backend="replay", replay_tables=(path,), replay_sleep=0.0)
    )
    try:
        yield Case(table.space(), worker.measurer(table.workload), heuristic, "failed", 12)
    finally:
        worker.close()


@pytest.mark.parametrize("kind", ["in-process", "in-process-ahead", "supervised", "replay", "worker"])
def test_measurer_contract(kind: str, tmp_path: Path) -> None:
    lookahead = 2 if kind.endswith("-ahead") else 0
    with _case(kind, tmp_path) as case, case.measurer as measurer:
        spy = Spy(measurer)
        options = SearchOptions(trials=case.trials, seed=0, retime_rounds=1, retime_runs=2, lookahead=lookahead)
        result = run_search(case.space, spy, options)
        ok = next(t for t in result.trials if t.measurement.status == "ok")
        retimed = spy.retime(ok.config, 3)
        anchors = [spy.anchor_runs("dense", 2), spy.anchor_runs("tiled_dense", 2, ok.config)]
    keys = [c.key for c in spy.measured]
    assert len(keys) == len(set(keys)), "params measured twice"
    # Looking ahead, every measured config was announced first (and nothing else was); otherwise none.
    assert [c.key for c in spy.prefetched] == (keys if lookahead else [])
    assert all(case.space.violation(c) is None for c in spy.measured), "an invalid point was measured"
    assert spy.measured[0] == case.failing  # the warm start proposes the heuristic first
    failed = result.trials[0].measurement
    assert failed.status == case.failure and failed.error, "a failure must come back as a value with its reason"
    assert len(result.trials) == case.trials, "the search goes on after a failure"
    assert all(t.measurement.status in STATUSES for t in result.trials)
    assert result.best is not None and result.best.measurement.status == "ok"
    assert result.best.config != case.failing
    assert len(retimed) == 3 and all(t > 0 for t in retimed)
    live = kind in ("in-process", "in-process-ahead", "supervised")
    assert all((len(runs) == 2 and min(runs) > 0) if live else len(runs) in (0, 2) for runs in anchors)
    # The winner was timed beside its anchors: a live measurer has both; a replay answers what its table
    # recorded (format-2 tables hold dense, and tiled dense for their fastest configs only).
    if live:
        assert set(result.anchors) == {"dense", "tiled_dense"}
    else:
        assert set(result.anchors) <= {"dense", "tiled_dense"}


def test_an_anchor_the_device_cannot_run_answers_no_runs_and_the_child_goes_on() -> None:
    """Dense attention materialises the whole score matrix and may fail to compile or run at a video's
    length: the supervised measurer answers no runs for it (the winner's timing then leaves it out,
    autotune.search.anchor_rounds) instead of an exception that would lose the whole tune."""
    heuristic = heuristic_config(LIVE.pattern, "xla", LIVE.dtype)
    with Supervisor(LIVE, "xla", OPTIONS, trial_timeout_s=120, inject={"anchor:dense": "error"}) as supervisor:
        assert supervisor.measure(heuristic).status == "ok"
        assert supervisor.anchor_runs("dense", 2) == []
        assert len(supervisor.anchor_runs("tiled_dense", 2, heuristic)) >= 2
        assert len(supervisor.retime(heuristic, 2)) == 2 and supervisor.restarts == 0
