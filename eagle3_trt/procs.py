"""Processes and ports of the servers the toolkit starts (Triton, Dynamo): one copy of each check.

Servers bind ``HOST`` (127.0.0.1) only, unless a user asks otherwise."""

from __future__ import annotations

import os
import socket
from pathlib import Path

HOST = "127.0.0.1"


def pid_alive(pid: int) -> bool:
    """``pid`` runs: our own exited child is reaped and counts as gone, and so does a zombie that
    another parent has not reaped (``kill(pid, 0)`` still succeeds for both)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return False
    except ChildProcessError:  # not our child
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"
    except OSError:
        return True


def group_alive(pgid: int) -> bool:
    """Any process of process group ``pgid`` runs (a server's workers outlive its leader)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member owned by another user: still there
        return True
    return True


def port_is_free(port: int, host: str = HOST) -> bool:
    """Nothing listens on host:port (SO_REUSEADDR, as the servers set it: a TIME_WAIT left by a
    previous run does not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
