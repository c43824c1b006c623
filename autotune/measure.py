"""Measuring one TileConfig on one workload: compile, check, time.

A :class:`WorkloadBench` holds the workload's inputs and the float64 reference
of a sample of query rows, built once. ``measure(config)`` then
 1. lowers and compiles (both timed; a failure is ``failed`` with its kind),
 2. runs once and checks the output on the sampled rows against the reference
    (NaN or an error over the tolerance is ``wrong``: a fast wrong config never
    wins),
 3. warms up and times repeated runs (``block_until_ready``) until both a repeat
    count and a minimum time are met; after ``prune_after`` runs a config whose
    median is ``prune_factor`` times the best so far stops early as ``pruned``.
Compiled executables are kept (LRU) so the final re-timing does not recompile.

Test seam: ``inject`` maps a params key to ``wrong``, ``nan``, ``crash``
(SIGKILL of this process) or ``hang``, so the supervision can be tested on
purpose-built failures.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import signal
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernel.attention import sparse_attention
from kernel.config import TileConfig
from kernel.reference import dense_attention, reference_attention
from kernel.workload import Workload

TOLERANCE = {"float32": 2e-5, "bfloat16": 2e-2}
STATUSES = ("ok", "failed", "invalid", "pruned", "crashed", "timeout", "wrong")


def config_key(config: TileConfig | dict[str, Any]) -> str:
    """Stable key of a config's params (the "same params" of a study)."""
    import hashlib
    import json

    params = config.to_dict() if isinstance(config, TileConfig) else config
    return hashlib.sha256(json.dumps(params, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]


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
    def median_ms(self) -> float | None:
        return float(np.median(self.runs_ms)) if self.runs_ms else None

    @property
    def p10_ms(self) -> float | None:
        return float(np.percentile(self.runs_ms, 10)) if self.runs_ms else None

    @property
    def p90_ms(self) -> float | None:
        return float(np.percentile(self.runs_ms, 90)) if self.runs_ms else None

    @property
    def spread(self) -> float | None:
        m = self.median_ms
        if not m or self.p10_ms is None or self.p90_ms is None:
            return None
        return (self.p90_ms - self.p10_ms) / m

    def trial_fields(self) -> dict[str, Any]:
        """Columns of a stored trial."""
        return {
            "compile_ms": self.compile_ms,
            "median_ms": self.median_ms,
            "p10_ms": self.p10_ms,
            "p90_ms": self.p90_ms,
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
    lowered = text.lower()
    if "resource_exhausted" in lowered or "resource exhausted" in lowered or "out of memory" in lowered:
        return "failed", "resource exhausted: " + first
    return "failed", "compile error: " + first


class WorkloadBench:
    """Inputs, reference and compiled executables of one workload on this process's device."""

    def __init__(
        self,
        workload: Workload,
        backend: str,
        options: MeasureOptions | None = None,
        inject: dict[str, str] | None = None,
        cache_size: int = 8,
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
        self._cache_size = cache_size

    def _fn(self, config: TileConfig) -> Any:
        pattern, backend = self.workload.pattern, self.backend

        def attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
            return sparse_attention(q, k, v, pattern, config, backend)

        return attention

    def _inject(self, key: str, stage: str) -> str | None:
        action = self.inject.get(key)
        if action == "crash" and stage == "compile":
            os.kill(os.getpid(), signal.SIGKILL)
        if action == "hang" and stage == "compile":
            time.sleep(10**6)
        return action

    def measure(self, config: TileConfig, prune_above_ms: float | None = None) -> Measurement:
        key = config_key(config)
        action = self._inject(key, "compile")
        try:
            t0 = time.perf_counter()
            lowered = jax.jit(self._fn(config)).lower(self.q, self.k, self.v)
            t1 = time.perf_counter()
            compiled = lowered.compile()
            t2 = time.perf_counter()
        except Exception as exc:  # compile errors of every kind are data
            status, text = classify_error(exc)
            return Measurement(status, error=text)
        lower_ms, compile_ms = (t1 - t0) * 1e3, (t2 - t1) * 1e3
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
        o = self.options
        args = (self.q, self.k, self.v)
        for _ in range(o.warmup):
            jax.block_until_ready(compiled(*args))
        runs: list[float] = []
        start = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            jax.block_until_ready(compiled(*args))
            runs.append((time.perf_counter() - t0) * 1e3)
            elapsed = time.perf_counter() - start
            if prune_above_ms is not None and len(runs) == o.prune_after and float(np.median(runs)) > prune_above_ms:
                return runs, True
            if (len(runs) >= o.repeats and elapsed >= o.min_time_s) or elapsed >= o.max_time_s:
                return runs, False

    def _remember(self, key: str, compiled: Any) -> None:
        self._compiled[key] = compiled
        self._compiled.move_to_end(key)
        while len(self._compiled) > self._cache_size:
            self._compiled.popitem(last=False)

    def retime(self, config: TileConfig, runs: int) -> list[float]:
        """``runs`` more timed runs of an already measured config (recompiles if evicted)."""
        key = config_key(config)
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = jax.jit(self._fn(config)).lower(self.q, self.k, self.v).compile()
            self._remember(key, compiled)
        return _timed_runs(compiled, (self.q, self.k, self.v), runs)

    def dense_ms(self, repeats: int = 5) -> float:
        """Median time of dense attention (jax.nn.dot_product_attention) on the same inputs."""

        compiled = jax.jit(dense_attention).lower(self.q, self.k, self.v).compile()
        return float(np.median(_timed_runs(compiled, (self.q, self.k, self.v), repeats)))


def _timed_runs(compiled: Any, args: tuple[Any, ...], runs: int) -> list[float]:
    """One untimed run, then ``runs`` timed ones (ms), each to ``block_until_ready``."""
    jax.block_until_ready(compiled(*args))
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        out.append((time.perf_counter() - t0) * 1e3)
    return out
