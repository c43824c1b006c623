"""Tuning workers on SQLite and PostgreSQL: jobs run to a tuned config, cancel, SIGTERM,
retries, and resuming a job whose worker died (replay backend: no device needed)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import signal
import threading
from pathlib import Path
from typing import Any

import optuna
import psycopg
import pytest
from sqlalchemy import select, update
from sqlalchemy.exc import OperationalError

from autotune.replay import RecordedTable, ReplayMeasurer
from autotune.search import SearchOptions, SearchResult, pick_winner
from server.store import models, queue, workloads
from server.store.db import Database
from server.worker.coordinator import trial_result
from server.worker.worker import Worker, WorkerOptions, optuna_storage, publish_job_winner, study_name
from tests.server.worker.workers import (
    TABLE,
    check_job_records,
    finished_trials,
    queue_replay_jobs,
    start_worker,
    statuses,
    wait_for,
)


def replay_worker(url: str, **overrides: Any) -> Worker:
    options = WorkerOptions(
        database_url=url, backend="replay", replay_tables=(TABLE,), exit_when_idle=True, replay_sleep=0.0, poll_s=0.1
    )
    return Worker(WorkerOptions(**{**options.__dict__, **overrides}))


def test_worker_tunes_queued_jobs_and_publishes_the_best(database_url: str, db: Database) -> None:
    ids = queue_replay_jobs(db, 3, budget=8)
    worker = replay_worker(database_url)
    events: list[tuple[str, dict[str, Any]]] = []
    worker.on_event = lambda kind, data: events.append((kind, data))
    try:
        outcomes = worker.run()
    finally:
        worker.close()
    assert [(o.job_id, o.status) for o in outcomes] == [(i, "done") for i in ids]
    tuned_events = [data for kind, data in events if kind == "tuned"]
    # A replay's figures come from its table: the machine's load is not reported against them.
    assert [d["job_id"] for d in tuned_events] == ids and all(d["others_cores"] is None for d in tuned_events)
    table = RecordedTable.load(TABLE)
    for job_id in ids:
        assert check_job_records(db, job_id, budget=8) == {worker.name: 8}
    with db.read_sessions() as session:
        for job_id in ids:
            job = session.get(models.Job, job_id)
            assert job is not None
            row = session.get(models.Workload, job.workload_id)
            assert row is not None
            result = workloads.lookup(session, workloads.workload_of(row), dict(table.versions))
            assert result.source == "tuned" and result.tuned is not None
            tuned = session.get(models.TunedConfig, result.tuned["id"])
            assert tuned is not None and tuned.trial_id is not None
            winner = session.get(models.Trial, tuned.trial_id)
            assert winner is not None and winner.job_id == job_id and winner.params == result.config
            # The speedups' spread is kept as the worker announced it, for each anchor the table holds
            # (not every table holds a tiled dense anchor for every winner), and it holds the median speedup.
            (event,) = [d for d in tuned_events if d["job_id"] == job_id]
            assert tuned.speedup_p10_p90 == event["speedup_p10_p90"] is not None
            assert set(event["speedup_p10_p90"]) == {"dense"} | ({"tiled_dense"} if tuned.tiled_dense_ms else set())
            low, high = tuned.speedup_p10_p90["dense"]
            assert tuned.speedup is not None and low <= tuned.speedup <= high
            # The winner is one of the re-timed finalists: among the top three trials of the job.
            ranked = sorted((t.median_ms or 0, t.id) for t in finished_trials(db, job_id) if t.status == "ok")
            assert winner.id in [trial_id for _, trial_id in ranked[:3]]


def test_a_replay_worker_runs_only_jobs_of_its_tables_kernel_version(database_url: str, db: Database) -> None:
    """The table was recorded on one version of the backend's kernel: a job of another version is left
    queued (its times would be stored under a key they were not measured on)."""
    table = RecordedTable.load(TABLE)
    other = dataclasses.replace(table.workload, kernel_version=f"{table.workload.kernel_version}-other")
    with db.transaction() as session:
        skipped = queue.enqueue_job(session, workloads.workload_row(session, other), budget=4)[0].id
    (mine,) = queue_replay_jobs(db, 1, budget=4)
    worker = replay_worker(database_url)
    assert worker.kernel_versions == (table.workload.kernel_version,)
    try:
        outcomes = worker.run()
    finally:
        worker.close()
    assert [(o.job_id, o.status) for o in outcomes] == [(mine, "done")]
    assert statuses(db, [skipped]) == {skipped: "queued"}


def test_cancel_stops_the_worker_and_keeps_the_job_cancelled(db: Database, database_url: str) -> None:
    (job_id,) = queue_replay_jobs(db, 1, budget=40)
    worker = replay_worker(database_url, replay_sleep=0.15, lease_s=1.5)

    def cancel_after_two_trials() -> None:
        wait_for(lambda: len(finished_trials(db, job_id)) >= 2, 60, "two trials")
        with db.transaction() as session:
            job = session.get(models.Job, job_id)
            assert job is not None
            queue.cancel_job(session, job)

    canceller = threading.Thread(target=cancel_after_two_trials)
    canceller.start()
    try:
        outcomes = worker.run()
    finally:
        worker.close()
        canceller.join(60)
    assert [o.status for o in outcomes] == ["lost"]
    assert statuses(db, [job_id]) == {job_id: "cancelled"}
    with db.read_sessions() as session:
        trials = queue.job_trials(session, job_id)
    assert len([t for t in trials if t.status != "invalid"]) < 40
    assert not [t for t in trials if t.status == "running"]  # the trial in flight was abandoned


def test_a_failing_job_is_retried_then_failed(db: Database, database_url: str) -> None:
    other = RecordedTable.load(TABLE.parent / "cpu-demo.xla.json").workload  # no small-mixed table serves it
    with db.transaction() as session:
        job, _ = queue.enqueue_job(session, workloads.workload_row(session, other), budget=4)
        job_id = job.id
    worker = replay_worker(database_url)
    try:
        outcomes = worker.run()
    finally:
        worker.close()
    assert [o.status for o in outcomes] == ["failed"] * 3
    with db.read_sessions() as session:
        failed = session.get(models.Job, job_id)
        assert failed is not None and failed.status == "failed" and failed.attempts == 3
        assert failed.error is not None and "no replay table matches" in failed.error


def test_a_dead_workers_job_resumes_without_losing_or_repeating_trials(db: Database, database_url: str) -> None:
    (job_id,) = queue_replay_jobs(db, 1, budget=10)
    table = RecordedTable.load(TABLE)
    configs = [c for c, m in table.entries.values() if m.status == "ok"][:4]
    with db.transaction() as session:
        assert queue.claim_job(session, "dead", device_kind="cpu", backend="xla") is not None
        kept = []
        for config in configs[:3]:
            r = queue.reserve_trial(session, job_id, "dead", config.to_dict())
            m = table.entries[next(k for k, (c, _) in table.entries.items() if c == config)][1]
            assert queue.complete_trial(session, r.trial_id or 0, "dead", "ok", **m.trial_fields())
            kept.append(r.trial_id)
        in_flight = queue.reserve_trial(session, job_id, "dead", configs[3].to_dict()).trial_id
        job = session.get(models.Job, job_id)
        assert job is not None
        name = study_name(job)
    # The dead worker had asked its study for a trial it never told: it stays RUNNING there.
    study = optuna.create_study(study_name=name, storage=optuna_storage(database_url), direction="minimize")
    study.ask()
    with db.transaction() as session:
        session.execute(
            update(models.JobLease).values(expires_at=models.utcnow() - dt.timedelta(seconds=1))
        )  # the worker was killed: its lease runs out
        session.commit()
    worker = replay_worker(database_url)
    try:
        (outcome,) = worker.run()
    finally:
        worker.close()
    assert outcome.status == "done" and outcome.trials == 10 - 4
    per_worker = check_job_records(db, job_id, budget=10)
    assert per_worker == {"dead": 3, worker.name: 6}
    with db.read_sessions() as session:
        for trial_id in kept:
            trial = session.get(models.Trial, trial_id)
            assert trial is not None and trial.status == "ok" and trial.worker == "dead"
        crashed = session.get(models.Trial, in_flight)
        assert crashed is not None and crashed.status == "crashed"
        job = session.get(models.Job, job_id)
        assert job is not None and job.attempts == 2
    states = {t.state for t in optuna.load_study(study_name=name, storage=optuna_storage(database_url)).trials}
    assert optuna.trial.TrialState.RUNNING not in states and optuna.trial.TrialState.FAIL in states


@pytest.mark.slow
def test_sigterm_finishes_the_trial_gives_the_job_back_and_a_new_worker_resumes(
    db: Database, database_url: str
) -> None:
    (job_id,) = queue_replay_jobs(db, 1, budget=12)
    proc = start_worker(database_url, "--replay-sleep", "0.3", "--lease", "3", "--exit-when-idle")
    try:
        wait_for(lambda: len(finished_trials(db, job_id)) >= 2, 120, "two trials of the first worker")
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = proc.output()
    proc.close()
    assert proc.returncode == 0, out
    assert "stops after the trial in flight" in out
    before = finished_trials(db, job_id)
    with db.read_sessions() as session:
        job = session.get(models.Job, job_id)
        assert job is not None and job.status == "queued" and job.attempts == 0
        assert [lease.end_reason for lease in queue.job_leases(session, job_id)] == ["released"]
        assert queue.running_trials(session, job_id) == 0
    worker = replay_worker(database_url)
    try:
        (outcome,) = worker.run()
    finally:
        worker.close()
    assert outcome.status == "done" and outcome.trials == 12 - len(before)
    check_job_records(db, job_id, budget=12)
    after = {t.id for t in finished_trials(db, job_id)}
    assert {t.id for t in before} <= after


def jobs_tuned_configs(db: Database, job_id: int) -> list[models.TunedConfig]:
    """The tuned configs published from the trials of ``job_id``."""
    with db.read_sessions() as session:
        return list(
            session.scalars(
                select(models.TunedConfig)
                .join(models.Trial, models.Trial.id == models.TunedConfig.trial_id)
                .where(models.Trial.job_id == job_id)
            )
        )


def test_a_co_worker_that_dies_mid_trial_is_settled_when_its_lease_expires(db: Database, database_url: str) -> None:
    """A co-worker of a ``parallelism: 2`` job dies with a trial in flight and a trial RUNNING in
    the job's study. The survivor finalizes as soon as the dead lease expires (not after a fixed
    timeout: its deadline here is 2 x 30 s + 2 s), and the finished job keeps no ``running``
    trial and no RUNNING Optuna trial; the dead lease ends ``expired``, not ``job_done``."""
    (job_id,) = queue_replay_jobs(db, 1, budget=8, parallelism=2)
    table = RecordedTable.load(TABLE)
    config = next(c for c, m in table.entries.values() if m.status == "ok")
    with db.transaction() as session:
        job = queue.claim_job(session, "dead", device_kind="cpu", backend="xla", lease_s=600)
        assert job is not None
        name = study_name(job)
        in_flight = queue.reserve_trial(session, job_id, "dead", config.to_dict()).trial_id
    optuna.create_study(study_name=name, storage=optuna_storage(database_url), direction="minimize").ask()
    worker = replay_worker(database_url, lease_s=2.0, trial_timeout_s=30.0)
    outcomes: list[Any] = []
    thread = threading.Thread(target=lambda: outcomes.extend(worker.run()))
    thread.start()
    try:

        def finalizing() -> bool:
            with db.read_sessions() as session:
                job = session.get(models.Job, job_id)
                return job is not None and job.finalizer == worker.name

        wait_for(finalizing, 120, "the survivor to finalize")
        assert statuses(db, [job_id]) == {job_id: "running"}  # it waits for the co-worker's trial
        with db.transaction() as session:  # the co-worker was killed: its lease runs out now
            session.execute(
                update(models.JobLease)
                .where(models.JobLease.worker == "dead")
                .values(expires_at=models.utcnow() - dt.timedelta(seconds=1))
            )
    finally:
        thread.join(120)
        worker.close()
    assert [(o.job_id, o.status) for o in outcomes] == [(job_id, "done")]
    with db.read_sessions() as session:
        job = session.get(models.Job, job_id)
        assert job is not None and job.status == "done" and job.attempts == 1  # joined, never taken over
        ends = {lease.worker: lease.end_reason for lease in queue.job_leases(session, job_id)}
        assert ends == {"dead": "expired", worker.name: "done"}
        crashed = session.get(models.Trial, in_flight)
        assert crashed is not None and crashed.status == "crashed" and crashed.error == queue.LOST_LEASE_ERROR
        assert queue.running_trials(session, job_id) == 0
    states = [t.state for t in optuna.load_study(study_name=name, storage=optuna_storage(database_url)).trials]
    assert optuna.trial.TrialState.RUNNING not in states and optuna.trial.TrialState.FAIL in states
    assert len(jobs_tuned_configs(db, job_id)) == 1


def test_one_tuned_config_per_job_however_many_finish_it(db: Database, database_url: str) -> None:
    """Every worker holding a job tries to finish it and publish at once, then once more: one of
    them publishes, once; the others and the repeats write nothing (a second finalizer, a retry
    after a crash, or a worker whose job is done never adds a second tuned config). The winner's
    repeat -- a retry whose first try committed before an outage took its answer -- answers the
    id it published; with another winner it answers None."""
    holders = 4
    (job_id,) = queue_replay_jobs(db, 1, budget=8, parallelism=holders)
    table = RecordedTable.load(TABLE)
    measured = [(c, m) for c, m in table.entries.values() if m.status == "ok"][:3]
    names = [f"w{i}" for i in range(holders)]
    with db.transaction() as session:
        for name in names:
            assert queue.claim_job(session, name, device_kind="cpu", backend="xla") is not None
        for config, m in measured:
            trial_id = queue.reserve_trial(session, job_id, names[0], config.to_dict()).trial_id
            assert queue.complete_trial(session, trial_id or 0, names[0], "ok", **m.trial_fields())
        job = session.get(models.Job, job_id)
        assert job is not None
        row = session.get(models.Workload, job.workload_id)
        assert row is not None
        key = row.key
        result = SearchResult(trials=[trial_result(t) for t in queue.job_trials(session, job_id)], best=None)
    pick_winner(result, ReplayMeasurer(table), SearchOptions(), table.space())
    versions = {"jax": "replay", "jaxlib": "replay", "libtpu": None}
    published: list[int | None] = []
    barrier = threading.Barrier(holders)

    def finish(name: str) -> None:
        barrier.wait()
        published.append(publish_job_winner(db, job_id, name, key, result, versions))

    threads = [threading.Thread(target=finish, args=(name,)) for name in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(published) == holders and sum(p is not None for p in published) == 1, published
    (tuned,) = jobs_tuned_configs(db, job_id)
    assert tuned.id in published and tuned.is_current
    with db.read_sessions() as session:
        ends = {lease.worker: lease.end_reason for lease in queue.job_leases(session, job_id)}
    (winner,) = [name for name, end in ends.items() if end == "done"]
    again = {name: publish_job_winner(db, job_id, name, key, result, versions) for name in names}
    assert again == {name: tuned.id if name == winner else None for name in names}
    assert result.best is not None
    other = next(t for t in result.trials if t.number != result.best.number)
    elsewhere = dataclasses.replace(result, best=other)
    assert publish_job_winner(db, job_id, winner, key, elsewhere, versions) is None
    assert [t.id for t in jobs_tuned_configs(db, job_id)] == [tuned.id]
    assert statuses(db, [job_id]) == {job_id: "done"}


def test_a_tell_retried_after_its_commit_landed_succeeds_and_another_value_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection breaks after Optuna's ``set_trial_state_values`` committed: the retry finds the
    trial finished with what it was setting and succeeds. A retry that finds other values there (a
    different writer's), or a second tell that met no outage, raises as Optuna does."""
    storage = optuna_storage(f"sqlite:///{tmp_path / 'study.db'}", patience=10)
    study = optuna.create_study(storage=storage, study_name="ambiguous")
    original = optuna.storages.RDBStorage.set_trial_state_values
    committed: list[list[float]] = []  # the values the next call commits before its connection breaks

    def commit_then_break(self: Any, trial_id: int, state: Any, values: Any = None) -> bool:
        if not committed:
            return original(self, trial_id, state, values)
        original(self, trial_id, state, committed.pop())
        raise OperationalError("COMMIT", {}, psycopg.errors.AdminShutdown("terminating connection"))

    monkeypatch.setattr(optuna.storages.RDBStorage, "set_trial_state_values", commit_then_break)
    done = optuna.trial.TrialState.COMPLETE
    first, second = study.ask(), study.ask()

    committed.append([1.25])
    assert storage.set_trial_state_values(first._trial_id, done, [1.25]) is True
    assert not committed and storage.get_trial(first._trial_id).values == [1.25]
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        storage.set_trial_state_values(first._trial_id, done, [1.25])  # no outage met: a second tell

    committed.append([9.0])
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        storage.set_trial_state_values(second._trial_id, done, [3.0])
    assert not committed and storage.get_trial(second._trial_id).values == [9.0]
    storage.remove_session()
    storage.engine.dispose()


def test_the_tolerant_storage_wraps_every_call_the_study_makes() -> None:
    """Every storage method that Optuna's study front (_CachedStorage) calls on the RDB storage
    rides out an outage, but for the ones of Optuna's own heartbeats (unused here) and delete_study."""
    import inspect
    import re

    from optuna.storages import _cached_storage

    from server.worker.coordinator import STORAGE_CALLS, OutageTolerantStorage

    called = set(re.findall(r"self\._backend\.(\w+)\(", inspect.getsource(_cached_storage)))
    assert {"_create_new_trial", "_get_trials", "set_trial_state_values"} <= called  # the pattern finds the calls
    unused = {
        "record_heartbeat",
        "_get_stale_trial_ids",
        "get_heartbeat_interval",
        "get_heartbeat_stale_trial_callback",
    }
    assert called - unused - {"delete_study"} <= set(STORAGE_CALLS), sorted(called - set(STORAGE_CALLS))
    for name in STORAGE_CALLS:
        assert hasattr(optuna.storages.RDBStorage, name), f"Optuna has no RDBStorage.{name} any more"
        assert getattr(OutageTolerantStorage, name) is not getattr(optuna.storages.RDBStorage, name), name
