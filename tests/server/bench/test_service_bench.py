"""``tiletune bench service``: seeding writes what it says, and a tiny run reports every phase without errors.

Figures are never compared with wall-clock expectations: only the report's
structure, that requests succeeded, and internal consistency (p99 >= p50).
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from typing import Any

import pytest
from fastapi import HTTPException
from fastapi.testclient import TestClient
from sqlalchemy import func, select, text
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from server.api.limits import STRUCTURAL, check_workload, max_json_structure
from server.api.schemas import WorkloadSpec
from server.bench import BenchError
from server.bench.abuse import crowded_body, invalid_body, largest_workload
from server.bench.harness import http_server, process_tree_rss_bytes, uvicorn_command
from server.bench.load import lookup_requests, percentile
from server.bench.seeding import BENCH_VERSIONS, plan_workloads, prepare_database, seed_database
from server.bench.service import (
    BARE_BODY,
    BARE_PATH,
    BARE_TARGET,
    ServiceBenchOptions,
    bare_app,
    empty_twin,
    run_service_bench,
)
from server.cli import app as cli_app
from server.settings import Settings
from server.store import models, workloads
from server.store.db import Database

PHASES = ("bare", "lookup_empty", "lookup", "history", "lookup_quiet", "lookup_abused")
# What the abuse client's requests must get: refused bodies, the largest workload accepted, its figures
# drawn (or, when the drawing processes are busy or out of time, a 503 to retry).
ABUSE_ANSWERS = {
    "crowded_body": {"413"},
    "invalid_body": {"422"},
    "largest_job": {"200", "201"},
    "largest_lookup": {"200"},
    "page": {"200"},
    "figure": {"200", "503"},
}


def _check_seeded(url: str, n_workloads: int, trials: int) -> None:
    plan = plan_workloads(n_workloads, seed=3)
    assert len(plan.keys) == len(set(plan.keys)) == n_workloads
    prepare_database(url)
    result = seed_database(url, plan, trials, seed=3)
    assert (result.workloads, result.trials) == (n_workloads, trials)
    assert result.tuned_configs == sum(plan.tuned)
    db = Database(url)
    try:
        with db.transaction() as session:

            def count(model: type[models.Base], *where: Any) -> int:
                return session.scalar(select(func.count()).select_from(model).where(*where)) or 0

            assert count(models.Workload) == n_workloads
            assert count(models.Trial) == trials
            assert count(models.TunedConfig, models.TunedConfig.is_current.is_(True)) == sum(plan.tuned)
            assert count(models.TunedConfig) == result.tuned_configs + result.superseded_configs
            assert count(models.Trial, models.Trial.status == "ok") > 0

            # Rows are the ones the store would write: columns agree with the parsed spec.
            tuned_index = plan.tuned.index(True)
            row = workloads.find_workload(session, plan.keys[tuned_index])
            assert row is not None
            wl = workloads.workload_of(row)
            assert wl.key == row.key
            assert (row.family, row.pattern_hash, row.seq_len, row.heads) == (
                wl.family,
                wl.pattern.pattern_hash,
                wl.pattern.seq_len,
                wl.heads,
            )
            assert workloads.lookup(session, wl, BENCH_VERSIONS).source == "tuned"

            if False in plan.tuned:
                untuned = workloads.find_workload(session, plan.keys[plan.tuned.index(False)])
                assert untuned is not None
                assert workloads.lookup(session, workloads.workload_of(untuned), BENCH_VERSIONS).source != "tuned"

            history_key = result.history_keys[0]
            owner = workloads.find_workload(session, history_key)
            assert owner is not None and count(models.Trial, models.Trial.workload_id == owner.id) > 0
    finally:
        db.dispose()


def test_seeding_writes_exactly_the_workloads_and_trials(tmp_path: Path) -> None:
    _check_seeded(f"sqlite:///{tmp_path / 'seed.db'}", 50, 500)


@pytest.mark.postgres
def test_seeding_on_postgres(postgres_url: str) -> None:
    """The COPY path; the test database is a throwaway one (the bench empties tt_* tables first)."""
    _check_seeded(postgres_url, 40, 400)
    db = Database(postgres_url)
    try:
        with db.transaction() as session:  # sequences moved past the explicit ids: the store can still insert
            row = workloads.workload_row(session, plan_workloads(41, seed=3).params[40].build())
            assert row.id == 41
    finally:
        db.dispose()


def test_lookup_requests_mix_hits_and_misses() -> None:
    plan = plan_workloads(60, seed=1)
    hits = set(plan.hit_bodies)
    requests = lookup_requests(plan, miss_fraction=0.25, seed=1)
    share = sum(r.body not in hits for r in requests) / len(requests)
    assert 0.15 < share < 0.35
    assert all(r.method == "POST" and r.path == "/v1/lookup" for r in requests)
    assert all(r.body in hits for r in lookup_requests(plan, miss_fraction=0.0))


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 1.0) == 100.0
    assert percentile([3.0], 0.99) == 3.0


def test_bare_app_answers_a_constant() -> None:
    with TestClient(bare_app()) as client:
        response = client.post(BARE_PATH, content=b'{"anything": 1}')
    assert response.status_code == 200 and response.json() == BARE_BODY


SMALL = {
    "device_kind": "cpu",
    "backend": "xla",
    "dtype": "float32",
    "batch": 1,
    "head_dim": 32,
    "pattern": {"layout": {"frames": 2, "tokens_per_frame": 64}, "heads": [{"kind": "spatial", "window_frames": 1}]},
}


def test_the_empty_twin_is_a_migrated_empty_database_dropped_afterwards(database_url: str) -> None:
    """lookup_empty runs beside the seeded lookups on a second database of the same kind."""
    seeded = Database(database_url)
    try:
        with seeded.transaction() as session:
            workloads.workload_row(session, WorkloadSpec.model_validate(SMALL).to_workload())
        with empty_twin(database_url) as twin:
            assert twin != database_url and make_url(twin).get_backend_name() == seeded.dialect
            db = Database(twin)
            try:
                with db.transaction() as session:
                    assert session.scalar(select(func.count()).select_from(models.Workload)) == 0
            finally:
                db.dispose()
        if seeded.dialect == "postgresql":
            with seeded.transaction() as session:
                names = session.scalars(text("SELECT datname FROM pg_database")).all()
            assert make_url(twin).database not in names
    finally:
        seeded.empty_tables()
        seeded.dispose()


def test_bare_and_lookup_routes_run_alike() -> None:
    """Both on the event loop (or both in the thread pool): a plain ``def`` route pays a thread-pool hop
    an ``async def`` one does not, and the ratio would measure that instead of the lookup's own work."""
    from server.api.lookup import router

    def endpoint(routes: Any, path: str) -> Any:
        return next(r.endpoint for r in routes if getattr(r, "path", None) == path)

    bare = endpoint(bare_app().routes, BARE_PATH)
    lookup = endpoint(router.routes, "/v1/lookup")
    assert inspect.iscoroutinefunction(bare) == inspect.iscoroutinefunction(lookup)


def test_a_server_that_does_not_start_is_reported_with_its_stderr() -> None:
    command = lambda port: uvicorn_command("server.bench.service:no_such_factory", port)  # noqa: E731
    with (
        pytest.raises(BenchError, match="the broken exited") as info,
        http_server("broken", command, lambda c: c.get("/").status_code == 200, timeout_s=30),
    ):
        pass
    assert "no_such_factory" in str(info.value)


@pytest.mark.parametrize(
    "settings",
    [Settings(database_url="sqlite://"), Settings(database_url="sqlite://", max_heads=8, max_body_bytes=4096)],
)
def test_the_abuse_requests_are_the_worst_the_limits_allow(settings: Settings) -> None:
    """The largest workload sits at every limit (one more token or head is refused); the crowded body
    fills the size limit past the JSON scan; the invalid one fills it within the scan (so it is
    validated)."""
    limit = max_json_structure(settings)
    crowded, invalid = crowded_body(settings), invalid_body(settings, limit)
    assert settings.max_body_bytes - 64 <= len(crowded) <= settings.max_body_bytes
    assert sum(crowded.count(c) for c in STRUCTURAL) > limit
    assert settings.max_body_bytes * 0.9 <= len(invalid) <= settings.max_body_bytes
    assert json.loads(invalid)["workload"]
    structure = sum(invalid.count(c) for c in STRUCTURAL)
    assert structure <= limit and (structure >= limit - 2 or len(json.loads(invalid)) > settings.max_body_bytes // 20)
    seen = set()
    for round_ in range(3):
        body = largest_workload(settings, round_)
        spec = WorkloadSpec.model_validate(body)
        wl = spec.to_workload()
        check_workload(wl, settings, preset=False)  # within every limit
        assert (wl.pattern.seq_len, wl.heads, len(wl.pattern.classes()), wl.batch) == (
            settings.max_tokens,
            settings.max_heads,
            min(settings.max_head_classes, settings.max_heads),
            settings.max_batch,
        )
        seen.add(wl.key)
        reached = ["max_tokens", "max_heads", "max_batch"]
        reached += ["max_head_classes"] if settings.max_head_classes <= settings.max_heads else []
        for over in reached:
            tighter = settings.model_copy(update={over: getattr(settings, over) - 1})
            with pytest.raises(HTTPException, match=over.upper()):
                check_workload(wl, tighter, preset=False)
    assert len(seen) == 3  # a new workload, and so new figures, every round


def test_the_server_tree_memory_counts_the_children() -> None:
    with http_server("bare", lambda port: uvicorn_command(BARE_TARGET, port), lambda c: True, timeout_s=60) as srv:
        _ = srv.base_url
        tree = process_tree_rss_bytes(srv.pid)
        own = process_tree_rss_bytes(os.getpid())
    assert tree is not None and own is not None and tree > 0 and own >= tree  # the server is our child
    assert process_tree_rss_bytes(2**22 + 12345) is None


@pytest.mark.slow
def test_run_service_bench_tiny(tmp_path: Path) -> None:
    opts = ServiceBenchOptions(workloads=50, trials=500, clients=2, duration_s=1.0, warmup_s=0.2, rounds=2)
    report = run_service_bench(opts)
    assert tuple(report["phases"]) == PHASES
    for name in PHASES:
        phase = report["phases"][name]
        assert phase["errors"] == 0, (name, phase["error_samples"])
        assert phase["requests"] > 0 and phase["rps"] > 0, name
        assert phase["p99_ms"] >= phase["p50_ms"] > 0, name
        assert phase["max_ms"] >= phase["p99_ms"], name
        assert phase["windows"] == 2, name  # every phase in the same interleaving, the empty lookups too
        assert phase["server_peak_rss_mb"] > 0, name
    abuse = report["abuse"]
    assert abuse["rounds"] >= 1 and abuse["requests"]
    for kind, answers in abuse["requests"].items():
        assert set(answers["statuses"]) <= ABUSE_ANSWERS[kind], (kind, answers["statuses"])
    ratios = report["ratios"]
    assert ratios["lookup_p99_abused_over_quiet"] == round(
        report["phases"]["lookup_abused"]["p99_ms"] / report["phases"]["lookup_quiet"]["p99_ms"], 3
    )
    assert ratios["server_peak_rss_mb"] == max(p["server_peak_rss_mb"] for p in report["phases"].values())
    assert set(report["phases"]["lookup_empty"]["by_label"]) == {"heuristic"}
    assert "tuned" in report["phases"]["lookup"]["by_label"]
    seed = report["seed"]
    assert (seed["workloads"], seed["trials"]) == (50, 500)
    ratios = report["ratios"]
    assert ratios["history_p99_ms"] == report["phases"]["history"]["p99_ms"]
    assert report["options"]["database"] == "sqlite"


@pytest.mark.slow
def test_cli_json_and_option_errors() -> None:
    runner = CliRunner()
    args = ["bench", "service", "--workloads", "20", "--trials", "100", "--clients", "1", "--rounds", "1", "--no-abuse"]
    result = runner.invoke(cli_app, [*args, "--duration", "0.3", "--warmup", "0", "--no-compare-empty", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert tuple(report["phases"]) == ("bare", "lookup", "history") and report["abuse"] is None
    assert report["ratios"]["lookup_p99_seeded_over_empty"] is None
    result = runner.invoke(cli_app, [*args, "--miss-fraction", "2"])
    assert result.exit_code == 2


def test_an_unreachable_database_is_a_clear_error() -> None:
    opts = ServiceBenchOptions(workloads=5, trials=0, database_url="postgresql+psycopg://postgres@127.0.0.1:1/none")
    with pytest.raises(BenchError, match=r"database postgresql\+psycopg://postgres@127.0.0.1:1/none"):
        run_service_bench(opts)
