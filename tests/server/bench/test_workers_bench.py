"""``tiletune bench workers`` runs worker processes on the replay backend and reports jobs per minute."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from server.cli import app as cli


@pytest.mark.slow
def test_bench_workers_reports_throughput_and_efficiency(tmp_path) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'bench.db'}"
    args = ["bench", "workers", "--database-url", url, "--workers", "1,2", "--jobs-per-worker", "1", "--budget", "3"]
    result = CliRunner().invoke(cli, [*args, "--replay-sleep", "0", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    runs = report["runs"]
    assert [(r["workers"], r["jobs"], r["failed"], r["trials"]) for r in runs] == [(1, 1, 0, 3), (2, 2, 0, 6)]
    assert runs[0]["efficiency"] == 1.0 and runs[1]["efficiency"] > 0
    assert all(r["jobs_per_minute"] == pytest.approx(r["jobs"] / r["seconds"] * 60, rel=0.01) for r in runs)


def test_bench_workers_rejects_a_missing_table(tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = CliRunner().invoke(cli, ["bench", "workers", "--table", str(tmp_path / "none.json")])
    assert result.exit_code == 2 and "does not exist" in " ".join(result.output.split())
