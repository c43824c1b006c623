"""``tiletune bench pipeline``: real compiles for a TPU generation, a replayed device, both modes side by
side, and a compile worker's throughput. Timings are not asserted (a benchmark's job); what each
mode does is: compiling in line, the device waits for every compile."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kernel.tpu_targets import libtpu_installed
from server.bench import pipeline
from server.cli import app
from tests.autotune.test_compile_pool import WORKLOAD

pytestmark = [
    pytest.mark.skipif(
        not libtpu_installed(), reason="libtpu (the TPU compiler) is not installed: pip install -e '.[tpu]'"
    ),
    pytest.mark.slow,
]


def test_bench_pipeline_runs_both_modes_and_a_compile_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    # A small workload of the tpu space (compiles in well under a second) instead of a preset's.
    monkeypatch.setattr(pipeline, "tpu_workload", lambda preset, generation: WORKLOAD)
    argv = ["bench", "pipeline", "--generation", "v5e", "--trials", "3", "--processes", "1", "--lookahead", "1"]
    argv += ["--trial-s", "0", "--rounds", "1", "--worker-configs", "2", "--json"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["device_kind"] == "TPU v5 lite" and report["versions"]["libtpu"]
    inline, pipelined = report["modes"]["inline"], report["modes"]["pipelined"]
    for mode in (inline, pipelined):
        (run,) = mode["runs"]
        assert run["trials"] == 3 and len(run["waits_s"]) == len(run["compile_s"]) == 3
        assert 0 < mode["busy_fraction"] <= 1
    (run,) = inline["runs"]
    # In line, every trial's config starts compiling when the device asks for it: it waits the whole compile.
    assert all(wait >= compile_s for wait, compile_s in zip(run["waits_s"], run["compile_s"], strict=True))
    assert report["same_configs"]  # the random sampler proposes alike whatever the mode
    assert [r["processes"] for r in report["compile_worker"]] == [1, 2]
    assert all(r["verdicts"] == 2 and r["per_minute"] > 0 for r in report["compile_worker"])
