"""The launcher: finding tritonserver, refusing bad repositories before launch, and failing fast
with Triton's own error when the server cannot load the model (real tritonserver processes)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
import yaml

from eagle3_trt.errors import UserError
from eagle3_trt.triton_serving.package import package_bundle
from eagle3_trt.triton_serving.server import (
    HOST,
    ServerHandle,
    find_tritonserver,
    free_ports,
    prepare_backend_dir,
    start_server,
    stop_recorded,
)


def _have_tritonserver() -> bool:
    import importlib.util
    import shutil

    return bool(shutil.which("tritonserver") or importlib.util.find_spec("pytriton"))


pytestmark = [pytest.mark.triton, pytest.mark.needs("tritonserver")]


@pytest.fixture()
def repo(fp8_bundle, tmp_path) -> Path:
    package_bundle(fp8_bundle, tmp_path / "repo")
    return tmp_path / "repo"


def _ports() -> dict:
    h, g, m = free_ports(3)
    return {"http_port": h, "grpc_port": g, "metrics_port": m}


def test_pytriton_install_and_backend_dir(tmp_path):
    inst = find_tritonserver()
    assert inst.executable.is_file()
    if inst.kind == "pytriton":
        bdir = prepare_backend_dir(inst, tmp_path)
        stub = bdir / "python" / "triton_python_backend_stub"
        assert stub.is_file() and stub.stat().st_mode & 0o111
        assert (bdir / "python" / "libtriton_python.so").is_file()
        assert any(Path(d).name == "nvidia_pytriton.libs" for d in inst.lib_dirs)


def test_invalid_config_refused_before_launch(repo, tmp_path):
    cfg = repo / "eagle3" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace("decoupled: true", "decoupled: false"))
    t0 = time.monotonic()
    with pytest.raises(UserError, match="decoupled: true"):
        start_server(repo, state_dir=tmp_path / "s", **_ports())
    assert time.monotonic() - t0 < 5
    assert not (tmp_path / "s" / "server.json").exists()


def test_port_in_use_refused(repo, tmp_path):
    with socket.socket() as s:
        s.bind((HOST, 0))
        s.listen()
        ports = _ports() | {"grpc_port": s.getsockname()[1]}
        with pytest.raises(UserError, match="--grpc-port"):
            start_server(repo, state_dir=tmp_path / "s", **ports)


@pytest.mark.parametrize(
    "breakage, triton_says",
    [
        ("model_yaml", "unknown_option: Extra inputs are not permitted"),
        ("pbtxt", "no_such_field"),
    ],
)
def test_broken_repository_fails_fast_with_tritons_error(repo, tmp_path, breakage, triton_says):
    """Our pre-launch check is skipped so that Triton itself meets the broken model."""
    if breakage == "model_yaml":
        my = repo / "eagle3" / "1" / "eagle3.yaml"
        my.write_text(yaml.safe_dump(yaml.safe_load(my.read_text()) | {"unknown_option": 1}))
    else:
        cfg = repo / "eagle3" / "config.pbtxt"
        cfg.write_text(cfg.read_text() + "\nno_such_field: 1\n")
    t0 = time.monotonic()
    with pytest.raises(UserError) as e:
        start_server(repo, state_dir=tmp_path / "s", validate=False, timeout_s=120, **_ports())
    took = time.monotonic() - t0
    msg = str(e.value)
    assert "exited with code" in msg and triton_says in msg, msg
    assert took < 60, took  # fails as soon as Triton gives up, not at the readiness timeout
    assert not (tmp_path / "s" / "server.json").exists()
    assert stop_recorded(tmp_path / "s") is None


def test_stop_without_server(tmp_path):
    assert stop_recorded(tmp_path) is None
    with pytest.raises(UserError, match="no server recorded"):
        ServerHandle.load(tmp_path)
