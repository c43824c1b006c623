"""A real supervised study: injected crash (SIGKILL), hang and wrong result are recorded
as trials, the study completes, and the wrong config never wins; results land in the database."""

from __future__ import annotations

import dataclasses
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
from server.store.migrate import upgrade
from server.worker.tune import family_prior, tune_workload, warm_start_configs

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
    # Finalized in the search's own measuring process: the fresh ones are test_tune_command_stores_results'.
    search = SearchOptions(
        trials=8, seed=0, seed_configs=(crash, hang), prune=False, anchor_processes=1, resolve_processes=1
    )
    outcome = tune_workload(
        WORKLOAD,
        database_url=url,
        search=search,
        inject=inject,
        trial_timeout_s=10,  # the injected hang costs this long; a real trial here takes 1-3 s
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
        # How busy the machine was while the winner was timed is stored beside its anchors.
        assert outcome.result.others_cores is not None and tuned.others_cores == outcome.result.others_cores
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
            "--no-warm-start",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    import json

    report = json.loads(result.stdout)
    assert report["measured"] == 4 and report["best"]["tuned_config_id"] is not None
    # Both anchors were timed beside the winner, and the speedups shown are over them.
    for anchor, speedup in (("dense", "speedup"), ("tiled_dense", "speedup_vs_tiled_dense")):
        expected = report["anchors_ms"][anchor] / report["best"]["median_ms"]
        assert report["best"][speedup] == pytest.approx(expected, rel=0.01)
        low, high = report["best"]["speedup_p10_p90"][anchor]  # stated with its spread
        assert 0 < low <= high
    # ... timed in the search's measuring process and two fresh ones, their runs pooled.
    assert report["best"]["anchor_processes"] == 3
    # Finalists tied after the first rounds were re-timed in three processes; none tied, none re-timed.
    assert report["best"]["resolve_processes"] in (0, 3)
    # The tuned config keeps the spread the command showed.
    configs = json.loads(CliRunner().invoke(cli, ["configs", "--database-url", url, "--json"]).stdout)["items"]
    (stored,) = [c["timing"] for c in configs if c["workload_key"] == report["workload_key"]]
    assert stored["speedup_p10_p90"] == report["best"]["speedup_p10_p90"]
    history = CliRunner().invoke(cli, ["history", report["workload_key"], "--database-url", url, "--json"])
    items = json.loads(history.stdout)["items"]
    assert len(items) >= 4
    # --no-warm-start: the search did not begin with the heuristic (seed 0 of plain TPE's random start does not)
    wl = Workload.from_dict({**json.loads(spec.read_text()), "device_kind": "cpu", "backend": "xla", "batch": 1})
    heuristic = heuristic_config(wl.pattern, "xla", "float32").to_dict()
    first = min(items, key=lambda t: t["number"] if t.get("number") is not None else 10**9)
    assert first["params"] != heuristic


def test_warm_starts_are_the_own_config_then_the_three_nearest_tuned_workloads_of_the_family(tmp_path: Any) -> None:
    """The database's knowledge that starts a search: the workload's current config, then the configs
    of its nearest tuned neighbours (same device kind, backend, family), closest first; a fourth
    neighbour and another family's config stay out."""
    url = f"sqlite:///{tmp_path / 'seeds.db'}"
    upgrade(url)
    db = Database(url)
    heuristic = heuristic_config(WORKLOAD.pattern, "xla", "float32")

    def with_frames(frames: int, heads: tuple[HeadPattern, ...] = WORKLOAD.pattern.heads) -> Workload:
        return dataclasses.replace(WORKLOAD, pattern=SparsityPattern(VideoLayout(frames, 64), heads))

    def config(block_q: int) -> dict[str, Any]:
        return dataclasses.replace(heuristic, block_q=block_q).to_dict()

    tuned = [
        (WORKLOAD, 8),  # its own config
        (with_frames(5), 16),
        (with_frames(6), 32),
        (with_frames(12), 64),
        (with_frames(40), 128),  # a fourth neighbour, the farthest
        (with_frames(5, (HeadPattern.dense(),)), 256),  # another family
    ]
    try:
        with db.transaction() as session:
            for wl, block_q in tuned:
                row = workloads.workload_row(session, wl)
                records.publish_tuned_config(session, row, config(block_q), median_ms=1.0, versions={})
            own = workloads.workload_row(session, WORKLOAD).id
        with db.transaction() as session:
            seeds = warm_start_configs(session, own, WORKLOAD)
    finally:
        db.dispose()
    assert [c.block_q for c in seeds] == [8, 16, 32, 64]


def test_the_family_model_is_fitted_on_the_ok_trials_of_the_other_workloads_of_the_family(tmp_path: Any) -> None:
    """records.family_trials reads what the family's model learns from: ok trials with a time, of the
    other workloads of the device kind, backend, kernel version and family; not the workload's own trials,
    not another family's or kernel version's, not failed ones. family_prior fits the model once there are enough."""
    url = f"sqlite:///{tmp_path / 'family.db'}"
    upgrade(url)
    db = Database(url)
    space = SearchSpace(WORKLOAD, "xla")
    configs = space.enumerate()[:30]
    sibling = dataclasses.replace(WORKLOAD, pattern=SparsityPattern(VideoLayout(6, 64), WORKLOAD.pattern.heads))
    stranger = dataclasses.replace(WORKLOAD, pattern=SparsityPattern(VideoLayout(6, 64), (HeadPattern.dense(),)))
    gpu = dataclasses.replace(sibling, device_kind="other-cpu")
    older = dataclasses.replace(sibling, kernel_version=f"{WORKLOAD.kernel_version}-older")  # another kernel's times
    measured = ((WORKLOAD, "ok"), (stranger, "ok"), (gpu, "ok"), (older, "ok"), (sibling, "ok"), (sibling, "pruned"))
    try:
        with db.transaction() as session:
            for wl, status in measured:
                row = workloads.workload_row(session, wl)
                for i, c in enumerate(configs):
                    median = 1.0 + i if status == "ok" else 0.5  # a pruned trial's partial median: not a time
                    records.record_trial(session, row, c.to_dict(), status, median_ms=median)
        with db.transaction() as session:
            trials = records.family_trials(session, WORKLOAD)
            assert {wl.key for wl, _, _ in trials} == {sibling.key}
            assert sorted(m for _, _, m in trials) == [1.0 + i for i in range(len(configs))]
            assert family_prior(session, WORKLOAD) is not None
            assert len(records.family_trials(session, WORKLOAD, limit=5)) == 5
            assert records.family_trials(session, WORKLOAD, workloads=0) == []
            assert family_prior(session, stranger) is None  # its family holds no other workload
    finally:
        db.dispose()
