"""A supervised measuring process: crashes and hangs become trials, not outages.

The child process owns the device and a :class:`~autotune.measure.WorkloadBench`
for the whole study (inputs, reference and compiled executables are kept
between trials). The parent sends one request at a time and waits at most
``trial_timeout_s``: a child that dies (segfault, abort, SIGKILL, OOM killer) is
recorded as ``crashed``, one that does not answer in time is killed and recorded
as ``timeout``; either way a fresh child is started and the search goes on.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
import traceback
from typing import Any

from autotune.measure import Measurement, MeasureOptions
from kernel.config import TileConfig
from kernel.workload import Workload


def _child_main(
    conn: Any, workload: dict[str, Any], backend: str, options: dict[str, Any], inject: dict[str, str]
) -> None:
    from autotune.measure import MeasureOptions as Options
    from autotune.measure import WorkloadBench

    try:
        bench = WorkloadBench(Workload.from_dict(workload), backend, Options(**options), inject)
    except Exception:
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ready", None))
    while True:
        try:
            op, payload = conn.recv()
        except EOFError:
            return
        try:
            if op == "measure":
                config, prune = payload
                result: Any = bench.measure(TileConfig.from_dict(config), prune).to_dict()
            elif op == "retime":
                config, runs = payload
                result = bench.retime(TileConfig.from_dict(config), runs)
            elif op == "anchor":
                anchor, runs, config = payload
                result = bench.anchor_runs(anchor, runs, TileConfig.from_dict(config) if config else None)
            elif op == "stop":
                return
            else:
                raise ValueError(f"unknown op {op!r}")
            conn.send(("ok", result))
        except Exception:
            conn.send(("error", traceback.format_exc()))


class ChildCrashedError(RuntimeError):
    pass


class MeasurementAborted(Exception):  # noqa: N818  (not an error: the caller asked for it)
    """The measurement in flight was abandoned on request (``abort`` was set); the child is gone."""


class Supervisor:
    """Runs measurements in a child process; restarts it after a crash or a hang."""

    def __init__(
        self,
        workload: Workload,
        backend: str,
        options: MeasureOptions | None = None,
        trial_timeout_s: float = 300.0,
        startup_timeout_s: float = 300.0,
        inject: dict[str, str] | None = None,
        abort: threading.Event | None = None,
    ) -> None:
        """``abort``: when set, the call in flight is abandoned (the child is killed) and
        raises :class:`MeasurementAborted`; a later call starts a fresh child."""
        self.workload = workload
        self.backend = backend
        self.options = options or MeasureOptions()
        self.trial_timeout_s = trial_timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.inject = inject or {}
        self.abort = abort
        self.restarts = 0
        self._ctx = mp.get_context("spawn")  # a fresh interpreter: no inherited JAX/XLA state
        self._proc: Any = None
        self._conn: Any = None

    def __enter__(self) -> Supervisor:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        import dataclasses

        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(
            target=_child_main,
            args=(child, self.workload.canonical(), self.backend, dataclasses.asdict(self.options), self.inject),
            daemon=True,
        )
        self._proc.start()
        child.close()
        self._conn = parent
        status, payload = self._receive(self.startup_timeout_s, "starting the measuring process")
        if status != "ready":
            self.close()
            raise RuntimeError(f"measuring process failed to start:\n{payload}")

    def close(self) -> None:
        if self._proc is None:
            return
        try:
            if self._proc.is_alive():
                self._conn.send(("stop", None))
                self._proc.join(5)
        except (OSError, EOFError, BrokenPipeError):
            pass
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        self._conn.close()
        self._proc = None

    def _restart(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()
        if self._proc is not None:
            self._proc.join(5)
            self._conn.close()
            self._proc = None
        self.restarts += 1
        self.start()

    def _receive(self, timeout_s: float, what: str) -> tuple[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            if self._conn.poll(0.05):
                try:
                    return self._conn.recv()
                except (EOFError, OSError):
                    raise ChildCrashedError(self._exit_text()) from None
            if not self._proc.is_alive():
                # Drain a reply that raced the exit.
                if self._conn.poll(0):
                    try:
                        return self._conn.recv()
                    except (EOFError, OSError):
                        pass
                raise ChildCrashedError(self._exit_text())
            if time.monotonic() > deadline:
                raise TimeoutError(f"no answer after {timeout_s:g} s while {what}")
            if self.abort is not None and self.abort.is_set():
                self._proc.kill()
                self._proc.join(5)
                self._conn.close()
                self._proc = None
                raise MeasurementAborted(f"abandoned while {what}")

    def _exit_text(self) -> str:
        self._proc.join(1)
        code = self._proc.exitcode
        if code is not None and code < 0:
            import signal

            try:
                return f"measuring process killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"measuring process killed by signal {-code}"
        return f"measuring process exited with code {code}"

    def _call(self, op: str, payload: Any, what: str) -> Any:
        if self._proc is None:  # aborted earlier: a fresh child
            self.start()
        self._conn.send((op, payload))
        status, result = self._receive(self.trial_timeout_s, what)
        if status == "error":
            raise RuntimeError(result)
        return result

    def measure(self, config: TileConfig, prune_above_ms: float | None = None) -> Measurement:
        """Measure in the child; a crash or a hang is returned as a Measurement."""
        try:
            return Measurement.from_dict(self._call("measure", (config.to_dict(), prune_above_ms), "measuring"))
        except ChildCrashedError as exc:
            self._restart()
            return Measurement("crashed", error=str(exc))
        except TimeoutError as exc:
            self._restart()
            return Measurement("timeout", error=str(exc))
        except RuntimeError as exc:  # an unexpected exception inside the child: data, not a stop
            return Measurement("failed", error="measuring error: " + str(exc).strip().splitlines()[-1])

    def retime(self, config: TileConfig, runs: int) -> list[float]:
        try:
            return list(self._call("retime", (config.to_dict(), runs), "re-timing"))
        except (ChildCrashedError, TimeoutError):
            self._restart()
            return []

    def anchor_runs(self, anchor: str, runs: int, config: TileConfig | None = None) -> list[float]:
        """Runs of an anchor (see :meth:`autotune.measure.WorkloadBench.anchor_runs`); [] after a crash or hang."""
        payload = (anchor, runs, config.to_dict() if config else None)
        try:
            return list(self._call("anchor", payload, f"timing the {anchor} anchor"))
        except (ChildCrashedError, TimeoutError):
            self._restart()
            return []
