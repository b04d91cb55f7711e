"""Processes and ports of the servers the toolkit starts (Triton, Dynamo): one copy of each check.

Servers bind ``HOST`` (127.0.0.1) only, unless a user asks otherwise."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

HOST = "127.0.0.1"


def torchrun_env() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment; (0, 1, 0) outside torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0"))


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


# ---- what is left of a server after it exits ------------------------------------------------------
# A server's workers can outlive it: Triton's Python-backend stubs keep running (reparented to
# init, holding their shared-memory files) when Triton exits with work in flight. They are found
# by process group, by a unique token in their command line, and by the files they hold open.


def _proc_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def group_members(pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` (from /proc: ``killpg`` cannot list them)."""
    out = []
    for pid in _proc_pids():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(pid)
    return out


def parent_pid(pid: int) -> int | None:
    """``pid``'s parent (from /proc), or None when it has exited."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def cmdline_contains(token: str) -> list[int]:
    """Live processes whose command line contains ``token`` (a unique name given at start)."""
    out = []
    for pid in _proc_pids():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if token.encode() in cmd and pid_alive(pid):
            out.append(pid)
    return out


def serving_repository(repo: Path) -> list[int]:
    """Live processes started with ``--model-repository=REPO`` or ``--model-repository REPO``
    (tritonserver's flag, as ``eagle3-trt serve`` and upstream's launcher pass it): a repository a
    running server has loaded is not rewritten under it, whichever state directory started it."""
    want = os.path.realpath(repo)
    out = []
    for pid in _proc_pids():
        try:
            args = [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
        except OSError:
            continue
        given = [a.split("=", 1)[1] for a in args if a.startswith("--model-repository=")]
        given += [b for a, b in zip(args, args[1:]) if a == "--model-repository"]
        if any(os.path.realpath(g) == want for g in given) and pid_alive(pid):
            out.append(pid)
    return out


def holders_of(path_prefix: str) -> list[int]:
    """Live processes with a file whose path starts with ``path_prefix`` open or mapped (a deleted
    shared-memory file counts: it stays allocated while a process holds it)."""
    out = []
    for pid in _proc_pids():
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
            held = any(os.readlink(fd).startswith(path_prefix) for fd in fds if _is_link(fd))
            held = held or path_prefix in Path(f"/proc/{pid}/maps").read_text()
        except OSError:  # exited meanwhile, or another user's
            continue
        if held and pid_alive(pid):
            out.append(pid)
    return out


def _is_link(p: Path) -> bool:
    try:
        return p.is_symlink()
    except OSError:
        return False


def describe(pid: int) -> str:
    """``pid 123 (triton_python_backend_stub)``, for reports."""
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
    except OSError:
        argv0 = ""
    return f"pid {pid} ({Path(argv0).name or '?'})"


def terminate(pids: list[int], grace_s: float, kill_wait_s: float = 5.0) -> tuple[dict[int, str], list[int]]:
    """SIGTERM ``pids``, SIGKILL those still alive after ``grace_s``. Returns ({pid: signal that
    ended it}, pids still alive after ``kill_wait_s`` more)."""
    ended: dict[int, str] = {}
    alive = [p for p in pids if p != os.getpid() and pid_alive(p)]
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, kill_wait_s)):
        for p in alive:
            try:
                os.kill(p, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + wait_s
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            for p in [p for p in alive if not pid_alive(p)]:
                ended[p] = sig.name
                alive.remove(p)
    return ended, alive
