"""Kept executables and the process's memory mappings (:data:`autotune.measure.MAP_BUDGET`).

An exhaustive recording keeps every config's executable for its interleaved rounds. XLA's CPU
backend maps each executable in many pieces, and a Linux process may hold only vm.max_map_count
mappings: past it, LLVM fails every further compile with "Cannot allocate memory", which would be
recorded as the configs' own compile errors. These tests pin the three things that prevent that:
dropping an executable gives its mappings back, kept executables are evicted past the budget
(and re-timing one recompiles it), and a compile that ran out of memory while executables were
kept is retried without them.
"""

from __future__ import annotations

from typing import Any

import pytest

from autotune.measure import MAP_BUDGET, MeasureOptions, WorkloadBench, classify_error, memory_maps
from autotune.space import SearchSpace

from .test_measurer_contract import LIVE as SMALL  # compiles in about a second per config

OPTIONS = MeasureOptions(repeats=1, min_time_s=0.0, check_rows=16, keep_compiled=100)


def configs(n: int) -> list[Any]:
    found = SearchSpace(SMALL, "xla").enumerate()
    assert len(found) >= n
    return found[:n]


@pytest.mark.skipif(memory_maps() is None, reason="the system does not report memory mappings (not Linux)")
def test_dropping_a_kept_executable_gives_its_mappings_back() -> None:
    bench = WorkloadBench(SMALL, "xla", OPTIONS)
    for config in configs(4):
        assert bench.measure(config).status == "ok"
    kept = memory_maps()
    assert kept is not None and len(bench._compiled) == 4
    bench._compiled.popitem(last=False)
    bench._compiled.popitem(last=False)
    after = memory_maps()
    assert after is not None
    # Eviction is only worth something if nothing else (a jax cache, a cycle) holds the executable.
    assert after[0] < kept[0], (kept, after)


def test_kept_executables_are_evicted_oldest_first_past_the_map_budget() -> None:
    bench = WorkloadBench(SMALL, "xla", OPTIONS)
    per_executable, limit = 100, 1000
    room = int(MAP_BUDGET * limit) // per_executable  # executables the budget holds
    bench.maps = lambda: (per_executable * len(bench._compiled), limit)
    measured = configs(room + 3)
    for config in measured:
        assert bench.measure(config).status == "ok"
    assert list(bench._compiled) == [c.key for c in measured[-room:]]
    assert bench.evicted == 3
    evicted = measured[0]
    assert len(bench.retime(evicted, 2)) == 2  # recompiled, then kept as the newest
    assert list(bench._compiled)[-1] == evicted.key and len(bench._compiled) == room


def test_without_a_map_count_only_keep_compiled_bounds_what_is_kept() -> None:
    bench = WorkloadBench(SMALL, "xla", OPTIONS)
    bench.maps = lambda: None
    for config in configs(3):
        bench.measure(config)
    assert len(bench._compiled) == 3 and bench.evicted == 0


class OutOfMemoryOnce:
    """Wraps a bench's compile: the first compile of ``key`` fails as LLVM does past the map limit."""

    def __init__(self, bench: WorkloadBench, key: str) -> None:
        self.compile, self.key, self.failed = bench._compile, key, 0

    def __call__(self, config: Any) -> Any:
        if config.key == self.key and not self.failed:
            self.failed += 1
            raise RuntimeError("INTERNAL: LLVM compilation error: Cannot allocate memory")
        return self.compile(config)


def test_a_compile_out_of_memory_with_executables_kept_is_retried_without_them() -> None:
    bench = WorkloadBench(SMALL, "xla", OPTIONS)
    first, second, third = configs(3)
    bench.measure(first)
    bench.measure(second)
    bench._compile = OutOfMemoryOnce(bench, third.key)  # type: ignore[method-assign]
    m = bench.measure(third)
    assert m.status == "ok", m.error
    assert list(bench._compiled) == [third.key] and bench.evicted == 2


def test_an_anchor_compile_out_of_memory_with_executables_kept_is_retried_without_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Anchors are kept and evicted like configs, so their recompiles take the same retry."""
    from kernel.reference import dense_attention

    bench = WorkloadBench(SMALL, "xla", OPTIONS)
    (config,) = configs(1)
    bench.measure(config)
    traced = []

    def dense_out_of_memory_once(q: Any, k: Any, v: Any) -> Any:
        traced.append(1)
        if len(traced) == 1:
            raise RuntimeError("INTERNAL: LLVM compilation error: Cannot allocate memory")
        return dense_attention(q, k, v)

    monkeypatch.setattr("autotune.measure.dense_attention", dense_out_of_memory_once)
    assert len(bench.anchor_runs("dense", 2)) == 2
    assert list(bench._compiled) == ["anchor:dense"] and bench.evicted == 1


def test_a_compile_out_of_memory_with_nothing_kept_is_the_configs_failure_and_says_so() -> None:
    bench = WorkloadBench(SMALL, "xla", OPTIONS)
    (config,) = configs(1)
    bench._compile = OutOfMemoryOnce(bench, config.key)  # type: ignore[method-assign]
    m = bench.measure(config)
    assert m.status == "failed" and m.error is not None and m.error.startswith("resource exhausted:"), m.error


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("INTERNAL: LLVM compilation error: Cannot allocate memory", "resource exhausted"),
        ("RESOURCE_EXHAUSTED: Ran out of memory in memory space vmem", "resource exhausted"),
        ("INTERNAL: Mosaic failed to compile TPU kernel: unsupported shape", "compile error"),
    ],
)
def test_compile_errors_name_their_kind(message: str, kind: str) -> None:
    status, text = classify_error(RuntimeError(message))
    assert status == "failed" and text.startswith(kind + ":"), text
