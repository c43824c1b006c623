"""The compile gate: does one (workload, TileConfig) compile for one TPU generation, and does the
estimate agree?

:func:`compile_gate` asks the millisecond estimates first (the TPU tiling rules of
``TileConfig.check_tpu`` and the VMEM/SMEM budget model of :mod:`kernel.budget`), then
compiles for real on a compile-only target (:func:`kernel.tpu_compile.compile_for_tpu`),
and returns both with the software versions the verdict holds for: the compiler is the
judge, the estimate (:func:`kernel.candidates.tpu_violation`, the one the search space
uses) the pre-filter whose disagreements with it are worth knowing. A
verdict is about the compiler of these versions; running (and timing) still needs a TPU.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from autotune.versions import software_versions
from kernel.candidates import tpu_violation
from kernel.config import TileConfig
from kernel.tpu_compile import CompileOutcome, compile_for_tpu
from kernel.tpu_targets import tpu_target
from kernel.workload import Workload


@dataclasses.dataclass(frozen=True)
class GateVerdict:
    """The estimate's and the compiler's verdicts on one config for one generation."""

    config: TileConfig
    estimate: str | None  # why the estimates reject the config, or None
    outcome: CompileOutcome
    versions: dict[str, str | None]

    @property
    def agree(self) -> bool:
        """Whether the estimate predicted the compiler's verdict."""
        return (self.estimate is None) == self.outcome.ok

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "estimate": self.estimate,
            "outcome": self.outcome.to_dict(),
            "versions": dict(self.versions),
            "agree": self.agree,
        }


def compile_gate(workload: Workload, config: TileConfig, target: str | None = None) -> GateVerdict:
    """Estimate, then compile, ``config`` of ``workload`` for ``target`` (a generation such as
    ``v6e`` or a device kind; default the workload's own device kind)."""
    kind = tpu_target(target or workload.device_kind).device_kind
    outcome = compile_for_tpu(
        workload.pattern,
        config,
        kind,
        batch=workload.batch,
        head_dim=workload.head_dim,
        dtype=workload.dtype,
    )
    return GateVerdict(config, tpu_violation(workload, config, kind), outcome, software_versions("tpu"))
