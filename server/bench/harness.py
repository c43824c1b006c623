"""The one process harness: tiletune's own child processes (a server, a worker, a command).

``tiletune up``, the benchmarks and the tests all start children the same way:
:class:`Child` runs a command in its own session (so a Ctrl-C in the terminal
reaches it once, through the parent), its output in a log file whose tail goes
into every error, readiness by a probe, and a stop that first asks (SIGTERM:
a worker finishes its trial, a server drains) and then kills the whole process
group. :func:`http_server` adds a free loopback port, retried when another
process takes it first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import httpx

from autotune.host_load import process_table, process_tree
from server.bench import BenchError

HOST = "127.0.0.1"
TAIL_CHARS = 3000  # characters of a child's log shown in an error
SOURCE_ROOT = Path(__file__).resolve().parents[2]  # kernel/, autotune/, server/ live here


class ChildError(BenchError):
    """A child exited early or did not become ready; the message ends with its log's tail."""


def tiletune_command(*args: str) -> list[str]:
    """``tiletune ARGS`` run by this interpreter (no console script needed)."""
    return [sys.executable, "-m", "server.cli", *args]


def uvicorn_command(target: str, port: int, workers: int = 1) -> list[str]:
    """uvicorn serving the app factory ``target`` ("module:function") on ``HOST:port``."""
    return [sys.executable, "-m", "uvicorn", target, "--factory", "--host", HOST, "--port", str(port),
            "--workers", str(workers), "--log-level", "warning"]  # fmt: skip


def child_env(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment, unbuffered output, this source tree importable, ``overrides``."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = str(SOURCE_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(overrides or {})
    return env


def free_port() -> int:
    """A loopback port free right now (another process may still take it: see :func:`http_server`)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def process_tree_cpu_seconds(root: int) -> float | None:
    """CPU seconds (user + system) of process ``root`` and its descendants, from /proc; None elsewhere."""
    try:
        tick = os.sysconf("SC_CLK_TCK")
        table = process_table()
        tree = process_tree(root, table)
        if not tree:
            return None
        return sum(int(table[pid][1][11]) + int(table[pid][1][12]) for pid in tree) / tick
    except (OSError, ValueError, AttributeError, IndexError):
        return None


def process_tree_rss_bytes(root: int) -> int | None:
    """Resident memory of process ``root`` and its descendants (the sum of their RSS: pages they
    share count once per process, so this is an upper bound), from /proc; None elsewhere."""
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        table = process_table()
        tree = process_tree(root, table)
        if not tree:
            return None
        return sum(int(table[pid][1][21]) for pid in tree) * page
    except (OSError, ValueError, AttributeError, IndexError):
        return None


class Child:
    """One child process with its log (a file named by ``log``, else a temporary one)."""

    def __init__(
        self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None, log: Path | None = None
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log = log
        self._out: IO[bytes] = log.open("wb") if log is not None else tempfile.TemporaryFile()  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.argv,
            env=dict(env) if env is not None else child_env(),
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def poll(self) -> int | None:
        return self.proc.poll()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the child itself (not its group: a worker's measuring process is its own to stop)."""
        if self.alive():
            self.proc.send_signal(sig)

    def send_signal(self, sig: int) -> None:
        self.signal(sig)

    def wait(self, timeout_s: float | None = None) -> int | None:
        """The exit code, or None if the child still runs after ``timeout_s``."""
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL to the child's whole process group (its own children included)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def output(self) -> str:
        """Everything the child wrote so far."""
        self._out.flush()
        if self.log is not None:
            return self.log.read_text(errors="replace")
        self._out.seek(0)
        text = self._out.read().decode(errors="replace")
        self._out.seek(0, os.SEEK_END)
        return str(text)

    def tail(self, chars: int = TAIL_CHARS) -> str:
        return self.output()[-chars:].strip()

    def wait_until(self, ready: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.05) -> None:
        """Until ``ready()``; :class:`ChildError` with the log's tail if the child exits first or time runs out."""
        deadline = time.monotonic() + timeout_s
        while not ready():
            if not self.alive():
                raise ChildError(f"the {self.name} exited (code {self.returncode}) before {what}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise ChildError(f"the {self.name} did not get to {what} within {timeout_s:g} s:\n{self.tail()}")
            time.sleep(poll_s)

    def wait_for_output(self, text: str, timeout_s: float) -> None:
        """Until the child has printed ``text`` (e.g. a worker's "claiming" once it is up)."""
        self.wait_until(lambda: text in self.output(), timeout_s, f"printing {text!r}", poll_s=0.1)

    def has_open(self, path: Path) -> bool:
        """Whether the child holds ``path`` open right now (Linux ``/proc``: e.g. a database file,
        to tell when a command got to its database); False once it exited."""
        target = os.path.realpath(path)
        try:
            fds = os.listdir(f"/proc/{self.proc.pid}/fd")
        except OSError:
            return False
        for fd in fds:
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{self.proc.pid}/fd/{fd}") == target:
                    return True
        return False

    def cpu_seconds(self) -> float | None:
        return process_tree_cpu_seconds(self.proc.pid)

    def rss_bytes(self) -> int | None:
        return process_tree_rss_bytes(self.proc.pid)

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM, up to ``grace_s`` to exit, then SIGKILL to the group; the exit code."""
        if self.alive():
            self.signal(signal.SIGTERM)
            if self.wait(grace_s) is None:
                self.kill()
        self.close()
        return self.proc.returncode

    def close(self) -> None:
        """Close the log (the child must have exited)."""
        if not self._out.closed:
            self._out.close()

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


class HttpChild(Child):
    """A child serving HTTP on ``HOST:port``."""

    def __init__(self, name: str, argv: Sequence[str], port: int, **kwargs: Any) -> None:
        super().__init__(name, argv, **kwargs)
        self.port = port

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"


@contextlib.contextmanager
def http_server(
    name: str,
    command: Callable[[int], Sequence[str]],
    probe: Callable[[httpx.Client], bool],
    *,
    env: Mapping[str, str] | None = None,
    log: Path | None = None,
    timeout_s: float = 60.0,
) -> Iterator[HttpChild]:
    """``command(port)`` on a free loopback port, entered once ``probe(client)`` is true, stopped
    on exit. A port taken by another process between the check and the bind is retried."""
    for attempt in range(3):
        port = free_port()
        server = HttpChild(name, command(port), port, env=env, log=log)
        try:
            with httpx.Client(base_url=server.base_url, timeout=5.0) as client:

                def ready() -> bool:
                    try:
                        return probe(client)
                    except httpx.HTTPError:
                        return False

                server.wait_until(ready, timeout_s, f"answering on {server.base_url}")
        except ChildError:
            in_use = "address already in use" in server.tail().lower()
            server.stop()
            if in_use and attempt < 2:
                continue
            raise
        try:
            yield server
        finally:
            server.stop()
        return
