"""Off a TPU host, loading libtpu prints no error: :func:`kernel.tpu_targets.quiet_libtpu_off_tpu`.

Without it, every process that loads libtpu here (a compile-only target, JAX probing its platforms)
printed an ``INVALID_ARGUMENT`` error about TPU worker hostnames and a "Failed to find host bounds"
warning, though nothing was wrong.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kernel import tpu_targets
from kernel.tpu_targets import (
    LOCAL_LIBTPU_ENV,
    TPU_EXTRA_HINT,
    libtpu_installed,
    quiet_libtpu_off_tpu,
    tpu_possibly_attached,
)
from server.cli import app as cli

LIBTPU_NOISE = ("INVALID_ARGUMENT", "host bounds", "could not determine TPU")
HOST_VARS = ("TPU_WORKER_HOSTNAMES", "TPU_HOST_BOUNDS", "TPU_ACCELERATOR_TYPE")


def fake_pci(root: Path, vendors: list[str]) -> Path:
    """A directory laid out as /sys/bus/pci/devices, one device per vendor id."""
    for i, vendor in enumerate(vendors):
        device = root / f"0000:00:0{i}.0"
        device.mkdir(parents=True)
        (device / "vendor").write_text(vendor + "\n")
    return root


def fake_dev(root: Path, files: list[str]) -> Path:
    """A directory laid out as /dev holding ``files`` (paths relative to it)."""
    root.mkdir(parents=True)
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).touch()
    return root


def test_a_host_without_google_devices_is_told_it_is_one_local_worker(tmp_path: Path) -> None:
    env: dict[str, str] = {"PATH": "/bin"}
    pci, dev = fake_pci(tmp_path / "pci", ["0x8086", "0x1af4"]), fake_dev(tmp_path / "dev", ["null", "vfio/vfio"])
    assert quiet_libtpu_off_tpu(env, pci, dev) == LOCAL_LIBTPU_ENV
    assert env == {"PATH": "/bin", "TPU_WORKER_HOSTNAMES": "localhost", "TPU_HOST_BOUNDS": "1,1,1"}


def test_a_host_with_a_google_device_is_left_alone(tmp_path: Path) -> None:
    """A TPU VM's chips (or a GCE VM's virtual NIC) share the vendor id: libtpu must read the real slice."""
    env: dict[str, str] = {}
    pci, dev = fake_pci(tmp_path / "pci", ["0x8086", "0x1ae0"]), fake_dev(tmp_path / "dev", [])
    assert quiet_libtpu_off_tpu(env, pci, dev) == {}
    assert env == {}


@pytest.mark.parametrize("chip", ["accel0", "vfio/0"])
def test_a_host_with_a_tpu_device_file_is_left_alone(chip: str, tmp_path: Path) -> None:
    """Where the PCI devices cannot be read (a container), a TPU's device files still tell."""
    env: dict[str, str] = {}
    pci, dev = fake_pci(tmp_path / "pci", []), fake_dev(tmp_path / "dev", [chip])
    assert tpu_possibly_attached(pci, dev)
    assert quiet_libtpu_off_tpu(env, pci, dev) == {}
    assert env == {}


@pytest.mark.parametrize("name", HOST_VARS)
def test_a_slice_the_user_described_is_left_alone(name: str, tmp_path: Path) -> None:
    env = {name: "v5litepod-8" if name == "TPU_ACCELERATOR_TYPE" else "host-a,host-b"}
    assert quiet_libtpu_off_tpu(env, fake_pci(tmp_path / "pci", []), fake_dev(tmp_path / "dev", [])) == {}
    assert env == {name: env[name]}


def test_every_command_quiets_libtpu_before_it_runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in HOST_VARS:  # set, then deleted: so the test's end restores each as it was, absent ones absent
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setattr(tpu_targets, "PCI_DEVICES", fake_pci(tmp_path / "pci", ["0x10de"]))
    monkeypatch.setattr(tpu_targets, "DEVICE_FILES", fake_dev(tmp_path / "dev", ["null"]))
    result = CliRunner().invoke(cli, ["presets"])
    assert result.exit_code == 0, result.output
    assert {name: os.environ.get(name) for name in LOCAL_LIBTPU_ENV} == LOCAL_LIBTPU_ENV


@pytest.mark.skipif(not libtpu_installed(), reason=f"libtpu (the TPU compiler) is not installed: {TPU_EXTRA_HINT}")
@pytest.mark.skipif(
    tpu_possibly_attached(), reason="this host may have a TPU (a Google PCI device or a TPU's device file)"
)
def test_a_compile_only_target_loads_libtpu_without_an_error_here() -> None:
    env = {k: v for k, v in os.environ.items() if k not in HOST_VARS}
    code = "from kernel.tpu_targets import target_device; print(target_device('v6e').device_kind)"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "TPU v6 lite"
    assert not [line for line in done.stderr.splitlines() if any(n in line for n in LIBTPU_NOISE)], done.stderr
