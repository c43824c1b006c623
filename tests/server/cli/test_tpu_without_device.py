"""`tiletune tune|worker --backend tpu` on a machine without a TPU: one line naming the compile-only role."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.device import probe_device
from kernel import tpu_targets
from server.cli import app as cli

runner = CliRunner()


@pytest.fixture(scope="module")
def no_tpu() -> None:
    if probe_device().platform == "tpu":
        pytest.skip("this machine has a TPU: --backend tpu runs here")


@pytest.mark.parametrize("libtpu", [True, False])
@pytest.mark.parametrize("command", [["tune", "--preset", "cpu-demo"], ["worker", "--exit-when-idle"]])
def test_backend_tpu_without_a_tpu_is_one_line_naming_the_compile_only_role(
    no_tpu: None, command: list[str], libtpu: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tpu_targets, "libtpu_installed", lambda: libtpu)
    url = f"sqlite:///{tmp_path / 'tiletune.db'}"
    result = runner.invoke(cli, [*command, "--backend", "tpu", "--database-url", url])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    line = lines[0]
    assert line.startswith(f"error: `tiletune {command[0]} --backend tpu` times configs on a TPU device")
    assert "only compile for TPU, as a compile-only host" in line
    assert "`tiletune worker --compile-only` compiles the configs of queued TPU jobs" in line
    assert "tiletune bench compile" in line
    assert ("pip install -e '.[tpu]'" in line) is not libtpu
    assert "Traceback" not in result.output
