"""Stop signals (SIGINT, SIGTERM) acted on in a thread of their own, never inside the signal handler.

Python runs a signal handler in the main thread between any two bytecodes: also while that thread holds a
lock, and inside an earlier handler. A handler that sets a ``threading.Event`` (whose lock is not
reentrant) deadlocks when the signal lands while the main thread holds that lock, in ``Event.wait`` or in
an earlier handler's ``set``: two signals at once (a Ctrl-C beside a SIGTERM, ``timeout`` forwarding its
SIGTERM beside a ``kill``) left ``tiletune up`` hung for good, its server and worker still running.

:class:`SignalRelay` installs a handler that does nothing in Python; the interpreter's C-level handler
writes each signal's number to a socket (:func:`signal.set_wakeup_fd`), and a relay thread reads it and
calls the callback, where taking locks, printing and setting events are safe.
"""

from __future__ import annotations

import signal
import socket
import threading
import traceback
from collections.abc import Callable, Iterable
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _noted_by_the_wakeup_fd(_signum: int, _frame: FrameType | None) -> None:
    """The Python-level handler: nothing (a Python handler must exist for the C one to write the fd)."""


class SignalRelay:
    """Call ``on_signal(signum)`` in the relay thread for each of ``signals`` this process receives, in
    order, one at a time, from construction until :meth:`close`. Construct it in the main thread."""

    def __init__(self, on_signal: Callable[[int], None], signals: Iterable[signal.Signals] = STOP_SIGNALS) -> None:
        self._on_signal = on_signal
        self._signals = tuple(signals)
        self._read, self._write = socket.socketpair()
        self._write.setblocking(False)  # set_wakeup_fd requires it: the C handler must never block
        self._old_fd = signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)
        self._old = {s: signal.signal(s, _noted_by_the_wakeup_fd) for s in self._signals}
        self._thread = threading.Thread(target=self._relay, name="signal-relay", daemon=True)
        self._thread.start()

    def _relay(self) -> None:
        wanted = {int(s) for s in self._signals}
        while True:
            try:
                data = self._read.recv(64)
            except OSError:
                return
            if not data:  # close() shut the writing end
                return
            for signum in data:
                if signum in wanted:
                    try:
                        self._on_signal(signum)
                    except Exception:  # a failing callback must not end the relay: later signals still count
                        traceback.print_exc()

    def close(self) -> None:
        """Give the signals their earlier handlers back and end the relay thread."""
        for s, handler in self._old.items():
            signal.signal(s, handler)
        signal.set_wakeup_fd(self._old_fd)
        self._write.close()
        self._thread.join(5)
        self._read.close()

    def __enter__(self) -> SignalRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
