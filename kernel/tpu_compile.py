"""Compiling the Pallas kernel for a real TPU generation on this machine: the judge of validity.

:func:`compile_for_tpu` runs the whole XLA:TPU + Mosaic compile of every kernel call
of one (pattern, TileConfig) for a compile-only target (:mod:`kernel.tpu_targets`)
and turns what happens into a :class:`CompileOutcome`: ok with the compile seconds
and the executable's memory figures, or the compiler's first error line with its
cause. Failures are values, not exceptions, so a sweep over a space goes on.

Causes, from the first error line:
 - ``rule``: TileConfig's TPU tiling rules or the Pallas lowering refused the blocks
   (the millisecond gate of :mod:`kernel.lowering`; nothing was compiled);
 - ``smem``: the scalar-prefetched tables (and Mosaic's own scalars) exceed SMEM;
 - ``vmem``: the blocks, scratch and Mosaic's internal scratch exceed scoped VMEM;
 - ``layout``: Mosaic cannot lay out a vector op of the kernel for this chip;
 - ``other``: anything else (the error line says what);
 - ``crashed`` / ``timeout``: the compiling process died or did not answer in time
   (set by the process that supervises it, :mod:`autotune.compile_pool`).
The estimates of :mod:`kernel.budget` stay the pre-filter that keeps a search from
asking for obviously oversized configs; this compile says what really fits.
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any, Literal

import jax
import numpy as np

from kernel.config import TileConfig
from kernel.lowering import first_line, kernel_calls
from kernel.pattern import SparsityPattern
from kernel.tpu_targets import target_device, tpu_target

Cause = Literal["rule", "smem", "vmem", "layout", "other", "crashed", "timeout"]
CAUSES: tuple[str, ...] = ("rule", "smem", "vmem", "layout", "other", "crashed", "timeout")
# Figures of jax's CompiledMemoryStats kept per call (bytes; host_* figures are zero on TPU).
MEMORY_FIELDS = (
    "argument_size_in_bytes",
    "output_size_in_bytes",
    "temp_size_in_bytes",
    "generated_code_size_in_bytes",
)
_LAYOUT_WORDS = ("layout", "tiling", "not implemented", "unsupported", "relayout", "shape cast")
# XLA's scoped-VMEM overflow says how much was asked for on a later line than its first.
_VMEM_SIZES = re.compile(r"Scoped allocation with size \S+ and limit \S+ exceeded scoped vmem limit by [0-9.]+\w*")


@dataclasses.dataclass(frozen=True)
class CompileOutcome:
    """What compiling one config for one TPU generation gave.

    ``memory`` holds, per :data:`MEMORY_FIELDS` name, the largest figure over the
    config's kernel calls (the call that must fit); ``compile_s`` is the sum over
    them (lowering included). On failure ``cause`` and ``error`` (the compiler's
    first line) are set and ``memory`` is empty.
    """

    device_kind: str
    ok: bool
    compile_s: float
    calls: int
    memory: dict[str, int] = dataclasses.field(default_factory=dict)
    cause: Cause | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompileOutcome:
        return cls(**data)


def classify(message: str) -> Cause:
    """The cause of a compile error from its text (see the module docstring)."""
    text = message.lower()
    if "smem" in text:
        return "smem"
    if "vmem" in text:
        return "vmem"
    if any(word in text for word in _LAYOUT_WORDS):
        return "layout"
    return "other"


def error_line(exc: BaseException) -> str:
    """The compiler's first error line, with the sizes of a scoped-VMEM overflow appended (its first
    line is only "RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom:")."""
    line = first_line(exc)
    sizes = _VMEM_SIZES.search(str(exc))
    return f"{line} {sizes.group(0)}" if sizes and sizes.group(0) not in line else line


def compile_for_tpu(
    pattern: SparsityPattern,
    config: TileConfig,
    target: str,
    *,
    batch: int = 1,
    head_dim: int = 128,
    dtype: str = "bfloat16",
) -> CompileOutcome:
    """Compile every kernel call of ``config`` for the TPU generation ``target`` (a device
    kind such as ``TPU v6 lite`` or a generation such as ``v6e``).

    Raises :class:`~kernel.tpu_targets.TpuCompilerUnavailableError` without libtpu and
    ValueError for an unknown generation; every verdict on the config is returned.
    """
    kind = tpu_target(target).device_kind
    device = target_device(kind)
    try:
        config.check_tpu(dtype)
    except ValueError as exc:
        return CompileOutcome(kind, False, 0.0, 0, cause="rule", error=str(exc))
    mesh = jax.sharding.Mesh(np.array([device]), ("d",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    memory: dict[str, int] = {}
    seconds, calls = 0.0, 0
    for call, args in kernel_calls(pattern, config, batch=batch, head_dim=head_dim, dtype=dtype, sharding=sharding):
        start = time.perf_counter()
        try:
            lowered = jax.jit(call).trace(*args).lower()
        except Exception as exc:  # the Pallas TPU lowering refuses illegal blocks in various types
            return CompileOutcome(kind, False, seconds, calls, cause="rule", error=first_line(exc))
        try:
            compiled = lowered.compile()
        except Exception as exc:  # XlaRuntimeError (RESOURCE_EXHAUSTED, INTERNAL, ...) from XLA or Mosaic
            seconds += time.perf_counter() - start
            return CompileOutcome(kind, False, seconds, calls, cause=classify(str(exc)), error=error_line(exc))
        seconds += time.perf_counter() - start
        calls += 1
        stats = compiled.memory_analysis()
        for name in MEMORY_FIELDS:
            value = int(getattr(stats, name, 0) or 0)
            memory[name] = max(memory.get(name, 0), value)
    return CompileOutcome(kind, True, seconds, calls, memory)
