"""Exhaustive tables: recording, the replay backend, and the search benchmark on the committed fixtures."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from typer.testing import CliRunner

from autotune.measure import MeasureOptions
from autotune.replay import TABLES as TABLES_DIR
from autotune.replay import RecordedTable, ReplayMeasurer, record_table
from autotune.search import SearchOptions, run_search
from autotune.space import SearchSpace
from kernel.layout import VideoLayout
from kernel.pattern import HeadPattern, SparsityPattern
from kernel.workload import Workload
from server.bench.search import replay
from server.cli import app as cli

TABLES = sorted(TABLES_DIR.glob("*.xla.json"))


def test_at_least_three_committed_tables_are_exhaustive_and_valid() -> None:
    assert len(TABLES) >= 3
    for path in TABLES:
        table = RecordedTable.load(path)
        space = table.space()
        assert table.backend == "xla" and table.device_kind == "cpu"
        assert {c.key for c in space.enumerate()} == set(table.entries)  # every valid point, once
        _, best = table.best
        assert best.status == "ok" and best.max_error is not None and best.max_error <= 2e-5
        assert table.dense_ms and table.dense_ms > 0


def test_replay_answers_recorded_measurements() -> None:
    table = RecordedTable.load(TABLES[0])
    measurer = ReplayMeasurer(table)
    config, recorded = next(iter(table.entries.values()))
    assert measurer.measure(config) == recorded
    assert measurer.retime(config, 4) and len(measurer.retime(config, 4)) == 4
    measurer = ReplayMeasurer(table)
    result = run_search(table.space(), measurer, SearchOptions(trials=15, seed=2))
    assert len(result.trials) == 15 and len(set(measurer.measured)) == 15
    assert result.best is not None and result.best.measurement.status == "ok"


@pytest.mark.parametrize("sampler", ["tpe", "random", "grid"])
def test_replay_benchmark_statistics(sampler: str) -> None:
    table = RecordedTable.load(TABLES[-1])
    stats = replay(table, TABLES[-1].name, sampler, seeds=2)
    summary = stats.summary()
    assert summary["table_size"] == len(table.entries)
    assert all(1 <= t <= len(table.entries) for t in stats.trials_to_within)  # the whole table is the budget
    assert all(v >= 1.0 for values in stats.best_at_budget.values() for v in values)
    assert summary["best_at_budget"]["40"] <= summary["best_at_budget"]["5"]


def test_replay_command_prints_json() -> None:
    result = CliRunner().invoke(
        cli, ["bench", "search", "--replay", *map(str, TABLES[-2:]), "--sampler", "random", "--seeds", "2", "--json"]
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["table"] for r in rows] == [t.name for t in TABLES[-2:]]  # both tables after one --replay
    assert rows[0]["sampler"] == "random" and math.isfinite(rows[0]["median_trials_to_within_2pct"])


@pytest.mark.slow
def test_record_a_small_table_and_reload_it(tmp_path: Any) -> None:
    workload = Workload("cpu", "xla", "float32", 1, 32, SparsityPattern(VideoLayout(2, 64), (HeadPattern.spatial(0),)))
    space = SearchSpace(workload, "xla", blocks_q=(32, 64), blocks_kv=(32, 64))
    table = record_table(workload, space=space, measure=MeasureOptions(repeats=2, min_time_s=0.0))
    assert len(table.entries) == len(space.enumerate()) == 16
    assert all(m.status == "ok" for _, m in table.entries.values())
    path = tmp_path / "t.json"
    table.save(path)
    again = RecordedTable.load(path)
    assert set(again.entries) == set(table.entries) and again.best[1].median_ms == table.best[1].median_ms
