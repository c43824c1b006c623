"""Long commands show their progress when stderr is a file, not only on a terminal."""

from __future__ import annotations

import io

from rich.console import Console
from rich.progress import MofNCompleteColumn, TextColumn

from server.cli.progress import LoggedProgress, status


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def console(terminal: bool) -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=terminal, width=50), buffer


def lines_while_running(terminal: bool) -> list[str]:
    """Drive a 100-step bar with a state field, as `tiletune up` does, and keep what it printed before it ended."""
    con, buffer = console(terminal)
    clock = Clock()
    bar = LoggedProgress(
        TextColumn("{task.fields[state]}"),
        MofNCompleteColumn(),
        console=con,
        phase_fields=("state",),
        every_s=60.0,
        clock=clock,
        auto_refresh=False,  # on a terminal Rich draws only when asked: nothing of its own mid-run
    )
    with bar:
        task = bar.add_task("job", total=100, state="queued")
        bar.update(task, completed=0, state="queued")
        bar.update(task, completed=0, state="running")  # a new state: a line
        for done in range(1, 35):  # 10, 20, 30: a line each
            bar.update(task, completed=done)
        clock.now = 61.0  # a minute without a tenth: a line anyway
        bar.update(task, completed=35)
        bar.update(task, completed=36)  # neither: silent
        bar.update(task, total=200, completed=36)  # a new total (a new phase): a line
        long_state = "checked compact q256 kv128 temporal_major align=frame by_pattern"
        bar.update(task, completed=100, state=long_state)  # logged whole, not cut to the console's 50 columns
        printed = buffer.getvalue()
    return printed.splitlines()


def test_off_a_terminal_a_bar_prints_a_line_per_tenth_phase_and_minute() -> None:
    lines = lines_while_running(terminal=False)
    assert [line.split() for line in lines] == [
        ["queued", "0/100"],
        ["running", "0/100"],
        ["running", "10/100"],
        ["running", "20/100"],
        ["running", "30/100"],
        ["running", "35/100"],
        ["running", "36/200"],
        ["checked", "compact", "q256", "kv128", "temporal_major", "align=frame", "by_pattern", "100/200"],
    ]


def test_off_a_terminal_a_bar_ends_on_its_final_state_printed_once() -> None:
    """Rich's own final print off a terminal would repeat the last line; the bar prints the final state
    itself, once, and only when its last line did not already show it."""
    con, buffer = console(terminal=False)
    bar = LoggedProgress(MofNCompleteColumn(), console=con, clock=Clock())
    with bar:
        task = bar.add_task("trials", total=40)
        for done in range(1, 38):  # 1/40, then each tenth to 36/40; 37/40 not (the same tenth)
            bar.update(task, completed=done)
    assert buffer.getvalue().endswith("\n36/40\n37/40\n")

    con, buffer = console(terminal=False)
    bar = LoggedProgress(MofNCompleteColumn(), console=con, clock=Clock())
    with bar:
        task = bar.add_task("trials", total=40)
        for done in range(1, 41):
            bar.update(task, completed=done)
    assert buffer.getvalue().endswith("\n36/40\n40/40\n")


def test_on_a_terminal_the_bar_is_rich_s_own() -> None:
    lines = lines_while_running(terminal=True)
    assert not any("10/100" in line or "36/200" in line for line in lines)


def test_off_a_terminal_a_status_prints_new_messages_at_most_every_few_seconds() -> None:
    con, buffer = console(terminal=False)
    clock = Clock()
    with status(con, "benchmarking", every_s=5.0, clock=clock) as line:
        line.update("round 1/10")  # too soon after the first: dropped
        clock.now = 6.0
        line.update("round 2/10")
        clock.now = 20.0
        line.update("round 2/10")  # the same message: dropped
        line.update("round [3]/10")  # printed as given, not read as markup
    assert buffer.getvalue().splitlines() == ["benchmarking", "round 2/10", "round [3]/10"]
