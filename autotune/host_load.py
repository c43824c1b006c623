"""How much of this machine other programs used while something was timed.

Timing a CPU backend on one core in CPU time (:mod:`autotune.measure`) keeps a
competing process's turns on that core out of the figures, but not its effect on
what the core shares: on a 2-core VM a busy loop on the *other* core slowed
cpu-demo's compute-bound tiled kernel by 26% in CPU time and the memory-bound
dense anchor by 3%, so a speedup over dense measured under load reads low. No
clock corrects that; what can be done is to say it. :class:`OtherLoad` reads the
machine's busy time (``/proc/stat``) and this process tree's own CPU time over an
interval: the difference is what everything else used, in cores. Linux only;
elsewhere it reports nothing.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Self

PROC = Path("/proc")
BUSY_ABOVE_CORES = 0.25  # other programs using more than this while anchors were timed: the figures say so


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """Machine busy jiffies, this process tree's jiffies, and the wall clock at one instant."""

    machine_busy: int
    own: int
    wall: float


def _machine_busy(proc: Path) -> int:
    fields = [int(x) for x in (proc / "stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    steal = fields[7] if len(fields) > 7 else 0  # another VM's time, not this machine's programs
    return sum(fields[:8]) - idle - steal


def process_table(proc: Path = PROC) -> dict[int, tuple[int, list[str]]]:
    """Every process of this machine: pid -> (parent pid, its ``stat`` fields after the name; the
    name may hold spaces and parentheses). A process that ends while it is read is left out."""
    table: dict[int, tuple[int, list[str]]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        table[int(entry.name)] = (int(fields[1]), fields)
    return table


def process_tree(root: int, table: dict[int, tuple[int, list[str]]]) -> set[int]:
    """``root`` and its descendants in ``table`` (empty when ``root`` is not in it)."""
    if root not in table:
        return set()
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, (ppid, _) in table.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier.extend(children)
    return tree


def _tree_jiffies(proc: Path, root: int) -> int:
    """CPU time of ``root``'s tree: utime + stime of it and every live descendant, and cutime + cstime
    of each (its children that ended and were waited for). Without the latter a child that ends while
    it is watched, like a measuring process replaced by a fresh one, takes all the CPU time it ever
    used out of the tree's total, and that time would be counted as other programs'."""
    table = process_table(proc)
    return sum(sum(int(x) for x in table[pid][1][11:15]) for pid in process_tree(root, table))


def snapshot(proc: Path = PROC, root: int | None = None) -> Snapshot | None:
    """The machine's and this process tree's CPU jiffies now; None where ``/proc`` cannot tell."""
    try:
        return Snapshot(_machine_busy(proc), _tree_jiffies(proc, root or os.getpid()), time.monotonic())
    except (OSError, ValueError, IndexError):
        return None


def other_cores(before: Snapshot, after: Snapshot, ticks_per_s: float) -> float:
    """Cores other programs kept busy on average between two snapshots (never below 0: the two
    readings are not taken at the same instant)."""
    seconds = after.wall - before.wall
    if seconds <= 0:
        return 0.0
    others = (after.machine_busy - before.machine_busy) - (after.own - before.own)
    return max(0.0, others / ticks_per_s / seconds)


def _core_jiffies(proc: Path) -> dict[int, tuple[int, int]]:
    """core -> (busy, total) jiffies, from the ``cpuN`` lines of ``/proc/stat``."""
    out = {}
    for line in (proc / "stat").read_text().splitlines()[1:]:
        name, *rest = line.split()
        if not (name.startswith("cpu") and name[3:].isdigit()):
            continue
        fields = [int(x) for x in rest[:8]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        out[int(name[3:])] = (sum(fields) - idle, sum(fields))
    return out


def core_busy(interval_s: float = 0.2, proc: Path = PROC) -> dict[int, float]:
    """Busy share (0-1) of each core over ``interval_s``; empty where ``/proc/stat`` cannot tell. Used to
    measure on the quietest core: the one another worker's measuring child is not already timing on."""
    try:
        before = _core_jiffies(proc)
        time.sleep(interval_s)
        after = _core_jiffies(proc)
    except (OSError, ValueError, IndexError):
        return {}
    busy = {}
    for core, (b1, t1) in after.items():
        b0, t0 = before.get(core, (b1, t1))
        busy[core] = (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0
    return busy


class OtherLoad:
    """``with OtherLoad() as load: ...`` then ``load.cores``: what other programs used meanwhile
    (None where it cannot be read)."""

    def __init__(self, proc: Path = PROC) -> None:
        self.proc = proc
        self.cores: float | None = None
        self._before: Snapshot | None = None

    def __enter__(self) -> Self:
        self._before = snapshot(self.proc)
        return self

    def __exit__(self, *exc: object) -> None:
        after = snapshot(self.proc)
        if self._before is not None and after is not None:
            self.cores = other_cores(self._before, after, float(os.sysconf("SC_CLK_TCK")))
