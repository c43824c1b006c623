"""A search on the ``tpu`` backend without a TPU: real compiles, a replayed device, and the pipeline
that keeps the device busy while the next candidates compile.

On a TPU worker every candidate costs a compile on the host CPUs (0.2 s to 10 s) before
the device can time it. Compiled in line, the device idles for every compile; with the
search proposing ``lookahead`` configs ahead (:class:`autotune.search.SearchOptions`)
and a :class:`~autotune.compile_pool.CompilePool` compiling them while the device times
the current one, it only idles when the compilers cannot keep up.

:class:`ReplayedDevice` is that measurer with the device replaced: each config is
compiled for real for the workload's TPU generation (libtpu's compile-only target), and
"runs" for ``trial_s`` (what a trial costs the device besides its timed runs: inputs,
warm-up, the check against the reference) plus ``runs`` x :func:`model_ms` of wall
time, during which the device counts as busy. Neither is a TPU measurement: they only
set how long the device is busy per trial, so the pipeline can be judged; timing still
needs the device. A config the
compiler refuses is a ``failed`` trial with the compiler's error, as on a TPU.
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import Future

from autotune.compile_pool import CompilePool
from autotune.measure import Measurement
from kernel.config import TileConfig
from kernel.cost import grid_steps
from kernel.tpu_compile import CompileOutcome
from kernel.workload import Workload

# The device model of ReplayedDevice: a fixed cost per grid step (pipeline fill, DMA issue)
# and the two tile matmuls at a peak rate (TPU v6e, bf16: 918 TFLOP/s).
STEP_MS = 0.35e-3
PEAK_FLOP_PER_MS = 918e9


def model_ms(workload: Workload, config: TileConfig) -> float:
    """Modelled device milliseconds of one call of ``config`` (see the module docstring)."""
    steps = grid_steps(workload.pattern, config, "tpu") * workload.batch
    flops_per_step = 4.0 * config.block_q * config.block_kv * workload.head_dim
    return steps * (STEP_MS + flops_per_step / PEAK_FLOP_PER_MS)


@dataclasses.dataclass
class DeviceLog:
    """Where a replayed device's wall time went, from its first trial to its last."""

    busy_s: float = 0.0  # running configs
    waits_s: list[float] = dataclasses.field(default_factory=list)  # per trial: waiting for its compile
    first: float | None = None
    last: float | None = None
    compiles: list[CompileOutcome] = dataclasses.field(default_factory=list)

    @property
    def waiting_s(self) -> float:
        return sum(self.waits_s)

    @property
    def wall_s(self) -> float:
        return 0.0 if self.first is None or self.last is None else self.last - self.first

    @property
    def busy_fraction(self) -> float:
        return self.busy_s / self.wall_s if self.wall_s > 0 else 0.0


class ReplayedDevice:
    """A measurer of ``tpu`` configs: compiles real (through ``pool``), runs replayed (see the module
    docstring). ``prefetch`` starts a config's compile; ``measure`` waits for it, then runs."""

    def __init__(
        self, workload: Workload, pool: CompilePool, runs: int = 10, device_scale: float = 1.0, trial_s: float = 0.0
    ) -> None:
        self.workload = workload
        self.pool = pool
        self.runs = runs
        self.trial_s = trial_s
        self.device_scale = device_scale  # multiplies the modelled device time (a slower or faster chip)
        self.log = DeviceLog()
        self._compiles: dict[str, Future[CompileOutcome]] = {}

    def __enter__(self) -> ReplayedDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        for future in self._compiles.values():
            future.cancel()

    def prefetch(self, config: TileConfig) -> None:
        if config.key not in self._compiles:
            self._compiles[config.key] = self.pool.submit(config)

    def _run(self, config: TileConfig, runs: int, overhead_s: float = 0.0) -> list[float]:
        ms = model_ms(self.workload, config) * self.device_scale
        start = time.monotonic()
        time.sleep(overhead_s + ms * runs / 1e3)
        self.log.busy_s += time.monotonic() - start
        return [ms] * runs

    def measure(self, config: TileConfig, prune_above_ms: float | None = None) -> Measurement:
        now = time.monotonic()
        if self.log.first is None:
            self.log.first = now
        self.prefetch(config)  # in line when the search did not propose it ahead
        outcome = self._compiles.pop(config.key).result()
        self.log.waits_s.append(time.monotonic() - now)
        self.log.compiles.append(outcome)
        try:
            if not outcome.ok:
                error = f"does not compile for {outcome.device_kind}: {outcome.cause}: {outcome.error}"
                return Measurement("failed", compile_ms=outcome.compile_s * 1e3, error=error)
            return Measurement(
                "ok", compile_ms=outcome.compile_s * 1e3, runs_ms=tuple(self._run(config, self.runs, self.trial_s))
            )
        finally:
            self.log.last = time.monotonic()

    def retime(self, config: TileConfig, runs: int) -> list[float]:
        return self._run(config, runs)

    def anchor_runs(self, anchor: str, runs: int, config: TileConfig | None = None) -> list[float]:
        return []  # no dense anchor on a replayed device
