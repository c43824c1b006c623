"""Wall-clock timing of compiled JAX callables: compile once, warm up, repeat.

Every run ends with ``block_until_ready`` so the time covers the device work,
not just the dispatch. Callers compare figures measured side by side in one
process; a single absolute number from a shared machine means little.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class Timing:
    """Run times in milliseconds of one measured callable."""

    compile_ms: float
    runs_ms: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        return float(np.median(self.runs_ms))

    @property
    def p10_ms(self) -> float:
        return float(np.percentile(self.runs_ms, 10))

    @property
    def p90_ms(self) -> float:
        return float(np.percentile(self.runs_ms, 90))

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: relative noise of the measurement."""
        return (self.p90_ms - self.p10_ms) / self.median_ms if self.median_ms > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "compile_ms": round(self.compile_ms, 3),
            "median_ms": round(self.median_ms, 4),
            "p10_ms": round(self.p10_ms, 4),
            "p90_ms": round(self.p90_ms, 4),
            "runs": len(self.runs_ms),
        }


def compile_fn(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    """jit + lower + compile ``fn`` for ``args``; returns (compiled, compile ms)."""
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, (time.perf_counter() - start) * 1e3


def time_compiled(
    compiled: Any,
    args: tuple[Any, ...],
    *,
    warmup: int = 1,
    repeats: int = 5,
    min_time_s: float = 0.0,
    compile_ms: float = 0.0,
) -> Timing:
    """Median-friendly timing: ``warmup`` untimed runs, then at least ``repeats``
    timed runs and at least ``min_time_s`` seconds of them."""
    for _ in range(warmup):
        jax.block_until_ready(compiled(*args))
    runs: list[float] = []
    started = time.perf_counter()
    while len(runs) < repeats or time.perf_counter() - started < min_time_s:
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        runs.append((time.perf_counter() - t0) * 1e3)
    return Timing(compile_ms, tuple(runs))


def measure(fn: Callable[..., Any], args: tuple[Any, ...], **kwargs: Any) -> Timing:
    compiled, compile_ms = compile_fn(fn, *args)
    return time_compiled(compiled, args, compile_ms=compile_ms, **kwargs)
