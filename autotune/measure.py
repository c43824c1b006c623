"""Measuring one TileConfig on one workload: compile, check, time.

This module holds the one timing loop of tiletune (:func:`timed_runs`: every run
ends with ``block_until_ready``, so a time covers the device work, not the
dispatch) and the one place run times become figures (:class:`RunStats`:
median, p10, p90, spread).

A :class:`WorkloadBench` is the in-process measurer: it holds the workload's
inputs and the float64 reference of a sample of query rows, built once.
``measure(config)`` then
 1. lowers and compiles (both timed; a failure is ``failed`` with its kind),
 2. runs once and checks the output on the sampled rows against the reference
    (NaN or an error over the tolerance is ``wrong``: a fast wrong config never
    wins),
 3. warms up and times repeated runs until both a repeat count and a minimum
    time are met; after ``prune_after`` runs a config whose median is over
    ``prune_above_ms`` stops early as ``pruned``.
Compiled executables are kept (LRU) so the final re-timing does not recompile,
within a share of the process's memory mappings (:data:`MAP_BUDGET`).

CPU backends (``xla``, ``interpret``) are timed on one core, in CPU time. A
supervised measuring child pins itself to one core (:func:`pin_one_core`) before
JAX starts, so XLA runs every program on one thread: the library's dense anchor,
which would otherwise take every core, gets no more of the machine than the
single-threaded tiled kernel it is compared with. Its runs are then timed by the
process's CPU clock (:data:`CLOCKS`), which another process competing for the
core does not advance; on a quiet machine the two clocks agree (cpu-demo, pinned:
33.8 / 33.7 ms and 505.4 / 505.0 ms wall / CPU). Under load the wall clock reads
a long program's fair share of the core and a short one's nearly full speed; the
CPU clock does not, but a load on the other cores still slows a compute-bound
kernel more than memory-bound dense attention, which no clock corrects
(:mod:`autotune.host_load` measures such a load; README, "Tuning").

Test seam: ``inject`` maps a params key (or an anchor's, ``anchor:dense``) to
``wrong``, ``nan``, ``crash`` (SIGKILL of this process), ``hang`` or ``error`` (an
exception while compiling), so the supervision can be tested on purpose-built
failures.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import signal
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from autotune.host_load import core_busy
from kernel.attention import sparse_attention
from kernel.config import TileConfig
from kernel.pattern import HeadPattern, SparsityPattern
from kernel.reference import TOLERANCE, dense_attention, reference_attention
from kernel.workload import Workload

STATUSES = ("ok", "failed", "invalid", "pruned", "crashed", "timeout", "wrong")
CPU_BACKENDS = ("xla", "interpret")  # backends whose programs run on this machine's CPU
T = TypeVar("T")
# A Linux process may hold at most vm.max_map_count memory mappings (65,530 by default). XLA's CPU backend
# maps each executable's code and data in many pieces (about 185 mappings for one xla kernel of
# spatial-temporal-hd128-bf16), so a recording that kept all 272 of that table's executables ran out: LLVM
# failed the remaining compiles with "Cannot allocate memory", which read as those configs' compile errors.
# Kept executables are evicted, oldest first, past this share of the limit (a re-timing recompiles them).
MAP_BUDGET = 0.5
# What a run time is read from: the wall clock, or this process's CPU time (all its threads).
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def pin_one_core(core: int | None = None) -> int:
    """Pin this process to one core it may run on, and return it. Call before JAX creates its CPU
    client: XLA sizes its thread pool by the cores the process may use. ``core`` names it (a
    ValueError if this process may not run there); by default it is the quietest of the allowed
    cores over a fifth of a second (:func:`autotune.host_load.core_busy`), so the measuring child of a
    second worker on the machine does not time on the core the first one is timing on (ties: by process
    id)."""
    allowed = sorted(os.sched_getaffinity(0))
    if core is None:
        busy = core_busy() if len(allowed) > 1 else {}
        start = os.getpid() % len(allowed)
        rotated = allowed[start:] + allowed[:start]
        core = min(rotated, key=lambda c: round(busy.get(c, 0.0), 1))
    elif core not in allowed:
        raise ValueError(f"core {core} is not one this process may run on (allowed: {allowed})")
    os.sched_setaffinity(0, {core})
    return core


def clock_for(backend: str) -> str:
    """The clock runs of ``backend`` are timed by in this process: ``cpu`` for a CPU backend in a
    process pinned to one core (:func:`pin_one_core`), else ``wall``. A process on several cores
    keeps the wall clock: its CPU time would add up the threads XLA spreads a program over."""
    return "cpu" if backend in CPU_BACKENDS and len(os.sched_getaffinity(0)) == 1 else "wall"


@dataclasses.dataclass(frozen=True)
class RunStats:
    """Median, p10 and p90 of a set of run times (ms), and their spread."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    runs: int

    @classmethod
    def of(cls, runs_ms: Sequence[float]) -> RunStats | None:
        """The statistics of ``runs_ms``; None when there are no runs."""
        if len(runs_ms) == 0:
            return None
        runs = np.asarray(runs_ms, dtype=float)
        p10, median, p90 = np.percentile(runs, [10, 50, 90])
        return cls(float(median), float(p10), float(p90), int(runs.size))

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: the relative noise of the runs (0 for a zero median)."""
        return (self.p90_ms - self.p10_ms) / self.median_ms if self.median_ms > 0 else 0.0


def timed_runs(
    compiled: Callable[..., Any],
    args: Sequence[Any],
    *,
    warmup: int = 1,
    repeats: int = 5,
    min_time_s: float = 0.0,
    max_time_s: float = math.inf,
    stop_early: Callable[[list[float]], bool] | None = None,
    clock: str = "wall",
) -> tuple[list[float], bool]:
    """``warmup`` untimed runs, then timed runs (ms, read from :data:`CLOCKS` ``[clock]``) until at
    least ``repeats`` runs and ``min_time_s`` seconds of them, or ``max_time_s`` seconds (wall).
    ``stop_early(runs)`` is asked after every run; True ends the loop. Returns (runs, whether it
    stopped early)."""
    now = CLOCKS[clock]
    for _ in range(warmup):
        jax.block_until_ready(compiled(*args))
    runs: list[float] = []
    start = time.perf_counter()
    while True:
        t0 = now()
        jax.block_until_ready(compiled(*args))
        runs.append((now() - t0) * 1e3)
        if stop_early is not None and stop_early(runs):
            return runs, True
        elapsed = time.perf_counter() - start
        if (len(runs) >= repeats and elapsed >= min_time_s) or elapsed >= max_time_s:
            return runs, False


def time_function(
    fn: Callable[..., Any], args: Sequence[Any], *, repeats: int = 5, min_time_s: float = 0.0
) -> Measurement:
    """jit, lower and compile ``fn`` for ``args`` (timed), then :func:`timed_runs`; an ``ok``
    Measurement (benchmarks of callables that are not a TileConfig: anchors, variants)."""
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_ms = (time.perf_counter() - t0) * 1e3
    runs, _ = timed_runs(compiled, args, repeats=repeats, min_time_s=min_time_s)
    return Measurement("ok", compile_ms=compile_ms, runs_ms=tuple(runs))


@dataclasses.dataclass
class MeasureOptions:
    warmup: int = 1
    repeats: int = 5
    min_time_s: float = 0.2
    max_time_s: float = 20.0
    check_rows: int = 64
    prune_after: int = 3
    prune_factor: float = 2.0
    seed: int = 0
    keep_compiled: int = 8  # executables kept for re-timing (an exhaustive recording keeps them all)
    # Threads compiling configs announced by ``prefetch`` while the device times the current one. Only
    # worth it where the timed work runs on a device, not on the CPU that compiles (the tpu backend).
    compile_threads: int = 1
    # CPU backends: the supervised measuring child runs on one core and times in CPU time (module doc);
    # ``core`` names it (default: the quietest, :func:`pin_one_core`).
    one_core: bool = True
    core: int | None = None


ANCHORS = ("dense", "tiled_dense")


def tiled_dense(pattern: SparsityPattern, config: TileConfig) -> tuple[SparsityPattern, TileConfig]:
    """The tiled dense anchor of ``config``: the same backend and tiles on an all-dense pattern
    (compact traversal, no alignment, one call for all heads), so a speedup over it counts only
    the work the sparsity saves, not the backend's."""
    dense = SparsityPattern(pattern.layout, (HeadPattern.dense(),) * pattern.num_heads)
    return dense, dataclasses.replace(
        config, variant="compact", block_kv_compute=config.block_kv, align="none", head_grouping="all"
    )


@dataclasses.dataclass
class Measurement:
    """The outcome of measuring one config (a trial's data)."""

    status: str
    compile_ms: float | None = None
    lower_ms: float | None = None
    runs_ms: tuple[float, ...] = ()
    max_error: float | None = None
    error: str | None = None

    @property
    def stats(self) -> RunStats | None:
        return RunStats.of(self.runs_ms)

    @property
    def median_ms(self) -> float | None:
        stats = self.stats
        return stats.median_ms if stats else None

    @property
    def p10_ms(self) -> float | None:
        stats = self.stats
        return stats.p10_ms if stats else None

    @property
    def p90_ms(self) -> float | None:
        stats = self.stats
        return stats.p90_ms if stats else None

    @property
    def spread(self) -> float | None:
        stats = self.stats
        return stats.spread if stats else None

    def trial_fields(self) -> dict[str, Any]:
        """Columns of a stored trial."""
        stats = self.stats
        return {
            "compile_ms": self.compile_ms,
            "median_ms": stats.median_ms if stats else None,
            "p10_ms": stats.p10_ms if stats else None,
            "p90_ms": stats.p90_ms if stats else None,
            "max_error": self.max_error,
            "error": self.error,
        }

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurement:
        data = dict(data)
        data["runs_ms"] = tuple(data.get("runs_ms", ()))
        return cls(**data)


def classify_error(exc: BaseException) -> tuple[str, str]:
    """(status, error text) of a compile or run failure."""
    text = f"{type(exc).__name__}: {exc}".strip()
    first = text.splitlines()[0][:2000]
    if resource_exhausted(text):
        return "failed", "resource exhausted: " + first
    return "failed", "compile error: " + first


def resource_exhausted(text: str) -> bool:
    """Whether an error's text says the process ran out of memory (or of mappings: ENOMEM), not the config."""
    lowered = text.lower()
    return any(s in lowered for s in ("resource_exhausted", "resource exhausted", "out of memory", "cannot allocate"))


def memory_maps() -> tuple[int, int] | None:
    """(memory mappings this process holds, the most it may hold: vm.max_map_count), None where the
    system does not say (not Linux). Reading them costs a few ms at tens of thousands of mappings."""
    try:
        with open("/proc/self/maps", "rb") as f:
            used = f.read().count(b"\n")
        with open("/proc/sys/vm/max_map_count") as f:
            limit = int(f.read())
    except (OSError, ValueError):
        return None
    return used, limit


class WorkloadBench:
    """Inputs, reference and compiled executables of one workload on this process's device."""

    def __init__(
        self,
        workload: Workload,
        backend: str,
        options: MeasureOptions | None = None,
        inject: dict[str, str] | None = None,
    ) -> None:
        self.workload = workload
        self.backend = backend
        self.options = options or MeasureOptions()
        self.inject = inject or {}
        pattern = workload.pattern
        shape = (workload.batch, pattern.num_heads, pattern.seq_len, workload.head_dim)
        keys = jax.random.split(jax.random.PRNGKey(self.options.seed), 3)
        dtype = jnp.dtype(workload.dtype)
        self.q, self.k, self.v = (jax.random.normal(key, shape, jnp.float32).astype(dtype) for key in keys)
        n = pattern.seq_len
        rng = np.random.default_rng(self.options.seed)
        rows = np.arange(n) if n <= self.options.check_rows else rng.choice(n, self.options.check_rows, replace=False)
        self.rows = np.sort(rows)
        q32, k32, v32 = (x.astype(jnp.float32) for x in (self.q, self.k, self.v))
        self.reference = reference_attention(q32, k32, v32, pattern, rows=self.rows)
        self.tolerance = TOLERANCE[workload.dtype]
        self._compiled: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._ahead: dict[str, Future[tuple[Any, float, float]]] = {}
        self._compiler: ThreadPoolExecutor | None = None
        self.clock = clock_for(backend)
        self.maps: Callable[[], tuple[int, int] | None] = memory_maps  # test seam: a process's map count
        self.evicted = 0  # kept executables dropped to stay within MAP_BUDGET

    def _fn(self, config: TileConfig, pattern: SparsityPattern | None = None) -> Any:
        pattern, backend = pattern or self.workload.pattern, self.backend

        def attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
            return sparse_attention(q, k, v, pattern, config, backend)

        return attention

    def _inject(self, key: str, stage: str) -> str | None:
        action = self.inject.get(key)
        if action == "crash" and stage == "compile":
            os.kill(os.getpid(), signal.SIGKILL)
        if action == "hang" and stage == "compile":
            time.sleep(10**6)
        if action == "error" and stage == "compile":
            raise RuntimeError(f"injected error compiling {key}")
        return action

    def _compile(self, config: TileConfig) -> tuple[Any, float, float]:
        """(executable, lower ms, compile ms) of ``config``; compile errors raise."""
        self._inject(config.key, "compile")
        t0 = time.perf_counter()
        lowered = jax.jit(self._fn(config)).lower(self.q, self.k, self.v)
        t1 = time.perf_counter()
        compiled = lowered.compile()
        t2 = time.perf_counter()
        return compiled, (t1 - t0) * 1e3, (t2 - t1) * 1e3

    def _compile_or_free(self, compile: Callable[[], T], ahead: Future[T] | None = None) -> T:
        """``compile()`` (or the prefetched result of the same compile). Every compile of the bench (a
        config's, an anchor's) goes through here: one that ran out of memory while executables were kept
        is retried once without them, since the process's state failed it, not the program."""
        try:
            return ahead.result() if ahead is not None else compile()
        except Exception as exc:
            if not (resource_exhausted(str(exc)) and self._compiled):
                raise
            self.evicted += len(self._compiled)
            self._compiled.clear()
            return compile()

    def prefetch(self, config: TileConfig) -> None:
        """Start compiling ``config`` in a background thread (:attr:`MeasureOptions.compile_threads`);
        :meth:`measure` takes the executable when it gets there. On a TPU the device times the current
        config meanwhile; on a CPU backend the compile would share the timed CPU, so searches there do
        not prefetch (``SearchOptions.lookahead`` 0)."""
        if config.key in self._ahead or config.key in self._compiled:
            return
        if self._compiler is None:
            self._compiler = ThreadPoolExecutor(max(1, self.options.compile_threads), "tiletune-compile")
        self._ahead[config.key] = self._compiler.submit(self._compile, config)

    def measure(self, config: TileConfig, prune_above_ms: float | None = None) -> Measurement:
        key = config.key
        action = self.inject.get(key)
        try:
            compiled, lower_ms, compile_ms = self._compile_or_free(
                lambda: self._compile(config), self._ahead.pop(key, None)
            )
        except Exception as exc:  # compile errors of every kind are data
            status, text = classify_error(exc)
            return Measurement(status, error=text)
        self._remember(key, compiled)
        try:
            out = np.asarray(jax.block_until_ready(compiled(self.q, self.k, self.v)).astype(jnp.float32))
        except Exception as exc:
            status, text = classify_error(exc)
            return Measurement(
                status, compile_ms=compile_ms, lower_ms=lower_ms, error=text.replace("compile error", "run error")
            )
        if action == "wrong":
            out = out + 1.0
        if action == "nan":
            out = out * np.nan
        sample = out[:, :, self.rows].astype(np.float64)
        if not np.isfinite(sample).all():
            return Measurement("wrong", compile_ms, lower_ms, error="output has NaN or Inf", max_error=float("nan"))
        max_error = float(np.abs(sample - self.reference).max())
        if max_error > self.tolerance:
            return Measurement(
                "wrong",
                compile_ms,
                lower_ms,
                max_error=max_error,
                error=f"max abs error {max_error:.3g} > tolerance {self.tolerance:g}",
            )
        runs, pruned = self._time(compiled, prune_above_ms)
        return Measurement("pruned" if pruned else "ok", compile_ms, lower_ms, tuple(runs), max_error)

    def _time(self, compiled: Any, prune_above_ms: float | None) -> tuple[list[float], bool]:
        """Timed runs, and whether they stopped early as clearly slower than ``prune_above_ms``."""
        options = self.options

        def clearly_slower(runs: list[float]) -> bool:
            return (
                prune_above_ms is not None
                and len(runs) == options.prune_after
                and float(np.median(runs)) > prune_above_ms
            )

        return timed_runs(
            compiled,
            (self.q, self.k, self.v),
            warmup=options.warmup,
            repeats=options.repeats,
            min_time_s=options.min_time_s,
            max_time_s=options.max_time_s,
            stop_early=clearly_slower,
            clock=self.clock,
        )

    def _remember(self, key: str, compiled: Any) -> None:
        self._compiled[key] = compiled
        self._compiled.move_to_end(key)
        while len(self._compiled) > max(1, self.options.keep_compiled):
            self._compiled.popitem(last=False)
        while len(self._compiled) > 1 and (maps := self.maps()) is not None and maps[0] > MAP_BUDGET * maps[1]:
            self._compiled.popitem(last=False)  # frees its mappings at once (no cycle holds an executable)
            self.evicted += 1

    def retime(self, config: TileConfig, runs: int) -> list[float]:
        """``runs`` more timed runs of an already measured config (recompiles if evicted)."""
        compiled = self._compiled.get(config.key)
        if compiled is None:
            compiled = self._compile_or_free(lambda: self._compile(config))[0]
            self._remember(config.key, compiled)
        return timed_runs(compiled, (self.q, self.k, self.v), repeats=runs, clock=self.clock)[0]

    def anchor_runs(self, anchor: str, runs: int, config: TileConfig | None = None) -> list[float]:
        """``runs`` timed runs of an anchor on the same inputs: ``dense`` is the library's dense attention
        (jax.nn.dot_product_attention), ``tiled_dense`` :func:`tiled_dense` of ``config``."""
        if anchor == "dense":
            key, fn = "anchor:dense", dense_attention
        elif anchor == "tiled_dense" and config is not None:
            pattern, tiles = tiled_dense(self.workload.pattern, config)
            key, fn = f"anchor:tiled_dense:{tiles.key}", self._fn(tiles, pattern)
        else:
            raise ValueError(f"anchor must be one of {ANCHORS} (tiled_dense with a config), got {anchor!r}")
        compiled = self._compiled.get(key)
        if compiled is None:
            self._inject(key, "compile")
            compiled = self._compile_or_free(lambda: jax.jit(fn).lower(self.q, self.k, self.v).compile())
            self._remember(key, compiled)
        return timed_runs(compiled, (self.q, self.k, self.v), repeats=runs, clock=self.clock)[0]
