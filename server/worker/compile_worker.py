"""``tiletune worker --compile-only``: compile the candidate configs of queued TPU jobs ahead of the TPU workers.

A compile worker needs no TPU: libtpu's compile-only targets (:mod:`kernel.tpu_targets`)
run the real XLA:TPU + Mosaic compile on any CPU host. It loops over the queued and
running jobs of TPU workloads (highest priority first) and, per job, compiles the valid
configs of its ``tpu`` space in the order the search will ask for them
(:func:`autotune.compile_pool.compile_order`: the kernel's heuristic and the database's
warm starts first, then outwards from them), ``processes`` at a time in supervised
child processes (:class:`autotune.compile_pool.CompilePool`). Each verdict is stored
as a trial of the workload (:mod:`server.store.compiles`), keyed by the compiler's
versions; a TPU worker of the same versions treats a refused config as an invalid
point and never compiles it on the device host.

It never claims the job (the TPU workers do): it only reserves each compile, so
several compile workers share a job without compiling anything twice. It moves to the
next job when a job ends or its configs all have verdicts.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from typing import Any

from sqlalchemy.orm import Session

from autotune.compile_pool import CompilePool, compile_order
from autotune.space import SearchSpace
from autotune.versions import software_versions
from kernel.config import TileConfig
from kernel.heuristic import heuristic_config
from kernel.tpu_compile import CompileOutcome
from kernel.tpu_targets import TARGETS, require_libtpu
from kernel.workload import Workload
from server.store import compiles, workloads
from server.store.db import Database
from server.store.outage import OutageWait, Patience, is_outage
from server.worker.tune import warm_start_configs
from server.worker.worker import worker_name

log = logging.getLogger("tiletune.worker")

#: A compile's reservation and verdict wait out a database outage as long as the compile worker runs,
#: then (asked to stop) this long since the first try; a verdict dropped lets its reservation go stale.
RECORD_PATIENCE_S = 60.0


@dataclasses.dataclass
class CompileWorkerOptions:
    database_url: str
    processes: int = 1  # compiling processes (one per core is the most a host gains)
    compile_timeout_s: float = 300.0  # a compile that takes longer is recorded uncompilable (timeout)
    poll_s: float = 5.0
    exit_when_idle: bool = False  # stop when no TPU job has a config left to compile
    max_configs: int | None = None  # per job: this worker stores at most this many verdicts (None: the space)
    stale_after_s: float = 900.0  # a reservation older than this belongs to a dead worker
    name: str | None = None


@dataclasses.dataclass
class CompiledJob:
    job_id: int
    workload_key: str
    compiled: int = 0  # verdicts this worker stored (ok or refused)
    refused: int = 0
    seconds: float = 0.0  # wall time spent on the job


class CompileWorker:
    """One compile worker process (see the module docstring)."""

    def __init__(self, options: CompileWorkerOptions, on_event: Callable[[str, dict[str, Any]], None] | None = None):
        require_libtpu()
        self.options = options
        self.name = options.name or worker_name()
        self.host = socket.gethostname()
        self.on_event = on_event or (lambda _kind, _data: None)
        self.db = Database(options.database_url)
        self.versions = software_versions("tpu")
        self._stop = threading.Event()
        self._verdicts: dict[int, int] = {}  # job id -> verdicts this worker stored
        # job id -> its configs in compile order, built once: the run loop revisits every active job
        # each poll, and ordering a preset's space estimates every config of it.
        self._orders: dict[int, list[TileConfig]] = {}

    def request_stop(self) -> None:
        """Stop after the compiles in flight (their verdicts are kept)."""
        self._stop.set()

    def close(self) -> None:
        self.db.dispose()

    def run(self) -> list[CompiledJob]:
        """Compile for TPU jobs until stopped (or, ``exit_when_idle``, until none has work left)."""
        done: list[CompiledJob] = []
        self.on_event("started", {"worker": self.name, "role": "compile", "versions": self.versions})
        outage = OutageWait(f"compile worker {self.name}", self.options.poll_s)
        while not self._stop.is_set():
            try:
                worked = self._visit_jobs(done)
            except Exception as exc:
                if not is_outage(exc):
                    raise
                # Reservations left in flight go stale (stale_after_s) and are compiled again.
                self._stop.wait(outage.failed(exc))
                continue
            outage.succeeded()
            if not worked:
                if self.options.exit_when_idle:
                    break
                self._stop.wait(self.options.poll_s)
        self.on_event("stopped", {"worker": self.name, "jobs": len(done)})
        return done

    def _visit_jobs(self, done: list[CompiledJob]) -> bool:
        """One pass over the active TPU jobs; whether any verdict was stored."""
        worked = False
        with self.db.read_sessions() as session:
            jobs = [(job_id, row.id, workloads.workload_of(row)) for job_id, row in compiles.tpu_jobs(session)]
        for job_id, workload_id, workload in jobs:
            if self._stop.is_set():
                break
            if workload.device_kind not in TARGETS:
                continue  # a TPU generation this libtpu has no target for
            outcome = self.compile_job(job_id, workload_id, workload)
            if outcome.compiled:
                worked = True
                done.append(outcome)
                self.on_event("job_compiled", dataclasses.asdict(outcome))
        return worked

    def plan(self, workload_id: int, workload: Workload, job_id: int) -> list[TileConfig]:
        """The job's configs still without a verdict for these versions, in compile order."""
        with self.db.read_sessions() as session:
            if job_id not in self._orders:
                first = [heuristic_config(workload.pattern, "tpu", workload.dtype)]
                first += warm_start_configs(session, workload_id, workload)
                self._orders[job_id] = compile_order(SearchSpace(workload, "tpu"), first, seed=job_id)
            known = compiles.compile_verdicts(session, workload_id, self.versions)
        order = [c for c in self._orders[job_id] if c.key not in known]
        if self.options.max_configs is None:
            return order
        return order[: max(0, self.options.max_configs - self._verdicts.get(job_id, 0))]

    def compile_job(self, job_id: int, workload_id: int, workload: Workload) -> CompiledJob:
        """Compile the job's configs, ``processes`` in flight, until done or the job ends."""
        start = time.monotonic()
        outcome = CompiledJob(job_id, workload.key)
        configs = self.plan(workload_id, workload, job_id)
        if not configs:
            return outcome
        inflight: dict[Future[CompileOutcome], tuple[int, TileConfig]] = {}
        with CompilePool(workload, self.options.processes, self.options.compile_timeout_s) as pool:
            pending = iter(configs)
            exhausted = False
            while True:
                while not exhausted and not self._stop.is_set() and len(inflight) < self.options.processes:
                    config = next(pending, None)
                    if config is None:
                        exhausted = True
                        break
                    active, trial_id = self.db.transact(
                        functools.partial(self._reserve, job_id=job_id, workload_id=workload_id, config=config),
                        what=f"job {job_id}: reserving a compile",
                        patience=self.patience,
                    )
                    if not active:
                        exhausted = True
                        break
                    if trial_id is not None:
                        inflight[pool.submit(config)] = (trial_id, config)
                if not inflight:
                    break
                finished, _ = wait(list(inflight), return_when="FIRST_COMPLETED")
                for future in finished:
                    trial_id, config = inflight.pop(future)
                    if future.exception() is not None:  # no compiling process could start: give all back
                        with self.db.transaction() as session:
                            for tid in [trial_id, *(t for t, _ in inflight.values())]:
                                compiles.release_compile(session, tid, self.name)
                        raise RuntimeError(f"compiling for {workload.device_kind} failed: {future.exception()}")
                    verdict = future.result()

                    if self._record(job_id, trial_id, verdict):
                        outcome.compiled += 1
                        outcome.refused += not verdict.ok
                        self._verdicts[job_id] = self._verdicts.get(job_id, 0) + 1
                    self.on_event(
                        "compiled",
                        {
                            "job_id": job_id,
                            "config": config.describe(),
                            "ok": verdict.ok,
                            "compile_s": round(verdict.compile_s, 3),
                            "error": verdict.error,
                        },
                    )
        outcome.seconds = time.monotonic() - start
        return outcome

    @property
    def patience(self) -> Patience:
        """A reservation or verdict waits out an outage as long as this worker runs (compiles in flight
        would be lost with the pool), then :data:`RECORD_PATIENCE_S`."""
        return Patience(RECORD_PATIENCE_S, until=self._stop)

    def _reserve(self, session: Session, job_id: int, workload_id: int, config: TileConfig) -> tuple[bool, int | None]:
        """Whether the job is still active, and the compile trial reserved for ``config`` (None: another
        worker's reservation or a verdict is there)."""
        if not compiles.job_active(session, job_id):
            return False, None
        trial_id = compiles.reserve_compile(
            session,
            workload_id,
            config.to_dict(),
            self.versions,
            worker=self.name,
            host=self.host,
            stale_after_s=self.options.stale_after_s,
        )
        return True, trial_id

    def _record(self, job_id: int, trial_id: int, verdict: CompileOutcome) -> bool:
        """Keep ``verdict`` as the compile trial's outcome (False: the reservation is no longer ours).
        A verdict costs a compile: an outage is waited out (:attr:`patience`)."""
        return self.db.transact(
            lambda session: compiles.record_compile(session, trial_id, self.name, verdict),
            what=f"job {job_id}: recording a compile",
            patience=self.patience,
        )
