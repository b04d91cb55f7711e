"""Finding one torchrun rank's process, for the tests that kill a rank mid-run."""

from __future__ import annotations

import subprocess

import psutil


def rank_pid(launcher: subprocess.Popen, rank: int) -> int | None:
    """The pid of worker ``rank`` under a torchrun launcher (its environment names RANK), or None yet."""
    for child in psutil.Process(launcher.pid).children(recursive=True):
        try:
            if child.environ().get("RANK") == str(rank) and child.environ().get("LOCAL_RANK") is not None:
                return int(child.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None
