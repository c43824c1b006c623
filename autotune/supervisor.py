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
import os
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, Self

from autotune.measure import Measurement, MeasureOptions
from kernel.config import TileConfig
from kernel.workload import Workload


def serve_requests(conn: Any, setup: Callable[[], Callable[[str, Any], Any]]) -> None:
    """The child side of :class:`SupervisedChild`: ``setup()`` builds the request handler (its
    failure is sent as the start-up error), then every ``(op, payload)`` is answered with
    ``("ok", handler(op, payload))`` or ``("error", traceback)`` until ``stop`` or a closed pipe."""
    try:
        handle = setup()
    except Exception:
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ready", None))
    while True:
        try:
            op, payload = conn.recv()
        except EOFError:
            return
        if op == "stop":
            return
        try:
            conn.send(("ok", handle(op, payload)))
        except Exception:
            conn.send(("error", traceback.format_exc()))


def _jax_platforms() -> str | None:
    """JAX's ``jax_platforms`` setting (None: every platform it finds), a config attribute mypy cannot see."""
    import jax

    value: str | None = jax.config.jax_platforms  # type: ignore[attr-defined]
    return value


def _child_main(
    conn: Any, workload: dict[str, Any], backend: str, options: dict[str, Any], inject: dict[str, str]
) -> None:
    from autotune.device import CPU_DEVICE_KIND
    from autotune.measure import CPU_BACKENDS, WorkloadBench, pin_one_core
    from autotune.measure import MeasureOptions as Options

    def setup() -> Callable[[str, Any], Any]:
        import jax

        if workload.get("device_kind") == CPU_DEVICE_KIND and _jax_platforms() is None:
            # Measuring on this machine's CPU needs no other platform. Left to probe them all, JAX
            # starts libtpu (the `tpu` extra) on a machine without a TPU, which falls back to the CPU
            # but prints an INVALID_ARGUMENT error about TPU hostnames a few seconds later.
            jax.config.update("jax_platforms", "cpu")
        if backend in CPU_BACKENDS and options.get("one_core", True):
            pin_one_core(options.get("core"))  # before the bench below makes JAX create its CPU client
        bench = WorkloadBench(Workload.from_dict(workload), backend, Options(**options), inject)

        def handle(op: str, payload: Any) -> Any:
            if op == "measure":
                config, prune = payload
                return bench.measure(TileConfig.from_dict(config), prune).to_dict()
            if op == "retime":
                config, runs = payload
                return bench.retime(TileConfig.from_dict(config), runs)
            if op == "prefetch":
                return bench.prefetch(TileConfig.from_dict(payload))
            if op == "clock":
                return {
                    "clock": bench.clock,
                    "cores": sorted(os.sched_getaffinity(0)),
                    "platforms": _jax_platforms(),
                }
            if op == "anchor":
                anchor, runs, config = payload
                return bench.anchor_runs(anchor, runs, TileConfig.from_dict(config) if config else None)
            raise ValueError(f"unknown op {op!r}")

        return handle

    serve_requests(conn, setup)


class ChildCrashedError(RuntimeError):
    pass


class MeasurementAborted(Exception):  # noqa: N818  (not an error: the caller asked for it)
    """The measurement in flight was abandoned on request (``abort`` was set); the child is gone."""


class SupervisedChild:
    """One spawned child process that answers ``(op, payload)`` requests one at a time.

    ``target(conn, *args)`` runs in the child: it sends ``("ready", None)`` (or
    ``("error", text)``) once set up, then answers each request with ``("ok", result)``
    or ``("error", text)`` until it gets ``("stop", None)``. The parent waits at most
    ``call_timeout_s`` per request; a child that dies raises :class:`ChildCrashedError`,
    one that does not answer :class:`TimeoutError`, and either is replaced by a fresh
    child (``restart``). ``abort``, when set, abandons the call in flight.
    """

    role = "child process"

    def __init__(
        self,
        target: Any,
        args: tuple[Any, ...],
        *,
        call_timeout_s: float,
        startup_timeout_s: float,
        abort: threading.Event | None = None,
    ) -> None:
        self._target = target
        self._args = args
        self.call_timeout_s = call_timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.abort = abort
        self.restarts = 0
        self._ctx = mp.get_context("spawn")  # a fresh interpreter: no inherited JAX/XLA state
        self._proc: Any = None
        self._conn: Any = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=self._target, args=(child, *self._args), daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent
        status, payload = self._receive(self.startup_timeout_s, f"starting the {self.role}")
        if status != "ready":
            self.close()
            raise RuntimeError(f"{self.role} failed to start:\n{payload}")

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

    def restart(self) -> None:
        """Kill the child (if alive) and start a fresh one."""
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
                return f"{self.role} killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"{self.role} killed by signal {-code}"
        return f"{self.role} exited with code {code}"

    def call(self, op: str, payload: Any, what: str) -> Any:
        """Send one request and return its result; RuntimeError carries the child's traceback."""
        if self._proc is None:  # aborted earlier: a fresh child
            self.start()
        self._conn.send((op, payload))
        status, result = self._receive(self.call_timeout_s, what)
        if status == "error":
            raise RuntimeError(result)
        return result


class Supervisor(SupervisedChild):
    """Runs measurements in a child process; restarts it after a crash or a hang."""

    role = "measuring process"

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
        import dataclasses

        self.workload = workload
        self.backend = backend
        self.options = options or MeasureOptions()
        self.inject = inject or {}
        super().__init__(
            _child_main,
            (workload.canonical(), backend, dataclasses.asdict(self.options), self.inject),
            call_timeout_s=trial_timeout_s,
            startup_timeout_s=startup_timeout_s,
            abort=abort,
        )

    @property
    def trial_timeout_s(self) -> float:
        return self.call_timeout_s

    def measure(self, config: TileConfig, prune_above_ms: float | None = None) -> Measurement:
        """Measure in the child; a crash or a hang is returned as a Measurement."""
        try:
            return Measurement.from_dict(self.call("measure", (config.to_dict(), prune_above_ms), "measuring"))
        except ChildCrashedError as exc:
            self.restart()
            return Measurement("crashed", error=str(exc))
        except TimeoutError as exc:
            self.restart()
            return Measurement("timeout", error=str(exc))
        except RuntimeError as exc:  # an unexpected exception inside the child: data, not a stop
            return Measurement("failed", error="measuring error: " + str(exc).strip().splitlines()[-1])

    def clock(self) -> dict[str, Any]:
        """How the child times runs: ``{"clock": "cpu" | "wall", "cores": [the cores it may run on],
        "platforms": the JAX platforms it may use (None: all)}`` (:func:`autotune.measure.clock_for`)."""
        result: dict[str, Any] = self.call("clock", None, "asking for the clock")
        return result

    def prefetch(self, config: TileConfig) -> None:
        """Have the child start compiling ``config`` (see :meth:`autotune.measure.WorkloadBench.prefetch`)."""
        try:
            self.call("prefetch", config.to_dict(), "announcing a config")
        except (ChildCrashedError, TimeoutError):
            self.restart()

    def retime(self, config: TileConfig, runs: int) -> list[float]:
        try:
            return list(self.call("retime", (config.to_dict(), runs), "re-timing"))
        except (ChildCrashedError, TimeoutError):
            self.restart()
            return []

    def anchor_runs(self, anchor: str, runs: int, config: TileConfig | None = None) -> list[float]:
        """Runs of an anchor (see :meth:`autotune.measure.WorkloadBench.anchor_runs`); [] after a crash or hang,
        and [] when it fails in the child: dense attention materialises the whole score matrix and may not
        compile or run at a video's length, which must cost the tune that figure, not its winner."""
        payload = (anchor, runs, config.to_dict() if config else None)
        try:
            return list(self.call("anchor", payload, f"timing the {anchor} anchor"))
        except (ChildCrashedError, TimeoutError):
            self.restart()
            return []
        except RuntimeError:  # the child's own exception, the child still serving
            return []
