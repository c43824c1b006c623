"""``tiletune bench compile``: the report, the sample and the disagreement table.

The compiler is replaced by a stand-in with known verdicts (real compiles of a preset's
512-row tiles take seconds each; tests/autotune/test_compile_gate.py compiles for real).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from autotune.compile_gate import GateVerdict
from kernel.config import TileConfig
from kernel.tpu_compile import CompileOutcome
from kernel.workload import Workload
from server.bench import compile as bench
from server.cli import app


def fake_gate(workload: Workload, config: TileConfig, target: str | None = None) -> GateVerdict:
    """The compiler's stand-in: refuses SMEM past 1 MiB like the estimate, but fits VMEM up to
    twice the estimated budget (the direction the real compiler disagrees in)."""
    kind = target or workload.device_kind
    reason = bench.tpu_violation(workload, config, kind)
    if reason is not None and reason.startswith("smem"):
        outcome = CompileOutcome(kind, False, 0.5, 0, cause="smem", error="RESOURCE_EXHAUSTED: ... smem")
    else:
        outcome = CompileOutcome(kind, True, 0.1 * config.block_q / 128, 2, {"argument_size_in_bytes": 1})
    return GateVerdict(config, reason, outcome, {"jax": "x", "jaxlib": "x", "libtpu": "y"})


@pytest.fixture
def fake_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "compile_gate", fake_gate)
    monkeypatch.setattr(bench, "require_libtpu", lambda: None)


def test_sample_takes_half_from_the_estimate_rejected() -> None:
    configs = [TileConfig("compact", 128 * (i + 1), 128) for i in range(10)]
    rejected = {c.key for c in configs[:3]}
    chosen = bench.pick(configs, rejected, 6, seed=0)
    assert len(chosen) == 6 and len({c.key for c in chosen}) == 6
    assert sum(c.key in rejected for c in chosen) == 3
    assert len(bench.pick(configs, rejected, 8, seed=0)) == 8  # the admitted fill what the rejected cannot
    assert bench.pick(configs, rejected, None, seed=0) == configs


def test_bench_compile_reports_causes_and_disagreements(fake_compiler: None, tmp_path: Path) -> None:
    table = tmp_path / "agreement.md"
    result = CliRunner().invoke(
        app,
        ["bench", "compile", "--preset", "cogvideox-5b", "--generation", "v5e,tpu7x", "--sample", "10", "--json",
         "--markdown", str(table)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    reports: list[dict[str, Any]] = [json.loads(chunk) for chunk in _json_chunks(result.stdout)]
    assert [r["generation"] for r in reports] == ["v5e", "tpu7x"]
    for r in reports:
        assert r["compiled"] == 10 and r["space"] > r["estimated_to_fit"] > 0
        assert all(d["estimate"] is not None and d["estimate"].startswith("vmem") for d in r["disagreements"])
        assert sum(r["failures_by_cause"].values()) == r["compiled"] - r["ok"]
    assert any(r["disagreements"] for r in reports)
    text = table.read_text()
    assert "| cogvideox-5b | v5e | 10 |" in text and "estimate refuses, compiler fits" in text
    assert "vmem: estimated" in text


def test_bench_compile_without_libtpu_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kernel.tpu_targets.libtpu_installed", lambda: False)
    result = CliRunner().invoke(app, ["bench", "compile", "--preset", "cogvideox-5b", "--sample", "1"])
    assert result.exit_code == 2
    assert "pip install -e '.[tpu]'" in result.output


def _json_chunks(text: str) -> list[str]:
    """The JSON documents printed one after the other (one per generation)."""
    decoder, out, i = json.JSONDecoder(), [], 0
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        obj, end = decoder.raw_decode(text, i)
        out.append(json.dumps(obj))
        i = end
    return out
