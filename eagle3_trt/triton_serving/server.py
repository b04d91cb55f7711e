"""Start and stop a real ``tritonserver`` on 127.0.0.1 with a generated repository.

Where the server comes from:
  * a TensorRT-LLM / Triton container: ``tritonserver`` on PATH (its own Python backend);
  * a CPU machine: the ``nvidia-pytriton`` wheel, which bundles ``tritonserver``, the
    Python backend and per-Python-version backend stubs. The stub is copied into a backend
    directory we own, and ``LD_LIBRARY_PATH`` gets the wheel's ``.libs`` folder and this
    Python's own libdir (otherwise the stub loads the system libpython against our standard
    library and fails with "'_thread.RLock' object has no attribute '_recursion_count'": seen
    with nvidia-pytriton 0.7.0 / tritonserver 2.51.0, system Python 3.11.2 vs pyenv 3.11.7).

The server runs in its own session (process group), logs to a file, and leaves a
``server.json`` in the state directory so ``eagle3-trt stop`` can find it.

Stopping: ``stop`` writes a drain marker (``draining.py``), then SIGTERM. Triton stops taking
requests and waits up to ``--exit-timeout-secs`` (``EXIT_TIMEOUT_S``) for in-flight work; the model
lets requests run for the drain window (``DRAIN_S``) and then ends each one still open with a
"server is shutting down" error, so Triton unloads the models and exits well inside its timeout.
A version that a gRPC stream still holds (tritonserver 2.51 keeps the first request of every stream,
and with it the model version, until the stream closes: ``draining.py``) is not unloaded by Triton
however idle it is: the model instance ends its own runtime and stub once the marker is there and
nothing has been in flight for a few seconds. ``stop`` waits longer than all that before it kills
the process group, except when only such connections hold the server: once every backend stub has
exited (nothing can be in flight without one) it gets ``IDLE_EXIT_S`` more, then is ended and the
stop counts as clean (before, a stream kept open after its last response made ``stop`` wait out
Triton's exit timeout, kill it after 35 s and claim lost requests). Once the server is gone,
whatever is left of it (its process group, Python-backend stubs that outlived it: found by group,
by the shared-memory prefix in their command line and by the ``/dev/shm`` files they hold) gets
SIGTERM, then SIGKILL; ``stop`` reports what it had to kill (and exits non-zero), keeps
``server.json`` while anything of it still runs, and removes the server's shared-memory regions
(``/dev/shm/<shm_prefix>*``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import site
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from eagle3_trt.atomic import FILE_MODE, make_dirs, staged_dir, write_json
from eagle3_trt.errors import UserError
from eagle3_trt.procs import HOST, cmdline_contains, describe, group_members, holders_of, parent_pid, pid_alive, port_is_free, terminate
from eagle3_trt.runtime.capture import CaptureConfig, capture_env
from eagle3_trt.triton_serving.draining import RETIRE_INFIX, SHM_DIR, marker_path, write_marker
from eagle3_trt.triton_serving.package import check_repository, package_import_root

STATE_FILE = "server.json"
DEFAULT_STATE_DIR = Path(".serve")
# On `stop`, requests get DRAIN_S to finish, then the model ends them with an error; Triton's own
# limit (EXIT_TIMEOUT_S) leaves time after that to deliver the errors and unload the models.
# `stop` waits STOP_TIMEOUT_S (> both) before it kills the server.
DRAIN_S = 15.0
EXIT_TIMEOUT_S = 25
DRAIN_MAX_S = EXIT_TIMEOUT_S - 5.0
STOP_TIMEOUT_S = 35.0
# After the server exits: how long its stubs get to exit on their own, then to honour SIGTERM.
LEFTOVER_GRACE_S = 3.0
# After SIGTERM, once every backend stub of the server has exited (Triton unloaded its models, or an
# instance held only by open gRPC streams retired itself: both happen only with nothing in flight),
# how long it gets to exit before `stop` ends it: past that it is held only by open connections with
# no request (tritonserver 2.51 then waits out --exit-timeout-secs for the versions such streams
# hold, and on the gRPC server's shutdown past that).
IDLE_EXIT_S = 3.0


@dataclass(frozen=True)
class TritonInstall:
    executable: Path
    kind: str  # "pytriton" | "path"
    backend_src: Path | None = None  # pytriton: backends/python
    stub: Path | None = None  # pytriton: python_backend_stubs/<py>/triton_python_backend_stub
    lib_dirs: tuple[str, ...] = ()


def find_tritonserver() -> TritonInstall:
    """Prefer tritonserver on PATH (container); else the nvidia-pytriton wheel's copy."""
    on_path = shutil.which("tritonserver")
    if on_path:
        return TritonInstall(Path(on_path), "path")
    try:
        import pytriton  # local: optional (CPU machines); a container has tritonserver on PATH
    except ImportError:
        raise UserError(
            "tritonserver",
            "not on PATH and the nvidia-pytriton wheel is not installed",
            "pip install 'nvidia-pytriton==0.7.0' (CPU machines) or run inside a Triton/TensorRT-LLM container",
        ) from None
    if pytriton.__file__ is None:  # a namespace package of that name, not the wheel
        raise UserError("pytriton", "is importable but is not the nvidia-pytriton wheel", "pip install 'nvidia-pytriton==0.7.0'")
    root = Path(pytriton.__file__).resolve().parent / "tritonserver"
    exe = root / "bin" / "tritonserver"
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / py / "triton_python_backend_stub"
    backend = root / "backends" / "python"
    for p, what in ((exe, "tritonserver binary"), (stub, f"Python {py} backend stub"), (backend / "libtriton_python.so", "Python backend")):
        if not p.exists():
            raise UserError(p, f"{what} missing from the nvidia-pytriton wheel", "reinstall nvidia-pytriton==0.7.0")
    libs = root.parent.parent / "nvidia_pytriton.libs"
    pylib = sysconfig.get_config_var("LIBDIR") or ""
    return TritonInstall(exe, "pytriton", backend, stub, tuple(str(p) for p in (libs, Path(pylib)) if str(p) and Path(p).is_dir()))


def prepare_backend_dir(install: TritonInstall, state_dir: Path) -> Path | None:
    """pytriton: backends/python = the wheel's backend + the stub for this Python."""
    if install.kind != "pytriton":
        return None
    bdir = state_dir / "backends"
    with staged_dir(bdir / "python") as pdir:
        shutil.copytree(install.backend_src, pdir, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)  # type: ignore[arg-type]
        shutil.copy2(install.stub, pdir / "triton_python_backend_stub")  # type: ignore[arg-type]
    return bdir


def server_env(install: TritonInstall) -> dict[str, str]:
    """Environment for tritonserver and its Python-backend stubs.

    The stub embeds Python in isolated mode: it ignores PYTHONPATH and sees the base
    interpreter's site-packages, not this virtual environment's. The model therefore
    reads EAGLE3_SYS_PATH (and EAGLE3_DROP_SYSTEM_SITE) first thing and adopts the
    launching interpreter's import path; PYTHONPATH is still set for other tools.
    """
    env = dict(os.environ)
    if install.lib_dirs:
        env["LD_LIBRARY_PATH"] = os.pathsep.join([*install.lib_dirs, *filter(None, [env.get("LD_LIBRARY_PATH")])])
    paths = [package_import_root(), *site.getsitepackages()]
    env["EAGLE3_SYS_PATH"] = os.pathsep.join(dict.fromkeys(paths))
    in_venv = sys.prefix != sys.base_prefix
    env["EAGLE3_DROP_SYSTEM_SITE"] = "1" if in_venv and not _venv_includes_system_site() else "0"
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.setdefault("LC_ALL", "C.UTF-8")
    env.setdefault("LANG", "C.UTF-8")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _venv_includes_system_site() -> bool:
    cfg = Path(sys.prefix) / "pyvenv.cfg"
    try:
        for line in cfg.read_text().splitlines():
            key, _, val = line.partition("=")
            if key.strip() == "include-system-site-packages":
                return val.strip().lower() == "true"
    except OSError:
        pass
    return False


def free_ports(n: int) -> list[int]:
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


@dataclass
class ServerHandle:
    pid: int
    repo: str
    http_port: int
    grpc_port: int
    metrics_port: int
    log_file: str
    state_dir: str
    models: list[str] = field(default_factory=list)
    started_at: float = 0.0
    shm_prefix: str = ""  # the Python backend's shared-memory region names start with this
    # http_port is the project's HTTP front (http_front.py); tritonserver's own HTTP endpoint is on this loopback port
    triton_http_port: int = 0
    front_pid: int = 0

    @property
    def http_url(self) -> str:
        return f"http://{HOST}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{HOST}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{HOST}:{self.metrics_port}/metrics"

    def save(self) -> None:
        write_json(Path(self.state_dir) / STATE_FILE, asdict(self))

    @classmethod
    def load(cls, state_dir: Path) -> ServerHandle:
        path = Path(state_dir) / STATE_FILE
        try:
            return cls(**json.loads(path.read_text()))
        except FileNotFoundError:
            raise UserError(path, "no server recorded here", "start one with `eagle3-trt serve REPO`") from None
        except (ValueError, TypeError) as e:  # not JSON, or not this record's fields
            raise UserError(path, f"unreadable server record ({e})", f"remove {state_dir} after checking no tritonserver is left") from None

    def alive(self) -> bool:
        return pid_alive(self.pid)


def log_errors(log_file: Path, tail: int = 25) -> str:
    """Triton's error lines (E-prefixed glog lines, Python tracebacks) from the log, else its tail."""
    try:
        lines = Path(log_file).read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no log written)"
    errs = [ln for ln in lines if ln.startswith("E") or "Error" in ln or "error:" in ln or "Traceback" in ln]
    picked = errs[-tail:] if errs else lines[-tail:]
    return "\n".join(picked)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/v2/health/ready", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def start_server(
    repo: Path,
    *,
    state_dir: Path = DEFAULT_STATE_DIR,
    http_port: int = 8000,
    grpc_port: int = 8001,
    metrics_port: int = 8002,
    timeout_s: float = 600.0,
    log_verbose: int = 0,
    validate: bool = True,
    extra_args: tuple[str, ...] = (),
    capture: CaptureConfig | None = None,
) -> ServerHandle:
    """Launch tritonserver, wait for /v2/health/ready; on failure stop it and raise with Triton's error.

    ``capture``: record finished requests (runtime/capture.py); None: nothing is captured, even
    when the caller's environment carries capture settings."""
    repo = Path(repo).resolve()
    state_dir = Path(state_dir).resolve()
    _check_can_start(state_dir, http_port, grpc_port, metrics_port)  # a running server: refused before anything is touched
    models = check_repository(repo) if validate else []
    make_dirs(state_dir)

    install = find_tritonserver()
    backend_dir = prepare_backend_dir(install, state_dir)
    shm_prefix = f"eagle3_{uuid.uuid4().hex[:12]}_"
    log_file = state_dir / "tritonserver.log"
    triton_http_port = next(p for p in free_ports(4) if p not in (http_port, grpc_port, metrics_port))
    cmd = _server_argv(install, repo, backend_dir, shm_prefix, triton_http_port, grpc_port, metrics_port, log_verbose, extra_args)
    env = capture_env(capture, server_env(install))
    with open(log_file, "wb") as log:
        os.chmod(log_file, FILE_MODE)
        log.write((" ".join(cmd) + "\n").encode())
        log.flush()
        # umask 022: the Python backend writes __pycache__ into the repository's model directories and
        # the backend directory; under a umask of 077 those would be 0700, unreadable to other users.
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True, umask=0o022)
    front = _start_front(repo, state_dir, http_port, triton_http_port, proc.pid, server_env(install))
    handle = ServerHandle(
        proc.pid, str(repo), http_port, grpc_port, metrics_port, str(log_file), str(state_dir), models, time.time(), shm_prefix, triton_http_port, front.pid
    )
    handle.save()
    _wait_ready(proc, handle, timeout_s, front)
    return handle


FRONT_MODULE = "eagle3_trt.triton_serving.http_front"
FRONT_LOG = "http_front.log"


def _start_front(repo: Path, state_dir: Path, port: int, triton_http_port: int, triton_pid: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """The project's HTTP front (http_front.py) on the user's HTTP port, in a session of its own (not
    tritonserver's process group, whose members ``stop`` counts as the server's); it exits with tritonserver."""
    argv = [
        sys.executable,
        "-m",
        FRONT_MODULE,
        "--port",
        str(port),
        "--upstream-port",
        str(triton_http_port),
        "--repo",
        str(repo),
        "--watch-pid",
        str(triton_pid),
    ]
    with open(state_dir / FRONT_LOG, "wb") as log:
        os.chmod(state_dir / FRONT_LOG, FILE_MODE)
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)


def _stop_front(handle: ServerHandle, grace_s: float) -> tuple[str, ...]:
    """End the HTTP front (it exits on its own once tritonserver has); what is left of it after SIGKILL."""
    pid = handle.front_pid
    if not pid or not pid_alive(pid) or pid not in cmdline_contains(FRONT_MODULE):
        return ()
    name = describe(pid)
    _, alive = terminate([pid], grace_s)
    return (name,) if alive else ()


def _check_can_start(state_dir: Path, http_port: int, grpc_port: int, metrics_port: int) -> None:
    """Refuse a second server in one state directory, and ports already taken."""
    try:
        prev: ServerHandle | None = ServerHandle.load(state_dir)
    except UserError:  # no server recorded here
        prev = None
    if prev is not None and prev.alive():
        # where it runs and how to stop it: the newcomer who typed `serve` twice needs both
        by_make = " (make stop)" if state_dir == DEFAULT_STATE_DIR.resolve() else ""
        raise UserError(
            state_dir / STATE_FILE,
            f"a server is already running here: tritonserver pid {prev.pid}, HTTP {prev.http_port}, gRPC {prev.grpc_port}, "
            f"metrics {prev.metrics_port} on {HOST}, repository {prev.repo}",
            f"stop it with `eagle3-trt stop --state-dir {state_dir}`{by_make}, or pass another --state-dir and free ports",
        )
    for name, port in (("--http-port", http_port), ("--grpc-port", grpc_port), ("--metrics-port", metrics_port)):
        if not port_is_free(port):
            raise UserError(name, f"port {port} on {HOST} is in use", "pick another port or stop what holds it")


def _server_argv(
    install: TritonInstall,
    repo: Path,
    backend_dir: Path | None,
    shm_prefix: str,
    http_port: int,
    grpc_port: int,
    metrics_port: int,
    log_verbose: int,
    extra_args: tuple[str, ...],
) -> list[str]:
    cmd = [
        str(install.executable),
        f"--model-repository={repo}",
        f"--http-address={HOST}",
        f"--http-port={http_port}",
        f"--grpc-address={HOST}",
        f"--grpc-port={grpc_port}",
        f"--metrics-address={HOST}",
        f"--metrics-port={metrics_port}",
        "--allow-gpu-metrics=false",
        # Our config.pbtxt is complete; mirror upstream's launcher so that is what gets tested.
        "--disable-auto-complete-config",
        # Explicit model control: every model loaded at start (as in the default mode), and the
        # repository API enabled, through which `eagle3-trt deploy` loads a new version (deploy.py).
        "--model-control-mode=explicit",
        "--load-model=*",
        "--exit-on-error=true",
        "--strict-readiness=true",
        f"--log-verbose={log_verbose}",
        # Two servers on one host must not share the Python backend's shared-memory names.
        f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
        f"--exit-timeout-secs={EXIT_TIMEOUT_S}",
        *extra_args,
    ]
    if backend_dir is not None:
        cmd.append(f"--backend-directory={backend_dir}")
    return cmd


def _wait_ready(proc: subprocess.Popen[bytes], handle: ServerHandle, timeout_s: float, front: subprocess.Popen[bytes] | None = None) -> None:
    """Return once the server answers /v2/health/ready (through the HTTP front); raise with Triton's
    (or the front's) error when either exits or the wait times out."""
    state_dir, log_file = Path(handle.state_dir), Path(handle.log_file)
    deadline = time.monotonic() + timeout_s
    while True:
        if front is not None and front.poll() is not None:
            stop_server(handle)
            front_log = state_dir / FRONT_LOG
            raise UserError(
                "--http-port",
                f"the HTTP front on {HOST}:{handle.http_port} exited with code {front.returncode}; it said:\n{log_errors(front_log)}",
                f"full log: {front_log}",
            )
        rc = proc.poll()
        if rc is not None:
            _forget(state_dir)
            raise UserError(
                "tritonserver",
                f"exited with code {rc} before becoming ready; Triton said:\n{log_errors(log_file)}",
                f"full log: {log_file}",
            )
        if _ready(handle.http_url):
            return
        if time.monotonic() > deadline:
            stop_server(handle)
            raise UserError(
                "tritonserver",
                f"not ready after {timeout_s:.0f} s; last log lines:\n{log_errors(log_file)}",
                f"raise --timeout or read {log_file}",
            )
        time.sleep(0.25)


def _forget(state_dir: Path) -> None:
    try:
        (Path(state_dir) / STATE_FILE).unlink()
    except FileNotFoundError:
        pass


@dataclass(frozen=True)
class StopResult:
    pid: int
    was_alive: bool
    killed: bool  # did not exit within the timeout after SIGTERM: its process group got SIGKILL
    removed_shm: tuple[str, ...]  # shared-memory regions it left behind, now removed
    killed_leftovers: tuple[str, ...] = ()  # its processes still running after it exited, and the signal that ended each
    left: tuple[str, ...] = ()  # its processes still running after SIGKILL (e.g. another user's): not stopped
    idle_s: float | None = None  # ended this long after SIGTERM with its models unloaded: only idle connections held it (nothing lost)

    def __bool__(self) -> bool:
        return self.was_alive or bool(self.killed_leftovers or self.left)

    @property
    def clean(self) -> bool:
        """Stopped without killing anything, and nothing of it is left."""
        return not (self.killed or self.killed_leftovers or self.left)

    def lines(self, timeout_s: float) -> list[str]:
        out = []
        if self.idle_s is not None:
            out.append(
                f"tritonserver (pid {self.pid}) had no request in flight (every backend stub had exited) but still held model versions "
                "for gRPC streams that had sent them requests (tritonserver 2.51 keeps a stream's first request until the stream closes): "
                f"ended it {self.idle_s:.1f} s after SIGTERM; no request was lost "
                "(a request still running when the drain window ended was answered with the retry error)"
            )
        if self.killed:
            out.append(
                f"tritonserver (pid {self.pid}) did not exit within {timeout_s:.0f} s of SIGTERM: killed its process group "
                "(in-flight requests were lost; see its log)"
            )
        if self.killed_leftovers:
            out.append(f"killed {len(self.killed_leftovers)} process(es) of it still running after it exited: {', '.join(self.killed_leftovers)}")
        if self.left:
            out.append(f"still running after SIGKILL: {', '.join(self.left)}")
        if self.removed_shm:
            out.append(f"removed {len(self.removed_shm)} shared-memory region(s) it left behind: {', '.join(self.removed_shm)}")
        return out


def remove_shm_regions(prefix: str, shm_dir: Path = SHM_DIR) -> tuple[str, ...]:
    """Delete ``shm_dir/<prefix>*`` (the regions of one server, named by its unique prefix)."""
    if not _valid_prefix(prefix):
        return ()
    removed = []
    for p in sorted(Path(shm_dir).glob(prefix + "*")):
        try:
            p.unlink()
            removed.append(str(p))
        except FileNotFoundError:
            pass
    return tuple(removed)


def stop_server(
    handle: ServerHandle, timeout_s: float = STOP_TIMEOUT_S, shm_dir: Path = SHM_DIR, drain_s: float = DRAIN_S, grace_s: float = LEFTOVER_GRACE_S
) -> StopResult:
    """Drain (``drain_s``), SIGTERM the server (it unloads models, stubs exit), SIGKILL its process
    group if it hangs past ``timeout_s``; then end whatever of it is left and remove its
    shared-memory regions. Truthy when anything of a server was running."""
    pid = handle.pid
    was_alive = pid_alive(pid)
    killed = False
    idle_s: float | None = None
    if was_alive:
        if _valid_prefix(handle.shm_prefix):
            write_marker(handle.shm_prefix, drain_s, shm_dir)
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        unloaded: float | None = None  # when no backend stub of it was left
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
            if unloaded is None and not [p for p in _leftovers(handle, shm_dir) if p != pid]:
                unloaded = time.monotonic()
            if unloaded is not None and time.monotonic() - unloaded > IDLE_EXIT_S:
                break  # nothing in flight: only idle connections keep it
        if pid_alive(pid):
            if unloaded is not None and time.monotonic() < deadline:
                idle_s = time.monotonic() - t0
            else:
                killed = True
            try:
                os.killpg(pid, signal.SIGKILL)  # the group started with the server: stubs included
            except (ProcessLookupError, PermissionError):
                pass
            deadline = time.monotonic() + 5
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
    # The stubs exit on their own shortly after the server; one that does not (Triton exited with
    # work in flight: the stub keeps computing, reparented to init, its shared memory held) is ended here.
    deadline = time.monotonic() + grace_s
    while _leftovers(handle, shm_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    rest = _leftovers(handle, shm_dir)
    names = {p: describe(p) for p in rest}  # while they still run
    # A stub's reference runtime runs in a worker process of its own (runtime/executor_worker.py),
    # in the stub's process group. It ignores SIGTERM and exits when its stub's socket reaches EOF:
    # it is ended with its stub, and only killed (named as its stub's) if it outlives it.
    workers = {p: parent_pid(p) for p in rest if p in cmdline_contains(EXECUTOR_WORKER)}
    for p, parent in workers.items():
        names[p] = f"pid {p} (reference runtime worker of {names[parent]})" if parent in names else f"pid {p} (reference runtime worker)"
    ended, alive = terminate([p for p in rest if p not in workers], grace_s) if rest else ({}, [])
    deadline = time.monotonic() + grace_s
    while any(pid_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    w_ended, w_alive = terminate(list(workers), grace_s)
    ended.update(w_ended)
    alive += w_alive
    killed_leftovers = tuple(f"{names[p]} by {sig}" for p, sig in sorted(ended.items()))
    left = tuple(names[p] for p in alive) + _stop_front(handle, grace_s)
    if _valid_prefix(handle.shm_prefix):  # our markers, not regions it left behind
        marker_path(handle.shm_prefix, shm_dir).unlink(missing_ok=True)
        for m in Path(shm_dir).glob(f"{handle.shm_prefix}{RETIRE_INFIX}*"):
            m.unlink(missing_ok=True)
    removed = remove_shm_regions(handle.shm_prefix, shm_dir)
    if not left:  # keep the record while anything of it runs: a second `stop` finds it again
        _forget(Path(handle.state_dir))
    return StopResult(pid, was_alive, killed, removed, killed_leftovers, left, idle_s)


# executor_ipc.WORKER_MODULE, the reference runtime's worker process (not imported here: it loads torch)
EXECUTOR_WORKER = "eagle3_trt.runtime.executor_worker"


def _valid_prefix(prefix: str) -> bool:
    return prefix.startswith("eagle3_") and len(prefix) >= 12  # never a broad pattern


def _leftovers(handle: ServerHandle, shm_dir: Path) -> list[int]:
    """Processes of the server still running: its process group, and the stubs that may have left
    it (found by the unique shared-memory prefix in their command line or in the files they hold)."""
    pids = set(group_members(handle.pid))
    if _valid_prefix(handle.shm_prefix):
        pids.update(cmdline_contains(handle.shm_prefix))
        pids.update(holders_of(str(Path(shm_dir) / handle.shm_prefix)))
    pids.discard(os.getpid())
    return sorted(p for p in pids if pid_alive(p))


def stop_recorded(state_dir: Path = DEFAULT_STATE_DIR, timeout_s: float = STOP_TIMEOUT_S, drain_s: float = DRAIN_S) -> StopResult | None:
    """Stop the server recorded in ``state_dir``; None when nothing was recorded there."""
    try:
        handle = ServerHandle.load(state_dir)
    except UserError:
        return None
    return stop_server(handle, timeout_s, drain_s=drain_s)
