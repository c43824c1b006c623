"""``tiletune worker``: claims tuning jobs from the database and runs them.

A worker loops: claim a queued job of its own device kind and backend (see
:mod:`server.jobs`), run the search on the job's Optuna study (RDBStorage in
the same database, so the workers of one job share it and a resumed job keeps
its history), store each trial as it finishes, and at the end re-time the top
configs and publish the winner as the workload's tuned config.

- A heartbeat thread extends the lease every ``lease_s / 3``. A heartbeat that
  fails (the job was cancelled, or the worker stalled past its lease and was
  replaced) stops the work: the trial in flight is abandoned.
- Every trial is reserved in the database before it is measured: workers of one
  job never measure the same params, and together they stay within its budget.
  The worker that sees the budget spent first becomes the job's finalizer;
  the others leave the job.
- ``request_stop()`` (the CLI calls it on SIGTERM / SIGINT) finishes the trial in
  flight, then gives the job back; ``request_stop(abandon=True)`` (a second
  signal) kills the measurement in flight at once.
- A job that raises is ``failed`` with the error, and queued again while it has
  attempts left.

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

from autotune.measure import Measurement, MeasureOptions, config_key
from autotune.replay import RecordedTable, ReplayMeasurer
from autotune.search import Measurer, SearchOptions, SearchResult, TrialResult, pick_winner, run_search
from autotune.space import SearchSpace
from autotune.supervisor import MeasurementAborted, Supervisor
from kernel.config import TileConfig
from kernel.workload import Workload

log = logging.getLogger("tiletune.worker")

WORKER_BACKENDS = ("auto", "tpu", "xla", "interpret", "replay")


def worker_name() -> str:
    """host-pid-random: unique per process, readable in lease and trial records."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


def study_name(job: Any) -> str:
    """The Optuna study of a job: its id and creation time (ids restart when tables are emptied)."""
    return f"tiletune-job-{job.id}-{job.created_at:%Y%m%dT%H%M%S%f}"


def optuna_storage(url: str, attempts: int = 5) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage on tiletune's database (its tables live beside ours).

    On SQLite its connections get tiletune's pragmas with a long busy timeout
    (the server and the worker write the same file; Optuna commits every
    suggested param, so an fsync per commit cost 5 ms each). Creating the tables
    races when several workers start at once on a fresh database, so a failed
    first connection is retried.
    """
    from server.db import configure_sqlite, normalize_url

    url = normalize_url(url)
    sqlite = url.startswith("sqlite")
    kwargs: dict[str, Any] = {"connect_args": {"timeout": 60}} if sqlite else {"pool_pre_ping": True}
    for attempt in range(attempts):
        try:
            storage = optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
            if sqlite:
                configure_sqlite(storage.engine, 60000, foreign_keys=False)
                storage.engine.dispose()  # the connection that created the tables had no pragmas
            return storage
        except Exception:
            if attempt == attempts - 1:
                raise
            time.sleep(0.5 + attempt + secrets.randbelow(500) / 1000)
    raise AssertionError("unreachable")


@dataclasses.dataclass
class WorkerOptions:
    database_url: str
    backend: str = "auto"  # auto | tpu | xla | interpret | replay
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
        from server.db import Database

        self.o = options
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
            self._storage = optuna_storage(self.o.database_url)
        return self._storage

    # ------------------------------------------------------------ the loop

    def run(self) -> list[JobOutcome]:
        """Claim and run jobs until stopped, ``max_jobs`` are done, or (``exit_when_idle``) none is left."""
        from server import jobs

        outcomes: list[JobOutcome] = []
        self.on_event("started", {"worker": self.name, "device_kind": self.device_kind, "backend": self.backend})
        while not self._stop.is_set():
            if self.o.max_jobs is not None and len(outcomes) >= self.o.max_jobs:
                break
            with self.db.sessions() as session:
                job = jobs.claim_job(
                    session, self.name, device_kind=self.device_kind, backend=self.backend, lease_s=self.o.lease_s
                )
                claimed = None if job is None else (job.id, job.workload_id, job.budget, job.attempts, study_name(job))
                idle = (
                    claimed is None
                    and self.o.exit_when_idle
                    and not jobs.has_claimable(session, self.name, device_kind=self.device_kind, backend=self.backend)
                )
            if claimed is None:
                if idle:
                    break
                self._stop.wait(self.o.poll_s)
                continue
            outcome = self.run_job(*claimed)
            outcomes.append(outcome)
            self.on_event("job_finished", dataclasses.asdict(outcome))
        self.on_event("stopped", {"worker": self.name, "jobs": len(outcomes)})
        return outcomes

    def run_job(self, job_id: int, workload_id: int, budget: int, attempt: int, study: str) -> JobOutcome:
        """Run the claimed job ``job_id`` to its end (or this worker's part of it)."""
        from server import jobs, models, store

        with self.db.sessions() as session:
            row = session.get(models.Workload, workload_id)
            assert row is not None
            workload = store.workload_of(row)
            seeds = [TileConfig.from_dict(t.config) for t in [store.current_config(session, workload_id)] if t]
            near = store.nearest(session, workload, 16)  # warm start from the closest tuned workload
            if near is not None:
                seeds.append(TileConfig.from_dict(near[0]["config"]))
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
        coordinator = JobCoordinator(self, job_id, workload_id, lost)
        try:
            with self._measurer(workload) as measurer:
                result = self._search(job_id, study, workload, measurer, coordinator, seeds)
                if lost.is_set():
                    return JobOutcome(job_id, workload.key, "lost", len(result.trials))
                if self._stop.is_set():
                    with self.db.sessions() as session:
                        jobs.release_job(session, job_id, self.name)
                    return JobOutcome(job_id, workload.key, "released", len(result.trials))
                return self._finish(job_id, workload, measurer, result, lost)
        except MeasurementAborted:
            coordinator.abandon()
            if lost.is_set():
                return JobOutcome(job_id, workload.key, "lost", coordinator.completed)
            with self.db.sessions() as session:
                jobs.release_job(session, job_id, self.name)
            return JobOutcome(job_id, workload.key, "released", coordinator.completed)
        except Exception as exc:
            coordinator.abandon()
            error = f"{type(exc).__name__}: {exc}"
            log.error("job %s failed on %s:\n%s", job_id, self.name, traceback.format_exc())
            with self.db.sessions() as session:
                jobs.finish_job(session, job_id, self.name, "failed", error[:4000])
            return JobOutcome(job_id, workload.key, "failed", coordinator.completed, error=error)
        finally:
            finished.set()
            beat.join(5)

    def _heartbeat(self, job_id: int, lost: threading.Event, finished: threading.Event) -> None:
        from server import jobs

        interval = max(0.2, self.o.lease_s / 3)
        while not finished.wait(interval):
            try:
                with self.db.sessions() as session:
                    held = jobs.heartbeat(session, job_id, self.name, self.o.lease_s)
            except Exception as exc:  # the database is briefly away: the lease has slack, try again
                log.warning("heartbeat of job %s failed: %s", job_id, exc)
                continue
            if not held:
                log.warning("job %s is no longer held by %s (cancelled or taken over): stopping", job_id, self.name)
                lost.set()
                self._abort.set()  # abandon the trial in flight
                return

    def _search(
        self,
        job_id: int,
        study: str,
        workload: Workload,
        measurer: Measurer,
        coordinator: JobCoordinator,
        seeds: Sequence[TileConfig],
    ) -> SearchResult:
        space = SearchSpace(workload, workload.backend)
        # Co-workers of one job sample with different seeds, or they would propose alike.
        seed = (self.o.search.seed + zlib.crc32(self.name.encode())) % (2**31)
        options = dataclasses.replace(self.o.search, seed=seed, seed_configs=(*self.o.search.seed_configs, *seeds))

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

        self._fail_orphaned_trials(job_id, study)
        return run_search(
            space,
            measurer,
            options,
            storage=self.storage(),
            study_name=study,
            coordinator=coordinator,
            on_trial=progress,
            finalize=False,
        )

    def _fail_orphaned_trials(self, job_id: int, study: str) -> None:
        """When this worker alone holds a resumed job, trials left RUNNING in its study belong
        to workers that died or were killed: mark them FAIL, or samplers would take their
        params as in flight forever (the measurements themselves are in tt_trial)."""
        from server import jobs

        with self.db.sessions() as session:
            holders = jobs.job_progress(session, [job_id])[job_id].workers
        if list(holders) != [self.name]:
            return
        storage = self.storage()
        try:
            study_id = storage.get_study_id_from_name(study)
        except KeyError:  # a fresh job: no study yet
            return
        running = storage.get_all_trials(study_id, deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        for trial in running:
            storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)

    def _finish(
        self, job_id: int, workload: Workload, measurer: Measurer, result: SearchResult, lost: threading.Event
    ) -> JobOutcome:
        """The budget is spent: the first worker here re-times the finalists and publishes; the others leave."""
        from server import jobs, models, store

        mine = len(result.trials)
        with self.db.sessions() as session:
            if not jobs.begin_finalize(session, job_id, self.name):
                jobs.leave_job(session, job_id, self.name)
                return JobOutcome(job_id, workload.key, "left", mine)
        self._wait_for_co_workers(job_id, lost)
        if lost.is_set():
            return JobOutcome(job_id, workload.key, "lost", mine)
        with self.db.sessions() as session:
            rows = jobs.job_trials(session, job_id, ("ok",))
            everyone = SearchResult(trials=[_trial_result(r) for r in rows], best=None)
        pick_winner(everyone, measurer, self.o.search)
        if everyone.best is None or everyone.best_median_ms is None:
            with self.db.sessions() as session:
                jobs.finish_job(session, job_id, self.name, "failed", "no config measured ok")
            return JobOutcome(job_id, workload.key, "failed", mine, error="no config measured ok")
        from autotune.tune import publish_winner

        everyone.dense_ms = measurer.dense_ms()
        with self.db.sessions() as session:
            row = store.find_workload(session, workload.key)
            assert row is not None
            best_row = session.get(models.Trial, everyone.best.number)  # _trial_result keeps the row id there
            tuned_id = publish_winner(session, row, everyone, self.versions(), best_row)
            jobs.finish_job(session, job_id, self.name, "done")
        self.on_event(
            "tuned",
            {"job_id": job_id, "workload_key": workload.key, "config": everyone.best.config.describe(),
             "median_ms": everyone.best_median_ms, "dense_ms": everyone.dense_ms, "tuned_config_id": tuned_id},
        )  # fmt: skip
        return JobOutcome(job_id, workload.key, "done", mine, tuned_id)

    def _wait_for_co_workers(self, job_id: int, lost: threading.Event) -> None:
        """Until no trial of the job is in flight (trials of workers that died are reaped)."""
        from server import jobs

        deadline = time.monotonic() + 2 * self.o.trial_timeout_s + self.o.lease_s
        while not lost.is_set() and time.monotonic() < deadline:
            with self.db.sessions() as session:
                jobs.reap_lost_trials(session, job_id)
                if jobs.running_trials(session, job_id) == 0:
                    return
            lost.wait(min(1.0, self.o.poll_s))

    def versions(self) -> dict[str, str | None]:
        """Software versions recorded with every trial and tuned config (a replay records the table's)."""
        if self._versions is None:
            if self.backend_is_replay:
                self._versions = dict(self.tables[0].versions) or {"jax": "replay", "jaxlib": "replay", "libtpu": None}
            else:
                from autotune.tune import software_versions

                self._versions = software_versions()
        return self._versions

    @property
    def backend_is_replay(self) -> bool:
        return self.o.backend == "replay"

    # ------------------------------------------------------------ measuring

    def _measurer(self, workload: Workload) -> Any:
        if self.backend_is_replay:
            return _ReplayContext(self._table_for(workload), self.o.replay_sleep, self._abort)
        return Supervisor(workload, workload.backend, self.o.measure, self.o.trial_timeout_s, abort=self._abort)

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


class _ReplayContext:
    """A ReplayMeasurer whose sleeps end early when the worker abandons the trial."""

    def __init__(self, table: RecordedTable, sleep: float, abort: threading.Event) -> None:
        self.inner = ReplayMeasurer(table, sleep=False)
        self.sleep = sleep
        self.abort = abort

    def __enter__(self) -> _ReplayContext:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def measure(self, config: TileConfig, prune_above_ms: float | None = None) -> Measurement:
        m = self.inner.measure(config, prune_above_ms)
        if self.sleep > 0 and self.abort.wait(self.sleep * ((m.compile_ms or 0.0) + sum(m.runs_ms)) / 1e3):
            raise MeasurementAborted("abandoned while replaying")
        return m

    def retime(self, config: TileConfig, runs: int) -> list[float]:
        return self.inner.retime(config, runs)

    def dense_ms(self, repeats: int = 5) -> float | None:
        return self.inner.dense_ms(repeats)


def _trial_result(row: Any) -> TrialResult:
    """A stored ok trial as a TrialResult (``number`` holds the row id, to find it again)."""
    return TrialResult(row.id, TileConfig.from_dict(row.params), _measurement(row))


def _measurement(row: Any) -> Measurement:
    """A stored trial's outcome (its median stands for its runs)."""
    runs = (row.median_ms,) if row.median_ms is not None else ()
    return Measurement(row.status, compile_ms=row.compile_ms, runs_ms=runs, max_error=row.max_error, error=row.error)


class JobCoordinator:
    """The :class:`~autotune.search.Coordinator` of one worker on one job, backed by
    the job's trial rows (reservations) and the worker's lease."""

    def __init__(self, worker: Worker, job_id: int, workload_id: int, lost: threading.Event) -> None:
        self.w = worker
        self.job_id = job_id
        self.workload_id = workload_id
        self.lost = lost
        self.reserved: dict[str, int] = {}  # config key -> trial row id, while measuring
        self.completed = 0

    def measured(self) -> dict[str, Measurement]:
        from server import jobs, models

        with self.w.db.sessions() as session:
            rows = jobs.job_trials(session, self.job_id, [s for s in models.FINAL_TRIAL_STATUSES if s != "invalid"])
            return {config_key(TileConfig.from_dict(r.params)): _measurement(r) for r in rows}

    def stopping(self) -> bool:
        return self.w.stopping or self.lost.is_set()

    def reserve(self, config: TileConfig, number: int) -> tuple[str, Measurement | None]:
        from server import jobs

        if self.stopping():
            return "stop", None
        with self.w.db.sessions() as session:
            r = jobs.reserve_trial(
                session,
                self.job_id,
                self.w.name,
                config.to_dict(),
                number=number,
                host=self.w.host,
                versions=self.w.versions(),
            )
            if r.verdict == "reserved":
                assert r.trial_id is not None
                self.reserved[config_key(config)] = r.trial_id
                return "go", None
            if r.verdict == "known":
                assert r.trial is not None
                return "known", _measurement(r.trial)
            if r.verdict == "lost":
                self.lost.set()
                return "stop", None
            return r.verdict, None  # busy | full

    def complete(self, trial: TrialResult) -> bool:
        from server import jobs

        trial_id = self.reserved.pop(config_key(trial.config))
        with self.w.db.sessions() as session:
            kept = jobs.complete_trial(
                session, trial_id, self.w.name, trial.measurement.status, **trial.measurement.trial_fields()
            )
        if not kept:
            self.lost.set()
            return False
        self.completed += 1
        return True

    def invalid(self, config: TileConfig, reason: str) -> None:
        from server import jobs

        with self.w.db.sessions() as session:
            jobs.record_invalid(
                session, self.job_id, self.workload_id, config.to_dict(), reason, host=self.w.host, worker=self.w.name
            )

    def abandon(self) -> None:
        """Drop the reservations of trials this worker will not finish."""
        from server import jobs

        if not self.reserved:
            return
        with self.w.db.sessions() as session:
            for trial_id in self.reserved.values():
                jobs.abandon_trial(session, trial_id, self.w.name)
        self.reserved.clear()
