"""Worker processes sharing a PostgreSQL queue: 24 jobs over 4 workers, a worker killed
with SIGKILL mid-job, and two workers sharing one job's study and budget."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import optuna
import pytest

from server.bench.harness import Child
from server.store import models
from server.store.db import Database
from server.store.migrate import upgrade
from server.worker.worker import optuna_storage, study_name
from tests.server.worker.workers import (
    check_job_records,
    finished_trials,
    queue_replay_jobs,
    start_worker,
    start_workers,
    statuses,
    wait_for,
)

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture
def pg(postgres_url: str) -> Iterator[Database]:
    upgrade(postgres_url)
    database = Database(postgres_url)
    database.empty_tables()
    yield database
    database.dispose()


def stop_all(procs: list[Child]) -> list[str]:
    """Wait for the workers (they exit when idle); their output."""
    out = []
    for p in procs:
        if p.wait(240) is None:
            p.kill()
        out.append(p.output())
        p.close()
    return out


def stop_when_done(db: Database, job_ids: list[int], procs: list[Child]) -> list[str]:
    """Once every job has ended, SIGTERM the workers (which stay up on an empty queue); their output."""
    try:
        wait_for(lambda: set(statuses(db, job_ids).values()) <= {"done", "failed"}, 240, "the jobs", poll_s=0.5)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
    return stop_all(procs)


def test_four_workers_twenty_four_jobs_each_done_exactly_once(pg: Database, postgres_url: str) -> None:
    procs = start_workers(postgres_url, 4, "--replay-sleep", "0.05", "--poll", "0.2")
    ids = queue_replay_jobs(pg, 24, budget=5)
    logs = stop_when_done(pg, ids, procs)
    assert [p.returncode for p in procs] == [0, 0, 0, 0], logs
    assert set(statuses(pg, ids).values()) == {"done"}
    workers_used = set()
    for job_id in ids:
        per_worker = check_job_records(pg, job_id, budget=5)
        assert len(per_worker) == 1  # parallelism 1: one worker measured all of it
        workers_used |= set(per_worker)
    assert len(workers_used) == 4, "every worker took a share"


def test_killed_worker_job_completes_elsewhere_without_losing_or_repeating_trials(
    pg: Database, postgres_url: str
) -> None:
    ids = queue_replay_jobs(pg, 2, budget=12)
    victim = start_worker(postgres_url, "--replay-sleep", "0.3", "--lease", "3", "--exit-when-idle")
    try:
        wait_for(lambda: len(finished_trials(pg, ids[0])) >= 3, 120, "three trials of the first job")
        before = {t.id: t.params_key for t in finished_trials(pg, ids[0])}
        victim.send_signal(signal.SIGKILL)
        victim.wait(30)
    finally:
        if victim.poll() is None:
            victim.kill()
    with pg.read_sessions() as session:
        held = session.query(models.JobLease).filter(models.JobLease.job_id == ids[0]).one()
        dead = held.worker
    rescuer = start_worker(postgres_url, "--replay-sleep", "0.05", "--lease", "3", "--poll", "0.2")
    try:  # it stays up: the killed worker's job becomes claimable only once its lease runs out
        wait_for(lambda: set(statuses(pg, ids).values()) == {"done"}, 180, "both jobs done", poll_s=0.5)
    finally:
        rescuer.send_signal(signal.SIGTERM)
        (log,) = stop_all([rescuer])
    assert rescuer.returncode == 0, log
    per_worker = check_job_records(pg, ids[0], budget=12)
    assert dead in per_worker and len(per_worker) == 2
    after = {t.id: t.params_key for t in finished_trials(pg, ids[0])}
    assert before.items() <= after.items(), "a completed trial of the killed worker was lost"
    with pg.read_sessions() as session:
        leases = session.query(models.JobLease).filter(models.JobLease.job_id == ids[0]).order_by(models.JobLease.id)
        assert [(lease.worker == dead, lease.end_reason) for lease in leases] == [(True, "expired"), (False, "done")]
        job = session.get(models.Job, ids[0])
        assert job is not None and job.attempts == 2


def test_two_workers_share_one_job_within_its_budget(pg: Database, postgres_url: str) -> None:
    procs = start_workers(postgres_url, 2, "--replay-sleep", "0.2", "--poll", "0.2")
    (job_id,) = queue_replay_jobs(pg, 1, budget=24, parallelism=2)
    logs = stop_when_done(pg, [job_id], procs)
    assert [p.returncode for p in procs] == [0, 0], logs
    per_worker = check_job_records(pg, job_id, budget=24)
    assert len(per_worker) == 2 and min(per_worker.values()) >= 4, per_worker  # both measured a share
    with pg.read_sessions() as session:
        leases = session.query(models.JobLease).filter(models.JobLease.job_id == job_id).all()
        job = session.get(models.Job, job_id)
        assert job is not None
        name = study_name(job)
    reasons = sorted(lease.end_reason or "" for lease in leases)
    assert reasons in (["budget", "done"], ["done", "job_done"]), reasons  # the other left, or was still there
    study = optuna.load_study(study_name=name, storage=optuna_storage(postgres_url))
    told = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len({tuple(sorted(t.params.items())) for t in told}) >= 24  # one shared study holds both workers' trials
