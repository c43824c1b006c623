"""Debian's Chromium and ChromeDriver for the browser tests, installed on demand.

CI runs on a clean Debian machine as root without a browser: the test set-up
installs ``chromium`` and ``chromium-driver`` with apt (never a browser download
of Selenium's or Playwright's own) and skips only when that is impossible.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
PACKAGES = ("chromium", "chromium-driver")


def ensure_chromium(timeout_s: float = 540.0) -> str | None:
    """Install the browser when missing; None when it is there, else why it cannot be."""
    if CHROMIUM.exists() and CHROMEDRIVER.exists():
        return None
    apt = shutil.which("apt-get")
    if apt is None:
        return f"{CHROMIUM} or {CHROMEDRIVER} missing and there is no apt-get to install {' '.join(PACKAGES)}"
    if os.geteuid() != 0:
        return f"{CHROMIUM} or {CHROMEDRIVER} missing; installing {' '.join(PACKAGES)} needs root"
    deadline = time.monotonic() + timeout_s
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # Wait for a concurrent apt (another job on the machine) instead of failing on its lock.
    lock = ["-o", "DPkg::Lock::Timeout=120"]
    install = [apt, *lock, "install", "-y", "-q", *PACKAGES]
    errors = []
    # A stale package list names versions the mirror no longer has: update once, then retry.
    for step in ([install], [[apt, *lock, "update", "-q"], install]):
        for argv in step:
            left = deadline - time.monotonic()
            if left <= 0:
                return f"installing {' '.join(PACKAGES)} took longer than {timeout_s:.0f} s"
            try:
                done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=left, check=False)
            except subprocess.TimeoutExpired:
                return f"installing {' '.join(PACKAGES)} took longer than {timeout_s:.0f} s"
            if done.returncode != 0:
                errors.append(f"{' '.join(argv[:1] + argv[3:])}: exit {done.returncode}: {done.stderr.strip()[-400:]}")
                break
        else:
            if CHROMIUM.exists() and CHROMEDRIVER.exists():
                return None
            errors.append(f"apt-get succeeded but {CHROMIUM} or {CHROMEDRIVER} is still missing")
    return "could not install chromium: " + " | ".join(errors)
