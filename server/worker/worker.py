"""``tiletune worker``: claims tuning jobs from the database and runs them.

A worker loops: claim a queued job of its own device kind and backend (see
:mod:`server.store.queue`), run the search on the job's Optuna study (RDBStorage
in the same database, so the workers of one job share it and a resumed job
keeps its history), store each trial as it finishes, and at the end re-time the
top configs and publish the winner as the workload's tuned config.

- A heartbeat thread extends the lease every ``lease_s / 3``. A heartbeat that
  fails (the job was cancelled, or the worker stalled past its lease and was
  replaced) stops the work: the trial in flight is abandoned. A heartbeat also
  ends the expired leases of co-workers (they died) and records their trials in
  flight ``crashed``.
- Every trial is reserved in the database before it is measured
  (:class:`~server.worker.coordinator.JobCoordinator`): workers of one job never
  measure the same params, and together they stay within its budget. The worker
  that sees the budget spent first becomes the job's finalizer; the others leave
  the job. The finalizer waits until no co-worker holds the job (a dead one for
  its lease to expire), marks the trials that dead workers left RUNNING in the
  study FAIL, re-times the finalists, then finishes the job and publishes the
  winner in one transaction that publishes nothing unless it is the one that
  ends the job (:func:`publish_job_winner`).
- ``request_stop()`` (the CLI calls it on SIGTERM / SIGINT) finishes the trial in
  flight, then gives the job back; ``request_stop(abandon=True)`` (a second
  signal) kills the measurement in flight at once.
- A job that raises is ``failed`` with the error, and queued again while it has
  attempts left. A database outage is not the job's fault: the worker waits it
  out (:attr:`Worker.patience`, :mod:`server.store.outage`).

The ``replay`` backend answers measurements from recorded exhaustive tables
(:mod:`autotune.replay`), optionally spending the recorded compile and run time
as sleep, so the queue, the shared studies and recovery can be exercised and
benchmarked without a device. It serves jobs whose workload matches a table's
in everything but the batch size (which only tells the jobs apart).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import socket
import threading
import time
import traceback
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import optuna
from sqlalchemy.orm import Session

from autotune.measure import MeasureOptions
from autotune.replay import RecordedTable, ReplayMeasurer
from autotune.search import Measurer, SearchOptions, SearchResult, TrialResult, pick_winner, run_search
from autotune.space import SearchSpace
from autotune.supervisor import MeasurementAborted, Supervisor
from autotune.surrogate import Ridge
from autotune.versions import software_versions
from kernel.config import TileConfig
from kernel.workload import BACKENDS, KERNEL_VERSIONS, Workload
from server.store import compiles, models, queue, records, workloads
from server.store.db import Database
from server.store.outage import LOG_EVERY, OutageWait, Patience, describe, is_outage, ride_out
from server.worker.coordinator import (
    JobCoordinator,
    fail_orphaned_trials,
    optuna_storage,
    study_name,
    trial_result,
)
from server.worker.tune import family_prior, publish_winner, warm_start_configs

log = logging.getLogger("tiletune.worker")

WORKER_BACKENDS = ("auto", *BACKENDS, "replay")
#: How long a worker stopping in a database outage still tries to give its job back (then the lease ends it).
GIVE_BACK_S = 5.0


class LostJob(Exception):  # noqa: N818  (a condition of the job, not a bug)
    """The worker no longer holds the job it was finishing: nothing of the finish is kept."""


def publish_job_winner(
    db: Database, job_id: int, worker: str, workload_key: str, result: SearchResult, versions: dict[str, str | None]
) -> int | None:
    """Finish the job ``done`` and publish ``result``'s re-timed winner as the workload's tuned config,
    in one transaction: the id of the tuned config, or None when ``worker`` no longer holds the
    running job (nothing is written then).

    The job's end comes first and checks, under the job row's lock, that the job is still
    running and held by ``worker`` (:func:`~server.store.queue.finish_job`); the publish
    follows only then. So however often this runs for one job -- a second finalizer after a
    take-over, a retry after a crash, a worker whose lease was ended -- the job gets one tuned
    config, and a worker killed before the commit leaves neither. A retry after an outage
    whose first try committed finds the job finished by ``worker`` and this very winner
    current, and answers its id as the first try would have.
    """
    try:
        with db.transaction() as session:
            finished = queue.finish_job(session, job_id, worker, "done")  # first: it takes the job row's lock
            row = workloads.find_workload(session, workload_key)
            assert row is not None and result.best is not None
            best_row_id = result.best.number  # trial_result keeps the row id there
            if not finished:
                current = records.current_config(session, row.id)
                if queue.finished_by(session, job_id, worker) and current and current.trial_id == best_row_id:
                    return current.id
                raise LostJob(f"job {job_id} is no longer held by {worker}")
            return publish_winner(session, row, result, versions, session.get(models.Trial, best_row_id))
    except LostJob:
        return None


def worker_name() -> str:
    """host-pid-random: unique per process, readable in lease and trial records."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


@dataclasses.dataclass
class WorkerOptions:
    database_url: str
    backend: str = "auto"  # one of WORKER_BACKENDS
    device_kind: str = "auto"
    max_jobs: int | None = None  # stop after this many jobs
    exit_when_idle: bool = False  # stop when no job is claimable (tests, benchmarks, batch runs)
    lease_s: float = 60.0
    poll_s: float = 2.0
    trial_timeout_s: float = 300.0
    measure: MeasureOptions = dataclasses.field(default_factory=MeasureOptions)
    search: SearchOptions = dataclasses.field(default_factory=SearchOptions)
    replay_tables: tuple[Path, ...] = ()
    replay_sleep: float = 1.0  # fraction of the recorded compile + run time slept per replayed trial
    name: str | None = None


@dataclasses.dataclass
class JobOutcome:
    job_id: int
    workload_key: str
    status: str  # done | left | failed | released | lost
    trials: int = 0  # trials this worker measured
    tuned_config_id: int | None = None
    error: str | None = None


class Worker:
    """One tuning worker process (see the module docstring)."""

    def __init__(self, options: WorkerOptions, on_event: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        self.options = options
        self.name = options.name or worker_name()
        self.host = socket.gethostname()
        self.on_event = on_event or (lambda _kind, _data: None)
        self.db = Database(options.database_url)
        self._stop = threading.Event()
        self._abort = threading.Event()
        self.tables: list[RecordedTable] = []
        if options.backend == "replay":
            if not options.replay_tables:
                raise ValueError("the replay backend needs at least one --replay-table")
            self.tables = [RecordedTable.load(p) for p in options.replay_tables]
            pairs = {(t.workload.device_kind, t.workload.backend) for t in self.tables}
            if len(pairs) != 1:
                raise ValueError(f"replay tables must share one device kind and backend, got {sorted(pairs)}")
            ((self.device_kind, self.backend),) = pairs
            # A replay runs the kernel its tables were recorded on.
            self.kernel_versions: tuple[str, ...] = tuple(sorted({t.workload.kernel_version for t in self.tables}))
            if options.device_kind not in ("auto", self.device_kind):
                raise ValueError(
                    f"--device-kind {options.device_kind!r} does not match the tables' {self.device_kind!r}"
                )
        else:
            from autotune.device import probe_device
            from kernel.attention import resolve_backend

            device = probe_device()
            self.backend = resolve_backend(options.backend, device.platform)
            self.device_kind = device.kind if options.device_kind == "auto" else options.device_kind
            self.kernel_versions = (KERNEL_VERSIONS[self.backend],)
        self._storage: optuna.storages.RDBStorage | None = None
        self._versions: dict[str, str | None] | None = None

    # ------------------------------------------------------------ control

    def request_stop(self, abandon: bool = False) -> None:
        """Stop after the trial in flight (``abandon``: at once), giving the job back."""
        self._stop.set()
        if abandon:
            self._abort.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def close(self) -> None:
        self.db.dispose()
        if self._storage is not None:
            self._storage.remove_session()
            self._storage.engine.dispose()

    def storage(self) -> optuna.storages.RDBStorage:
        if self._storage is None:
            url, patience = self.options.database_url, self.patience
            self._storage = ride_out(
                lambda: optuna_storage(url, patience), what="opening the Optuna storage", patience=patience
            )
        return self._storage

    # ------------------------------------------------------------ the loop

    def run(self) -> list[JobOutcome]:
        """Claim and run jobs until stopped, ``max_jobs`` are done, or (``exit_when_idle``) none is left."""
        options = self.options
        outcomes: list[JobOutcome] = []
        self.on_event("started", {"worker": self.name, "device_kind": self.device_kind, "backend": self.backend})
        outage = OutageWait(f"worker {self.name}", options.poll_s)
        while not self._stop.is_set():
            if options.max_jobs is not None and len(outcomes) >= options.max_jobs:
                break
            try:
                claimed = self._claim()
                idle = claimed is None and options.exit_when_idle and not self._claimable()
            except Exception as exc:
                if not is_outage(exc):
                    raise
                self._stop.wait(outage.failed(exc))  # a claim needs the database: wait for it to come back
                continue
            outage.succeeded()
            if claimed is None:
                if idle:
                    break
                self._stop.wait(options.poll_s)
                continue
            outcome = self.run_job(*claimed)
            outcomes.append(outcome)
            self.on_event("job_finished", dataclasses.asdict(outcome))
        self.on_event("stopped", {"worker": self.name, "jobs": len(outcomes)})
        return outcomes

    def _claim(self) -> tuple[int, int, int, int, str] | None:
        """Claim a queued job: its id, workload id, budget, attempt and study name, or None."""
        with self.db.transaction() as session:
            job = queue.claim_job(
                session,
                self.name,
                device_kind=self.device_kind,
                backend=self.backend,
                kernel_versions=self.kernel_versions,
                lease_s=self.options.lease_s,
            )
            return None if job is None else (job.id, job.workload_id, job.budget, job.attempts, study_name(job))

    def _claimable(self) -> bool:
        """Whether a job is left for this worker (one that another claim holds locked right now counts)."""
        with self.db.read_sessions() as session:
            return queue.has_claimable(
                session,
                self.name,
                device_kind=self.device_kind,
                backend=self.backend,
                kernel_versions=self.kernel_versions,
            )

    def run_job(self, job_id: int, workload_id: int, budget: int, attempt: int, study: str) -> JobOutcome:
        """Run the claimed job ``job_id`` to its end (or this worker's part of it).

        A database outage is waited out as long as the worker runs (:attr:`patience`); one
        it is asked to stop in gives the job back rather than failing it: the job is not at
        fault, its measured trials are kept, and the next claim resumes it (:meth:`_give_back`).
        """
        try:
            workload, seeds, prior = self.db.read(
                lambda session: self._job_inputs(session, workload_id),
                what=f"job {job_id}: reading it",
                patience=self.patience,
            )
        except Exception as exc:
            if not is_outage(exc):
                raise
            return self._give_back(job_id, f"workload {workload_id}", None, exc)
        self.on_event(
            "job_started", {"job_id": job_id, "workload_key": workload.key, "budget": budget, "attempt": attempt}
        )
        if not self._stop.is_set():
            self._abort.clear()  # set by a previous job's lost lease
        lost, finished = threading.Event(), threading.Event()
        beat = threading.Thread(
            target=self._heartbeat, args=(job_id, lost, finished), daemon=True, name=f"heartbeat-{job_id}"
        )
        beat.start()
        coordinator = JobCoordinator(
            self.db,
            self.name,
            job_id,
            workload_id,
            lost,
            host=self.host,
            versions=self.versions(),
            stopping=lambda: self.stopping,
            patience=self.patience,
        )
        try:
            try:
                with self.measurer(workload) as measurer:
                    result = self._search(job_id, study, workload_id, workload, measurer, coordinator, seeds, prior)
                    if lost.is_set():
                        return JobOutcome(job_id, workload.key, "lost", len(result.trials))
                    if self._stop.is_set():
                        self._release(job_id)
                        return JobOutcome(job_id, workload.key, "released", len(result.trials))
                    return self._finish(job_id, study, workload, measurer, result, lost)
            except MeasurementAborted:
                coordinator.abandon()
                if lost.is_set():
                    return JobOutcome(job_id, workload.key, "lost", coordinator.completed)
                self._release(job_id)
                return JobOutcome(job_id, workload.key, "released", coordinator.completed)
            except Exception as exc:
                if is_outage(exc):
                    raise
                coordinator.abandon()
                error = f"{type(exc).__name__}: {exc}"
                log.error("job %s failed on %s:\n%s", job_id, self.name, traceback.format_exc())
                self._end_failed(job_id, error)
                return JobOutcome(job_id, workload.key, "failed", coordinator.completed, error=error)
        except Exception as exc:
            if not is_outage(exc):
                raise
            return self._give_back(job_id, workload.key, coordinator, exc)
        finally:
            finished.set()
            beat.join(5)

    @property
    def patience(self) -> Patience:
        """How long one unit of a job's database work waits out an outage: as long as the worker
        runs, then (asked to stop) half its lease since the first try.

        Waiting past the lease is safe: the heartbeat cannot extend the lease while the
        database is away, but an expired lease stays the worker's until another worker's
        claim ends it, and every write checks that (a take-over meanwhile makes the next one
        find the job lost). A failover longer than the lease therefore costs neither the
        trial in flight nor an attempt of the job, unless another worker took the job.
        """
        return Patience(self.options.lease_s / 2, until=self._stop)

    def _job_inputs(self, session: Session, workload_id: int) -> tuple[Workload, list[TileConfig], Ridge | None]:
        """The job's workload, its warm-start configs and its family's model (None without a warm start)."""
        row = session.get(models.Workload, workload_id)
        assert row is not None
        workload = workloads.workload_of(row)
        seeds = warm_start_configs(session, workload_id, workload)
        prior = family_prior(session, workload) if self.options.search.warm_start else None
        return workload, seeds, prior

    def _release(self, job_id: int, patience_s: float | None = None) -> bool:
        """Give the job back to the queue, its attempt uncounted, dropping this worker's reservations
        (False: the worker no longer held it); an outage is waited out for ``patience_s`` (default:
        half the lease; the worker is stopping, so not without end)."""
        return self.db.transact(
            lambda session: queue.release_job(session, job_id, self.name),
            what=f"job {job_id}: giving it back",
            patience=self.options.lease_s / 2 if patience_s is None else patience_s,
        )

    def _end_failed(self, job_id: int, error: str) -> None:
        self.db.transact(
            lambda session: queue.finish_job(session, job_id, self.name, "failed", error[:4000]),
            what=f"job {job_id}: recording its failure",
            patience=self.patience,
        )

    def _give_back(
        self, job_id: int, workload_key: str, coordinator: JobCoordinator | None, error: BaseException
    ) -> JobOutcome:
        """The worker was asked to stop while the database was away in the middle of a job: drop
        this worker's reservations and give the job back, trying for :data:`GIVE_BACK_S` more; if
        the database is still away, leave the job to its lease, whose end makes it claimable again."""
        done = 0 if coordinator is None else coordinator.completed
        reason = f"database unavailable: {error.__class__.__name__}"
        log.warning("job %s: stopping while the database is unavailable; giving the job back", job_id)

        try:
            released = self._release(job_id, patience_s=GIVE_BACK_S)
        except Exception as exc:
            if not is_outage(exc):
                raise
            log.warning("job %s: the database is still unavailable; its lease ends and it is claimable again", job_id)
            return JobOutcome(job_id, workload_key, "lost", done, error=reason)
        if coordinator is not None:
            coordinator.reserved.clear()
        return JobOutcome(job_id, workload_key, "released" if released else "lost", done, error=reason)

    def _heartbeat(self, job_id: int, lost: threading.Event, finished: threading.Event) -> None:
        interval = max(0.2, self.options.lease_s / 3)
        failures = 0
        while not finished.wait(interval):
            try:
                with self.db.transaction() as session:
                    held = queue.heartbeat(session, job_id, self.name, self.options.lease_s)
            except Exception as exc:  # the database is away: try again (an expired lease stays ours until claimed)
                if failures % LOG_EVERY == 0:  # the first failure, then sparingly through a long outage
                    log.warning("heartbeat of job %s failed: %s", job_id, describe(exc) if is_outage(exc) else exc)
                failures += 1
                continue
            if failures:
                log.warning("heartbeat of job %s works again after %d failed", job_id, failures)
                failures = 0
            if not held:
                log.warning("job %s is no longer held by %s (cancelled or taken over): stopping", job_id, self.name)
                lost.set()
                self._abort.set()  # abandon the trial in flight
                return

    def _search(
        self,
        job_id: int,
        study: str,
        workload_id: int,
        workload: Workload,
        measurer: Measurer,
        coordinator: JobCoordinator,
        seeds: Sequence[TileConfig],
        prior: Ridge | None = None,
    ) -> SearchResult:
        space = SearchSpace(workload, workload.backend)
        search = self.options.search
        # Co-workers of one job sample with different seeds, or they would propose alike.
        seed = (search.seed + zlib.crc32(self.name.encode())) % (2**31)
        # Compiling ahead pays only where the timed work runs on a device: on a CPU backend the compile
        # would share the CPU being timed.
        lookahead = search.lookahead if workload.backend == "tpu" else 0
        options = dataclasses.replace(
            search, seed=seed, seed_configs=(*search.seed_configs, *seeds), lookahead=lookahead, prior=prior
        )

        def progress(trial: TrialResult, result: SearchResult) -> None:
            m = trial.measurement
            self.on_event(
                "trial",
                {
                    "job_id": job_id,
                    "number": trial.number,
                    "config": trial.config.describe(),
                    "status": m.status,
                    "median_ms": m.median_ms,
                },
            )

        holders = self.db.read(
            lambda session: list(queue.job_progress(session, [job_id])[job_id].workers),
            what=f"job {job_id}: reading its workers",
            patience=self.patience,
        )
        if holders == [self.name]:
            fail_orphaned_trials(self.storage(), study)
        return run_search(
            space,
            measurer,
            options,
            storage=self.storage(),
            study_name=study,
            coordinator=coordinator,
            on_trial=progress,
            finalize=False,
            gate=self.compile_gate(workload_id) if workload.backend == "tpu" else None,
        )

    def compile_gate(self, workload_id: int) -> Callable[[TileConfig], str | None]:
        """Why a config must not be timed here: compile workers of this worker's compiler versions
        found that it does not compile (:mod:`server.worker.compile_worker`); None otherwise."""
        versions = self.versions()

        def gate(config: TileConfig) -> str | None:
            return self.db.read(
                lambda session: compiles.refusal(session, workload_id, config.to_dict(), versions),
                what="reading compile verdicts",
                patience=self.patience,
            )

        return gate

    def _finish(
        self,
        job_id: int,
        study: str,
        workload: Workload,
        measurer: Measurer,
        result: SearchResult,
        lost: threading.Event,
    ) -> JobOutcome:
        """The budget is spent: the first worker here re-times the finalists and publishes; the others leave."""
        mine = len(result.trials)

        def finalize_or_leave(session: Session) -> bool:
            finalizer = queue.begin_finalize(session, job_id, self.name)
            if not finalizer:
                queue.leave_job(session, job_id, self.name)
            return finalizer

        finalizer = self.db.transact(
            finalize_or_leave, what=f"job {job_id}: finishing its search", patience=self.patience
        )
        if not finalizer:
            return JobOutcome(job_id, workload.key, "left", mine)
        self._wait_for_co_workers(job_id, lost)
        if lost.is_set():
            return JobOutcome(job_id, workload.key, "lost", mine)
        # Nobody else works on the job now: a trial still RUNNING in its study was asked by a
        # worker that died, and would stay so on the finished job.
        fail_orphaned_trials(self.storage(), study)

        ok_trials = self.db.read(
            lambda session: [trial_result(r) for r in queue.job_trials(session, job_id, ("ok",))],
            what=f"job {job_id}: reading its trials",
            patience=self.patience,
        )
        everyone = SearchResult(trials=ok_trials, best=None)
        pick_winner(everyone, measurer, self.options.search, SearchSpace(workload, workload.backend))
        if self.options.backend == "replay":
            everyone.others_cores = None  # a replay answers from its table: the machine's load did not touch it
        if everyone.best is None or everyone.best_median_ms is None:
            self._end_failed(job_id, "no config measured ok")
            return JobOutcome(job_id, workload.key, "failed", mine, error="no config measured ok")
        # The re-timing above is the finish's costly part: a short outage must not throw it away.
        tuned_id = ride_out(
            lambda: publish_job_winner(self.db, job_id, self.name, workload.key, everyone, self.versions()),
            what=f"job {job_id}: publishing its winner",
            patience=Patience(self.options.lease_s, until=self._stop),
        )
        if tuned_id is None:
            return JobOutcome(job_id, workload.key, "lost", mine)
        self.on_event(
            "tuned",
            {"job_id": job_id, "workload_key": workload.key, "config": everyone.best.config.describe(),
             "median_ms": everyone.best_median_ms, "dense_ms": everyone.dense_ms,
             "tiled_dense_ms": everyone.anchor_ms("tiled_dense"), "tuned_config_id": tuned_id,
             "others_cores": everyone.others_cores, "speedup_p10_p90": everyone.speedup_p10_p90(),
             "anchor_processes": None if self.options.backend == "replay" else everyone.anchor_processes},
        )  # fmt: skip
        return JobOutcome(job_id, workload.key, "done", mine, tuned_id)

    def _wait_for_co_workers(self, job_id: int, lost: threading.Event) -> None:
        """Until no other worker holds the job and none of its trials is in flight.

        A co-worker that died is settled as soon as its lease expires (the lease
        ends, its trial in flight is recorded ``crashed``); a live one leaves once
        its trial in flight is recorded (the reservation after it finds the budget
        spent). The deadline only bounds a co-worker that keeps its lease alive but
        never finishes its trial (its measurement outlived every timeout): the
        job's end then records that trial ``crashed``.
        """
        deadline = time.monotonic() + 2 * self.options.trial_timeout_s + self.options.lease_s

        def busy(session: Session) -> int:
            queue.reap_lost_trials(session, job_id)
            return queue.co_workers(session, job_id, self.name) + queue.running_trials(session, job_id)

        while not lost.is_set() and time.monotonic() < deadline:
            if self.db.transact(busy, what=f"job {job_id}: waiting for its co-workers", patience=self.patience) == 0:
                return
            lost.wait(min(1.0, self.options.poll_s))

    def versions(self) -> dict[str, str | None]:
        """Software versions recorded with every trial and tuned config (a replay records the table's)."""
        if self._versions is None:
            if self.backend_is_replay:
                self._versions = dict(self.tables[0].versions) or {"jax": "replay", "jaxlib": "replay", "libtpu": None}
            else:
                self._versions = software_versions(self.backend)
        return self._versions

    @property
    def backend_is_replay(self) -> bool:
        return self.options.backend == "replay"

    # ------------------------------------------------------------ measuring

    def measurer(self, workload: Workload) -> ReplayMeasurer | Supervisor:
        """The measurer of one job: a supervised child on this machine's device, or the replay of a
        recorded table; either abandons the trial in flight when the worker stops at once."""
        options = self.options
        if self.backend_is_replay:
            return ReplayMeasurer(self._table_for(workload), options.replay_sleep, self._abort)
        return Supervisor(workload, workload.backend, options.measure, options.trial_timeout_s, abort=self._abort)

    def _table_for(self, workload: Workload) -> RecordedTable:
        for table in self.tables:
            t = table.workload
            if (t.dtype, t.head_dim, t.pattern.pattern_hash, t.kernel_version) == (
                workload.dtype,
                workload.head_dim,
                workload.pattern.pattern_hash,
                workload.kernel_version,
            ):
                return table
        raise ValueError(f"no replay table matches workload {workload.key} ({workload.pattern.describe()})")
