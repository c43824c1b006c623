"""Figures drawn off the event loop, in child processes with a deadline and a memory cap.

Drawing is CPU-bound Python (matplotlib, numpy, the kernel's block tables). In the
server process it would hold the GIL against the event loop and keep its memory (the
kernel's table cache, matplotlib's) after the request. A :class:`FigureRenderer` draws
in up to ``TILETUNE_FIGURE_WORKERS`` child processes of its own instead; each child

- runs under an address-space cap (``RLIMIT_AS`` = ``TILETUNE_FIGURE_MEMORY_MB``): a
  drawing that needs more fails with a ``MemoryError`` in the child, never the server;
- runs at a lower CPU priority (nice +10), so on a busy machine the API's requests
  are served first;
- is killed when a figure takes longer than ``TILETUNE_FIGURE_TIMEOUT_S`` (and a
  fresh one started for the next figure);
- exits after ``idle_s`` without work, giving its memory back.

The work is also bounded by construction (:func:`server.dashboard.figures.render`'s
``max_tiles``); the cap and the deadline are the guarantee when something else
(a workload with 100,000 trials, say) is slow. Waiting is bounded too: at most
``TILETUNE_FIGURE_QUEUE`` requests wait for a free child, each at most the deadline;
more get :class:`FigureUnavailable` (503, ``Retry-After``). Requests that wait hold
no thread: only one thread per child is ever blocked on a pipe.

The children are started with ``spawn`` (a fresh interpreter: nothing of the
server's threads, sockets or database pools is inherited), draw with ``target``
(``"module:function"``, called as ``function(record, name, max_tiles) -> bytes``;
tests substitute their own), and exit when the server's end of their pipe closes.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import multiprocessing as mp
import os
import resource
import signal
import threading
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread

from server.store.records import TuningRecord

DRAW_TARGET = "server.dashboard.renderer:draw_figure"
STARTUP_TIMEOUT_S = 120.0  # a child imports matplotlib and the kernel (JAX) before its first figure
IDLE_S = 300.0
NICE = 10
RETRY_AFTER_S = 5


class FigureUnavailable(Exception):  # noqa: N818  (an answer, not a bug)
    """A figure that could not be drawn now: ``status`` (503 busy, timed out or crashed; 422 over the
    memory budget; 500 a drawing bug) and a ``message`` that names the setting at fault."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(RETRY_AFTER_S)} if self.status == 503 else {}


def draw_figure(record: TuningRecord, name: str, max_tiles: int) -> bytes:
    """The default drawing: :func:`server.dashboard.figures.render` as PNG bytes."""
    from server.dashboard import figures

    return figures.render(record, name, max_tiles=max_tiles).png


def _resolve(target: str) -> Callable[..., bytes]:
    module, _, function = target.partition(":")
    draw: Callable[..., bytes] = getattr(importlib.import_module(module), function)
    return draw


def _child_main(conn: Any, target: str, memory_bytes: int, idle_s: float) -> None:
    """A drawing process: capped, niced, one figure at a time until idle or orphaned."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    with contextlib.suppress(OSError):
        os.nice(NICE)
    try:
        draw = _resolve(target)
        if target == DRAW_TARGET:
            from server.dashboard import figures  # noqa: F401  (imported now, not inside the first deadline)
    except BaseException as exc:  # reported to the server, which says why
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", os.getpid()))
    while conn.poll(idle_s):
        try:
            args = conn.recv()
        except (EOFError, OSError):
            return  # the server is gone
        try:
            png = draw(*args)
            _release_memory()
            conn.send(("ok", png))
        except MemoryError:
            conn.send(("memory", None))
            return  # a fresh child for the next figure, not a fragmented heap
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


def _release_memory() -> None:
    """Hand the memory a drawing freed back to the system: glibc keeps freed heap for reuse, and an
    idle child would otherwise sit on the peak of its largest drawing."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class _Child:
    """One drawing process and the server's end of its pipe."""

    def __init__(self, ctx: Any, target: str, memory_bytes: int, idle_s: float) -> None:
        self.conn, child_end = ctx.Pipe()
        self.proc = ctx.Process(
            target=_child_main, args=(child_end, target, memory_bytes, idle_s), daemon=True, name="tiletune-figures"
        )
        self.proc.start()
        child_end.close()

    def receive(self, timeout_s: float) -> tuple[str, Any] | None:
        """The child's next message; None after ``timeout_s``. EOFError when it died."""
        if not self.conn.poll(timeout_s):
            return None
        message: tuple[str, Any] = self.conn.recv()
        return message

    def alive(self) -> bool:
        return bool(self.proc.is_alive())

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()

    def exit_text(self) -> str:
        self.proc.join(1)
        code = self.proc.exitcode
        if code is not None and code < 0:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-code).name}"
        return f"exited with code {code}"


class FigureRenderer:
    """Draws figures in at most ``workers`` child processes (see the module docstring)."""

    def __init__(
        self,
        *,
        workers: int,
        queue: int,
        timeout_s: float,
        memory_mb: int,
        max_tiles: int,
        target: str = DRAW_TARGET,
        idle_s: float = IDLE_S,
    ) -> None:
        self.workers = workers
        self.queue = queue
        self.timeout_s = timeout_s
        self.memory_bytes = memory_mb << 20
        self.max_tiles = max_tiles
        self.target = target
        self.idle_s = idle_s
        self._ctx = mp.get_context("spawn")
        self._idle: list[_Child] = []
        self._busy: set[_Child] = set()
        self._lock = threading.Lock()
        self._pending = 0  # requests waiting or drawing; touched on the event loop only
        self._slots: anyio.CapacityLimiter | None = None
        self._threads: anyio.CapacityLimiter | None = None
        self._closed = False

    async def render(self, record: TuningRecord, name: str) -> bytes:
        """The PNG of figure ``name``, drawn by a child; :class:`FigureUnavailable` when it cannot be now."""
        if self._pending >= self.workers + self.queue:
            raise FigureUnavailable(
                503,
                f"figure: {self._pending} figures are being drawn or waiting (TILETUNE_FIGURE_WORKERS="
                f"{self.workers}, TILETUNE_FIGURE_QUEUE={self.queue}); retry later",
            )
        if self._slots is None or self._threads is None:
            self._slots = anyio.CapacityLimiter(self.workers)
            self._threads = anyio.CapacityLimiter(self.workers)
        self._pending += 1
        try:
            try:
                with anyio.fail_after(self.timeout_s):
                    await self._slots.acquire()
            except TimeoutError:
                raise FigureUnavailable(
                    503,
                    f"figure: no drawing process free within {self.timeout_s:g} s (TILETUNE_FIGURE_TIMEOUT_S); "
                    "retry later",
                ) from None
            try:
                return await anyio.to_thread.run_sync(self._draw, record, name, limiter=self._threads)
            finally:
                self._slots.release()
        finally:
            self._pending -= 1

    def _draw(self, record: TuningRecord, name: str) -> bytes:
        """In a worker thread, holding a slot: one figure in one child, which is killed on a deadline."""
        child = self._take()
        try:
            child.conn.send((record, name, self.max_tiles))
            reply = child.receive(self.timeout_s)
        except (EOFError, OSError):
            self._discard(child)
            raise FigureUnavailable(
                503, f"figure: the drawing process {child.exit_text()} while drawing {name}; retry later"
            ) from None
        if reply is None:
            self._discard(child)
            raise FigureUnavailable(
                503, f"figure: {name} not drawn within {self.timeout_s:g} s (TILETUNE_FIGURE_TIMEOUT_S); retry later"
            )
        status, payload = reply
        if status == "memory":
            self._discard(child)
            raise FigureUnavailable(
                422,
                f"figure: drawing {name} of this workload needs more than "
                f"TILETUNE_FIGURE_MEMORY_MB={self.memory_bytes >> 20} MiB",
            )
        self._give_back(child)
        if status != "ok":
            raise FigureUnavailable(500, f"figure: drawing {name} failed: {payload}")
        png: bytes = payload
        return png

    def _take(self) -> _Child:
        """An idle live child, or a new one once it is ready."""
        with self._lock:
            if self._closed:
                raise FigureUnavailable(503, "figure: the server is shutting down")
            while self._idle:
                child = self._idle.pop()
                if child.alive():
                    self._busy.add(child)
                    return child
                child.kill()  # exited while idle
        child = _Child(self._ctx, self.target, self.memory_bytes, self.idle_s)
        with self._lock:
            self._busy.add(child)
        try:
            reply = child.receive(STARTUP_TIMEOUT_S)
        except (EOFError, OSError):
            reply = ("error", child.exit_text())
        if reply is None or reply[0] != "ready":
            self._discard(child)
            why = "did not start in time" if reply is None else f"failed to start: {reply[1]}"
            raise FigureUnavailable(503, f"figure: the drawing process {why}")
        return child

    def _give_back(self, child: _Child) -> None:
        with self._lock:
            self._busy.discard(child)
            if self._closed:
                child.kill()
            else:
                self._idle.append(child)

    def _discard(self, child: _Child) -> None:
        with self._lock:
            self._busy.discard(child)
        child.kill()

    def pids(self) -> list[int]:
        """Process ids of the live children (idle or drawing)."""
        with self._lock:
            return [c.proc.pid for c in (*self._idle, *self._busy) if c.alive()]

    def close(self) -> None:
        """Kill every child; figures asked for afterwards are refused."""
        with self._lock:
            self._closed = True
            children = [*self._idle, *self._busy]
            self._idle.clear()
        for child in children:
            child.kill()
