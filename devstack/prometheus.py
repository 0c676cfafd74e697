"""Prometheus and promtool for the checks and tests: the binaries ``scripts/bootstrap`` unpacks
from Debian's ``prometheus`` package into ``.cache/prometheus`` (no system install)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".cache" / "prometheus" / "usr" / "bin"


def binary(name: str) -> Path:
    """``promtool`` or ``prometheus``; raises when ``scripts/bootstrap`` has not fetched it."""
    path = BIN / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run scripts/bootstrap (it unpacks {name})")
    return path


def check_metrics(exposition: str) -> tuple[bool, str]:
    """``promtool check metrics`` on one exposition: (clean, what it printed)."""
    done = subprocess.run(
        [binary("promtool"), "check", "metrics"],
        input=exposition,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode == 0, (done.stdout + done.stderr).strip()
