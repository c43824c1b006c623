"""``tiletune bench winner``: a winner (given, or the database's tuned config) is compiled, checked and
timed live beside a recorded table's tied set in interleaved rounds, and compared with the fastest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from autotune.measure import Measurement, MeasureOptions
from autotune.replay import RecordedTable
from autotune.search import SearchOptions
from autotune.space import SearchSpace
from server.cli import app as cli
from server.worker.tune import tune_workload

from ...autotune.test_measurer_contract import LIVE

runner = CliRunner()


def _table(tmp_path: Path) -> tuple[Path, RecordedTable, list[Any]]:
    """A table of three configs of a small workload: two recorded tied, a third reliably slower."""
    configs = SearchSpace(LIVE, "xla", blocks_q=(64, 128), blocks_kv=(64, 128)).enumerate()[:3]
    recorded = [(1.00, 1.01, 0.99, 1.02, 1.00, 0.98), (1.01, 0.99, 1.00, 1.02, 0.98, 1.01), (3.0,) * 6]
    entries = {c.key: (c, Measurement("ok", 1.0, 1.0, runs, 0.0)) for c, runs in zip(configs, recorded, strict=True)}
    table = RecordedTable(LIVE, "xla", "cpu", entries, rounds=6, clock="cpu")
    path = tmp_path / "small.xla.json"
    table.save(path)
    return path, table, configs


def _bench(*args: str, processes: int = 1, json_out: bool = True) -> Any:
    options = ["--rounds", "2", "--runs", "1", "--processes", str(processes)]
    return runner.invoke(cli, ["bench", "winner", *options, *(["--json"] if json_out else []), *args])


def test_a_given_winner_is_timed_beside_the_tied_set_and_compared_with_the_fastest(tmp_path: Path) -> None:
    path, table, configs = _table(tmp_path)
    assert table.tied_with_best() == {configs[0].key, configs[1].key}
    result = _bench("--table", str(path), "--config", json.dumps(configs[2].to_dict()), processes=2)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    # Two rounds in each of two measuring processes: every row compared with the pooled fastest in each.
    assert report["processes"] == 2
    assert all(len(r["process_ratios"]) == 2 and r["slower_in_processes"] == 0 for r in report["rows"])
    rows = report["rows"]
    assert {r["config"] for r in rows} == {c.describe() for c in configs}
    assert [r["median_ms"] for r in rows] == sorted(r["median_ms"] for r in rows)  # fastest first
    assert rows[0]["ratio"] == 1.0 and rows[0]["tied"]
    (winner,) = [r for r in rows if r["winner"]]
    assert winner["config"] == report["winner"] == configs[2].describe()
    assert not report["winner_in_table_tied_set"] and winner["table_ratio"] == pytest.approx(3.0, rel=0.05)
    assert report["winner_tied"] == winner["tied"] and report["clock"] == "cpu" and report["tied_set"] == 2
    # Four runs pooled (two a process) cannot show a difference (autotune.compare.MIN_RUNS): all tie.
    assert all(r["tied"] and r["p_value"] == 1.0 for r in rows)


def test_the_winner_comes_from_the_database_and_a_missing_one_is_named(tmp_path: Path) -> None:
    path, _, configs = _table(tmp_path)
    url = f"sqlite:///{tmp_path / 'tune.db'}"
    result = _bench("--table", str(path), "--database-url", url)
    assert result.exit_code == 2 and "tune it first" in result.output
    outcome = tune_workload(
        LIVE,
        database_url=url,
        # Only a tuned config is needed here: finalized in the search's own measuring process.
        search=SearchOptions(
            trials=2, seed=0, seed_configs=(configs[1],), prune=False, anchor_processes=1, resolve_processes=1
        ),
        measure=MeasureOptions(repeats=2, min_time_s=0.0, check_rows=16),
    )
    assert outcome.result.best is not None
    result = _bench("--table", str(path), "--database-url", url)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["winner"] == outcome.result.best.config.describe()


def test_bad_options_are_named(tmp_path: Path) -> None:
    path, _, _ = _table(tmp_path)
    result = _bench("--table", "no-such.xla.json")
    assert result.exit_code == 2 and "no shipped table" in result.output
    result = _bench("--table", str(path), "--config", "{not json")
    assert result.exit_code == 2 and "--config" in result.output


def test_a_fresh_process_that_cannot_start_leaves_the_verdict_to_the_ones_timed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autotune.supervisor import Supervisor

    def no_restart(self: Supervisor) -> None:
        raise RuntimeError("measuring process failed to start")

    monkeypatch.setattr(Supervisor, "restart", no_restart)
    path, _, configs = _table(tmp_path)
    result = _bench("--table", str(path), "--config", json.dumps(configs[0].to_dict()), processes=3, json_out=False)
    assert result.exit_code == 0, result.output
    printed = " ".join(result.output.split())  # however the terminal's width wrapped it
    assert "in each of 1 measuring process, pooled" in printed
    assert f"winner {configs[0].describe()}: " in printed
