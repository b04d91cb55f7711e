"""Real Triton and Dynamo servers for tests, started and stopped with the CLI as a user would.

``run_cli`` runs ``python -m eagle3_trt.cli`` from the checkout; ``triton_served`` / ``dynamo_served``
start a server (``serve`` / ``serve-dynamo`` on free ports), yield its handle and the start's
stdout, and stop it (``stop`` / ``stop-dynamo``), failing the test when either step fails.
``serve_triton`` / ``serve_dynamo`` start one for tests that stop it themselves. ``until`` waits for
a condition.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from eagle3_trt.dynamo_serving.launcher import Deployment, free_port
from eagle3_trt.triton_serving.server import ServerHandle, free_ports

REPO_ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``eagle3-trt ARGS`` in a subprocess from the checkout, its output captured."""
    return subprocess.run([sys.executable, "-m", "eagle3_trt.cli", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def check_ok(r: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    """``r``, or AssertionError with its output when it exited non-zero."""
    if r.returncode != 0:
        raise AssertionError(r.stdout + r.stderr)
    return r


def until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    """Wait until ``cond()`` holds; AssertionError ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() >= deadline:
            raise AssertionError(what)
        time.sleep(0.1)


def _then_stop(started: T, stop_command: str, state: Path) -> Iterator[T]:
    """Yield ``started``, then run ``stop_command --state-dir STATE`` (which must succeed unless the block failed)."""
    try:
        yield started
    except BaseException:
        run_cli(stop_command, "--state-dir", str(state))
        raise
    check_ok(run_cli(stop_command, "--state-dir", str(state)))


def serve_triton(repo: Path, state: Path, *extra: str, env: dict[str, str] | None = None) -> tuple[ServerHandle, str]:
    """``serve REPO`` on free HTTP/gRPC/metrics ports (plus ``extra``): its handle and stdout."""
    http, grpc, metrics = free_ports(3)
    args = ("--state-dir", str(state), "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics))
    r = check_ok(run_cli("serve", str(repo), *args, *extra, env=env))
    return ServerHandle.load(state), r.stdout


def stop_triton(state: Path) -> subprocess.CompletedProcess[str]:
    return check_ok(run_cli("stop", "--state-dir", str(state)))


@contextmanager
def triton_served(repo: Path, state: Path, *extra: str, env: dict[str, str] | None = None) -> Iterator[tuple[ServerHandle, str]]:
    """A Triton server for the block: (handle, serve's stdout); stopped at the end (stop must succeed)."""
    yield from _then_stop(serve_triton(repo, state, *extra, env=env), "stop", state)


def serve_dynamo(bundle: Path, state: Path, *extra: str, workers: int = 2) -> tuple[Deployment, str]:
    """``serve-dynamo BUNDLE`` with ``workers`` one-thread workers on a free port (plus ``extra``): the deployment and stdout."""
    args = ("--workers", str(workers), "--http-port", str(free_port()), "--state-dir", str(state), "--torch-threads", "1", "--timeout", "240")
    r = check_ok(run_cli("serve-dynamo", str(bundle), *args, *extra))
    dep = Deployment.load(state)
    if dep is None:
        raise AssertionError(f"serve-dynamo recorded no deployment in {state}: {r.stdout}")
    return dep, r.stdout


def stop_dynamo(state: Path) -> subprocess.CompletedProcess[str]:
    return check_ok(run_cli("stop-dynamo", "--state-dir", str(state)))


@contextmanager
def dynamo_served(bundle: Path, state: Path, *extra: str, workers: int = 2) -> Iterator[tuple[Deployment, str]]:
    """A Dynamo deployment for the block: (deployment, serve-dynamo's stdout); stopped at the end (stop must succeed)."""
    yield from _then_stop(serve_dynamo(bundle, state, *extra, workers=workers), "stop-dynamo", state)


__all__ = [
    "REPO_ROOT",
    "check_ok",
    "dynamo_served",
    "run_cli",
    "serve_dynamo",
    "serve_triton",
    "stop_dynamo",
    "stop_triton",
    "triton_served",
    "until",
]
