"""The newcomer's path end to end on a fresh SQLite file: ``tiletune up`` brings the server
and a worker up and tunes cpu-demo; meanwhile a lookup miss queues a second job, the
worker tunes it on the xla backend, and the next lookup answers ``tuned`` with a
config that runs exactly. Clients read the service all along: no 5xx, and no
"database is locked" anywhere while the server and the worker share the file."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import jax
import numpy as np
import pytest

from autotune.versions import software_versions
from kernel.attention import sparse_attention
from kernel.config import TileConfig
from kernel.layout import VideoLayout
from kernel.pattern import HeadPattern, SparsityPattern
from kernel.reference import reference_attention
from server.bench.harness import Child, child_env, free_port, tiletune_command
from server.store import models, tokens
from server.store.db import Database
from server.store.migrate import upgrade

SMALL = {
    "device_kind": "cpu",
    "backend": "xla",
    "dtype": "float32",
    "head_dim": 32,
    "pattern": {
        "layout": {"frames": 4, "tokens_per_frame": 64},
        "heads": [{"kind": "spatial", "window_frames": 1}, {"kind": "temporal", "window_positions": 4}],
    },
}
CPU_DEMO = {"device_kind": "cpu", "backend": "xla", "dtype": "float32", "preset": "cpu-demo"}
DEMO_TRIALS = 4


class Reader(threading.Thread):
    """Lookups, history pages and job listings in a loop; keeps every unexpected answer."""

    def __init__(self, base: str, versions: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.base, self.versions = base, versions
        self.stop = threading.Event()
        self.requests = 0
        self.bad: list[str] = []

    def run(self) -> None:
        with httpx.Client(base_url=self.base, timeout=30) as client:
            while not self.stop.is_set():
                for method, path, body in (
                    ("POST", "/v1/lookup", {"workload": CPU_DEMO, "versions": self.versions}),
                    ("POST", "/v1/lookup", {"workload": SMALL, "versions": self.versions}),
                    ("GET", "/v1/jobs", None),
                    ("GET", "/v1/trials?limit=20", None),
                ):
                    try:
                        r = client.request(method, path, json=body)
                    except httpx.HTTPError as exc:
                        self.bad.append(f"{method} {path}: {exc!r}")
                        continue
                    self.requests += 1
                    if r.status_code >= 500:
                        self.bad.append(f"{method} {path}: {r.status_code} {r.text[:300]}")
                time.sleep(0.05)


def wait_done(client: httpx.Client, job_id: int, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in ("done", "failed", "cancelled"):
            return job
        time.sleep(1)
    raise AssertionError(f"job {job_id} not done after {timeout_s:g} s: {job}")


@pytest.mark.slow
def test_up_tunes_cpu_demo_and_a_lookup_miss_end_to_end(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    upgrade(url)
    db = Database(url)
    with db.transaction() as session:
        token = tokens.create_token(session, "e2e", "writer")
    db.dispose()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    logs = tmp_path / "logs"
    # The lookup-miss job gets a small budget; both jobs finalize in 2 measuring processes instead of 3:
    # still the search's and a fresh one, at two thirds of the finalization's cost.
    env = child_env({"TILETUNE_JOB_BUDGET_DEFAULT": "6", "TILETUNE_FINALIZE_PROCESSES": "2"})
    # A short demo job proves the same path as the default 40 trials: claimed, searched, re-timed, published.
    argv = ["up", "--database-url", url, "--port", str(port), "--trials", str(DEMO_TRIALS), "--log-dir", str(logs)]
    up = Child("up", tiletune_command(*argv), env=env)
    versions = {k: v for k, v in software_versions("xla").items() if v is not None}
    reader = Reader(base, versions)
    try:
        with httpx.Client(base_url=base, timeout=30) as client:
            deadline = time.monotonic() + 120
            while True:  # up is ready once the demo job is queued
                try:
                    if client.get("/v1/jobs").json()["items"]:
                        break
                except (httpx.HTTPError, ValueError, KeyError):
                    pass
                assert up.poll() is None and time.monotonic() < deadline, up.output()
                time.sleep(0.5)
            reader.start()
            (demo_job,) = client.get("/v1/jobs").json()["items"]
            miss = client.post(
                "/v1/lookup",
                json={"workload": SMALL, "versions": versions, "enqueue": True},
                headers={"authorization": f"Bearer {token}"},
            ).json()
            assert miss["source"] == "heuristic" and miss["job_id"] is not None
            demo = wait_done(client, demo_job["id"], 600)
            small = wait_done(client, miss["job_id"], 300)
            assert demo["status"] == "done" and demo["trials"] == DEMO_TRIALS, demo
            assert small["status"] == "done" and small["trials"] == 6, small
            hit = client.post("/v1/lookup", json={"workload": SMALL, "versions": versions}).json()
            demo_hit = client.post("/v1/lookup", json={"workload": CPU_DEMO, "versions": versions}).json()
        assert hit["source"] == "tuned" and hit["config_id"] is not None
        assert demo_hit["source"] == "tuned"
    finally:
        reader.stop.set()
        reader.join(30)
        up.signal(signal.SIGINT)
        if up.wait(120) is None:
            up.kill()
        output = up.output()
        up.close()
    assert up.returncode == 0, output
    assert "look it up with:" in output and "curl -s" in output
    worker_log = (logs / "worker.log").read_text(errors="replace")
    assert worker_log.count("timed beside its anchors in 2 measuring process(es)") == 2, worker_log
    assert reader.requests > 20 and reader.bad == []
    everything = output + "".join(p.read_text(errors="replace") for p in logs.glob("*.log"))
    assert "database is locked" not in everything
    assert "Traceback" not in everything, everything[-3000:]

    # The tuned config of the missed workload runs exactly.
    config = TileConfig.from_dict(hit["config"])
    pattern = SparsityPattern(VideoLayout(4, 64), (HeadPattern.spatial(1), HeadPattern.temporal(4)))
    keys = jax.random.split(jax.random.PRNGKey(3), 3)
    q, k, v = (jax.random.normal(key, (1, 2, pattern.seq_len, 32), np.float32) for key in keys)
    out = np.asarray(sparse_attention(q, k, v, pattern, config, backend="xla"))
    ref = np.asarray(reference_attention(q, k, v, pattern))
    assert np.abs(out - ref).max() <= 2e-5


@pytest.mark.slow
def test_ctrl_c_stops_up_cleanly_mid_tuning(tmp_path: Path) -> None:
    """Ctrl-C while cpu-demo tunes: the worker finishes its trial and gives the job back,
    the server stops, and up exits 0 (the job resumes on the next start)."""
    url = f"sqlite:///{tmp_path / 'stop.db'}"
    port = free_port()
    argv = ["up", "--database-url", url, "--port", str(port), "--log-dir", str(tmp_path / "logs")]
    up = Child("up", tiletune_command(*argv))
    try:
        deadline = time.monotonic() + 180
        while True:  # through the API: the database file exists before its migrations are done
            assert up.poll() is None and time.monotonic() < deadline, "up stopped or no trial finished in time"
            try:
                listed = httpx.get(f"http://127.0.0.1:{port}/v1/jobs", timeout=5).json()["items"]
            except (httpx.HTTPError, ValueError, KeyError):
                listed = []
            if listed and listed[0]["trials"] >= 2:
                break
            time.sleep(0.5)
        up.signal(signal.SIGINT)
        up.wait(120)
    finally:
        if up.poll() is None:
            up.kill()
        output = up.output()
        up.close()
    assert up.returncode == 0, output
    db = Database(url)
    with db.read_sessions() as session:
        (job,) = session.query(models.Job).all()
        leases = session.query(models.JobLease).all()
        running = session.query(models.Trial).filter(models.Trial.status == "running").count()
    db.dispose()
    assert job.status == "queued" and job.attempts == 0, (job.status, job.attempts, output)
    assert [lease.end_reason for lease in leases] == ["released"] and running == 0
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)  # the server is gone
