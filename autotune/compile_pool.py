"""Compiling many TileConfigs of one workload for its TPU generation at once, in supervised processes.

A :class:`CompilePool` keeps ``processes`` child processes, each with libtpu's compiler
loaded once for the workload's device kind (:mod:`kernel.tpu_targets`), and hands them
configs in the order they were submitted: :meth:`CompilePool.submit` returns a future
of the :class:`~kernel.tpu_compile.CompileOutcome`. A child that crashes or does not
answer within ``timeout_s`` gives an outcome with cause ``crashed`` / ``timeout`` and is
replaced, so one bad config never stops a compile worker or a pipelined search.

Used by compile workers (``tiletune worker --compile-only``) and by the pipelined search
(:mod:`autotune.pipeline`), which compiles the next candidates while the device times
the current one.
"""

from __future__ import annotations

import queue
import random
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from autotune.space import SearchSpace
from autotune.supervisor import ChildCrashedError, SupervisedChild, serve_requests
from kernel.config import TileConfig
from kernel.tpu_compile import CompileOutcome
from kernel.workload import Workload


def _compile_main(conn: Any, workload: dict[str, Any], device_kind: str) -> None:
    from kernel.tpu_compile import compile_for_tpu
    from kernel.tpu_targets import target_device

    def setup() -> Callable[[str, Any], Any]:
        wl = Workload.from_dict(workload)
        target_device(device_kind)  # load the compiler before saying ready

        def handle(op: str, payload: Any) -> Any:
            if op != "compile":
                raise ValueError(f"unknown op {op!r}")
            config = TileConfig.from_dict(payload)
            return compile_for_tpu(
                wl.pattern, config, device_kind, batch=wl.batch, head_dim=wl.head_dim, dtype=wl.dtype
            ).to_dict()

        return handle

    serve_requests(conn, setup)


class CompileChild(SupervisedChild):
    """One compiling process for one workload; crashes and hangs become outcomes."""

    role = "compiling process"

    def __init__(self, workload: Workload, device_kind: str, timeout_s: float, startup_timeout_s: float = 120.0):
        self.device_kind = device_kind
        super().__init__(
            _compile_main,
            (workload.canonical(), device_kind),
            call_timeout_s=timeout_s,
            startup_timeout_s=startup_timeout_s,
        )

    def compile(self, config: TileConfig) -> CompileOutcome:
        try:
            return CompileOutcome.from_dict(self.call("compile", config.to_dict(), f"compiling {config.describe()}"))
        except ChildCrashedError as exc:
            self.restart()
            return CompileOutcome(self.device_kind, False, 0.0, 0, cause="crashed", error=str(exc))
        except TimeoutError as exc:
            self.restart()
            return CompileOutcome(self.device_kind, False, self.call_timeout_s, 0, cause="timeout", error=str(exc))
        except RuntimeError as exc:  # an unexpected exception in the child: data, not a stop
            line = str(exc).strip().splitlines()[-1]
            return CompileOutcome(self.device_kind, False, 0.0, 0, cause="other", error="compiling error: " + line)


_STOP = object()


class CompilePool:
    """``processes`` compiling processes fed from one queue, first submitted first compiled."""

    def __init__(self, workload: Workload, processes: int = 1, timeout_s: float = 300.0) -> None:
        from kernel.tpu_targets import require_libtpu, tpu_target

        require_libtpu()
        self.workload = workload
        self.device_kind = tpu_target(workload.device_kind).device_kind
        self.timeout_s = timeout_s
        self._queue: queue.Queue[Any] = queue.Queue()
        self._threads = [
            threading.Thread(target=self._serve, name=f"tiletune-compile-{i}", daemon=True) for i in range(processes)
        ]
        for thread in self._threads:
            thread.start()

    def __enter__(self) -> CompilePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(self, config: TileConfig) -> Future[CompileOutcome]:
        """Queue ``config``; its outcome arrives in the returned future (never an exception
        for a compiler verdict; a child that cannot start fails the future)."""
        future: Future[CompileOutcome] = Future()
        self._queue.put((config, future))
        return future

    def close(self) -> None:
        """Cancel the queued configs not yet taken, let the compiles in flight finish, stop
        the processes."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                item[1].cancel()
        for _ in self._threads:
            self._queue.put(_STOP)
        for thread in self._threads:
            thread.join()

    def _serve(self) -> None:
        child: CompileChild | None = None
        try:
            while True:
                item = self._queue.get()
                if item is _STOP:
                    return
                config, future = item
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    if child is None:
                        child = CompileChild(self.workload, self.device_kind, self.timeout_s)
                        child.start()
                    future.set_result(child.compile(config))
                except Exception as exc:  # the process could not start: the caller decides
                    future.set_exception(exc)
                    child = None
        finally:
            if child is not None:
                child.close()


def compile_order(space: SearchSpace, first: Sequence[TileConfig], seed: int = 0) -> list[TileConfig]:
    """The valid configs of ``space`` in the order a search is likely to ask for them, so compiling
    ahead in this order has the next ones ready: ``first`` (the warm starts, which a search measures
    first), then the rest by their distance to the nearest of them in the sampler's grid (the local
    steps of the default sampler move around the best of them), ties in a seeded random order."""
    valid = space.enumerate()
    by_key = {c.key: c for c in valid}
    head = list({c.key: c for c in first if c.key in by_key}.values())
    dims = space.dimensions()

    def index(config: TileConfig) -> dict[str, int]:
        params = space.params_of(config)
        return {name: dims[name].index(params[name]) for name in dims}

    starts = [index(c) for c in head]
    chosen = {c.key for c in head}
    rng = random.Random(seed)
    rest = [c for c in valid if c.key not in chosen]
    tiebreak = {c.key: rng.random() for c in rest}

    def distance(config: TileConfig) -> int:
        at = index(config)
        return min((sum(abs(at[n] - s[n]) for n in dims) for s in starts), default=0)

    return head + sorted(rest, key=lambda c: (distance(c), tiebreak[c.key]))
