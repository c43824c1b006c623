"""``tiletune bench crash``: a few runs of every scenario (the full 50-run version is the command).

Each run SIGKILLs a real tiletune process at a random point (seeded), restarts, and checks the
database and the jobs; a run whose checks fail is reported with its reasons and the command
exits 1, so the report saying every run recovered is the test.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from server.bench.crash import CrashBenchOptions, run_crash_bench
from server.cli import app as cli


def check_recovered(report: dict[str, object], scenarios: tuple[str, ...], runs: int, databases: set[str]) -> None:
    rows = report["scenarios"]
    assert isinstance(rows, list)
    assert {(r["scenario"], r["database"]) for r in rows} == {(s, d) for s in scenarios for d in databases}
    for r in rows:
        assert r["failures"] == [], r
        assert r["runs"] == r["recovered"] == runs, r
        if r["scenario"] not in ("upgrade", "starts"):  # these may be killed after their process exited
            assert r["killed"] == runs, r


@pytest.mark.slow
def test_killed_workers_and_server_recover_on_sqlite() -> None:
    """A worker killed in a trial and in its publish, the server killed as it starts. (Kills of
    ``db upgrade`` and of concurrent starters are tested at every statement boundary and with
    starters in step in tests/server/store/test_migration_safety.py.)"""
    scenarios = ("worker-trial", "worker-publish", "server")
    report = run_crash_bench(CrashBenchOptions(runs=1, seed=14, scenarios=scenarios))
    check_recovered(report, scenarios, 1, {"sqlite"})
    (trial,) = [r for r in report["scenarios"] if r["scenario"] == "worker-trial"]
    assert set(trial["figures"]) == {"settle_s (co-worker)"}  # run 1 of worker-trial: parallelism 2


@pytest.mark.slow
@pytest.mark.postgres
def test_a_finalizer_killed_inside_its_publish_recovers_on_postgresql(postgres_url: str) -> None:
    """The finalizer is blocked inside its publish transaction (the bench holds the publish lock)
    and killed there; on a scratch database, dropped afterwards. (Kills of ``db upgrade`` on
    PostgreSQL, transactional there, are in the 50-run command.)"""
    result = CliRunner().invoke(
        cli,
        ["bench", "crash", "--runs", "1", "--scenarios", "worker-publish", "--seed", "14", "--no-sqlite",
         "--database-url", postgres_url, "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    check_recovered(report, ("worker-publish",), 1, {"postgresql"})
    (publish,) = report["scenarios"]
    assert publish["counts"] == {"killed before the job was done": 1}  # inside the transaction: rolled back


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scenarios", "upgrade,reboot"], "unknown scenario(s) ['reboot']"),
        (["--database-url", "sqlite:///x.db"], "--database-url must be a PostgreSQL URL"),
        (["--no-sqlite"], "--no-sqlite leaves no database"),
    ],
)
def test_bad_options_are_usage_errors(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["bench", "crash", "--runs", "1", *args])
    assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output
