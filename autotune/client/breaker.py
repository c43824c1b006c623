"""A circuit breaker: stop calling a server that keeps failing, for a while."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class CircuitBreaker:
    """Closed (calls go through) until ``failures`` failed calls in a row; then open
    (no call) for ``cooldown_s``; then half-open: one probing call, whose outcome closes
    or re-opens it. ``clock`` is injectable for tests."""

    def __init__(self, failures: int, cooldown_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.failures = failures
        self.cooldown_s = cooldown_s
        self.clock = clock
        self._lock = threading.Lock()
        self._consecutive = 0
        self._open_until: float | None = None
        self._probing = False
        self.opened = 0  # times it opened

    @property
    def state(self) -> str:
        with self._lock:
            if self._open_until is None:
                return "closed"
            return "open" if self.clock() < self._open_until or self._probing else "half-open"

    def allow(self) -> bool:
        with self._lock:
            if self._open_until is None:
                return True
            if self.clock() < self._open_until or self._probing:
                return False
            self._probing = True
            return True

    def success(self) -> None:
        with self._lock:
            self._consecutive = 0
            self._open_until = None
            self._probing = False

    def failure(self) -> None:
        with self._lock:
            self._consecutive += 1
            if self._probing or self._consecutive >= self.failures:
                if self._open_until is None or self._probing:
                    self.opened += 1
                self._open_until = self.clock() + self.cooldown_s
                self._probing = False
