"""``tiletune bench search --replay``: strategies side by side on shipped tables, through the CLI."""

from __future__ import annotations

import json
from typing import Any

from typer.testing import CliRunner

from autotune.replay import bundled_table
from server.cli import app as cli

runner = CliRunner()
TABLES = [str(bundled_table(name)) for name in ("cpu-demo.xla.json", "small-mixed.xla.json", "suffix-sink.xla.json")]


def _replay(*args: str) -> Any:
    result = runner.invoke(cli, ["bench", "search", "--replay", *TABLES, "--seeds", "2", "--budget", "6", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_neighbours_of_the_same_family_join_the_warm_start() -> None:
    rows = _replay("--sampler", "tpe,random,surrogate", "--warm-start", "both", "--neighbours", "--json")
    by = {(r["table"], r["strategy"], r["warm_start"]): r for r in rows}
    assert len(rows) == 3 * 3 * 2
    # The family's model (fitted on a tune of the other table of the family) steers the default only.
    assert [(r["table"], r["warm_start"]) for r in rows if r["family_model"]] == [
        ("cpu-demo.xla.json", True),
        ("small-mixed.xla.json", True),
    ]
    assert {r["strategy"] for r in rows if r["family_model"]} == {"surrogate"}
    # cpu-demo and small-mixed are one family, each the other's neighbour; suffix-sink has none.
    for strategy in ("tpe", "random"):
        assert by[("cpu-demo.xla.json", strategy, True)]["neighbours"] == 1
        assert by[("small-mixed.xla.json", strategy, True)]["neighbours"] == 1
        assert by[("suffix-sink.xla.json", strategy, True)]["neighbours"] == 0
        assert by[("small-mixed.xla.json", strategy, False)]["neighbours"] == 0  # no warm start, no neighbours
    # On small-mixed the neighbour (cpu-demo's best) is tied with the fastest: reached in the second trial.
    assert by[("small-mixed.xla.json", "random", True)]["median_trials_to_tied"] <= 2
    plain = _replay("--sampler", "tpe", "--warm-start", "on", "--json")
    assert all(r["neighbours"] == 0 for r in plain)
    wide = {"COLUMNS": "250"}  # one line per row of the printed table
    args = ["bench", "search", "--replay", *TABLES[:2], "--sampler", "tpe", "--warm-start", "on", "--neighbours"]
    printed = runner.invoke(cli, [*args, "--seeds", "1", "--budget", "3"], env=wide)
    assert printed.exit_code == 0 and printed.stdout.count("on + 1 neighbour(s)") == 2, printed.output
    args[args.index("tpe")] = "surrogate"
    printed = runner.invoke(cli, [*args, "--seeds", "1", "--budget", "3"], env=wide)
    assert printed.exit_code == 0 and printed.stdout.count("on + 1 neighbour(s) + family model") == 2, printed.output


def test_a_table_of_another_kernel_version_is_no_neighbour() -> None:
    """Tunes on another version of the backend's kernel were fastest on other code: a database does not offer
    them (server.store.workloads.nearest_k, records.family_trials), and the replay does not either."""
    import dataclasses

    from autotune.replay import RecordedTable
    from server.bench.search import family_prior, neighbour_bests

    demo, small = (RecordedTable.load(t) for t in TABLES[:2])
    assert [c.key for c in neighbour_bests(small, [demo])] == [demo.best[0].key]
    other = dataclasses.replace(demo, workload=dataclasses.replace(demo.workload, kernel_version="other"))
    assert neighbour_bests(small, [other]) == []
    assert family_prior(small, [demo]) is not None and family_prior(small, [other]) is None


def test_bad_options_are_named() -> None:
    result = runner.invoke(cli, ["bench", "search", "--replay", TABLES[0], "--warm-start", "maybe"])
    assert result.exit_code == 2 and "--warm-start" in result.output
    result = runner.invoke(cli, ["bench", "search", "--replay", TABLES[0], "--sampler", "fastest"])
    assert result.exit_code == 2 and "fastest" in result.output
    result = runner.invoke(cli, ["bench", "search", "--replay", TABLES[0], "--peer-order", "sideways"])
    assert result.exit_code == 2 and "--peer-order" in result.output and "sideways" in result.output


def test_a_failed_peer_is_a_row_of_the_report(monkeypatch: Any) -> None:
    import server.bench.search as bench

    def broken(*args: Any, **kwargs: Any) -> list[str]:
        raise RuntimeError("peer crashed [bold]here[/bold]")

    monkeypatch.setattr(bench, "_peer_sequence", broken)
    args = ["bench", "search", "--replay", TABLES[1], "--sampler", "random,kt:mls", "--seeds", "1", "--budget", "3"]
    printed = runner.invoke(cli, [*args, "--warm-start", "off"], env={"COLUMNS": "250"})
    assert printed.exit_code == 0, printed.output
    # The error is printed as text, its brackets included (not read as markup), wrapped within its cell.
    assert "failed: seed 0: RuntimeError: peer crashed" in printed.stdout and "[bold]here[/bold]" in printed.stdout
    # No default among the strategies: no head-to-head below the table.
    assert "the default leads on" not in printed.stdout
    assert "kt:mls failed on small-mixed.xla.json: seed 0: RuntimeError: peer crashed [bold]here[/bold]" in " ".join(
        printed.stderr.split()
    )
    rows = json.loads(runner.invoke(cli, [*args, "--warm-start", "off", "--json"]).stdout)
    assert [r.get("error") for r in rows] == [None, "seed 0: RuntimeError: peer crashed [bold]here[/bold]"]


def test_the_report_sets_the_default_against_the_best_other_strategy() -> None:
    args = ["bench", "search", "--replay", *TABLES[:2], "--sampler", "surrogate,random", "--seeds", "2"]
    printed = runner.invoke(cli, [*args, "--budget", "6", "--warm-start", "both"], env={"COLUMNS": "250"})
    assert printed.exit_code == 0, printed.output
    lines = [" ".join(line.split()) for line in printed.stdout.splitlines()]
    summary = next(line for line in lines if line.startswith("the default leads on "))
    assert " of 4 rows, is level on " in summary, summary
    # Two seeds cannot tell strategies apart: beyond the noise every row is level.
    assert "beyond the seeds' noise it leads on 0 of 4 rows, is level on 4 and trails on 0" in " ".join(lines)
    assert printed.stdout.count("│ surrogate │") == 4 + 4  # its rows in the report, then in the head-to-head


def test_every_row_names_the_versions_its_figures_depend_on() -> None:
    from importlib import metadata

    rows = _replay("--sampler", "random", "--warm-start", "off", "--json")
    installed = {d: metadata.version(d) for d in ("optuna", "numpy", "scipy")}
    for row in rows:
        assert {k: row["versions"][k] for k in installed} == installed
        assert set(row["versions"]) == {"optuna", "numpy", "scipy", "kernel_tuner"}
    args = ["bench", "search", "--replay", TABLES[0], "--sampler", "random", "--seeds", "1", "--budget", "2"]
    printed = runner.invoke(cli, args, env={"COLUMNS": "250"})
    assert printed.exit_code == 0 and f"optuna {installed['optuna']}, numpy {installed['numpy']}" in printed.stdout


def test_a_record_too_short_to_tell_configs_apart_is_refused_before_any_compile(tmp_path: Any) -> None:
    out = tmp_path / "table.json"
    args = ["bench", "search", "--record", "--preset", "cpu-demo", "--out", str(out), "--rounds", "4"]
    result = runner.invoke(cli, args)
    assert result.exit_code == 2 and "--rounds 4" in result.output and "at least 5" in result.output, result.output
    assert not out.exists()


def test_json_output_is_strict_json_with_null_where_a_median_never_reached() -> None:
    """JSON has no Infinity: a median of seeds most of which never reached a tied config is null, so the
    report reads in jq or a browser, not only in Python."""

    def refuse(constant: str) -> Any:
        raise AssertionError(f"{constant} in --json output")

    args = ["--sampler", "random", "--warm-start", "off", "--budget", "1", "--seeds", "3", "--json"]
    result = runner.invoke(cli, ["bench", "search", "--replay", TABLES[0], *args])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout, parse_constant=refuse)
    assert row["reached"] == "0/3" and row["median_trials_to_tied"] is None
    assert row["trials_to_tied"] == [None, None, None] and row["median_regret"]["40"] is None


def test_rows_read_back_from_json_give_the_same_head_to_head() -> None:
    """The held-out verdicts are read from saved --json reports: a strategy whose median never reached is
    null there, and head_to_head takes it as never reached, as it does the report's own rows."""
    import math

    from autotune.replay import RecordedTable
    from server.bench.search import replay
    from server.bench.verdicts import head_to_head

    args = ["--sampler", "surrogate,random", "--warm-start", "off", "--budget", "5", "--seeds", "3", "--json"]
    result = runner.invoke(cli, ["bench", "search", "--replay", TABLES[1], *args])
    assert result.exit_code == 0, result.output
    saved = json.loads(result.stdout)
    assert [r["median_trials_to_tied"] is None for r in saved] == [False, True]  # random never reached
    table = RecordedTable.load(TABLES[1])
    name = "small-mixed.xla.json"
    live = [replay(table, name, s, 3, budget=5, warm_start=False).summary() for s in ("surrogate", "random")]
    (verdict,) = head_to_head(saved)
    assert verdict == head_to_head(live)[0]
    assert verdict["best_other_trials"] == math.inf and verdict["verdict"] == "leads"


def test_a_table_timed_while_the_machine_drifted_says_so() -> None:
    """Rounds 4-10 of small-mixed made 25% slower for every config, as a host's other VM waking would: the
    drift note gives the span and the rounds; the table as recorded (its rounds within 3%) has none. Recording
    and replaying print it, so a tied set made large by a drift is not read as a flat table."""
    import dataclasses

    from autotune.replay import RecordedTable
    from server.bench.search import drift_note

    table = RecordedTable.load(TABLES[1])
    assert drift_note(table) is None
    step = [1.0] * 3 + [1.25] * 7
    drifted = dataclasses.replace(
        table,
        entries={
            k: (c, dataclasses.replace(m, runs_ms=tuple(r * f for r, f in zip(m.runs_ms, step, strict=True))))
            for k, (c, m) in table.entries.items()
        },
    )
    note = drift_note(drifted)
    assert note is not None and "rounds ran 2" in note and f"{len(drifted.tied_with_best())} configs are tied" in note
    assert len(drifted.tied_with_best()) > len(table.tied_with_best())  # what the drift costs the table
    # Divided by their round's factor, the drifted runs give back the table's own tied set.
    assert drifted.tied_with_best(normalised=True) == table.tied_with_best(normalised=True)
    # A committed table recorded through such a step: rounds 1-3 ran about 0.82 of the rest.
    wide = {"COLUMNS": "250"}
    drifted_table = str(bundled_table("suffix-hd128-1k-f32.v2.xla.json"))
    for path, expected in ((drifted_table, True), (TABLES[1], False)):
        args = ["bench", "search", "--replay", path, "--sampler", "random", "--seeds", "1", "--budget", "2"]
        result = runner.invoke(cli, args, env=wide)
        assert result.exit_code == 0, result.output
        said = " ".join(result.stderr.split())
        assert ("the machine's speed moved while this table was timed" in said) == expected, result.stderr
        assert ("(--tied normalised takes the rounds' speeds out" in said) == expected, result.stderr

    # --tied normalised scores a replay on those runs: the step out, suffix-hd128-1k-f32's tied set shrinks.
    args = ["bench", "search", "--replay", drifted_table, "--sampler", "random", "--seeds", "1", "--budget", "2"]
    rows = {}
    for rule in ("recorded", "normalised"):
        result = runner.invoke(cli, [*args, "--tied", rule, "--json"], env=wide)
        assert result.exit_code == 0, result.output
        (rows[rule],) = [r for r in json.loads(result.stdout) if r["warm_start"]]
        assert rows[rule]["tied_rule"] == rule
    recorded = RecordedTable.load(drifted_table)
    assert rows["recorded"]["tied_set"] == len(recorded.tied_with_best())
    assert rows["normalised"]["tied_set"] == len(recorded.tied_with_best(normalised=True))
    assert rows["normalised"]["tied_set"] < rows["recorded"]["tied_set"]
    result = runner.invoke(cli, [*args, "--tied", "normalised"], env=wide)
    assert result.exit_code == 0 and "--tied normalised" in " ".join(result.stdout.split()), result.output
    assert "(--tied normalised takes" not in " ".join(result.stderr.split())  # no hint to use what is in use
    result = runner.invoke(cli, [*args, "--tied", "paired"], env=wide)
    assert result.exit_code == 2 and "--tied" in result.output and "recorded, normalised" in result.output


def test_a_recorded_table_is_summarised_with_its_fastest_and_the_count_of_others_tied_with_it() -> None:
    """The tied set holds the fastest itself: a table where nothing else is tied says so, not "1 configs"."""
    from autotune.replay import RecordedTable
    from server.bench.search import recorded_summary

    alone = RecordedTable.load(bundled_table("mixed-9f-band-bf16.v2.xla.json"))
    assert alone.tied_with_best() == {alone.best[0].key}
    assert recorded_summary(alone).endswith("; no other config is tied with it")
    assert recorded_summary(alone).startswith(f"best {alone.best[0].describe()} {alone.best[1].median_ms:.3f} ms")
    crowded = RecordedTable.load(bundled_table("temporal-sink-16k-bf16.v2.xla.json"))
    assert len(crowded.tied_with_best()) == 10  # the README's "(200, 10)"
    assert recorded_summary(crowded).endswith("; 9 other configs are tied with it")
    two = RecordedTable.load(bundled_table("spatial-prefix-w3-bf16.v2.xla.json"))
    assert len(two.tied_with_best()) == 2 and recorded_summary(two).endswith("; 1 other config is tied with it")


def test_the_drift_note_counts_its_tied_configs_in_a_sentence_that_agrees_with_the_count() -> None:
    """The drift note and the record's summary say a count the same way (``counted``): "1 config is",
    "10 configs are", never "1 configs are"."""
    from autotune.replay import RecordedTable
    from server.bench.search import counted, drift_note

    assert (counted(1, "config"), counted(10, "config")) == ("1 config is", "10 configs are")
    drifted = RecordedTable.load(bundled_table("temporal-sink-16k-bf16.v2.xla.json"))
    assert "the runs are wider and 10 configs are tied with the fastest;" in (drift_note(drifted) or "")
