"""Stop signals are acted on outside the signal handler (:mod:`server.cli.signals`).

A handler that set a ``threading.Event`` deadlocked when a signal came while the main thread held the
event's lock (in ``Event.wait``, or in an earlier handler): ``tiletune up`` hung for good after two
SIGTERMs. The tests that reproduce it run in a child process with a timeout, so a deadlock fails a test
instead of hanging the suite.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.replay import bundled_table
from kernel.tpu_targets import TPU_EXTRA_HINT, libtpu_installed
from server.cli import app as cli
from server.cli.signals import SignalRelay

TABLE = bundled_table("cpu-demo.xla.json")

HELD = textwrap.dedent(
    """
    import os, signal, threading, time
    {setup}
    cond = threading.Condition(threading.Lock())  # as a threading.Event holds: its lock is not reentrant
    state = {{"stopped": False}}

    def on_signal(signum, *_):
        with cond:
            state["stopped"] = True
            cond.notify_all()

    {install}
    with cond:  # the main thread holds the lock (as inside Event.wait) when the signal arrives
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)  # Python runs the handler at the next bytecode boundary: still inside this block
        stopped = cond.wait_for(lambda: state["stopped"], timeout=10)
    print("stopped" if stopped else "not stopped", flush=True)
    """
)


def run_held(setup: str, install: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    code = HELD.format(setup=setup, install=install)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s)


def test_a_stop_signal_while_the_main_thread_holds_the_lock_gets_through() -> None:
    done = run_held("from server.cli.signals import SignalRelay", "SignalRelay(on_signal)", 60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopped"


def test_the_same_signal_deadlocks_a_handler_that_takes_the_lock() -> None:
    """What the relay is for, and why the test above can fail: the callback run as the handler itself
    waits for a lock its own thread holds, for good (killed at the timeout)."""
    install = "signal.signal(signal.SIGTERM, on_signal)"
    with pytest.raises(subprocess.TimeoutExpired):
        run_held("", install, 5)


def test_signals_reach_the_callback_in_order_and_close_restores_the_handlers() -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    seen: list[int] = []
    arrived = threading.Event()

    def on_signal(signum: int) -> None:
        seen.append(signum)
        if len(seen) == 3:
            arrived.set()

    with SignalRelay(on_signal):
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGTERM):
            os.kill(os.getpid(), s)
            time.sleep(0.01)  # one at a time: the same signal twice before it is handled counts once
        assert arrived.wait(10), seen
    assert seen == [signal.SIGTERM, signal.SIGINT, signal.SIGTERM]
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_failing_callback_does_not_end_the_relay(capfd: pytest.CaptureFixture[str]) -> None:
    seen: list[int] = []
    second = threading.Event()

    def on_signal(signum: int) -> None:
        seen.append(signum)
        if len(seen) == 1:
            raise RuntimeError("first one fails")
        second.set()

    with SignalRelay(on_signal, (signal.SIGTERM,)):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)
        assert second.wait(10), seen
    assert "first one fails" in capfd.readouterr().err


@pytest.mark.parametrize("compile_only", [False, True])
def test_a_worker_run_in_process_gives_the_signals_back(compile_only: bool, tmp_path: Path) -> None:
    """`tiletune worker` relays SIGINT/SIGTERM while it runs and restores the caller's handlers when it ends."""
    if compile_only and not libtpu_installed():
        pytest.skip(f"the compile worker needs libtpu: {TPU_EXTRA_HINT}")
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    url = f"sqlite:///{tmp_path / 'tiletune.db'}"
    mode = ["--compile-only"] if compile_only else ["--backend", "replay", "--replay-table", str(TABLE)]
    result = CliRunner().invoke(cli, ["worker", *mode, "--exit-when-idle", "--poll", "0.05", "--database-url", url])
    assert result.exit_code == 0, result.output
    assert "stopped after 0" in result.output
    assert {s: signal.getsignal(s) for s in before} == before
