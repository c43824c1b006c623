"""A real supervised study: injected crash (SIGKILL), hang and wrong result are recorded
as trials, the study completes, and the wrong config never wins; results land in the database."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from autotune.measure import MeasureOptions
from autotune.search import SearchOptions
from autotune.space import SearchSpace
from kernel.heuristic import heuristic_config
from kernel.layout import VideoLayout
from kernel.pattern import HeadPattern, SparsityPattern
from kernel.workload import Workload
from server.cli import app as cli
from server.store import models, records, workloads
from server.store.db import Database
from server.worker.tune import tune_workload

WORKLOAD = Workload(
    "cpu",
    "xla",
    "float32",
    1,
    32,
    SparsityPattern(VideoLayout(4, 64), (HeadPattern.spatial(1), HeadPattern.temporal(4))),
)


@pytest.mark.slow
def test_crash_hang_and_wrong_are_recorded_and_the_study_completes(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'tune.db'}"
    space = SearchSpace(WORKLOAD, "xla")
    valid = space.enumerate()
    heuristic = heuristic_config(WORKLOAD.pattern, "xla", "float32")
    others = [c for c in valid if c != heuristic]
    crash, hang = others[0], others[1]
    # The heuristic is measured first (warm start); make it wrong, so a fast wrong result is on record.
    inject = {heuristic.key: "wrong", crash.key: "crash", hang.key: "hang"}
    search = SearchOptions(trials=8, seed=0, seed_configs=(crash, hang), prune=False)
    outcome = tune_workload(
        WORKLOAD,
        database_url=url,
        search=search,
        inject=inject,
        trial_timeout_s=20,
        measure=MeasureOptions(repeats=2, min_time_s=0.0),
    )
    statuses = {t.config.key: t.measurement.status for t in outcome.result.trials}
    assert statuses[heuristic.key] == "wrong"
    assert statuses[crash.key] == "crashed"
    assert statuses[hang.key] == "timeout"
    assert len(outcome.result.trials) == 8 and sum(s == "ok" for s in statuses.values()) == 5
    best = outcome.result.best
    assert best is not None and best.config.key not in inject
    db = Database(url)
    with db.transaction() as session:
        row = workloads.find_workload(session, WORKLOAD.key)
        assert row is not None
        rows = session.query(models.Trial).filter_by(workload_id=row.id).all()
        measured = [t.status for t in rows if t.status != "invalid"]  # invalid proposals are recorded, unmeasured
        assert sorted(measured) == sorted(statuses.values())
        assert all(t.compile_ms is None and t.error for t in rows if t.status == "invalid")
        crashed = next(t for t in rows if t.status == "crashed")
        assert "SIGKILL" in (crashed.error or "")
        tuned = records.current_config(session, row.id)
        assert tuned is not None and tuned.id == outcome.tuned_config_id
        assert tuned.config == best.config.to_dict() and tuned.dense_ms and tuned.median_ms > 0
        result = workloads.lookup(session, WORKLOAD, outcome.versions)
        assert result.source == "tuned" and result.config == best.config.to_dict()
    db.dispose()


@pytest.mark.slow
def test_tune_command_stores_results(tmp_path: Any) -> None:
    spec = tmp_path / "workload.json"
    spec.write_text(
        '{"dtype": "float32", "head_dim": 32, "pattern": {"layout": {"frames": 2, "tokens_per_frame": 64},'
        ' "heads": [{"kind": "spatial", "window_frames": 0}]}}'
    )
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    result = CliRunner().invoke(
        cli,
        [
            "tune",
            "--workload",
            str(spec),
            "--backend",
            "xla",
            "--trials",
            "4",
            "--repeats",
            "2",
            "--database-url",
            url,
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    import json

    report = json.loads(result.stdout)
    assert report["measured"] == 4 and report["best"]["tuned_config_id"] is not None
    assert report["best"]["speedup"] > 0
    history = CliRunner().invoke(cli, ["history", report["workload_key"], "--database-url", url, "--json"])
    assert len(json.loads(history.stdout)["items"]) >= 4
