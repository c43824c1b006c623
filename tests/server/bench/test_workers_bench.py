"""``tiletune bench workers`` runs worker processes on the replay backend and reports jobs per minute."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.measure import Measurement
from autotune.replay import RecordedTable, bundled_table
from server.cli import app as cli

TABLE = bundled_table("small-mixed.xla.json")


def _bench(tmp_path: Path, table: Path, *extra: str) -> tuple[dict, float]:  # type: ignore[type-arg]
    url = f"sqlite:///{tmp_path / 'bench.db'}"
    args = ["bench", "workers", "--database-url", url, "--workers", "1,2", "--jobs-per-worker", "1"]
    args += ["--budget", "3", "--table", str(table), "--json", *extra]
    started = time.perf_counter()
    result = CliRunner().invoke(cli, args)
    elapsed = time.perf_counter() - started
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), elapsed


@pytest.mark.slow
def test_bench_workers_reports_throughput_and_efficiency(tmp_path: Path) -> None:
    sleep = 0.2
    report, elapsed = _bench(tmp_path, TABLE, "--replay-sleep", str(sleep))
    runs = report["runs"]
    assert [(r["workers"], r["jobs"], r["done"], r["failed"], r["trials"]) for r in runs] == [
        (1, 1, 1, 0, 3),
        (2, 2, 2, 0, 6),
    ]
    # The timed window holds at least the device time the replay slept on one worker's three trials,
    # and the runs together fit inside the wall time of the whole command.
    table = RecordedTable.load(TABLE)
    shortest = min((m.compile_ms or 0.0) + sum(m.runs_ms) for _c, m in table.entries.values()) / 1e3 * sleep
    assert all(r["seconds"] >= 3 * shortest for r in runs)
    assert sum(r["seconds"] for r in runs) < elapsed
    assert runs[0]["efficiency"] == 1.0


@pytest.mark.slow
def test_failed_jobs_are_not_throughput(tmp_path: Path) -> None:
    """A table whose every config failed: each job ends failed (nothing measured ok), so nothing is done."""
    table = RecordedTable.load(TABLE)
    table.entries = {
        k: (c, Measurement("failed", error="compile error: recorded")) for k, (c, _m) in table.entries.items()
    }
    broken = tmp_path / "all-failed.json"
    table.save(broken)
    report, _ = _bench(tmp_path, broken, "--replay-sleep", "0")
    assert [(r["jobs"], r["done"], r["failed"], r["jobs_per_minute"]) for r in report["runs"]] == [
        (1, 0, 1, 0.0),
        (2, 0, 2, 0.0),
    ]


def test_bench_workers_rejects_a_missing_table(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["bench", "workers", "--table", str(tmp_path / "none.json")])
    assert result.exit_code == 2 and "does not exist" in " ".join(result.output.split())
