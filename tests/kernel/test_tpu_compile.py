"""The kernel compiles for real TPU generations on this CPU machine (libtpu's compile-only targets).

Shapes are the smallest that prove each point: a whole compile of a small call takes
0.1-0.8 s, one with 2048-row f32 tiles over 30 s.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from autotune.compile_gate import compile_gate
from kernel import tpu_targets
from kernel.attention import sparse_attention
from kernel.config import TileConfig
from kernel.layout import VideoLayout
from kernel.pattern import HeadPattern, SparsityPattern
from kernel.reference import TOLERANCE, reference_attention
from kernel.tpu_compile import classify, compile_for_tpu, error_line
from kernel.tpu_targets import GENERATIONS, TpuCompilerUnavailableError, libtpu_installed, target_device, tpu_target
from kernel.workload import Workload

needs_libtpu = pytest.mark.skipif(
    not libtpu_installed(), reason="libtpu (the TPU compiler) is not installed: pip install -e '.[tpu]'"
)
GATE_GENERATIONS = ("v5e", "v6e", "tpu7x")
# Heads placed differently in one call: a spatial head with a first-frame sink (frame-major) and a
# temporal head with a sink (temporal-major, frame 0 first: two segments), text prefix.
PLACED = SparsityPattern(
    VideoLayout(4, 120, 24, "prefix"), (HeadPattern.spatial(1, True), HeadPattern.temporal(6, True))
)


def max_error(pattern: SparsityPattern, config: TileConfig, dtype: str, head_dim: int = 128) -> float:
    """Max abs error of the interpret backend against the dense float64 reference."""
    rng = np.random.default_rng(0)
    shape = (1, pattern.num_heads, pattern.seq_len, head_dim)
    q, k, v = (jnp.asarray(rng.standard_normal(shape), jnp.float32).astype(dtype) for _ in range(3))
    out = np.asarray(sparse_attention(q, k, v, pattern, config, "interpret").astype(jnp.float32), np.float64)
    ref = reference_attention(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), pattern)
    return float(np.abs(out - ref).max())


@needs_libtpu
@pytest.mark.parametrize("generation", list(GENERATIONS))
def test_every_generation_is_a_compile_target_with_its_device_kind(generation: str) -> None:
    assert target_device(generation).device_kind == GENERATIONS[generation]
    assert target_device(GENERATIONS[generation]) is target_device(GENERATIONS[generation])


def test_unknown_generation_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown TPU generation 'v9'.*v6e \(TPU v6 lite\)"):
        tpu_target("v9")
    assert tpu_target("V6E") == tpu_target("TPU v6 lite")


def test_without_libtpu_the_error_names_the_tpu_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tpu_targets.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(TpuCompilerUnavailableError, match=r"pip install -e '\.\[tpu\]'"):
        tpu_targets.require_libtpu()


def test_compile_errors_are_classified_by_cause() -> None:
    assert classify("RESOURCE_EXHAUSTED: Ran out of memory in memory space smem. Used 1.00M of 1.00M smem.") == "smem"
    assert classify("RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom: ...") == "vmem"
    assert classify("INTERNAL: Mosaic failed to compile TPU kernel: unsupported layout") == "layout"
    assert classify("INTERNAL: something else") == "other"


def test_a_vmem_overflow_keeps_its_sizes() -> None:
    """XLA's first line of a scoped-VMEM overflow names no size; the sentence that does is kept
    (message of compact q2048 kv2048/1024 bf16 on v5e)."""
    exc = RuntimeError(
        "RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom:\nRan out of memory in memory space vmem while "
        "allocating on stack for %tiletune_compact.1 = bf16[1,1,4096,128] custom-call(...). Scoped allocation "
        "with size 21.59M and limit 16.00M exceeded scoped vmem limit by 5.59M. It should not be possible"
    )
    assert error_line(exc) == (
        "RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom: Scoped allocation with size 21.59M and limit "
        "16.00M exceeded scoped vmem limit by 5.59M"
    )
    assert error_line(RuntimeError("INTERNAL: one line\nmore")) == "INTERNAL: one line"


@needs_libtpu
@pytest.mark.parametrize("generation", GATE_GENERATIONS)
@pytest.mark.parametrize("variant", ["naive", "split", "compact"])
def test_heads_placed_differently_compile(generation: str, variant: str) -> None:
    """Regression: a call whose heads are placed differently chose their boolean slot flags with
    a select on i1 vectors, which Mosaic cannot legalize: it lowered, then failed to compile."""
    config = TileConfig(variant, 128, 256, 128, "temporal_major", "frame", "all")  # type: ignore[arg-type]
    outcome = compile_for_tpu(PLACED, config, generation, dtype="bfloat16")
    assert outcome.ok, outcome.error
    assert outcome.calls == 1
    assert outcome.memory["argument_size_in_bytes"] > 0


def test_heads_placed_differently_match_the_reference() -> None:
    """The fixed decoding is shared by every variant (test_exactness runs them all on mixed heads)."""
    config = TileConfig("compact", 128, 256, 128, "temporal_major", "frame", "all")
    assert max_error(PLACED, config, "float32", head_dim=16) <= TOLERANCE["float32"]


@needs_libtpu
def test_smem_exhaustion_is_a_classified_outcome_and_the_estimate_agrees() -> None:
    """naive 128x128 over 65,536 tokens: a 1 MiB dense tile table, over SMEM with the head params."""
    pattern = SparsityPattern(VideoLayout(16, 4096), (HeadPattern.spatial(1),))
    workload = Workload("TPU v5 lite", "tpu", "bfloat16", 1, 128, pattern)
    verdict = compile_gate(workload, TileConfig("naive", 128, 128, 0, "frame_major", "none", "by_pattern"))
    assert not verdict.outcome.ok
    assert verdict.outcome.cause == "smem"
    assert verdict.outcome.error is not None and "Ran out of memory in memory space smem" in verdict.outcome.error
    assert verdict.estimate is not None and verdict.estimate.startswith("smem")
    assert verdict.agree
    assert verdict.versions["libtpu"] is not None and verdict.versions["jax"] is not None


@needs_libtpu
@pytest.mark.parametrize(
    ("tokens_per_frame", "config", "fits"),
    [
        # 1,048,352 + 16 bytes of tables: under 1 MiB (the estimate once called it valid), refused
        (23150, TileConfig("naive", 128, 256, 128), False),
        # 1,044,484 + 16 bytes: 3 KiB left once rounded up, the least with which it compiles
        (16350, TileConfig("naive", 128, 128, 128), True),
    ],
)
def test_smem_boundary_configs_compile_as_estimated(tokens_per_frame: int, config: TileConfig, fits: bool) -> None:
    """The SMEM estimate's boundary (tests/kernel/test_budget.py) against the compiler itself, on
    one head of 4 frames: a compile of under a second each."""
    pattern = SparsityPattern(VideoLayout(4, tokens_per_frame), (HeadPattern.spatial(1),))
    verdict = compile_gate(Workload("TPU v6 lite", "tpu", "bfloat16", 1, 128, pattern), config)
    assert verdict.outcome.ok == fits, verdict.outcome.error
    assert fits or verdict.outcome.cause == "smem"
    assert verdict.agree, verdict.estimate


@needs_libtpu
def test_a_rule_violation_is_refused_before_compiling() -> None:
    outcome = compile_for_tpu(PLACED, TileConfig("compact", 120, 128, 0), "v6e", dtype="bfloat16")
    assert (outcome.ok, outcome.cause, outcome.calls) == (False, "rule", 0)
    assert outcome.error is not None and "multiple of 16" in outcome.error
