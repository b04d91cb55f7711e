"""``eagle3-trt deploy NEW --repo REPO``: NEW becomes the next version of a served Triton model.

How Triton is asked (checked on tritonserver 2.51.0, nvidia-pytriton 0.7.0, with 16 open gRPC
streams; tests/test_deploy_triton.py):

* ``serve`` runs Triton in explicit model-control mode (``--model-control-mode=explicit
  --load-model=*``: every model loaded at start, as before, and the repository API enabled).
* The version policy stays Triton's default, ``latest { num_versions: 1 }``: the highest numbered
  version directory is the one served, and config.pbtxt is never touched. A load whose config had
  changed (a ``version_policy`` written into config.pbtxt) made tritonserver 2.51 crash with SIGSEGV
  in ``TRITONBACKEND_ResponseFactoryIsCancelled`` while decoupled streams were open; adding a
  version directory and loading the unchanged model does not.
* ``deploy`` writes ``REPO/<name>/<n+1>/`` whole through the atomic writer (the packager's own
  per-version files: model.py, model.yaml, eagle3.yaml), adds them to the model's
  ``eagle3-package.json`` record, then ``POST /v2/repository/models/<name>/load``. Triton loads
  n+1 beside n (the call returns once it is ready); from then on a request without a version goes
  to n+1, and requests in flight (streams included) finish on n within the drain window (``--drain``,
  as ``stop`` gives them; one still running then is answered with an UNAVAILABLE error to retry).
  Triton unloads n once they have finished, except while a gRPC stream that sent n a request stays
  open: tritonserver 2.51 keeps each stream's first request, and with it the version, until the stream
  closes (``draining.py``; a stream whose refused request was abandoned by its client never does).
  So ``deploy`` retires n itself: a marker per backend stub of n (``draining.retire_marker_path``),
  on which the instance, once nothing has been in flight for a few seconds, ends its runtime and its
  stub. ``deploy`` waits for n's processes to end (past its drain window and that wait it kills them
  and says so) and reports the outcome: no stub or runtime of a replaced version outlives the deploy.
* ``deploy --rollback`` renames the served version's directory ``rolled-back-<n>`` (kept on disk;
  Triton ignores a version directory that is not a number) and loads again: the highest remaining
  version is loaded beside it and n is unloaded the same way. Version numbers are never reused, so
  Triton never mistakes a new version for one it has seen.
* A version that fails to load is renamed ``failed-<n>`` and Triton keeps serving the one before.

Without a running server for REPO, ``deploy`` refuses unless ``--offline``: then it only writes
(or rolls back) on disk, and the next ``serve`` serves the highest version.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from eagle3_trt.atomic import staged_dir, write_text
from eagle3_trt.atomic.lock import lock, unlock
from eagle3_trt.atomic.paths import fsync_dir
from eagle3_trt.errors import UserError
from eagle3_trt.formats.checkpoint_io import sha256_file
from eagle3_trt.pipeline.trtllm_adapter import serving_llm_kwargs
from eagle3_trt.procs import cmdline_contains, describe, parent_pid, pid_alive, terminate
from eagle3_trt.triton_serving.draining import RETIRE_POLL_S, RETIRE_QUIET_S, RETIRE_SETTLE_S, retire_marker_path, write_marker
from eagle3_trt.triton_serving.model_yaml import (
    MODEL_YAML,
    SERVING_YAML,
    BundleInfo,
    ModelYaml,
    load_model_yaml,
    load_serving_yaml,
    read_bundle,
    resolve_bundle,
)
from eagle3_trt.triton_serving.package import RECORD_FILE, PackageRecord, read_record, write_version_files
from eagle3_trt.triton_serving.server import DRAIN_S, EXECUTOR_WORKER, LEFTOVER_GRACE_S, STATE_FILE, ServerHandle

ROLLED_BACK = "rolled-back-"
FAILED = "failed-"
EXPLICIT_ARG = "--model-control-mode=explicit"
LOAD_TIMEOUT_S = 600.0
STUB_NAME = "triton_python_backend_stub"
# Past the drain window and the instance's own wait (RETIRE_*), how long a replaced version's
# processes get before `deploy` kills them.
RETIRE_GRACE_S = 10.0


@dataclass(frozen=True)
class DeployResult:
    model: str
    version: int  # served now
    previous: int  # served before
    bundle: Path  # the bundle version ``version`` serves
    loaded: bool  # the running server was asked (False: --offline)
    previous_state: str  # the previous version in Triton's repository index after the load ("" offline)
    seconds: float
    retired: Retired | None = None  # what became of the previous version's processes (None offline)


@dataclass(frozen=True)
class Retired:
    """The replaced version's backend stubs and runtime workers after ``deploy`` retired them."""

    processes: tuple[str, ...]  # what ran for it when the new version was ready
    waited_s: float
    killed: tuple[str, ...] = ()  # still running past the drain window and the instance's wait: killed, and the signal
    left: tuple[str, ...] = ()  # still running after SIGKILL

    @property
    def ended(self) -> bool:
        return not self.left


def version_numbers(mdir: Path) -> list[int]:
    """The model's version directories Triton sees (numbered), ascending."""
    return sorted(int(p.name) for p in Path(mdir).iterdir() if p.is_dir() and p.name.isdigit())


def _used_numbers(mdir: Path) -> list[int]:
    """Every number a version of this model ever had, rolled back and failed ones included."""
    out = list(version_numbers(mdir))
    for p in Path(mdir).iterdir():
        for prefix in (ROLLED_BACK, FAILED):
            if p.is_dir() and p.name.startswith(prefix) and p.name[len(prefix) :].isdigit():
                out.append(int(p.name[len(prefix) :]))
    return sorted(out)


def model_dir(repo: Path, name: str) -> Path:
    """REPO/<name>, refused unless `eagle3-trt package` wrote it (its record is there)."""
    repo = Path(repo)
    if not repo.is_dir():
        raise UserError(repo, "model repository not found", "write one with `eagle3-trt package BUNDLE -o REPO`")
    mdir = repo / name
    if not mdir.is_dir():
        names = sorted(p.name for p in repo.iterdir() if p.is_dir() and not p.name.startswith("."))
        raise UserError(mdir, f"no model '{name}' in this repository (it has: {', '.join(names) or 'none'})", "pass --name MODEL")
    if read_record(mdir) is None:
        raise UserError(
            mdir,
            f"a model `eagle3-trt package` did not write (no {RECORD_FILE}); deploy adds versions only to the toolkit's own models",
            "package the first version with `eagle3-trt package BUNDLE -o REPO`",
        )
    if not version_numbers(mdir):
        raise UserError(mdir, "has no version directory", "repackage it with `eagle3-trt package BUNDLE -o REPO --force`")
    return mdir


def version_bundle(mdir: Path, version: int) -> BundleInfo:
    """The bundle version ``version`` of the model serves (from its eagle3.yaml)."""
    sv_path = Path(mdir) / str(version) / SERVING_YAML
    return read_bundle(resolve_bundle(load_serving_yaml(sv_path), sv_path))


def check_same_target(new: BundleInfo, served: BundleInfo, where: str) -> None:
    """NEW must be built from the same target checkpoint (file digests in the manifests' sources)."""
    a, b = new.bundle.manifest.sources.target, served.bundle.manifest.sources.target
    if {k: v.sha256 for k, v in a.files.items()} != {k: v.sha256 for k, v in b.files.items()}:
        raise UserError(
            new.path,
            f"built for another target ({a.source or a.path}) than {where} serves ({b.source or b.path})",
            "deploy a head built for the served target; serve another target as another model (`eagle3-trt package --name`)",
        )


def find_server(repo: Path, state_dir: Path) -> ServerHandle | None:
    """The running server recorded in ``state_dir``, refused when it serves another repository or
    was started without the repository API (explicit model control); None when none runs."""
    try:
        h = ServerHandle.load(state_dir)
    except UserError:
        return None
    if not h.alive():
        return None
    if Path(h.repo).resolve() != Path(repo).resolve():
        raise UserError(
            Path(state_dir) / STATE_FILE,
            f"the server recorded here (pid {h.pid}) serves {h.repo}, not {Path(repo).resolve()}",
            "pass the --state-dir of the server that serves REPO",
        )
    try:
        argv = Path(f"/proc/{h.pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        argv = []
    if EXPLICIT_ARG not in argv:
        raise UserError(
            Path(state_dir) / STATE_FILE,
            f"tritonserver pid {h.pid} was started without {EXPLICIT_ARG}: it cannot load a new version",
            "restart it with this release's `eagle3-trt serve` (stop, serve), then deploy",
        )
    return h


def _post(url: str, timeout_s: float) -> tuple[int, str]:
    req = urllib.request.Request(url, data=b"{}", method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        body = e.read().decode(errors="replace")
        try:
            body = json.loads(body).get("error", body)
        except ValueError:
            pass
        return e.code, body
    except (urllib.error.URLError, OSError) as e:
        return 0, str(e)


def version_state(h: ServerHandle, name: str, version: int) -> str:
    """The version's state in Triton's repository index, lower case ("ready", "unloading", "unavailable"),
    "unloaded" when the index does not list it, "unknown" when the server does not answer."""
    code, body = _post(f"{h.http_url}/v2/repository/index", 30)
    if code != 200:
        return "unknown"
    try:
        rows = json.loads(body)
    except ValueError:
        return "unknown"
    for row in rows:
        if row.get("name") == name and str(row.get("version")) == str(version):
            return str(row.get("state", "unknown")).lower()
    return "unloaded"


def version_processes(h: ServerHandle, name: str, version: int) -> tuple[list[int], list[int]]:
    """(backend stubs, their runtime workers) running version ``version`` of ``name`` on server ``h``:
    stubs by the server's shared-memory prefix and the model file they were started with (a renamed
    directory keeps its stub's command line), workers by their parent."""
    model_py = str(Path(h.repo) / name / str(version) / "model.py")
    stubs = []
    for pid in cmdline_contains(h.shm_prefix) if h.shm_prefix.startswith("eagle3_") else []:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if len(argv) > 1 and Path(argv[0]).name == STUB_NAME and argv[1] == model_py:
            stubs.append(pid)
    workers = [p for p in cmdline_contains(EXECUTOR_WORKER) if parent_pid(p) in stubs]
    return stubs, workers


def retire_version(h: ServerHandle, name: str, version: int, drain_s: float) -> Retired:
    """Ask every stub of the replaced ``version`` to go (its drain window: ``drain_s``), wait for its
    processes to end, kill what still runs past the window and the instance's own wait."""
    t0 = time.monotonic()
    stubs, workers = version_processes(h, name, version)
    names = {p: describe(p) for p in stubs + workers}
    for p in stubs:
        write_marker(h.shm_prefix, drain_s, stub_pid=p)
    end = t0 + drain_s + RETIRE_SETTLE_S + RETIRE_QUIET_S + RETIRE_GRACE_S
    while any(pid_alive(p) for p in stubs + workers) and time.monotonic() < end:
        time.sleep(RETIRE_POLL_S / 2)
    waited = time.monotonic() - t0
    ended, left = terminate([p for p in stubs + workers if pid_alive(p)], LEFTOVER_GRACE_S)
    for p in stubs:
        retire_marker_path(h.shm_prefix, p).unlink(missing_ok=True)
    return Retired(
        tuple(names[p] for p in stubs + workers),
        waited,
        tuple(f"{names[p]} by {sig}" for p, sig in sorted(ended.items())),
        tuple(names[p] for p in left),
    )


def _load(h: ServerHandle, name: str, version: int, timeout_s: float) -> str | None:
    """Ask the server to load ``name`` (its highest version); None when ``version`` is ready, else Triton's error."""
    code, body = _post(f"{h.http_url}/v2/repository/models/{name}/load", timeout_s)
    if code != 200:
        return body or f"HTTP {code}"
    try:
        with urllib.request.urlopen(f"{h.http_url}/v2/models/{name}/versions/{version}/ready", timeout=30) as r:
            return None if r.status == 200 else f"version {version} not ready (HTTP {r.status})"
    except (urllib.error.URLError, OSError) as e:
        return f"version {version} not ready ({e})"


def _record_files(mdir: Path, renames: dict[str, str], added: Path | None) -> None:
    """Carry the model's record forward: renamed version directories, and a new one's files."""
    rec = read_record(mdir)
    files = dict(rec.files) if rec is not None else {}
    for old, new in renames.items():
        files = {(new + k[len(old) :] if k.startswith(old + "/") else k): v for k, v in files.items()}
    if added is not None:
        for p in sorted(added.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                files[p.relative_to(mdir).as_posix()] = sha256_file(p)
    write_text(mdir / RECORD_FILE, PackageRecord(files=dict(sorted(files.items()))).model_dump_json(indent=1) + "\n")


def _rename(mdir: Path, src: str, dst: str) -> None:
    os.replace(mdir / src, mdir / dst)
    fsync_dir(mdir)
    _record_files(mdir, {src: dst}, None)


def _write_version(mdir: Path, version: int, new: BundleInfo, like: int) -> Path:
    """REPO/<name>/<version>/ for bundle ``new``, with the serving settings of version ``like``."""
    cur = mdir / str(like)
    sv = load_serving_yaml(cur / SERVING_YAML).model_copy(update={"bundle": str(new.path)})
    my = load_model_yaml(cur / MODEL_YAML)
    kwargs = serving_llm_kwargs(new.path, new.bundle.options, speculation=sv.speculation, portable=True).kwargs
    dest = mdir / str(version)
    with staged_dir(dest) as d:
        write_version_files(d, sv, ModelYaml(my.triton_config, kwargs))
    _record_files(mdir, {}, dest)
    return dest


def deploy(
    new_bundle: Path | None,
    repo: Path,
    *,
    name: str,
    state_dir: Path,
    rollback: bool = False,
    offline: bool = False,
    timeout_s: float = LOAD_TIMEOUT_S,
    drain_s: float = DRAIN_S,
) -> DeployResult:
    """Add ``new_bundle`` as the next version of model ``name`` in ``repo`` (or, ``rollback``, go
    back to the version before the served one) and have the server recorded in ``state_dir`` serve it."""
    t0 = time.monotonic()
    repo = Path(repo)
    mdir = model_dir(repo, name)
    info: BundleInfo | None = None
    if not rollback:  # NEW is checked before the server: bad input is named first
        assert new_bundle is not None
        info = read_bundle(Path(new_bundle).resolve())
        check_same_target(info, version_bundle(mdir, version_numbers(mdir)[-1]), f"version {version_numbers(mdir)[-1]} of '{name}'")
    h = find_server(repo, state_dir)
    if h is None and not offline:
        raise UserError(
            Path(state_dir) / STATE_FILE,
            f"no server running for {repo}",
            f"start it with `eagle3-trt serve {repo} --state-dir {state_dir}`, or pass --offline to change the repository on disk only",
        )
    held = lock(mdir)
    try:
        served = version_numbers(mdir)[-1]
        if rollback:
            earlier = [v for v in version_numbers(mdir) if v < served]
            if not earlier:
                raise UserError(mdir, f"version {served} is the only version; there is nothing to roll back to", "deploy a bundle with `eagle3-trt deploy NEW`")
            target, info = earlier[-1], version_bundle(mdir, earlier[-1])  # refused here if its bundle is gone
            _rename(mdir, str(served), f"{ROLLED_BACK}{served}")
            undo = (f"{ROLLED_BACK}{served}", str(served))
        else:
            assert info is not None
            check_same_target(info, version_bundle(mdir, served), f"version {served} of '{name}'")  # again: under the lock
            target = _used_numbers(mdir)[-1] + 1
            _write_version(mdir, target, info, served)
            undo = (str(target), f"{FAILED}{target}")
        state = ""
        retired = None
        if h is not None:
            err = _load(h, name, target, timeout_s)
            if err is not None:
                _rename(mdir, *undo)
                _load(h, name, served, timeout_s)  # Triton serves the highest version on disk again: ``served``
                what = f"version {target} of '{name}' failed to load; version {served} is still served"
                raise UserError("tritonserver", f"{what}. Triton said: {err}", f"read {h.log_file}")
            retired = retire_version(h, name, served, drain_s)
            state = version_state(h, name, served)
    finally:
        unlock(mdir, held)
    return DeployResult(name, target, served, info.path, h is not None, state, time.monotonic() - t0, retired)
