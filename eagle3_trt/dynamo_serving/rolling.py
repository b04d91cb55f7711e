"""`eagle3-trt deploy-dynamo NEW --state-dir STATE_DIR`: replace a serve-dynamo deployment's workers one at a time.

For each worker in turn: start its replacement on NEW (the same command line and environment as
the worker it replaces, read from /proc, so its threads, device and capture settings carry over;
a new system port), wait until it is healthy and registered, then drain the old one: a drain
marker (drain.py) and SIGTERM. Dynamo takes it out of discovery, so the frontend routes new
requests to the others; its engine lets the requests it holds finish, then it exits. Only then
does the next worker go, so the deployment never serves with fewer workers than it had.

``--rollback`` does the same with the bundle served before (``deploy-history.json`` in the state
directory lists the bundles deployed, oldest first; its last entry is always state.json's bundle).
A worker that died is replaced first, on the new bundle, so a roll finishes with every worker up;
state.json records each worker's bundle, so running the command again resumes a roll that stopped.
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
from eagle3_trt.dynamo_serving.launcher import STATE_FILE, Deployment, Proc, _spawn, check_servable, free_port
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


def _instances(dep: Deployment) -> set[Path]:
    inst = Path(dep.discovery_dir) / "v1" / "instances"
    return {p for p in inst.rglob("*") if p.is_file()} if inst.is_dir() else set()


def worker_bundle(dep: Deployment, w: Proc) -> str:
    """The bundle worker ``w`` serves: recorded in state.json since workers carry it; for a state file
    written before that, its command line (alive) or the deployment's bundle."""
    if w.bundle:
        return w.bundle
    if w.alive():
        argv = _proc_argv(w.pid)
        if "--bundle" in argv:
            return argv[argv.index("--bundle") + 1]
    return dep.bundle


def _save(dep: Deployment, history: list[str]) -> None:
    """state.json and deploy-history.json, written together so that they always agree: the
    history's last bundle is the one state.json says the deployment serves (or is rolling to)."""
    assert history and history[-1] == dep.bundle
    dep.save()
    write_json(Path(dep.state_dir) / HISTORY_FILE, DeployHistory(bundles=history).model_dump())


def _next(dep: Deployment, new: Path) -> Proc | None:
    """The next worker to replace: a dead one first (nothing to drain, and the live ones keep
    serving meanwhile), then a live one not yet on ``new``; None when every worker serves ``new``."""
    dead = [w for w in dep.workers if not w.alive()]
    if dead:
        return dead[0]
    return next((w for w in dep.workers if worker_bundle(dep, w) != str(new)), None)


def roll_workers(state_dir: Path, new_bundle: Path | None, *, rollback: bool = False, drain_s: float = MAX_DRAIN_S, timeout_s: float = 300.0) -> RollResult:
    """Replace the workers one at a time until every one serves the new bundle.

    A worker found dead (before or during the roll) is replaced first, on the new bundle: the roll
    finishes with as many workers as the deployment had, and a live worker is drained only once its
    replacement serves. Running the same command again after a failure finishes the roll (workers
    already on the new bundle stay); ``--rollback`` goes back to the bundle before it."""
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
                f"deploy one with `eagle3-trt deploy-dynamo NEW --state-dir {state_dir}`",
            )
        new, history = Path(history[-2]), history[:-1]
    else:
        assert new_bundle is not None
        new = Path(new_bundle).resolve()
        history = history if history[-1] == str(new) else [*history, str(new)]
    check_servable(new)  # a bundle Dynamo cannot serve is refused before any worker is touched
    _check_same_target(new, Path(dep.bundle))
    previous = Path(dep.bundle)
    alive = [w for w in dep.workers if w.alive()]
    if not alive:
        raise UserError(
            state_dir / STATE_FILE,
            "no worker of the deployment is running: there is no command line to start replacements from",
            f"`eagle3-trt stop-dynamo --state-dir {state_dir}`, then `eagle3-trt serve-dynamo {new} --state-dir {state_dir}`",
        )
    # every worker runs the same command line but for its bundle and port: a live one is the template
    template_argv, template_env = _proc_argv(alive[0].pid), _proc_env(alive[0].pid)
    replaced: list[tuple[str, str]] = []
    killed: list[str] = []
    n_roles = len(list(state_dir.glob("worker-*.log")))
    first_card = Path(worker_bundle(dep, alive[0])) / "target"  # used only when the template has no --card-dir: a serve-dynamo worker
    while (old := _next(dep, new)) is not None:
        argv = list(template_argv)
        argv[argv.index("--bundle") + 1] = str(new)
        if "--card-dir" not in argv:  # the model card the frontend holds: the first bundle's target directory
            argv += ["--card-dir", str(first_card)]
        port = free_port({dep.frontend.port, *(w.port for w in dep.workers)})
        # a fixed request-plane port (serve-dynamo --worker-port-base) is the template's own, still bound: the kernel picks one
        env = {**{k: v for k, v in template_env.items() if k != "DYN_TCP_RPC_PORT"}, "DYN_SYSTEM_PORT": str(port)}
        role = f"worker-{n_roles}"
        n_roles += 1
        log = state_dir / f"{role}.log"
        before = _instances(dep)
        fresh = Proc(role, _spawn(argv, env, log), port, str(log), str(new))
        end = time.monotonic() + timeout_s
        while not (_healthy(port) and _instances(dep) - before):
            if not fresh.alive() or time.monotonic() > end:
                if fresh.alive():
                    os.killpg(fresh.pid, signal.SIGKILL)
                on_new = sum(worker_bundle(dep, w) == str(new) and w.alive() for w in dep.workers)
                if on_new == 0:  # nothing changed: the deployment still serves what it served
                    history = _history(state_dir, dep)
                else:
                    dep.bundle = str(new)
                _save(dep, history)
                keeps = f"{old.role} keeps serving" if old.alive() else f"{old.role} is dead and stays unreplaced"
                raise UserError(
                    role,
                    f"the replacement of {old.role} on {new} did not come up ({on_new} of {len(dep.workers)} workers serve it); {keeps}",
                    f"log: {log}; finish with `eagle3-trt deploy-dynamo {new} --state-dir {state_dir}`"
                    + (f" or go back with `eagle3-trt deploy-dynamo {previous} --state-dir {state_dir}`" if on_new else ""),
                )
            time.sleep(0.5)
        if old.alive():
            write_marker(Path(dep.discovery_dir), old.pid, drain_s)
            os.killpg(old.pid, signal.SIGTERM)
            end = time.monotonic() + min(drain_s, MAX_DRAIN_S) + 30
            while not _gone(old) and time.monotonic() < end:
                time.sleep(0.2)
            what = "drained and stopped"
        else:
            what = "was dead; replaced"
        if not _gone(old):
            os.killpg(old.pid, signal.SIGKILL)
            killed.append(old.role)
        marker_path(Path(dep.discovery_dir), old.pid).unlink(missing_ok=True)
        dep.workers[dep.workers.index(old)] = fresh
        dep.bundle = str(new)
        _save(dep, history)
        replaced.append((f"{old.role} (pid {old.pid}) {what}", f"{role} (pid {fresh.pid})"))
    dep.bundle = str(new)
    _save(dep, history)
    return RollResult(new, previous, replaced, killed, time.monotonic() - t0)
