"""`tiletune serve` on loopback, and lookup/configs/history against it and against the database."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from server.bench.harness import tiletune_command
from server.cli import app as cli
from server.store import records, workloads
from server.store.db import Database
from server.store.migrate import upgrade
from tests.server.api.test_api import CONFIG, VERSIONS
from tests.server.worker.workers import TABLE
from tests.serving import tiletune_serve

runner = CliRunner()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A real uvicorn server started by `tiletune serve` on a fresh SQLite file: (base url, database url)."""
    url = f"sqlite:///{tmp_path / 'served.db'}"
    with tiletune_serve(url, tmp_path / "server.log") as base:
        yield base, url


def seed(url: str) -> str:
    from kernel.presets import get_preset
    from kernel.workload import Workload

    db = Database(url)
    preset = get_preset("cpu-demo")
    wl = Workload("cpu", "xla", "float32", 1, preset.head_dim, preset.pattern())
    with db.transaction() as session:
        row = workloads.workload_row(session, wl)
        trial = records.record_trial(session, row, CONFIG, "ok", number=0, median_ms=3.0, compile_ms=50.0)
        records.record_trial(session, row, CONFIG, "crashed", number=1, error="child killed by SIGKILL")
        records.publish_tuned_config(
            session,
            row,
            CONFIG,
            median_ms=3.0,
            dense_ms=30.0,
            tiled_dense_ms=12.0,
            others_cores=0.75,
            speedup_p10_p90={"dense": [9.0, 11.5], "tiled_dense": [3.5, 4.25]},
            versions=VERSIONS,
            trial=trial,
        )
    db.dispose()
    return wl.key


def test_serve_and_query_over_http(served: tuple[str, str]) -> None:
    base, url = served
    key = seed(url)
    result = runner.invoke(cli, ["lookup", "--preset", "cpu-demo", "--backend", "xla", "--server", base, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["workload_key"] == key and data["source"] in ("tuned", "stale") and data["config"] == CONFIG
    timing = data["timing"]
    assert (timing["speedup"], timing["tiled_dense_ms"], timing["speedup_vs_tiled_dense"]) == (10.0, 12.0, 4.0)
    assert timing["others_cores"] == 0.75  # the load the anchors were timed under travels with them
    assert timing["speedup_p10_p90"] == {"dense": [9.0, 11.5], "tiled_dense": [3.5, 4.25]}  # and their spread
    human = " ".join(runner.invoke(cli, ["lookup", "--preset", "cpu-demo", "--server", base]).stdout.split())
    assert "10.00x (p10-p90 9.00-11.50) over jax.nn.dot_product_attention" in human
    assert "4.00x (p10-p90 3.50-4.25) over tiled dense" in human
    listing = runner.invoke(cli, ["configs", "--server", base])
    assert key in listing.stdout
    items = json.loads(runner.invoke(cli, ["configs", "--server", base, "--json"]).stdout)["items"]
    assert [i["timing"]["others_cores"] for i in items if i["workload_key"] == key] == [0.75]
    assert [i["timing"]["speedup_p10_p90"]["dense"] for i in items if i["workload_key"] == key] == [[9.0, 11.5]]
    history = runner.invoke(cli, ["history", key, "--server", base, "--json"])
    assert [t["status"] for t in json.loads(history.stdout)["items"]] == ["crashed", "ok"]
    missing = runner.invoke(cli, ["history", "0" * 32, "--server", base])
    assert missing.exit_code == 2 and "no workload with key" in missing.output


def test_query_the_database_directly(tmp_path) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'direct.db'}"
    upgrade(url)
    key = seed(url)
    result = runner.invoke(cli, ["lookup", "--preset", "cpu-demo", "--database-url", url, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["workload_key"] == key
    other = runner.invoke(
        cli,
        [
            "lookup",
            "--preset",
            "cpu-demo",
            "--device-kind",
            "TPU v6 lite",
            "--backend",
            "tpu",
            "--database-url",
            url,
            "--json",
        ],
    )
    assert json.loads(other.stdout)["source"] == "heuristic"
    assert key in runner.invoke(cli, ["configs", "--database-url", url, "--json"]).stdout
    assert runner.invoke(cli, ["history", key, "--status", "crashed", "--database-url", url]).exit_code == 0
    bad = runner.invoke(cli, ["lookup", "--preset", "nope", "--database-url", url])
    assert bad.exit_code == 2 and "unknown preset" in bad.output


@pytest.mark.parametrize("others", [None, 0.1, 1.3])
def test_a_worker_says_when_its_winner_was_timed_under_load(
    others: float | None, capsys: pytest.CaptureFixture[str]
) -> None:
    from server.cli.worker import _print_event

    event = {"job_id": 7, "config": "naive q64 kv64", "median_ms": 2.0, "dense_ms": 20.0, "tiled_dense_ms": 8.0}
    spread = {"dense": [9.0, 11.0], "tiled_dense": [3.75, 4.25]}
    _print_event("tuned", {**event, "tuned_config_id": 3, "others_cores": others, "speedup_p10_p90": spread}, False)
    printed = " ".join(capsys.readouterr().err.split())
    assert "job 7" in printed and "10.00x (p10-p90 9.00-11.00)" in printed and "4.00x (p10-p90 3.75-4.25)" in printed
    assert ("1.3 cores busy" in printed) == (others == 1.3)


def test_a_worker_finalizes_in_the_measuring_processes_it_is_told(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--finalize-processes`` (or TILETUNE_FINALIZE_PROCESSES) sets where the tied finalists and the
    winner's anchors are timed; unset, the search's defaults stand; below 1 is a usage error naming it."""
    from autotune.search import SearchOptions
    from server.cli.worker import _print_event, _search_options

    defaults = SearchOptions()
    assert _search_options(2, None) == SearchOptions(lookahead=2)
    told = _search_options(0, 1)
    assert (told.anchor_processes, told.resolve_processes, told.lookahead) == (1, 1, 0)
    assert (told.anchor_rounds, told.resolve_rounds) == (defaults.anchor_rounds, defaults.resolve_rounds)
    for argv, env in ((["--finalize-processes", "0"], {}), ([], {"TILETUNE_FINALIZE_PROCESSES": "0"})):
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        result = runner.invoke(cli, ["worker", "--backend", "replay", *argv])
        assert result.exit_code == 2 and "--finalize-processes" in result.output, result.output
        monkeypatch.delenv("TILETUNE_FINALIZE_PROCESSES", raising=False)
    capture = []
    monkeypatch.setattr("server.cli.worker.err.print", lambda text: capture.append(text))
    event = {"job_id": 7, "config": "naive q64 kv64", "median_ms": 2.0, "dense_ms": 20.0, "tuned_config_id": 3}
    _print_event("tuned", {**event, "anchor_processes": 2}, False)
    _print_event("tuned", event, False)  # a replay: no process timed anything
    assert ["in 2 measuring process(es)" in line for line in capture] == [True, False]


def test_a_core_the_process_may_not_run_on_is_refused_by_name(tmp_path) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'core.db'}"
    outside = max(os.sched_getaffinity(0)) + 1
    for command in (["tune", "--preset", "cpu-demo", "--backend", "xla"], ["worker", "--backend", "xla"]):
        result = runner.invoke(cli, [*command, "--core", str(outside), "--database-url", url])
        assert result.exit_code == 2 and "--core" in result.output, result.output


@pytest.mark.parametrize(
    ("content", "named"),
    [
        ("[1, 2]", "one object"),
        ("{not json", "Expecting property name"),
        (
            '{"dtype": "float32", "head_dim": 64, "pattern": {"layout": {"frames": 4, "tokens_per_frame": 100},'
            ' "heads": [{"kind": "temporal", "window_positions": 500}]}}',
            "window_positions=500",
        ),
        (None, "No such file"),
    ],
    ids=["a-list", "not-json", "window-out-of-range", "missing"],
)
def test_a_bad_workload_file_is_an_error_naming_what_is_wrong(tmp_path: Path, content: str | None, named: str) -> None:
    """`tune --workload` and `bench search --record --workload` exit 2 with one line saying what is wrong
    with the file, before any compile, never with a traceback."""
    spec = tmp_path / "workload.json"
    if content is not None:
        spec.write_text(content)
    url = f"sqlite:///{tmp_path / 'bad.db'}"
    for command in (
        ["tune", "--workload", str(spec), "--backend", "xla", "--database-url", url],
        ["bench", "search", "--record", "--workload", str(spec), "--out", str(tmp_path / "t.json")],
    ):
        result = runner.invoke(cli, command, env={"COLUMNS": "400"})
        assert result.exit_code == 2, (command, result.output)
        assert named in result.output and "Traceback" not in result.output, result.output
        assert not (tmp_path / "t.json").exists()
    if named in ("No such file", "Expecting property name"):  # what the server never sees is named by lookup
        result = runner.invoke(cli, ["lookup", "--workload", str(spec), "--database-url", url], env={"COLUMNS": "400"})
        assert result.exit_code == 2 and named in result.output and "Traceback" not in result.output, result.output


@pytest.mark.parametrize(
    "argv",
    [
        ["db", "upgrade"],
        ["worker", "--backend", "replay", "--replay-table", str(TABLE)],
        ["token", "create", "--name", "ops", "--role", "writer"],
    ],
    ids=lambda argv: argv[0],
)
def test_a_database_that_cannot_be_reached_is_one_line_not_a_traceback(argv: list[str]) -> None:
    """Port 9 refuses connections: the command says so in a line naming the host and port, and exits 1."""
    url = "postgresql+psycopg://postgres@127.0.0.1:9/absent"
    env = {**os.environ, "TILETUNE_DATABASE_URL": url}
    done = subprocess.run(tiletune_command(*argv), env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) <= 3, done.stderr
    assert "error: no database connection: OperationalError: connection failed" in done.stderr
    assert '"127.0.0.1", port 9 failed' in done.stderr and "TILETUNE_DATABASE_URL" in done.stderr
