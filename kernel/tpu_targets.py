"""Compile-only TPU targets: real TPU generations to compile for on a machine without a TPU.

libtpu ships the whole XLA:TPU + Mosaic compiler. Asked for a topology instead of
the local devices (``jax.experimental.topologies.get_topology_desc``), it returns
devices that can be compiled for but never run on: ``jax.jit(f).trace(...)
.lower().compile()`` with inputs placed on such a device runs the same compile a TPU
host would, with its errors (SMEM/VMEM exhausted, Mosaic layouts) and its memory
figures. Only running, and so timing, needs the device itself.

One target per generation the service knows, keyed by the ``device_kind`` a real
TPU of that generation reports (the key of tuned workloads). Single-chip
generations (v5e, v6e) are asked for a ``1x1`` slice; the megacore generations (v4,
v5p) and TPU7x only exist as ``2x2x1`` hosts, whose first device is compiled for
(TPU7x has two cores per chip, so eight devices). Targets are created once per
process: creating one loads libtpu's compiler (about a second).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
from typing import Any

TPU_EXTRA_HINT = "pip install -e '.[tpu]'"


class TpuCompilerUnavailableError(RuntimeError):
    """libtpu (the TPU compiler) is not installed, or cannot describe the topology."""


@dataclasses.dataclass(frozen=True)
class TpuTarget:
    """A TPU generation as libtpu's compile-only topology describes it."""

    generation: str  # the short name users type: v4, v5e, v5p, v6e, tpu7x
    device_kind: str  # what jax.devices()[0].device_kind says on a real TPU of this generation
    topology_name: str
    chip_config_name: str
    chips_per_host_bounds: tuple[int, int, int]


TARGETS: dict[str, TpuTarget] = {
    t.device_kind: t
    for t in (
        TpuTarget("v4", "TPU v4", "v4:2x2x1", "megacore", (2, 2, 1)),
        TpuTarget("v5e", "TPU v5 lite", "v5e:1x1", "default", (1, 1, 1)),
        TpuTarget("v5p", "TPU v5", "v5p:2x2x1", "megacore", (2, 2, 1)),
        TpuTarget("v6e", "TPU v6 lite", "v6e:1x1", "default", (1, 1, 1)),
        TpuTarget("tpu7x", "TPU7x", "tpu7x:2x2x1", "default", (2, 2, 1)),
    )
}
GENERATIONS: dict[str, str] = {t.generation: kind for kind, t in TARGETS.items()}


def tpu_target(name: str) -> TpuTarget:
    """The target of a device kind (``TPU v6 lite``) or a generation (``v6e``)."""
    kind = GENERATIONS.get(name.lower(), name)
    try:
        return TARGETS[kind]
    except KeyError:
        known = ", ".join(f"{g} ({k})" for g, k in GENERATIONS.items())
        raise ValueError(f"unknown TPU generation {name!r}; known: {known}") from None


def libtpu_installed() -> bool:
    """Whether the TPU compiler can be loaded in this environment (the ``tpu`` extra)."""
    return importlib.util.find_spec("libtpu") is not None


def require_libtpu() -> None:
    """Raise TpuCompilerUnavailableError, naming the ``tpu`` extra, unless libtpu is installed."""
    if not libtpu_installed():
        raise TpuCompilerUnavailableError(
            "compiling for TPU needs libtpu, the TPU compiler, which is not installed here; "
            f"install the tpu extra: {TPU_EXTRA_HINT}"
        )


@functools.cache
def target_device(name: str) -> Any:
    """A compile-only ``jax.Device`` of the generation ``name`` (device kind or generation),
    created once per process."""
    target = tpu_target(name)
    require_libtpu()
    # libtpu takes /tmp/libtpu_lockfile so that one process owns a host's TPU chips; a
    # compile-only target owns no chip, so several compiling processes (a test run beside
    # a compile bench) may load it. Only set when the caller has not chosen.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    try:
        topology = topologies.get_topology_desc(
            topology_name=target.topology_name,
            platform="tpu",
            chip_config_name=target.chip_config_name,
            chips_per_host_bounds=target.chips_per_host_bounds,
            num_slices=1,
        )
    except Exception as exc:  # libtpu reports an unknown topology or a broken install in its own types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TpuCompilerUnavailableError(
            f"libtpu could not describe the {target.generation} topology {target.topology_name!r}: {first}"
        ) from exc
    device: Any = topology.devices[0]
    if device.device_kind != target.device_kind:
        raise TpuCompilerUnavailableError(
            f"libtpu's {target.topology_name!r} device is {device.device_kind!r}, expected {target.device_kind!r}"
        )
    return device
