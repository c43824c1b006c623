"""What accelerator this machine has, read without opening it.

A TPU is held by one process at a time, and the measuring child of
:class:`~autotune.supervisor.Supervisor` needs it; so the processes that only
plan (``tiletune tune``, ``tiletune worker``) read the platform and device kind
in a short-lived child and never initialise a JAX backend themselves.
"""

from __future__ import annotations

import dataclasses
import functools
import subprocess
import sys

CPU_DEVICE_KIND = "cpu"  # device_kind of JAX's CPU devices: a workload measured on this machine's CPU
_PROBE = "import jax; d = jax.devices()[0]; print(jax.default_backend()); print(d.device_kind)"


@dataclasses.dataclass(frozen=True)
class Device:
    platform: str  # jax.default_backend(): cpu, tpu, gpu
    kind: str  # jax.devices()[0].device_kind, e.g. "TPU v6 lite" or "cpu"


@functools.lru_cache(maxsize=1)
def probe_device(timeout_s: float = 300.0) -> Device:
    """The platform and device kind of device 0, read in a child process (cached)."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=timeout_s, check=True
        )
    except subprocess.CalledProcessError as exc:
        tail = (exc.stderr or "").strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"could not read this machine's JAX device: {tail[0]}") from None
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"reading this machine's JAX device took over {timeout_s:g} s") from None
    platform, kind = done.stdout.strip().splitlines()[-2:]
    return Device(platform, kind)
