"""Start, watch and stop a local Dynamo deployment: one OpenAI frontend and N reference-runtime workers.

Everything runs on 127.0.0.1 with no etcd and no NATS: file discovery (``--discovery-backend
file``, the store under ``DYN_FILE_KV``) and the TCP request plane, as ``ai-dynamo`` 1.6.1 supports
on a plain machine. Each process runs in its own session (process group) and logs to a file in
the state directory; ``state.json`` records the pids, ports and logs so that ``status`` and
``stop`` find them from another shell. ``stop`` removes the discovery store and the state file.

Host binding: the frontend gets ``--http-host 127.0.0.1``; the request plane, the response-stream
server and each worker's system server (``/health``, ``/metrics``) get 127.0.0.1 through
``DYN_TCP_RPC_HOST``, ``DYN_TCP_RESPONSE_STREAM_HOST`` and ``DYN_SYSTEM_HOST`` (variable names read
from the ``dynamo._core`` 1.6.1 binary; without them the response-stream server binds the
host's address).
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from eagle3_trt.atomic import make_dirs, write_json
from eagle3_trt.errors import UserError
from eagle3_trt.procs import HOST, describe, group_members, pid_alive, port_is_free
from eagle3_trt.runtime.capture import CaptureConfig, capture_env
from eagle3_trt.runtime.llm_api import SERVED_MODEL_NAME

DEFAULT_STATE_DIR = Path(".serve-dynamo")
# Not Triton's 8000: `eagle3-trt serve` and `serve-dynamo` with their defaults run side by side
# (the same port as the Makefile's DYNAMO_PORT and the README's curl example).
DEFAULT_HTTP_PORT = 8080
STATE_FILE = "state.json"
DISCOVERY_DIR = "discovery"
# The Dynamo namespace the frontend and workers meet in (the worker's --namespace default too).
NAMESPACE = "eagle3"
# stop: how long admitted requests get to finish once the frontend stops taking new ones ...
STOP_GRACE_S = 30.0
# ... and how long the processes then get to exit before their process groups are killed.
STOP_TIMEOUT_S = 30.0
# The engine's gauge of requests being generated (engine.SpecMetrics takes the name from here: the
# launcher must import without Dynamo installed), read by stop().
INFLIGHT_METRIC = "eagle3_inflight_requests"
INSTALL_HINT = "make serve-dynamo installs it; by hand: pip install -e '.[dynamo]' && pip install --no-deps ai-dynamo==1.6.1"


@dataclass
class Proc:
    role: str  # frontend | worker-<i>
    pid: int
    port: int  # frontend: HTTP; worker: system server (/health, /metrics)
    log: str
    bundle: str = ""  # workers: the bundle it serves (mixed while deploy-dynamo rolls); "" for the frontend

    def alive(self) -> bool:
        return pid_alive(self.pid)


@dataclass
class Deployment:
    state_dir: str
    bundle: str
    model: str
    url: str
    discovery_dir: str
    frontend: Proc
    workers: list[Proc] = field(default_factory=list)
    started_unix: float = 0.0

    @property
    def procs(self) -> list[Proc]:
        return [self.frontend, *self.workers]

    def save(self) -> None:
        write_json(Path(self.state_dir) / STATE_FILE, asdict(self))

    @classmethod
    def load(cls, state_dir: Path) -> Deployment | None:
        p = Path(state_dir) / STATE_FILE
        if not p.is_file():
            return None
        try:
            d = json.loads(p.read_text())
            return cls(**{**d, "frontend": Proc(**d["frontend"]), "workers": [Proc(**w) for w in d["workers"]]})
        except (ValueError, KeyError, TypeError) as e:
            raise UserError(p, f"unreadable ({e})", f"remove {state_dir} after checking no Dynamo process is left") from None


# Dynamo 1.6.1 parses DYN_SYSTEM_PORT as an i16 ("invalid value unsigned int `32937`, expected i16
# for key SYSTEM_PORT"), so worker system ports are drawn below 32768, not from the kernel's
# ephemeral range.
_SYSTEM_PORTS = range(20000, 32768)


def worker_ports(base: int, workers: int, http_port: int) -> list[tuple[int, int]]:
    """``--worker-port-base``: worker ``i`` serves its system server (/health, /metrics;
    ``DYN_SYSTEM_PORT``) on ``base + 2i`` and its TCP request plane (``DYN_TCP_RPC_PORT``, read from
    the ``dynamo._core`` 1.6.1 binary; otherwise the kernel picks one) on ``base + 2i + 1``.
    Refused in one line: a range reaching past 32767 (Dynamo 1.6.1 reads the system port as an
    i16, see ``_SYSTEM_PORTS``) or below 1024, the frontend's --http-port inside it, a port taken."""
    last = base + 2 * workers - 1
    hint = f"pick a base in 1024-{32768 - 2 * workers} whose {2 * workers} ports avoid --http-port (make serve-dynamo WORKER_PORT_BASE=...)"
    if base < 1024 or last > _SYSTEM_PORTS.stop - 1:
        raise UserError("--worker-port-base", f"{base}: the workers' ports {base}-{last} must lie in 1024-{_SYSTEM_PORTS.stop - 1}", hint)
    if base <= http_port <= last:
        raise UserError("--worker-port-base", f"{base}: the workers' ports {base}-{last} include the frontend's --http-port {http_port}", hint)
    taken = [p for p in range(base, last + 1) if not port_is_free(p)]
    if taken:
        raise UserError("--worker-port-base", f"{base}: port {taken[0]} of the workers' {base}-{last} is in use on {HOST}", hint)
    return [(base + 2 * i, base + 2 * i + 1) for i in range(workers)]


def free_port(taken: set[int] = frozenset()) -> int:  # type: ignore[assignment]
    rng = random.Random()
    for _ in range(200):
        port = rng.choice(_SYSTEM_PORTS)
        if port not in taken and port_is_free(port):
            return port
    raise UserError("serve-dynamo", f"no free port in {_SYSTEM_PORTS.start}-{_SYSTEM_PORTS.stop - 1} on {HOST}")


def _get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, ""
    except (OSError, ValueError):
        return 0, ""


def log_error_line(log: Path) -> str:
    """The most telling line of a dead process's log: the last exception or error, else the last line."""
    try:
        lines = [ln.strip() for ln in Path(log).read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    for ln in reversed(lines):
        if ("Error" in ln or "Exception" in ln or " ERROR " in ln) and not ln.startswith("File "):
            return _strip_ansi(ln)[-300:]
    return _strip_ansi(lines[-1])[-300:] if lines else "(empty log)"


def _strip_ansi(s: str) -> str:
    out, i = [], 0
    while i < len(s):
        if s[i] == "\x1b":
            j = s.find("m", i)
            i = j + 1 if j >= 0 else len(s)
            continue
        out.append(s[i])
        i += 1
    return "".join(out)


def dynamo_env(discovery: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "DYN_FILE_KV": str(discovery),
            "DYN_DISCOVERY_BACKEND": "file",
            "DYN_REQUEST_PLANE": "tcp",
            "DYN_TCP_RPC_HOST": HOST,
            "DYN_TCP_RESPONSE_STREAM_HOST": HOST,
            "DYN_SYSTEM_HOST": HOST,
            "DYN_EVENT_PLANE_HOST": HOST,
            "HF_HUB_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.setdefault("DYN_LOG", "info")
    return env


def check_dynamo() -> None:
    for mod in ("dynamo.frontend", "dynamo.common.backend"):
        try:
            found = importlib.util.find_spec(mod) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            raise UserError("ai-dynamo", f"{mod} is not importable in {sys.executable}", INSTALL_HINT)


def _spawn(argv: list[str], env: dict[str, str], log: Path) -> int:
    with open(log, "ab") as f:  # the process's own output stream, appended to by it alone
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return p.pid


def start(
    bundle: Path,
    *,
    workers: int = 2,
    state_dir: Path = DEFAULT_STATE_DIR,
    http_port: int = DEFAULT_HTTP_PORT,
    model_name: str = SERVED_MODEL_NAME,
    torch_threads: int | None = None,
    device: str = "cpu",
    speculation: bool = True,
    migration_limit: int = 3,
    timeout_s: float = 300.0,
    capture: CaptureConfig | None = None,
    worker_port_base: int | None = None,
) -> Deployment:
    """Start the frontend and ``workers`` workers; return once every worker is registered and the
    model is listed. Any failure stops what was started and raises a one-line UserError.

    ``capture``: the workers record finished requests (runtime/capture.py); None: nothing is
    captured, even when this process's environment carries capture settings.

    ``worker_port_base``: the workers' fixed ports (``worker_ports``); None: free system ports
    drawn at random and request-plane ports the kernel picks."""
    bundle = Path(bundle).resolve()
    state_dir = Path(state_dir).resolve()
    _check_can_start(bundle, workers, state_dir, http_port)
    fixed = worker_ports(worker_port_base, workers, http_port) if worker_port_base is not None else None
    check_dynamo()
    make_dirs(state_dir)
    discovery = state_dir / DISCOVERY_DIR
    shutil.rmtree(discovery, ignore_errors=True)  # a stale store would advertise dead workers
    make_dirs(discovery)
    env = capture_env(None, dynamo_env(discovery))
    threads = torch_threads or max(1, (os.cpu_count() or 1) // workers)

    fe_log = state_dir / "frontend.log"
    fe_log.unlink(missing_ok=True)
    fe = Proc("frontend", _spawn(_frontend_argv(http_port, migration_limit), env, fe_log), http_port, str(fe_log))
    dep = Deployment(str(state_dir), str(bundle), model_name, f"http://{HOST}:{http_port}/v1", str(discovery), fe, [], time.time())
    try:
        for i in range(workers):
            port = fixed[i][0] if fixed else free_port({http_port, *(w.port for w in dep.workers)})
            rpc = {"DYN_TCP_RPC_PORT": str(fixed[i][1])} if fixed else {}
            log = state_dir / f"worker-{i}.log"
            log.unlink(missing_ok=True)
            # No Dynamo grace period on SIGTERM (default 5 s of serving after leaving discovery):
            # `stop` drains at the frontend for its own grace period first, and SIGTERMs the
            # workers only to end what is left (see stop()).
            wenv = capture_env(
                capture, {**env, **rpc, "DYN_SYSTEM_ENABLED": "true", "DYN_SYSTEM_PORT": str(port), "DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS": "0"}
            )
            argv = _worker_argv(bundle, model_name, device, threads, speculation)
            dep.workers.append(Proc(f"worker-{i}", _spawn(argv, wenv, log), port, str(log), str(bundle)))
        dep.save()
        _wait_ready(dep, timeout_s)
    except BaseException:
        stop(dep, grace_s=0)
        raise
    return dep


def _check_can_start(bundle: Path, workers: int, state_dir: Path, http_port: int) -> None:
    """Refuse, before anything starts: no bundle (or one Dynamo cannot serve), no workers, a deployment already running, a taken port."""
    check_servable(bundle)
    if workers < 1:
        raise UserError("--workers", f"{workers}: must be at least 1")
    old = Deployment.load(state_dir)
    if old is not None and any(p.alive() for p in old.procs):
        # where it runs and how to stop it: the newcomer who typed `serve-dynamo` twice needs both
        by_make = " (make stop)" if state_dir == DEFAULT_STATE_DIR.resolve() else ""
        running = ", ".join(f"{p.role} pid {p.pid} port {p.port}" for p in old.procs if p.alive())
        raise UserError(
            state_dir,
            f"a Dynamo deployment is already running from this state directory ({old.url}; {running}; bundle {old.bundle})",
            f"stop it first: eagle3-trt stop-dynamo --state-dir {state_dir}{by_make}, or pass another --state-dir and --http-port",
        )
    if not port_is_free(http_port):
        raise UserError(f"{HOST}:{http_port}", "port in use", "pick another with --http-port (make serve-dynamo DYNAMO_PORT=...) or stop what holds it")


def check_servable(bundle: Path) -> None:
    """Refuse, in one line, a bundle whose speculation method no TensorRT-LLM release serves (its method's
    head hooks say why and which engine does): Dynamo's workers run TensorRT-LLM's backend, or the
    reference runtime that predicts it, so serving such a bundle here would measure an engine nobody can
    deploy behind Dynamo. Triton refuses it the same way (triton_serving/model_yaml.read_bundle)."""
    # imported here: the registry behind refuse_on_trtllm imports torch, and stop/status must not wait for it
    from eagle3_trt.pipeline.bundle import open_bundle
    from eagle3_trt.pipeline.other_engines import refuse_on_trtllm

    if not (bundle / "manifest.json").is_file():
        raise UserError(bundle, "is not an engine bundle (no manifest.json)", "build one with `make engine` or `eagle3-trt engine`")
    b = open_bundle(bundle)
    refuse_on_trtllm(b.path, b.options, "Dynamo serving")


def _frontend_argv(http_port: int, migration_limit: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "dynamo.frontend",
        "--http-host",
        HOST,
        "--http-port",
        str(http_port),
        "--discovery-backend",
        "file",
        "--request-plane",
        "tcp",
        "--namespace",
        NAMESPACE,
        "--router-mode",
        "round-robin",
        "--migration-limit",
        str(migration_limit),
    ]


def _worker_argv(bundle: Path, model_name: str, device: str, threads: int, speculation: bool) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "eagle3_trt.dynamo_serving.worker",
        "--bundle",
        str(bundle),
        "--served-model-name",
        model_name,
        "--namespace",
        NAMESPACE,
        "--device",
        device,
        "--torch-threads",
        str(threads),
    ]
    if not speculation:
        argv.append("--no-speculation")
    return argv


def _registered(dep: Deployment) -> int:
    inst = Path(dep.discovery_dir) / "v1" / "instances"
    return sum(1 for p in inst.rglob("*") if p.is_file()) if inst.is_dir() else 0


def _wait_ready(dep: Deployment, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while True:
        for p in dep.procs:
            if not p.alive():
                raise UserError(p.role, f"exited during startup: {log_error_line(Path(p.log))}", f"log: {p.log}")
        healthy = all(_get(f"http://{HOST}:{w.port}/health")[0] == 200 for w in dep.workers)
        code, body = _get(f"{dep.url}/models")
        listed = code == 200 and f'"{dep.model}"' in body
        if healthy and listed and _registered(dep) >= len(dep.workers):
            return
        if time.monotonic() > end:
            raise UserError(
                "serve-dynamo", f"not ready after {timeout_s:.0f} s (workers healthy: {healthy}, model listed: {listed})", f"logs in {dep.state_dir}"
            )
        time.sleep(0.5)


def status(state_dir: Path = DEFAULT_STATE_DIR) -> tuple[Deployment | None, list[str], bool]:
    """(deployment, one line per process, all up)."""
    dep = Deployment.load(state_dir)
    if dep is None:
        return None, [], False
    lines, ok = [], True
    for p in dep.procs:
        if not p.alive():
            ok = False
            lines.append(f"{p.role:<9} pid {p.pid:<7} DEAD (its last error or log line: {log_error_line(Path(p.log))}; log: {p.log})")
            continue
        if p.role == "frontend":
            code, _ = _get(f"{dep.url}/models")
            what = f"up, {dep.url}" if code == 200 else f"running but /v1/models answers {code or 'nothing'}"
        else:
            code, _ = _get(f"http://{HOST}:{p.port}/health")
            what = f"up, metrics http://{HOST}:{p.port}/metrics" if code == 200 else f"running but /health answers {code or 'nothing'}"
        ok = ok and code == 200
        if p.bundle and p.bundle != dep.bundle:  # a deploy-dynamo roll that stopped half-way
            what += f", on {p.bundle} (the deployment rolls to {dep.bundle})"
        lines.append(f"{p.role:<9} pid {p.pid:<7} {what}")
    return dep, lines, ok


@dataclass
class StopResult:
    stopped: list[str]  # roles that exited after SIGTERM
    killed: list[str]  # roles whose process group got SIGKILL after the timeout
    inflight: int = 0  # requests being generated when stop began
    cut_off: int = 0  # of those, still being generated when the grace period ran out: ended with an error
    waited_s: float = 0.0  # how long the frontend drained
    left: list[str] = field(default_factory=list)  # "role: pid N" of processes still alive at the end

    @property
    def clean(self) -> bool:
        """Every process exited by itself after SIGTERM and none is left."""
        return not self.killed and not self.left


def _inflight(dep: Deployment) -> int:
    """Requests the live workers are generating (the engine's ``eagle3_inflight_requests`` gauge on
    each worker's system server); a worker that does not answer counts 0."""
    try:
        from prometheus_client.parser import text_string_to_metric_families  # the [dynamo] extra, as the workers
    except ImportError:  # the extra was removed while a deployment ran: stop it all the same, uncounted
        return 0
    n = 0.0
    for w in dep.workers:
        if not w.alive():
            continue
        code, body = _get(f"http://{HOST}:{w.port}/metrics")
        if code != 200:
            continue
        try:
            families = list(text_string_to_metric_families(body))
        except ValueError:
            continue
        n += sum(s.value for f in families if f.name == INFLIGHT_METRIC for s in f.samples if s.name == INFLIGHT_METRIC)
    return int(n)


def _signal_group(p: Proc, sig: signal.Signals) -> None:
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _gone(p: Proc) -> bool:
    return not p.alive() and not group_members(p.pid)


def stop(dep: Deployment, grace_s: float = STOP_GRACE_S, timeout_s: float = STOP_TIMEOUT_S) -> StopResult:
    """Stop the deployment without letting a cut-off answer look finished.

    1. SIGTERM the frontend: it stops taking requests (new ones get 503) and keeps streaming the
       admitted ones; it exits by itself once every stream has ended.
    2. Wait up to ``grace_s`` for that (the workers keep generating meanwhile).
    3. SIGTERM the workers (spawned with no Dynamo grace period of their own): their engine's
       cleanup ends every request still running with an error (``engine.Eagle3ReferenceEngine._cut_off``),
       which the frontend sends to the client as an error event (streaming) or a 5xx, never as
       ``finish_reason: "stop"``; the frontend then exits too.
    4. SIGKILL the process group of whatever is still there ``timeout_s`` later, then check that no
       process of any group is left; remove the discovery store, and the state file unless something is left.
    """
    res = StopResult([], [], inflight=_inflight(dep))
    t0 = time.monotonic()
    _signal_group(dep.frontend, signal.SIGTERM)
    while not _gone(dep.frontend) and time.monotonic() - t0 < grace_s:
        time.sleep(0.2)
    res.waited_s = time.monotonic() - t0
    res.cut_off = _inflight(dep)
    for w in dep.workers:
        _signal_group(w, signal.SIGTERM)
    order = [*dep.workers, dep.frontend]
    end = time.monotonic() + timeout_s
    pending = list(order)
    while pending and time.monotonic() < end:
        pending = [p for p in pending if not _gone(p)]
        if pending:
            time.sleep(0.2)
    for p in order:
        if p in pending:
            _signal_group(p, signal.SIGKILL)
            res.killed.append(p.role)
        else:
            res.stopped.append(p.role)
    deadline = time.monotonic() + 10
    while any(not _gone(p) for p in pending) and time.monotonic() < deadline:
        time.sleep(0.1)
    for p in order:
        pids = set(group_members(p.pid)) | ({p.pid} if p.alive() else set())
        res.left += [f"{p.role}: {describe(pid)}" for pid in sorted(pids)]
    shutil.rmtree(dep.discovery_dir, ignore_errors=True)
    if not res.left:  # else keep it: status-dynamo and a second stop-dynamo still find them
        (Path(dep.state_dir) / STATE_FILE).unlink(missing_ok=True)
    return res


def stop_recorded(state_dir: Path = DEFAULT_STATE_DIR, grace_s: float = STOP_GRACE_S, timeout_s: float = STOP_TIMEOUT_S) -> StopResult | None:
    dep = Deployment.load(state_dir)
    if dep is None:
        shutil.rmtree(Path(state_dir) / DISCOVERY_DIR, ignore_errors=True)
        return None
    return stop(dep, grace_s, timeout_s)
