"""Every endpoint on SQLite and PostgreSQL: lookup order, configs, history, jobs, health."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from kernel.workload import KERNEL_VERSIONS, Workload
from server.api.schemas import WorkloadSpec
from server.store import queue, records, workloads
from server.store.db import Database
from tests.server.conftest import row_counts, workload_body

VERSIONS = {"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": None}
CONFIG = {
    "variant": "compact",
    "block_q": 64,
    "block_kv": 128,
    "block_kv_compute": 128,
    "layout": "temporal_major",
    "align": "frame",
    "head_grouping": "by_pattern",
}


def as_workload(body: dict[str, Any]) -> Workload:
    return WorkloadSpec.model_validate(body).to_workload()


def seed_tuned(
    db: Database, body: dict[str, Any], median_ms: float = 2.0, trials: int = 3, versions: dict[str, Any] = VERSIONS
) -> tuple[str, int]:
    """A workload with some trials and a current tuned config: (key, tuned id)."""
    with db.transaction() as session:
        row = workloads.workload_row(session, as_workload(body))
        best = None
        for i in range(trials):
            best = records.record_trial(
                session,
                row,
                {**CONFIG, "block_q": 32 * (i + 1)},
                "ok",
                number=i,
                median_ms=median_ms + i,
                compile_ms=100.0,
                versions=versions,
            )
        records.record_trial(session, row, CONFIG, "wrong", number=trials, median_ms=0.1, max_error=3.0)
        tuned = records.publish_tuned_config(
            session,
            row,
            CONFIG,
            median_ms=median_ms,
            p10_ms=median_ms * 0.9,
            p90_ms=median_ms * 1.1,
            dense_ms=median_ms * 4,
            versions=versions,
            trial=best,
        )
        return row.key, tuned.id


def lookup(client: TestClient, body: dict[str, Any], headers: dict[str, str] | None = None, **extra: Any) -> Any:
    return client.post("/v1/lookup", json={"workload": body, "versions": VERSIONS, **extra}, headers=headers)


def test_health_ready_metrics(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ok"
    client.post("/v1/lookup", json={})
    text = client.get("/metrics").text
    assert 'tiletune_http_requests_total{method="GET",route="/healthz",status="200"} 1.0' in text
    assert 'route="/v1/lookup",status="422"' in text
    assert "tiletune_http_request_seconds_bucket" in text


def test_lookup_order_tuned_stale_nearest_heuristic(client: TestClient, db: Database) -> None:
    body = workload_body()
    miss = lookup(client, body).json()
    assert miss["source"] == "heuristic" and miss["config_id"] is None and miss["timing"] is None
    assert row_counts(db)["tt_workload"] == 0  # a plain lookup writes nothing

    key, tuned_id = seed_tuned(db, body)
    hit = lookup(client, body).json()
    assert hit["source"] == "tuned" and hit["workload_key"] == key and hit["config_id"] == tuned_id
    assert hit["config"] == CONFIG
    assert hit["timing"]["median_ms"] == 2.0 and abs(hit["timing"]["speedup"] - 4.0) < 1e-9

    other_versions = client.post("/v1/lookup", json={"workload": body, "versions": {"jax": "0.11.0"}}).json()
    assert other_versions["source"] == "stale" and other_versions["config_id"] == tuned_id
    assert other_versions["versions"]["jax"] == "0.10.2"

    # Same device kind, backend and family, another size: the nearest tuned workload.
    bigger = workload_body(pattern={**body["pattern"], "layout": {**body["pattern"]["layout"], "frames": 6}})
    near = lookup(client, bigger).json()
    assert near["source"] == "nearest" and near["neighbour_key"] == key and near["distance"] > 0

    # Another family (a dense head added) or another device kind: no neighbour.
    dense = workload_body(pattern={**body["pattern"], "heads": [*body["pattern"]["heads"], {"kind": "dense"}]})
    assert lookup(client, dense).json()["source"] == "heuristic"
    assert lookup(client, {**body, "device_kind": "TPU v6 lite"}).json()["source"] == "heuristic"


def test_nearest_picks_the_closest(client: TestClient, db: Database) -> None:
    base = workload_body()
    layout = base["pattern"]["layout"]
    far_key, _ = seed_tuned(db, workload_body(pattern={**base["pattern"], "layout": {**layout, "frames": 16}}))
    close_key, _ = seed_tuned(db, workload_body(pattern={**base["pattern"], "layout": {**layout, "frames": 5}}))
    result = lookup(client, base).json()
    assert result["source"] == "nearest" and result["neighbour_key"] == close_key != far_key


def test_a_neighbour_of_another_kernel_version_is_no_neighbour(client: TestClient, db: Database) -> None:
    """A config tuned on another version of the backend's kernel was fastest on other code."""
    base = workload_body()
    layout = base["pattern"]["layout"]
    neighbour = workload_body(pattern={**base["pattern"], "layout": {**layout, "frames": 5}}, kernel_version="1")
    assert as_workload(base).kernel_version == KERNEL_VERSIONS["xla"] != "1"
    key, _ = seed_tuned(db, neighbour)
    assert lookup(client, base).json()["source"] == "heuristic"
    older = lookup(client, {**base, "kernel_version": "1"}).json()
    assert older["source"] == "nearest" and older["neighbour_key"] == key


def test_lookup_pinned_to_a_snapshot(client: TestClient, db: Database, writer_token: str) -> None:
    """An answer's snapshot, sent back, gives the answer as of then, while unpinned lookups see new configs."""
    body = workload_body()
    layout = body["pattern"]["layout"]
    bigger = workload_body(pattern={**body["pattern"], "layout": {**layout, "frames": 6}})
    empty = lookup(client, body).json()
    assert empty["source"] == "heuristic" and empty["snapshot"] == 0

    key, old_id = seed_tuned(db, body)
    hit = lookup(client, body).json()
    assert hit["source"] == "tuned" and hit["config_id"] == old_id and hit["snapshot"] == old_id
    pinned_at = hit["snapshot"]
    assert lookup(client, bigger).json()["snapshot"] == pinned_at  # nearest carries it too

    newer = {**CONFIG, "block_q": 256}
    with db.transaction() as session:
        row = workloads.workload_row(session, as_workload(body))
        new_id = records.publish_tuned_config(session, row, newer, median_ms=1.0, versions=VERSIONS).id
        later_key = workloads.workload_row(session, as_workload(workload_body(batch=2))).key
        later_row = workloads.find_workload(session, later_key)
        assert later_row is not None
        later_id = records.publish_tuned_config(session, later_row, newer, median_ms=1.0, versions=VERSIONS).id
    assert pinned_at < new_id < later_id

    unpinned = lookup(client, body).json()
    assert unpinned["config"] == newer and unpinned["config_id"] == new_id and unpinned["snapshot"] == later_id
    pinned = lookup(client, body, snapshot=pinned_at).json()
    assert pinned["source"] == "tuned" and pinned["config"] == CONFIG and pinned["config_id"] == old_id
    assert pinned["snapshot"] == pinned_at
    assert lookup(client, body, snapshot=new_id).json()["config_id"] == new_id
    # The neighbour as it was at the snapshot, and a workload first tuned after it is not tuned yet.
    near = lookup(client, bigger, snapshot=pinned_at).json()
    assert near["source"] == "nearest" and near["config_id"] == old_id and near["neighbour_key"] == key
    assert lookup(client, bigger).json()["config_id"] == new_id
    assert lookup(client, workload_body(batch=2)).json()["config_id"] == later_id
    before = lookup(client, workload_body(batch=2), snapshot=pinned_at).json()
    assert before["source"] == "nearest" and before["config_id"] == old_id
    assert lookup(client, body, snapshot=0).json()["source"] == "heuristic"
    stale = client.post("/v1/lookup", json={"workload": body, "versions": {"jax": "0.11.0"}, "snapshot": pinned_at})
    assert stale.json()["source"] == "stale" and stale.json()["config_id"] == old_id

    # A pinned miss still queues tuning for later runs; on the session path too.
    auth = {"authorization": f"Bearer {writer_token}"}
    queued = lookup(client, bigger, snapshot=pinned_at, enqueue=True, headers=auth)
    assert queued.status_code == 200 and queued.json()["job_id"] is not None
    assert queued.json()["config_id"] == old_id and queued.json()["snapshot"] == pinned_at

    ahead = lookup(client, body, snapshot=later_id + 1)
    assert ahead.status_code == 422 and ahead.json()["message"].startswith("snapshot:")


def test_lookup_by_preset_and_enqueue_once(client: TestClient, db: Database, writer_token: str) -> None:
    body = {"device_kind": "cpu", "backend": "xla", "dtype": "float32", "preset": "cpu-demo"}
    auth = {"authorization": f"Bearer {writer_token}"}
    first = client.post("/v1/lookup", json={"workload": body, "enqueue": True}, headers=auth).json()
    second = client.post("/v1/lookup", json={"workload": body, "enqueue": True}, headers=auth).json()
    assert first["source"] == "heuristic" and first["job_id"] is not None
    assert second["job_id"] == first["job_id"]
    counts = row_counts(db)
    assert counts["tt_job"] == 1 and counts["tt_workload"] == 1
    job = client.get(f"/v1/jobs/{first['job_id']}").json()
    assert job["status"] == "queued" and job["workload_key"] == first["workload_key"]
    assert job["requested_by"] == "writer-test" and job["budget"] > 0


def test_configs_listing_filters_and_history_of_configs(client: TestClient, db: Database) -> None:
    key_a, _ = seed_tuned(db, workload_body())
    key_b, _ = seed_tuned(db, workload_body(device_kind="TPU v5 lite", backend="tpu", dtype="bfloat16"))
    # A new best supersedes the old one; nothing is deleted.
    with db.transaction() as session:
        row = workloads.find_workload(session, key_a)
        assert row is not None
        newer = records.publish_tuned_config(session, row, {**CONFIG, "block_q": 256}, median_ms=1.5, versions=VERSIONS)
    listing = client.get("/v1/configs").json()
    assert {item["workload_key"] for item in listing["items"]} == {key_a, key_b}
    assert all(item["is_current"] for item in listing["items"])
    tpu = client.get("/v1/configs", params={"device_kind": "TPU v5 lite"}).json()["items"]
    assert [item["workload_key"] for item in tpu] == [key_b]
    assert client.get("/v1/configs", params={"backend": "interpret"}).json()["items"] == []
    detail = client.get(f"/v1/configs/{key_a}").json()
    assert detail["current"]["id"] == newer.id and detail["current"]["config"]["block_q"] == 256
    assert len(detail["history"]) == 2 and detail["history"][1]["superseded_at"] is not None
    assert detail["workload"]["pattern"]["layout"]["frames"] == 4
    assert lookup(client, workload_body()).json()["config_id"] == newer.id


def test_history_and_trials_paginate(client: TestClient, db: Database) -> None:
    key, _ = seed_tuned(db, workload_body(), trials=7)  # 7 ok + 1 wrong
    seen: list[int] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 3} if cursor is None else {"limit": 3, "cursor": cursor}
        page = client.get(f"/v1/workloads/{key}/history", params=params).json()
        seen += [t["id"] for t in page["items"]]
        assert len(page["items"]) <= 3
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == 8 and seen == sorted(seen, reverse=True) and len(set(seen)) == 8
    wrong = client.get(f"/v1/workloads/{key}/history", params={"status": "wrong"}).json()["items"]
    assert [t["status"] for t in wrong] == ["wrong"] and wrong[0]["max_error"] == 3.0
    trials = client.get("/v1/trials", params={"workload_key": key, "status": "ok", "limit": 100}).json()
    assert len(trials["items"]) == 7 and trials["next_cursor"] is None
    assert all(t["workload_key"] == key for t in trials["items"])


def test_jobs_create_list_cancel(client: TestClient, db: Database, writer_token: str) -> None:
    auth = {"authorization": f"Bearer {writer_token}"}
    created = client.post("/v1/jobs", json={"workload": workload_body(), "budget": 10, "priority": 5}, headers=auth)
    assert created.status_code == 201
    job = created.json()
    again = client.post("/v1/jobs", json={"workload": workload_body(), "budget": 99}, headers=auth)
    assert again.status_code == 200 and again.json()["id"] == job["id"] and again.json()["budget"] == 10
    other = client.post("/v1/jobs", json={"workload": workload_body(batch=2)}, headers=auth).json()
    listing = client.get("/v1/jobs", params={"status": "queued"}).json()["items"]
    assert [j["id"] for j in listing] == [other["id"], job["id"]]
    cancelled = client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth).json()
    assert cancelled["status"] == "cancelled"
    assert client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth).json()["status"] == "cancelled"
    assert [j["id"] for j in client.get("/v1/jobs", params={"status": "cancelled"}).json()["items"]] == [job["id"]]
    # Once cancelled, a new job may be queued for the workload.
    renewed = client.post("/v1/jobs", json={"workload": workload_body()}, headers=auth)
    assert renewed.status_code == 201 and renewed.json()["id"] != job["id"]
    assert client.get("/v1/jobs/999999").status_code == 404


def test_job_endpoints_show_progress(client: TestClient, db: Database, writer_token: str) -> None:
    """Trials done and in flight, the best so far and the workers holding the job, as a worker reports them."""
    auth = {"authorization": f"Bearer {writer_token}"}
    job = client.post(
        "/v1/jobs", json={"workload": workload_body(), "budget": 6, "parallelism": 2}, headers=auth
    ).json()
    assert (job["trials"], job["trials_running"], job["best_ms"], job["workers"]) == (0, 0, None, [])
    assert job["parallelism"] == 2
    with db.transaction() as session:
        assert queue.claim_job(session, "w1", device_kind="cpu", backend="xla") is not None
        assert queue.claim_job(session, "w2", device_kind="cpu", backend="xla") is not None
        for i, median in enumerate((3.0, 2.5)):
            r = queue.reserve_trial(session, job["id"], "w1", {**CONFIG, "block_q": 32 * (i + 1)})
            assert queue.complete_trial(session, r.trial_id or 0, "w1", "ok", median_ms=median)
        queue.reserve_trial(session, job["id"], "w2", {**CONFIG, "block_q": 256})
    shown = client.get(f"/v1/jobs/{job['id']}").json()
    assert shown["status"] == "running" and shown["attempts"] == 1
    assert (shown["trials"], shown["trials_running"], shown["best_ms"]) == (2, 1, 2.5)
    assert shown["workers"] == ["w1", "w2"]
    assert client.get("/v1/jobs").json()["items"][0]["trials"] == 2
    running = client.get("/v1/trials", params={"job_id": job["id"], "status": "running"}).json()["items"]
    assert [(t["worker"], t["status"], t["finished_at"]) for t in running] == [("w2", "running", None)]


def test_openapi_documents_the_api(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    paths = set(spec["paths"])
    assert {
        "/v1/lookup",
        "/v1/configs",
        "/v1/configs/{key}",
        "/v1/workloads/{key}/history",
        "/v1/trials",
        "/v1/jobs",
        "/v1/jobs/{job_id}",
        "/v1/jobs/{job_id}/cancel",
        "/healthz",
        "/readyz",
        "/metrics",
    } <= paths
    assert "WorkloadSpec" in spec["components"]["schemas"]


def test_database_down_is_503_not_500() -> None:
    from server.app import create_app
    from server.settings import Settings

    settings = Settings(database_url="postgresql+psycopg://postgres@127.0.0.1:9/absent")
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        assert client.get("/healthz").status_code == 200
        ready = client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["status"] == "unavailable"
        down = client.post("/v1/lookup", json={"workload": workload_body()})
        assert down.status_code == 503 and "database" in down.json()["message"]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)  # SQLite has one writer at a time
def test_publishes_are_serialized_on_postgresql(db: Database) -> None:
    """Tuned-config ids commit in increasing order, so no row ever appears below a snapshot already handed out."""
    import threading

    from sqlalchemy import func, select

    assert db.dialect == "postgresql"
    with db.transaction() as session:
        row = workloads.workload_row(session, as_workload(workload_body()))
    done = threading.Event()
    with db.transaction() as holder:
        holder.execute(select(func.pg_advisory_xact_lock(records.PUBLISH_LOCK)))  # a publish in progress

        def publish() -> None:
            with db.transaction() as session:
                records.publish_tuned_config(session, row, CONFIG, median_ms=1.0, versions=VERSIONS)
            done.set()

        thread = threading.Thread(target=publish)
        thread.start()
        assert not done.wait(0.5)  # waits for the publish in progress to commit
        holder.commit()
    thread.join(30)
    assert done.is_set()
