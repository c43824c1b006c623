"""Progress of long commands that still shows when stderr is not a terminal.

Rich draws bars and spinners live only on a terminal. Under ``nohup``, systemd, CI or ``2> log`` a
:class:`rich.progress.Progress` prints its last state when it ends and nothing before, so an hour of
``tiletune bench search --record`` or a tune on a TPU VM looks hung. Off a terminal the helpers here print
plain lines instead: a bar's row every tenth of its total, when its total changes (a new phase), when one
of its named fields changes (a job's state), at least once a minute, and once more when it stops if its
last line is not its final state (in place of Rich's own final print, which would repeat that line); a
status's message when it changes, at most one every few seconds. On a terminal they are Rich's own,
unchanged.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import Progress, ProgressColumn, TaskID

from server.cli.common import FILE_WIDTH

LINE_EVERY_S = 60.0  # the longest a bar stays silent off a terminal
STEPS = 10  # off a terminal a bar prints a line each time it passes another 1/STEPS of its total
STATUS_EVERY_S = 5.0  # off a terminal, the least time between two status lines


class LoggedProgress(Progress):
    """A Rich progress that, when its console is not a terminal, prints the task's row as a line at the
    moments the module docstring names (``phase_fields``: the fields whose change is worth a line)."""

    def __init__(
        self,
        *columns: str | ProgressColumn,
        console: Console,
        phase_fields: tuple[str, ...] = (),
        every_s: float = LINE_EVERY_S,
        steps: int = STEPS,
        clock: Callable[[], float] = time.monotonic,
        **options: Any,
    ) -> None:
        logged = not console.is_terminal
        # Transient off a terminal: Rich then skips its final print; stop() prints the final state once.
        super().__init__(*columns, console=console, **{**options, "transient": options.get("transient") or logged})
        self._logged = logged
        self._phase_fields = phase_fields
        self._every_s = every_s
        self._steps = steps
        self._clock = clock
        # per task: when its last line was printed, and the step, total, phase and completed it showed
        self._last: dict[TaskID, tuple[float, int, float | None, tuple[Any, ...], float]] = {}

    def update(self, task_id: TaskID, **kwargs: Any) -> None:
        super().update(task_id, **kwargs)
        if self._logged:
            self._maybe_line(task_id)

    def stop(self) -> None:
        if not self._logged:
            super().stop()
            return
        if self.live.is_started:
            for task_id in list(self._tasks):
                self._maybe_line(task_id, final=True)
        # Not Progress.stop: off a terminal it prints a blank line after the final print it no longer makes.
        self.live.stop()

    def _maybe_line(self, task_id: TaskID, final: bool = False) -> None:
        with self._lock:
            task = self._tasks[task_id]
            total, completed = task.total, task.completed
            step = int(completed * self._steps // total) if total else 0
            phase = tuple(task.fields.get(f) for f in self._phase_fields)
        now = self._clock()
        last = self._last.get(task_id)
        if last is not None:
            at, last_step, last_total, last_phase, last_completed = last
            changed = step != last_step or total != last_total or phase != last_phase
            if final:
                changed = changed or completed != last_completed
            if not changed and (final or now - at < self._every_s):
                return
        self._last[task_id] = (now, step, total, phase, completed)
        # A log line is not a screen row: rendered FILE_WIDTH wide (Rich caps a print at the console's
        # width, 80 off a terminal), so the stage text is not cut short, then written unwrapped.
        buffer = io.StringIO()
        Console(file=buffer, width=FILE_WIDTH, color_system=None, force_terminal=False).print(
            self.make_tasks_table([task])
        )
        line = buffer.getvalue().rstrip()
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)


class _StatusLines:
    """Off a terminal, a status's messages as lines: each new one, at most one per ``every_s``."""

    def __init__(self, console: Console, every_s: float, clock: Callable[[], float]) -> None:
        self._console = console
        self._every_s = every_s
        self._clock = clock
        self._last: tuple[float, str] | None = None

    def update(self, message: str) -> None:
        now = self._clock()
        if self._last is not None and (message == self._last[1] or now - self._last[0] < self._every_s):
            return
        self._last = (now, message)
        self._console.print(message, markup=False, highlight=False)


@contextmanager
def status(
    console: Console, message: str, every_s: float = STATUS_EVERY_S, clock: Callable[[], float] = time.monotonic
) -> Iterator[Any]:
    """``console.status(message)`` on a terminal; elsewhere an object whose ``update(message)`` prints lines."""
    if console.is_terminal:
        with console.status(message) as live:
            yield live
        return
    lines = _StatusLines(console, every_s, clock)
    lines.update(message)
    yield lines
