"""``tiletune bench kernel`` runs end to end and reports what the issue asks for."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kernel.layout import VideoLayout
from server.bench.kernel import bench_block_tables, parse_heads
from server.cli import app

runner = CliRunner()


def test_bench_kernel_json_report() -> None:
    result = runner.invoke(
        app,
        [
            "bench",
            "kernel",
            "--preset",
            "cpu-demo",
            "--frames",
            "2",
            "--tokens-per-frame",
            "64",
            "--heads",
            "spatial:0x1,temporal:3x2",
            "--blocks",
            "32",
            "--repeats",
            "1",
            "--rounds",
            "6",
            "--tables",
            "",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["shape"] == [1, 3, 128, 64]
    # spatial own-frame over 2 frames: 1/2; temporal +-3 over 64 positions: (7*64 - 12) * 2 * 2 / 128**2
    assert report["density"] == pytest.approx((0.5 + 2 * (7 * 64 - 12) * 4 / 128**2) / 3)
    assert {r["config"]["variant"] for r in report["configs"]} == {"naive", "compact"}
    # Every callable was timed once per round, in interleaved rounds.
    timings = [report["dense"], *report["tiled_dense"].values(), *report["configs"]]
    timings += [report["temporal_layout"][lay] for lay in ("frame_major", "temporal_major")]
    assert [t["runs"] for t in timings] == [6] * len(timings)
    for t in timings:
        assert t["p10_ms"] <= t["median_ms"] <= t["p90_ms"]
        # The report rounds each figure to 4 decimals: the spread lies where the unrounded ms allow it.
        width, median, half = t["p90_ms"] - t["p10_ms"], t["median_ms"], 5e-5
        low, high = (width - 2 * half) / (median + half), (width + 2 * half) / (median - half)
        assert low - half <= t["spread"] <= high + half, t
    for r in report["configs"]:
        assert r["correct"] and r["max_error"] <= 2e-5
        assert 0 < r["tile_density"] <= 1 and r["tiles"]["full"] + r["tiles"]["partial"] > 0
        # The ratios are the anchors' medians over the config's, from the same rounds.
        tiled = report["tiled_dense"][str(r["config"]["block_q"])]
        assert r["speedup"] == pytest.approx(report["dense"]["median_ms"] / r["median_ms"], rel=2e-3)
        assert r["speedup_vs_tiled_dense"] == pytest.approx(tiled["median_ms"] / r["median_ms"], rel=2e-3)
        assert 0 <= r["speedup_p_value"] <= 1 and 0 <= r["speedup_vs_tiled_dense_p_value"] <= 1
    layout = report["temporal_layout"]
    assert layout["heads"] == 2
    assert layout["permutation_speedup"] == pytest.approx(
        layout["frame_major"]["median_ms"] / layout["temporal_major"]["median_ms"], rel=2e-3
    )


def test_bench_refuses_interpret_timing_and_bad_options() -> None:
    result = runner.invoke(app, ["bench", "kernel", "--backend", "interpret", "--tables", ""])
    assert result.exit_code == 2 and "correctness only" in result.output
    result = runner.invoke(app, ["bench", "kernel", "--variants", "fastest"])
    assert result.exit_code == 2 and "unknown variant" in result.output
    result = runner.invoke(app, ["bench", "kernel", "--blocks", "0,128"])
    assert result.exit_code == 2 and "must be >= 1" in result.output


def test_parse_heads() -> None:
    layout = VideoLayout(4, 16)
    pattern = parse_heads("spatial:1x2, temporal:3+sinkx1,densex1", layout)
    assert [h.describe() for h in pattern.heads] == [
        "spatial(window_frames=1)",
        "spatial(window_frames=1)",
        "temporal(window_positions=3)+sink",
        "dense",
    ]
    for bad in ("spatial:1", "causal:1x2", "spatial:ax1", "spatial:9x1"):
        with pytest.raises(ValueError):
            parse_heads(bad, layout)


def test_block_table_bench_on_a_real_preset() -> None:
    report = bench_block_tables("wan2.1-480p")
    assert report["heads"] == 40 and report["seq_len"] == 32760
    for run in report["runs"]:
        assert run["build_ms"] > 0 and run["peak_mb"] < 500
        assert run["full"] + run["partial"] + run["empty"] == run["tiles"]


def test_presets_command_lists_every_preset() -> None:
    result = runner.invoke(app, ["presets"])
    assert result.exit_code == 0
    for name in ("wan2.1-720p", "cpu-demo", "cogvideox-5b"):
        assert name in result.stdout
