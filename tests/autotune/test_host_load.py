"""What other programs used while the winner and its anchors were timed (autotune.host_load): the
machine's busy time less this process tree's, in cores."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from autotune import measure
from autotune.host_load import OtherLoad, Snapshot, core_busy, other_cores, snapshot


def _fake_proc(root: Path, cpu: list[int], procs: Mapping[int, tuple[int, ...]]) -> Path:
    """A /proc with a ``cpu`` line and ``pid -> (ppid, utime, stime[, cutime, cstime])`` processes."""
    root.mkdir(exist_ok=True)
    (root / "stat").write_text("cpu  " + " ".join(map(str, cpu)) + "\ncpu0 1 2 3\n")
    for pid, (ppid, utime, stime, *waited) in procs.items():
        (root / str(pid)).mkdir(exist_ok=True)
        cutime, cstime = waited or (0, 0)
        rest = ["S", ppid, *[0] * 9, utime, stime, cutime, cstime, 20]
        (root / str(pid) / "stat").write_text(f"{pid} (a (strange) name) " + " ".join(map(str, rest)) + "\n")
    (root / "self").mkdir(exist_ok=True)  # not a pid: skipped
    return root


def test_the_machine_busy_time_and_the_process_tree_are_read_from_proc(tmp_path: Path) -> None:
    # user nice system idle iowait irq softirq steal: busy = 50 + 5 + 20 + 3 + 2 = 80 (idle, iowait, steal not)
    cpu = [50, 5, 20, 1000, 40, 3, 2, 7, 0, 0]
    # 100 -> 101 -> 102 is the tree; 200 and its child 201 are another program's.
    procs = {100: (1, 10, 5), 101: (100, 30, 2), 102: (101, 4, 4), 200: (1, 99, 1), 201: (200, 7, 7)}
    found = snapshot(_fake_proc(tmp_path, cpu, procs), root=100)
    assert found is not None and (found.machine_busy, found.own) == (80, 55)
    assert snapshot(tmp_path / "missing", root=100) is None


def test_the_time_of_children_that_ended_stays_the_trees(tmp_path: Path) -> None:
    cpu = [50, 5, 20, 1000, 40, 3, 2, 7, 0, 0]
    # 101 ended and 100 waited for it: its 32 jiffies are now 100's cutime + cstime (30 + 2).
    before = snapshot(_fake_proc(tmp_path / "a", cpu, {100: (1, 10, 5), 101: (100, 30, 2)}), root=100)
    after = snapshot(_fake_proc(tmp_path / "b", cpu, {100: (1, 10, 5, 30, 2)}), root=100)
    assert before is not None and after is not None and before.own == after.own == 47


def test_other_cores_is_the_busy_time_not_ours_per_second() -> None:
    before, after = Snapshot(1000, 300, 10.0), Snapshot(1450, 400, 12.0)  # 450 busy jiffies, 100 ours, 2 s
    assert other_cores(before, after, ticks_per_s=100) == pytest.approx(1.75)
    assert other_cores(before, Snapshot(1050, 400, 12.0), 100) == 0.0  # readings not simultaneous: never negative
    assert other_cores(before, Snapshot(2000, 300, 10.0), 100) == 0.0  # no time passed


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads Linux /proc")
def test_a_busy_program_outside_the_process_tree_is_seen() -> None:
    # The shell exits at once, so the loop is re-parented away from this process tree: another program.
    loop = f"{sys.executable} -c 'import time; end = time.time() + 4\nwhile time.time() < end: pass'"
    pid = int(subprocess.run(["sh", "-c", f"{loop} >/dev/null 2>&1 & echo $!"], capture_output=True).stdout)
    try:
        time.sleep(0.2)
        with OtherLoad() as load:
            time.sleep(1.5)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    assert load.cores is not None and load.cores >= 0.4, load.cores


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads Linux /proc")
def test_a_child_that_ends_while_watched_keeps_its_time_in_the_tree() -> None:
    # A child of ours burns a second of CPU and is waited for between two snapshots (as the measuring
    # process is when the winner's anchors move to a fresh one). The tree's time must not drop by the
    # child's: that drop is what OtherLoad would count as other programs' (it read 1.97 cores on a
    # quiet machine). Compared on the tree alone, so other programs running meanwhile do not matter.
    busy = "import time; end = time.process_time() + 1.0\nwhile time.process_time() < end: pass\ninput()"
    child = subprocess.Popen([sys.executable, "-c", busy], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _cpu_seconds(child.pid) < 1.0:
            time.sleep(0.05)
        before = snapshot()
        child.communicate(b"\n", timeout=30)
        after = snapshot()
    finally:
        child.kill()
    assert before is not None and after is not None
    ticks = os.sysconf("SC_CLK_TCK")
    assert after.own >= before.own - 0.1 * ticks, (before.own, after.own)  # the child's ~1 s stays in


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_each_cores_busy_share_is_read_from_its_cpu_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "proc"
    root.mkdir()
    lines = iter(
        [
            # user nice system idle iowait: core 0 busy 100 of 200 jiffies between the readings, core 1 none
            "cpu  0 0 0 0 0\ncpu0 100 0 0 100 0\ncpu1 10 0 0 500 0\n",
            "cpu  0 0 0 0 0\ncpu0 180 0 20 200 0\ncpu1 10 0 0 700 0\n",
        ]
    )

    def advance(_: float) -> None:
        (root / "stat").write_text(next(lines))

    advance(0)
    monkeypatch.setattr("autotune.host_load.time.sleep", advance)
    assert core_busy(0.2, proc=root) == {0: pytest.approx(0.5), 1: 0.0}
    assert core_busy(0.2, proc=tmp_path / "missing") == {}


@pytest.mark.parametrize("busy", [{0: 0.9, 1: 0.02}, {0: 0.01, 1: 1.0}])
def test_the_measuring_core_is_the_quietest_unless_one_is_named(
    busy: dict[int, float], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second worker's measuring child does not time on the core the first one is timing on."""
    pinned: list[set[int]] = []
    monkeypatch.setattr(measure.os, "sched_getaffinity", lambda _pid: {0, 1})
    monkeypatch.setattr(measure.os, "sched_setaffinity", lambda _pid, cores: pinned.append(set(cores)))
    monkeypatch.setattr(measure, "core_busy", lambda: busy)
    quietest = min(busy, key=lambda c: busy[c])
    assert measure.pin_one_core() == quietest and pinned[-1] == {quietest}
    assert measure.pin_one_core(1 - quietest) == 1 - quietest and pinned[-1] == {1 - quietest}
    with pytest.raises(ValueError, match="core 5"):
        measure.pin_one_core(5)
