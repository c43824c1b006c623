"""The database side of one worker's search on one job: reservations, results, its Optuna study.

:class:`JobCoordinator` is the :class:`~autotune.search.Coordinator` the search
asks before and after every measurement: each trial is reserved in the job's
trial rows first (so the workers of one job never measure the same params and
together stay within its budget), and recorded when measured. The job's Optuna
study lives in the same database (:func:`optuna_storage`), shared by its workers.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import optuna
from optuna.trial import TrialState
from sqlalchemy.orm import Session

from autotune.measure import Measurement
from autotune.search import TrialResult
from kernel.config import TileConfig
from server.store import models, queue
from server.store.db import Database, configure_sqlite, normalize_url
from server.store.migrate import schema_lock
from server.store.outage import Patience, is_outage, ride_out

T = TypeVar("T")


def study_name(job: models.Job) -> str:
    """The Optuna study of a job: its id and creation time (ids restart when tables are emptied)."""
    return f"tiletune-job-{job.id}-{job.created_at:%Y%m%dT%H%M%S%f}"


#: The methods of Optuna's RDB storage that run statements, as its cached front (the study's storage)
#: and tiletune call them: each rides out a short outage (:class:`OutageTolerantStorage`).
STORAGE_CALLS = (
    "create_new_study",
    "get_study_id_from_name",
    "get_study_name_from_id",
    "get_study_directions",
    "get_study_user_attrs",
    "get_study_system_attrs",
    "set_study_user_attr",
    "set_study_system_attr",
    "get_all_studies",
    "_create_new_trial",
    "_set_trial_param",
    "get_trial_param",
    "set_trial_state_values",
    "set_trial_intermediate_value",
    "set_trial_user_attr",
    "set_trial_system_attr",
    "get_trial_id_from_study_id_trial_number",
    "get_trial",
    "_get_trials",
    "_get_best_trial_id",
)


class OutageTolerantStorage(optuna.storages.RDBStorage):
    """Optuna's RDB storage whose statement-running calls each ride out a database outage as long
    as its ``patience`` says (:func:`~server.store.outage.ride_out`), as the worker's own units of
    work do: without it a PostgreSQL restart that met one of the sampler's reads or a ``tell``
    would cost the worker its part of the job. Optuna rolls a failed call back whole, so calling
    it again is safe (but for the rare commit whose answer the outage took)."""

    patience: Patience | float = 30.0  # ride_out takes either

    def set_trial_state_values(self, trial_id: int, state: TrialState, values: Sequence[float] | None = None) -> bool:
        """Optuna's, riding out an outage; a retry that finds the trial already finished with this very
        state and these values is the first try's commit, whose answer the outage took, and succeeds
        (a ``tell`` must not fail the job's attempt with ``UpdateFinishedTrialError`` for it)."""
        method = optuna.storages.RDBStorage.set_trial_state_values
        met_outage = False

        def attempt() -> bool:
            nonlocal met_outage
            try:
                return method(self, trial_id, state, values)
            except optuna.exceptions.UpdateFinishedTrialError:
                if met_outage and self._finished_so(trial_id, state, values):
                    return True
                raise
            except Exception as exc:
                met_outage = met_outage or is_outage(exc)
                raise

        return ride_out(attempt, what="the job's study: set_trial_state_values", patience=self.patience)

    def _finished_so(self, trial_id: int, state: TrialState, values: Sequence[float] | None) -> bool:
        trial = optuna.storages.RDBStorage.get_trial(self, trial_id)
        return trial.state == state and (values is None or list(trial.values or ()) == list(values))


def _tolerant(name: str) -> Callable[..., Any]:
    method = getattr(optuna.storages.RDBStorage, name)

    @functools.wraps(method)
    def call(self: OutageTolerantStorage, *args: Any, **kwargs: Any) -> Any:
        what = f"the job's study: {name}"
        return ride_out(lambda: method(self, *args, **kwargs), what=what, patience=self.patience)

    return call


for _name in STORAGE_CALLS:
    # A name a later Optuna dropped is skipped, not an import error of every worker; the test
    # test_the_tolerant_storage_wraps_every_call_the_study_makes says when the list needs a look.
    if hasattr(optuna.storages.RDBStorage, _name) and _name not in OutageTolerantStorage.__dict__:
        setattr(OutageTolerantStorage, _name, _tolerant(_name))


def optuna_storage(url: str, patience: Patience | float = 30.0) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage on tiletune's database (its tables live beside ours).

    Optuna creates its tables (and stamps its own ``alembic_version``) when they
    are missing, which races when several workers start at once on a fresh
    database: the creation holds the database's schema lock, as migrations do
    (:func:`~server.store.migrate.schema_lock`), so one creates and the others
    find the tables there. On SQLite its connections get tiletune's pragmas with
    a long busy timeout (the server and the worker write the same file) and no
    fsync per commit (Optuna commits every suggested param). Its calls ride out a
    database outage as long as ``patience`` says (seconds, or a :class:`~server.store.outage.Patience`;
    :class:`OutageTolerantStorage`).
    """
    url = normalize_url(url)
    sqlite = url.startswith("sqlite")
    kwargs: dict[str, Any] = {"connect_args": {"timeout": 60}} if sqlite else {"pool_pre_ping": True}
    with schema_lock(url):
        storage = OutageTolerantStorage(url, engine_kwargs=kwargs)
    storage.patience = patience
    if sqlite:
        configure_sqlite(storage.engine, 60000, foreign_keys=False)
        storage.engine.dispose()  # the connection that created the tables had no pragmas
    return storage


def fail_orphaned_trials(storage: optuna.storages.RDBStorage, study: str) -> None:
    """Mark the RUNNING trials of ``study`` FAIL: called when one worker alone holds a resumed
    job, so they belong to workers that died or were killed, and samplers would otherwise
    take their params as in flight forever (the measurements themselves are in tt_trial)."""
    try:
        study_id = storage.get_study_id_from_name(study)
    except KeyError:  # a fresh job: no study yet
        return
    running = storage.get_all_trials(study_id, deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    for trial in running:
        storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)


def trial_result(row: models.Trial) -> TrialResult:
    """A stored ok trial as a TrialResult (``number`` holds the row id, to find it again)."""
    return TrialResult(row.id, TileConfig.from_dict(row.params), measurement_of(row))


def measurement_of(row: models.Trial) -> Measurement:
    """A stored trial's outcome (its median stands for its runs)."""
    runs = (row.median_ms,) if row.median_ms is not None else ()
    return Measurement(row.status, compile_ms=row.compile_ms, runs_ms=runs, max_error=row.max_error, error=row.error)


class JobCoordinator:
    """The :class:`~autotune.search.Coordinator` of one worker on one job, backed by the
    job's trial rows (reservations) and the worker's lease (``lost`` is set when it ends).

    Each of its units of database work rides out a database outage as long as
    ``patience`` says (:func:`~server.store.outage.ride_out`; the worker's: as long
    as it runs): a PostgreSQL restart between two trials costs the search nothing.
    A reservation or record after an outage that outlasted the lease still checks
    that the worker holds the job, so a take-over meanwhile is found (``lost``).
    """

    def __init__(
        self,
        db: Database,
        worker: str,
        job_id: int,
        workload_id: int,
        lost: threading.Event,
        *,
        host: str,
        versions: dict[str, str | None],
        stopping: Callable[[], bool],
        patience: Patience | float = 30.0,
    ) -> None:
        self.db = db
        self.worker = worker
        self.job_id = job_id
        self.workload_id = workload_id
        self.lost = lost
        self.host = host
        self.versions = versions
        self._stopping = stopping
        self.patience = patience
        self.reserved: dict[str, int] = {}  # config key -> trial row id, while measuring
        self.completed = 0

    def _write(self, work: Callable[[Session], T], what: str) -> T:
        return self.db.transact(work, what=f"job {self.job_id}: {what}", patience=self.patience)

    def measured(self) -> dict[str, Measurement]:
        final = [s for s in models.FINAL_TRIAL_STATUSES if s != "invalid"]

        def read(session: Session) -> dict[str, Measurement]:
            return {
                TileConfig.from_dict(r.params).key: measurement_of(r)
                for r in queue.job_trials(session, self.job_id, final)
            }

        return self.db.read(read, what=f"job {self.job_id}: reading the measured trials", patience=self.patience)

    def stopping(self) -> bool:
        return self._stopping() or self.lost.is_set()

    def reserve(self, config: TileConfig, number: int) -> tuple[str, Measurement | None]:
        if self.stopping():
            return "stop", None

        def reserve(session: Session) -> queue.Reservation:
            return queue.reserve_trial(
                session,
                self.job_id,
                self.worker,
                config.to_dict(),
                number=number,
                host=self.host,
                versions=self.versions,
            )

        r = self._write(reserve, "reserving a trial")
        own = r.trial is not None and r.trial.worker == self.worker and config.key not in self.reserved
        if r.verdict == "busy" and own:  # our own reservation, committed by a try whose answer an outage took
            r = queue.Reservation("reserved", r.trial_id)
        if r.verdict == "reserved":
            assert r.trial_id is not None
            self.reserved[config.key] = r.trial_id
            return "go", None
        if r.verdict == "known":
            assert r.trial is not None
            return "known", measurement_of(r.trial)
        if r.verdict == "lost":
            self.lost.set()
            return "stop", None
        return r.verdict, None  # busy | full

    def complete(self, trial: TrialResult) -> bool:
        trial_id = self.reserved.pop(trial.config.key)

        def complete(session: Session) -> bool:
            m = trial.measurement
            return queue.complete_trial(session, trial_id, self.worker, m.status, **m.trial_fields())

        if not self._write(complete, "recording a trial"):
            self.lost.set()
            return False
        self.completed += 1
        return True

    def invalid(self, config: TileConfig, reason: str) -> None:
        def record(session: Session) -> None:
            queue.record_invalid(
                session, self.job_id, self.workload_id, config.to_dict(), reason, host=self.host, worker=self.worker
            )

        self._write(record, "recording an invalid config")

    def abandon(self) -> None:
        """Drop the reservations of trials this worker will not finish."""
        if not self.reserved:
            return

        def drop(session: Session) -> None:
            for trial_id in self.reserved.values():
                queue.abandon_trial(session, trial_id, self.worker)

        self._write(drop, "dropping its reservations")
        self.reserved.clear()
