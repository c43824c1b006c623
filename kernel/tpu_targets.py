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
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

TPU_EXTRA_HINT = "pip install -e '.[tpu]'"
PCI_DEVICES = Path("/sys/bus/pci/devices")
GOOGLE_PCI_VENDOR = "0x1ae0"  # TPU chips' PCI vendor (also Google's virtual NIC and disks on GCE)
DEVICE_FILES = Path("/dev")
TPU_DEVICE_FILES = ("accel*", "vfio/[0-9]*")  # how a TPU VM's chips appear under DEVICE_FILES
# One local worker of a one-host slice: what libtpu would otherwise ask the TPU VM's metadata for.
LOCAL_LIBTPU_ENV = {"TPU_WORKER_HOSTNAMES": "localhost", "TPU_HOST_BOUNDS": "1,1,1"}
_LIBTPU_HOST_VARS = ("TPU_WORKER_HOSTNAMES", "TPU_HOST_BOUNDS", "TPU_ACCELERATOR_TYPE")


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


def tpu_possibly_attached(pci_devices: Path | None = None, device_files: Path | None = None) -> bool:
    """False only where this host certainly has no TPU: no PCI device of Google's vendor id (under
    ``pci_devices``, default :data:`PCI_DEVICES`; a TPU VM's chips have it, as do a GCE VM's virtual NIC
    and disks) and no device file a TPU's chips appear as (under ``device_files``, default
    :data:`DEVICE_FILES`: ``accel*``, or numbered ``vfio`` groups on v5p and later)."""
    for vendor in (pci_devices or PCI_DEVICES).glob("*/vendor"):
        try:
            if vendor.read_text().strip() == GOOGLE_PCI_VENDOR:
                return True
        except OSError:
            continue
    return any(any((device_files or DEVICE_FILES).glob(pattern)) for pattern in TPU_DEVICE_FILES)


def quiet_libtpu_off_tpu(
    environ: MutableMapping[str, str] | None = None, pci_devices: Path | None = None, device_files: Path | None = None
) -> dict[str, str]:
    """On a host that certainly has no TPU, tell libtpu it is the one local worker of a one-host slice
    (:data:`LOCAL_LIBTPU_ENV`), and return what was set.

    Loading libtpu, for a compile-only target or when JAX probes its platforms, asks a TPU VM's metadata
    for the slice's worker hostnames and host bounds; off a TPU VM it gets none and prints an
    ``INVALID_ARGUMENT`` error and a "Failed to find host bounds" warning to stderr, which read like a
    broken install though nothing is wrong (compile-only targets and the CPU work the same either way;
    the compiled programs are identical). Call before libtpu loads (environment variables reach it only
    then, and reach the processes started after). Nothing is set on a host with any Google PCI device
    (a TPU VM, where libtpu must read the real slice; or another GCE VM, where it is left as it was)
    or where the user set any of these variables; nor where a TPU's device files exist
    (:func:`tpu_possibly_attached`)."""
    env = os.environ if environ is None else environ
    if any(name in env for name in _LIBTPU_HOST_VARS) or tpu_possibly_attached(pci_devices, device_files):
        return {}
    for name, value in LOCAL_LIBTPU_ENV.items():
        env[name] = value
    return dict(LOCAL_LIBTPU_ENV)


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
    quiet_libtpu_off_tpu()
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
