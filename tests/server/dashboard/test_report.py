"""`tiletune report`: an HTML file and real PNGs of the expected sizes, from a seeded database."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from server.cli import app as cli
from server.dashboard import catalog, figures
from server.store import workloads
from server.store.db import Database
from server.store.migrate import upgrade
from tests.images import png_size
from tests.seeding import Seeded, seed_tuned_workload

runner = CliRunner()


@pytest.fixture
def seeded_db(tmp_path: Path) -> tuple[str, Seeded]:
    url = f"sqlite:///{tmp_path / 'report.db'}"
    upgrade(url)
    db = Database(url)
    seeded = seed_tuned_workload(db)
    db.dispose()
    return url, seeded


def expected_sizes(url: str, key: str) -> dict[str, tuple[int, int]]:
    db = Database(url)
    with db.transaction() as session:
        row = workloads.find_workload(session, key)
        assert row is not None
        record = figures.TuningRecord.load(session, row)
    db.dispose()
    variants, layouts = 2, 2  # the seeded trials' facets
    assert catalog.heatmap_size(record) == (
        catalog.HEATMAP_PANEL[0] * layouts + catalog.HEATMAP_EXTRA[0],
        catalog.HEATMAP_PANEL[1] * variants + catalog.HEATMAP_EXTRA[1],
    )
    classes = 2  # cpu-demo: spatial and temporal heads
    assert catalog.blockmap_size(record) == (
        catalog.BLOCKMAP_PANEL[0] * 2 + catalog.BLOCKMAP_EXTRA[0],
        catalog.BLOCKMAP_PANEL[1] * classes + catalog.BLOCKMAP_EXTRA[1],
    )
    return {
        "history": catalog.HISTORY_SIZE,
        "heatmap": catalog.heatmap_size(record),
        "blockmap": catalog.blockmap_size(record),
        "speedup": catalog.SPEEDUP_SIZE,
    }


def test_report_writes_html_and_pngs(seeded_db: tuple[str, Seeded], tmp_path: Path) -> None:
    url, seeded = seeded_db
    out = tmp_path / "report"
    result = runner.invoke(cli, ["report", "--workload", seeded.key, "--out", str(out), "--database-url", url])
    assert result.exit_code == 0, result.output
    html = (out / "index.html").read_text()
    assert seeded.key in html and seeded.winner.describe() in html
    for name, size in expected_sizes(url, seeded.key).items():
        png = out / f"{name}.png"
        assert png_size(png.read_bytes()) == size, name
        assert f'src="{name}.png"' in html
    # Every trial is listed, failures with their error text.
    assert len(re.findall(r"<tr>\s*<td class=\"num\">", html)) == seeded.trials
    assert "child killed by SIGKILL" in html and "status-wrong" in html


def test_report_by_preset_and_embedded(seeded_db: tuple[str, Seeded], tmp_path: Path) -> None:
    """--preset picks the workload of that preset that has a tuned config; --embed makes one file."""
    url, seeded = seeded_db
    out = tmp_path / "one-file"
    result = runner.invoke(cli, ["report", "--preset", "cpu-demo", "--embed", "--out", str(out), "--database-url", url])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["index.html"]
    html = (out / "index.html").read_text()
    assert seeded.key in html
    assert seeded.other_key in result.output  # the other cpu-demo workload is named, not chosen
    assert html.count('src="data:image/png;base64,') == 4


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workload", "xyz"], "--workload: 'xyz' is not a workload key"),
        (["--workload", "0" * 32], "--workload: no workload with key"),
        (["--preset", "nope"], "--preset: unknown preset 'nope'"),
        (["--preset", "wan2.1-720p"], "--preset: no workload of preset 'wan2.1-720p'"),
        (["--preset", "cpu-demo", "--device-kind", "TPU v6 lite"], "on device kind 'TPU v6 lite'"),
    ],
)
def test_report_bad_input(seeded_db: tuple[str, Seeded], tmp_path: Path, args: list[str], message: str) -> None:
    url, _ = seeded_db
    result = runner.invoke(cli, ["report", *args, "--out", str(tmp_path / "r"), "--database-url", url])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "r").exists()


def test_report_needs_exactly_one_workload(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    assert runner.invoke(cli, ["report", "--database-url", url]).exit_code == 2
    both = runner.invoke(cli, ["report", "--workload", "0" * 32, "--preset", "cpu-demo", "--database-url", url])
    assert both.exit_code == 2


def test_report_on_an_unmigrated_database(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    result = runner.invoke(cli, ["report", "--workload", "0" * 32, "--database-url", url])
    assert result.exit_code == 2
    assert "--database-url: cannot read tiletune's tables" in " ".join(result.output.split())
