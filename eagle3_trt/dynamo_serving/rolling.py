"""`eagle3-trt deploy NEW --dynamo STATE_DIR`: replace a serve-dynamo deployment's workers one at a time.

For each worker in turn: start its replacement on NEW (the same command line and environment as
the worker it replaces, read from /proc, so its threads, device and capture settings carry over;
a new system port), wait until it is healthy and registered, then drain the old one: a drain
marker (drain.py) and SIGTERM. Dynamo takes it out of discovery, so the frontend routes new
requests to the others; its engine lets the requests it holds finish, then it exits. Only then
does the next worker go, so the deployment never serves with fewer workers than it had.

``--rollback`` does the same with the bundle served before (``deploy-history.json`` in the state
directory lists the bundles deployed, oldest first).
"""

from __future__ import annotations

import os
import signal
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from eagle3_trt.atomic import write_json
from eagle3_trt.dynamo_serving.drain import MAX_DRAIN_S, marker_path, write_marker
from eagle3_trt.dynamo_serving.launcher import STATE_FILE, Deployment, Proc, _registered, _spawn, free_port
from eagle3_trt.errors import UserError
from eagle3_trt.pipeline.bundle import open_bundle
from eagle3_trt.procs import HOST, group_members

HISTORY_FILE = "deploy-history.json"


@dataclass(frozen=True)
class RollResult:
    bundle: Path
    previous: Path
    replaced: list[tuple[str, str]]  # (old role and pid, new role and pid)
    killed: list[str]  # old workers that had to be SIGKILLed after their drain
    seconds: float


class DeployHistory(BaseModel):
    """deploy-history.json: the bundles deployed, oldest first (written by ``roll``, read here only)."""

    model_config = ConfigDict(extra="forbid")

    bundles: list[str]


def _history(state_dir: Path, dep: Deployment) -> list[str]:
    p = Path(state_dir) / HISTORY_FILE
    try:
        h = DeployHistory.model_validate_json(p.read_bytes()).bundles
    except (OSError, ValidationError):
        return [dep.bundle]  # none yet, or not ours: the served bundle is the whole history
    return h if h and h[-1] == dep.bundle else [dep.bundle]


def _check_same_target(new: Path, served: Path) -> None:
    a, b = open_bundle(new).manifest.sources.target, open_bundle(served).manifest.sources.target
    if {k: v.sha256 for k, v in a.files.items()} != {k: v.sha256 for k, v in b.files.items()}:
        raise UserError(
            new,
            f"built for another target ({a.source or a.path}) than the Dynamo deployment serves ({b.source or b.path})",
            "deploy a head built for the served target; serve another target with its own serve-dynamo",
        )


def _proc_argv(pid: int) -> list[str]:
    return [a for a in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0") if a]


def _proc_env(pid: int) -> dict[str, str]:
    env = {}
    for item in Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0"):
        k, sep, v = item.partition("=")
        if sep:
            env[k] = v
    return env


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _gone(p: Proc) -> bool:
    return not p.alive() and not group_members(p.pid)


def roll_workers(state_dir: Path, new_bundle: Path | None, *, rollback: bool = False, drain_s: float = MAX_DRAIN_S, timeout_s: float = 300.0) -> RollResult:
    t0 = time.monotonic()
    state_dir = Path(state_dir).resolve()
    dep = Deployment.load(state_dir)
    if dep is None or not dep.frontend.alive():
        raise UserError(state_dir / STATE_FILE, "no Dynamo deployment running here", f"start one with `eagle3-trt serve-dynamo BUNDLE --state-dir {state_dir}`")
    history = _history(state_dir, dep)
    if rollback:
        if len(history) < 2:
            raise UserError(
                state_dir / HISTORY_FILE,
                f"{dep.bundle} is the only bundle deployed here; there is nothing to roll back to",
                "deploy one with `eagle3-trt deploy NEW --dynamo DIR`",
            )
        new = Path(history[-2])
    else:
        assert new_bundle is not None
        new = Path(new_bundle).resolve()
    _check_same_target(new, Path(dep.bundle))
    previous = Path(dep.bundle)
    replaced: list[tuple[str, str]] = []
    killed: list[str] = []
    n_roles = len(list(state_dir.glob("worker-*.log")))
    for i, old in enumerate(list(dep.workers)):
        if not old.alive():
            raise UserError(old.role, f"pid {old.pid} is not running", f"see `eagle3-trt status-dynamo --state-dir {state_dir}`; restart the deployment")
        argv = _proc_argv(old.pid)
        argv[argv.index("--bundle") + 1] = str(new)
        if "--card-dir" not in argv:  # the model card the frontend holds: the first bundle's target directory
            argv += ["--card-dir", str(previous / "target")]
        port = free_port({dep.frontend.port, *(w.port for w in dep.workers)})
        env = {**_proc_env(old.pid), "DYN_SYSTEM_PORT": str(port)}
        role = f"worker-{n_roles}"
        n_roles += 1
        log = state_dir / f"{role}.log"
        fresh = Proc(role, _spawn(argv, env, log), port, str(log))
        want = _registered(dep) + 1
        end = time.monotonic() + timeout_s
        while not (_healthy(port) and _registered(dep) >= want):
            if not fresh.alive() or time.monotonic() > end:
                if fresh.alive():
                    os.killpg(fresh.pid, signal.SIGKILL)
                raise UserError(role, f"the replacement of {old.role} on {new} did not come up; {old.role} keeps serving", f"log: {log}")
            time.sleep(0.5)
        write_marker(Path(dep.discovery_dir), old.pid, drain_s)
        os.killpg(old.pid, signal.SIGTERM)
        end = time.monotonic() + min(drain_s, MAX_DRAIN_S) + 30
        while not _gone(old) and time.monotonic() < end:
            time.sleep(0.2)
        if not _gone(old):
            os.killpg(old.pid, signal.SIGKILL)
            killed.append(old.role)
        marker_path(Path(dep.discovery_dir), old.pid).unlink(missing_ok=True)
        dep.workers[i] = fresh
        dep.bundle = str(new)
        dep.save()
        replaced.append((f"{old.role} (pid {old.pid})", f"{role} (pid {fresh.pid})"))
    write_json(state_dir / HISTORY_FILE, DeployHistory(bundles=history[:-1] if rollback else [*history, str(new)]).model_dump())
    return RollResult(new, previous, replaced, killed, time.monotonic() - t0)
