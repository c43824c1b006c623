"""Workers ride out a PostgreSQL outage instead of dying of it.

Its connections are cut (as a restart or a failover does) while it waits for jobs and
many times while it tunes one: it keeps working and the job ends as if nothing had
happened. The database then refuses connections for longer than the worker's lease in
the middle of a job: the worker waits and goes on, the job still its own. Asked to stop
in such an outage, it leaves the job to its lease and the next worker resumes it, its
records whole (check_job_records). A compile worker keeps waiting for TPU jobs through
cut connections and compiles the next one."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import select

from autotune.replay import RecordedTable, ReplayMeasurer
from autotune.search import SearchOptions
from kernel.config import params_key
from kernel.tpu_targets import libtpu_installed
from server.bench.crash import scratch_database
from server.bench.harness import Child, tiletune_command
from server.store import models, queue, workloads
from server.store.db import Database
from server.store.migrate import upgrade
from server.worker import tune
from tests.autotune.test_compile_pool import WORKLOAD
from tests.server.outages import connections, cut_connections, refused
from tests.server.worker.workers import TABLE, check_job_records, queue_replay_jobs, start_worker, statuses, wait_for

pytestmark = pytest.mark.postgres

BUDGET = 8


@pytest.fixture
def outage_url(postgres_url: str) -> Iterator[str]:
    """A database of this test's own: its outages reach no other test's connections."""
    with scratch_database(postgres_url, "outage") as url:
        upgrade(url)
        yield url


def job_status(url: str, job_id: int) -> str:
    db = Database(url)  # a fresh pool each time: the cuts end this process's connections too
    try:
        return statuses(db, [job_id])[job_id]
    finally:
        db.dispose()


def wait_done(url: str, job_id: int, timeout_s: float, every_s: float = 0.0) -> int:
    """Until the job is done, cutting the database's connections every ``every_s`` seconds while it
    runs (0: never); how many cuts landed while it was running."""
    deadline = time.monotonic() + timeout_s
    cuts = 0
    while (status := job_status(url, job_id)) != "done":
        assert status in ("queued", "running") and time.monotonic() < deadline, status
        if every_s and status == "running":
            cuts += cut_connections(url) > 0
        time.sleep(every_s or 0.2)
    return cuts


def queue_one(url: str) -> int:
    db = Database(url)
    try:
        (job_id,) = queue_replay_jobs(db, 1, budget=BUDGET)
        return job_id
    finally:
        db.dispose()


def stop(worker: Child) -> str:
    """Stop the worker as Ctrl-C does; everything it printed."""
    worker.signal(2)
    worker.wait(60)
    output = worker.output()
    worker.close()
    return output


def finished(url: str, job_id: int) -> tuple[models.Job, list[str | None]]:
    """The job, its records checked whole (check_job_records), and how each of its leases ended."""
    db = Database(url)
    try:
        check_job_records(db, job_id, BUDGET)
        with db.read_sessions() as session:
            job = session.get(models.Job, job_id)
            assert job is not None
            return job, [lease.end_reason for lease in queue.job_leases(session, job_id)]
    finally:
        db.dispose()


def test_a_worker_rides_out_connections_cut_while_idle_and_while_tuning(outage_url: str) -> None:
    worker = start_worker(outage_url, "--poll", "0.2", "--replay-sleep", "0.5")
    try:
        worker.wait_for_output("claiming", 120)
        for _ in range(3):  # idle: each next claim meets a broken connection, and connects again
            wait_for(lambda: connections(outage_url) > 0, 60, "the worker to connect again")
            assert cut_connections(outage_url) >= 1
        assert worker.poll() is None, worker.output()
        job_id = queue_one(outage_url)
        cuts = wait_done(outage_url, job_id, 180, every_s=0.3)
        assert cuts >= 3, f"only {cuts} cuts landed while the job ran: nothing tested mid-job"
        assert worker.poll() is None, worker.output()
    finally:
        output = stop(worker)
    job, leases = finished(outage_url, job_id)
    assert job.error is None and job.attempts == 1, output
    assert leases == ["done"], output  # each cut was ridden out where it met the worker: the job never left it
    assert "database unavailable" in output and "database reachable again" in output, output
    assert "giving the job back" not in output, output
    assert "Traceback" not in output, output
    assert "stopped after 1 job(s), 0 failed" in output, output


def start_job(url: str, worker: Child) -> int:
    """Queue a job and return once ``worker`` runs it, a few trials in."""
    worker.wait_for_output("claiming", 120)
    job_id = queue_one(url)
    deadline = time.monotonic() + 120
    while job_status(url, job_id) != "running":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(1.0)
    return job_id


def test_an_outage_longer_than_the_lease_is_waited_out_and_the_job_stays_the_workers(outage_url: str) -> None:
    # A 2 s lease and 6 s of refused connections mid-job: the lease expires meanwhile, but nobody
    # else claims the job, so the worker goes on where it was once the database answers.
    worker = start_worker(outage_url, "--poll", "0.2", "--lease", "2", "--replay-sleep", "0.5")
    try:
        job_id = start_job(outage_url, worker)
        with refused(outage_url):
            time.sleep(6)
            assert worker.poll() is None, worker.output()
        wait_done(outage_url, job_id, 180)
        assert worker.poll() is None, worker.output()
    finally:
        output = stop(worker)
    job, leases = finished(outage_url, job_id)
    assert job.attempts == 1 and leases == ["done"], output
    assert "giving the job back" not in output and "crashed" not in output, output
    assert "database unavailable for" in output and "database reachable again" in output, output
    assert "Traceback" not in output, output


def test_a_worker_stopped_in_an_outage_leaves_the_job_to_its_lease_and_it_is_resumed(outage_url: str) -> None:
    # Asked to stop while the database refuses connections, the worker gives up at once (its
    # patience since the first try, half of a 2 s lease, is spent), tries 5 s to give the job
    # back, and exits; the job's lease ends it, and the next worker resumes it in attempt 2.
    worker = start_worker(outage_url, "--poll", "0.2", "--lease", "2", "--replay-sleep", "0.5")
    job_id = start_job(outage_url, worker)
    with refused(outage_url):
        time.sleep(2)  # the worker meets the outage and waits for the database
        assert worker.poll() is None, worker.output()
        began = time.monotonic()
        output = stop(worker)
        took = time.monotonic() - began
    assert worker.returncode == 0 and took < 30, (took, output)
    assert "stopping while the database is unavailable; giving the job back" in output, output
    assert "the database is still unavailable; its lease ends and it is claimable again" in output, output
    resumed = start_worker(outage_url, "--poll", "0.2", "--lease", "2", "--replay-sleep", "0.05")
    try:
        wait_done(outage_url, job_id, 180)
    finally:
        output = stop(resumed)
    job, leases = finished(outage_url, job_id)
    assert job.attempts == 2 and leases == ["expired", "done"], output
    assert f"(budget {BUDGET}, attempt 2)" in output, output


@pytest.mark.skipif(
    not libtpu_installed(), reason="libtpu (the TPU compiler) is not installed: pip install -e '.[tpu]'"
)
def test_a_compile_worker_rides_out_connections_cut_while_it_waits_for_jobs(outage_url: str) -> None:
    argv = ["worker", "--compile-only", "--poll", "0.2", "--max-configs", "1", "--database-url", outage_url]
    worker = Child("compile worker", tiletune_command(*argv))
    try:
        worker.wait_for_output("compiling for queued TPU jobs", 120)
        for _ in range(3):
            wait_for(lambda: connections(outage_url) > 0, 60, "the compile worker to connect again")
            assert cut_connections(outage_url) >= 1
        db = Database(outage_url)
        try:
            with db.transaction() as session:
                queue.enqueue_job(session, workloads.workload_row(session, WORKLOAD), budget=8)

            def compiled() -> bool:
                with db.read_sessions() as session:
                    return session.scalar(select(models.Trial).where(models.Trial.status == "compiled")) is not None

            wait_for(compiled, 120, "a compile verdict after the outages")
        finally:
            db.dispose()
        assert worker.poll() is None, worker.output()
    finally:
        output = stop(worker)
    assert output.count("database reachable again") >= 3 and "Traceback" not in output, output


def test_a_local_tune_keeps_every_trial_and_its_winner_through_cut_connections(
    outage_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``tiletune tune`` stores each trial as it finishes and the winner at the end: a restart of
    the database meanwhile must not throw away the measurements (here answered from a recorded
    table, 0.1 of its recorded time each, so the cuts meet the writes)."""
    caplog.set_level(logging.WARNING, logger="tiletune.store")
    table = RecordedTable.load(TABLE)
    monkeypatch.setattr(tune, "Supervisor", lambda *args, **kwargs: ReplayMeasurer(table, 0.1))
    done = threading.Event()

    def cut_until_done() -> None:
        while not done.wait(0.15):
            cut_connections(outage_url)

    cutter = threading.Thread(target=cut_until_done)
    cutter.start()
    try:
        outcome = tune.tune_workload(
            table.workload, database_url=outage_url, search=SearchOptions(trials=BUDGET, seed=0)
        )
    finally:
        done.set()
        cutter.join(30)
    assert outcome.tuned_config_id is not None and len(outcome.result.trials) == BUDGET
    met = [r.getMessage() for r in caplog.records if "storing a trial" in r.getMessage()]
    assert met, "no cut met a trial's write: nothing tested"
    db = Database(outage_url)
    try:
        with db.read_sessions() as session:
            rows = session.scalars(select(models.Trial).where(models.Trial.status != "invalid")).all()
            assert sorted(r.params_key for r in rows) == sorted(
                params_key(t.config.to_dict()) for t in outcome.result.trials
            )
            tuned = session.get(models.TunedConfig, outcome.tuned_config_id)
            assert tuned is not None and tuned.trial_id in {r.id for r in rows}
    finally:
        db.dispose()
