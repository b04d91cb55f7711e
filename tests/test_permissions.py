"""Bundles, Triton repositories and the server's state are readable by other users (a Triton
container usually runs as another uid) whatever the umask, and a build stopped with SIGTERM
(``docker stop``, Kubernetes) leaves nothing behind. Real CLI processes on real files."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from fnmatch import fnmatch
from pathlib import Path

import pytest

from eagle3_trt.triton_serving.server import free_ports

REPO_ROOT = Path(__file__).resolve().parents[1]
# One OpenMP thread: spin-waiting threads on a busy 2-core machine make a 10 s build take a minute.
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _cli(*args: str, umask: int = 0o077, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eagle3_trt.cli", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout, umask=umask, env=ENV)


def _bad_modes(root: Path, executables: tuple[str, ...] = ()) -> list[str]:
    """Every entry under root that is not 0755 (directories, executables) or 0644 (other files)."""
    bad = []
    for p in [root, *root.rglob("*")]:
        rel = p.relative_to(root).as_posix()
        mode = stat.S_IMODE(p.lstat().st_mode)
        want = 0o755 if p.is_dir() or any(fnmatch(rel, pat) for pat in executables) else 0o644
        if mode != want:
            bad.append(f"{rel or '.'}: {oct(mode)} (want {oct(want)})")
    return bad


def _no_staging_left(root: Path) -> list[str]:
    """Lock files and staging entries the atomic writer must never leave inside an output."""
    return [p.relative_to(root).as_posix() for p in root.rglob(".*") if ".tmp-" in p.name or ".old-" in p.name or p.name.endswith(".lock")]


def test_bundle_built_and_packaged_under_umask_077_is_world_readable(fp8_bundle, tmp_path):
    # The session's bundle (built in this process) first: mkdtemp/mkstemp make 0700/0600 whatever the umask.
    assert _bad_modes(fp8_bundle, executables=("launch/*.sh",)) == []
    repo = tmp_path / "new" / "repo"
    r = _cli("package", str(fp8_bundle), "-o", str(repo))
    assert r.returncode == 0, r.stderr
    assert _bad_modes(repo) == [] and _no_staging_left(repo) == []
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o755  # a parent the writer created
    assert [p.name for p in (tmp_path / "new").iterdir()] == ["repo"]  # no lock or staging beside it


def test_bundle_built_under_umask_077_is_world_readable(tmp_path):
    bundle = tmp_path / "engines" / "tiny"
    r = _cli("engine", "--model", "tiny", "--target-gpu", "h100", "-o", str(bundle))
    assert r.returncode == 0, r.stderr
    assert (bundle / "target" / "model.safetensors").is_file() and (bundle / "draft" / "model.safetensors").is_file()
    assert sorted(p.name for p in (bundle / "launch").glob("*.sh"))  # scripts exist, and must stay executable
    assert _bad_modes(tmp_path / "engines", executables=("tiny/launch/*.sh",)) == []
    assert _no_staging_left(bundle) == []
    assert [p.name for p in (tmp_path / "engines").iterdir()] == ["tiny"]


@pytest.mark.triton
@pytest.mark.needs("tritonserver")
def test_serve_and_stop_under_umask_077_leave_readable_files(fp8_bundle, tmp_path):
    repo, state = tmp_path / "repo", tmp_path / "state"
    assert _cli("package", str(fp8_bundle), "-o", str(repo)).returncode == 0
    http, grpc, metrics = free_ports(3)
    r = _cli(
        "serve", str(repo), "--state-dir", str(state), "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--timeout", "240"
    )
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        # The Python backend has imported model.py by now: its __pycache__ lands in the repository.
        assert list(repo.rglob("__pycache__"))
        assert _bad_modes(repo) == []
        assert _bad_modes(state, executables=("backends/python/triton_python_backend_stub",)) == []
    finally:
        stop = _cli("stop", "--state-dir", str(state))
    assert stop.returncode == 0, stop.stderr
    assert _bad_modes(state, executables=("backends/python/triton_python_backend_stub",)) == []
    assert not (state / "server.json").exists()


def test_sigterm_during_a_build_leaves_nothing(tmp_path):
    out = tmp_path / "bundle"
    proc = subprocess.Popen(
        [sys.executable, "-m", "eagle3_trt.cli", "engine", "--model", "tiny", "--target-gpu", "h100", "-o", str(out)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        deadline = time.monotonic() + 120
        staging: list[Path] = []
        while not staging:  # the staging directory appears once validation and input hashing are done
            assert proc.poll() is None, "the build ended before it started writing"
            assert time.monotonic() < deadline, "no staging directory after 120 s"
            time.sleep(0.02)
            staging = list(tmp_path.glob(".bundle.tmp-*"))
        time.sleep(0.3)  # into quantization
        assert proc.poll() is None, "the build finished before it could be stopped"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode != 0
    assert "Traceback" not in err, err
    assert not out.exists() and not staging[0].exists()
    assert list(tmp_path.iterdir()) == []  # no staging dir, no lock file
