"""`serve-dynamo --worker-port-base`: the workers' ports chosen by the user (issue 31 friction).

Worker i serves /health and /metrics (DYN_SYSTEM_PORT) on BASE+2i and its TCP request plane
(DYN_TCP_RPC_PORT) on BASE+2i+1; bad bases are refused in one line before anything starts."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from eagle3_trt.dynamo_serving.launcher import Deployment, worker_ports
from eagle3_trt.errors import UserError
from eagle3_trt.procs import HOST, port_is_free

REPO_ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eagle3_trt.cli", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)


def _free_base(n: int) -> int:
    """A base in Dynamo's system-port range whose next ``n`` ports are all free now."""
    for base in range(24000, 32000, 10):
        if all(port_is_free(p) for p in range(base, base + n)):
            return base
    raise AssertionError("no run of free ports in 24000-32000")


def test_ports_are_laid_out_per_worker():
    base = _free_base(6)
    assert worker_ports(base, 3, http_port=8080) == [(base, base + 1), (base + 2, base + 3), (base + 4, base + 5)]


@pytest.mark.parametrize(
    ("base", "workers", "http_port", "says"),
    [
        (80, 2, 8080, "must lie in 1024-32767"),
        (32766, 2, 8080, "32766-32769 must lie in 1024-32767"),  # Dynamo 1.6.1 reads the system port as an i16
        (9000, 2, 9002, "include the frontend's --http-port 9002"),
    ],
)
def test_bad_bases_are_refused(base, workers, http_port, says):
    with pytest.raises(UserError) as e:
        worker_ports(base, workers, http_port)
    assert e.value.where == "--worker-port-base" and says in str(e.value)


def test_a_taken_port_is_refused_in_one_line_before_anything_starts(fp8_bundle, tmp_path):
    base = _free_base(4)
    with socket.socket() as s:
        s.bind((HOST, base + 3))
        s.listen()
        r = _cli("serve-dynamo", str(fp8_bundle), "--worker-port-base", str(base), "--state-dir", str(tmp_path / "s"), "--http-port", "8089")
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert last.startswith(f"error: --worker-port-base: {base}: port {base + 3} of the workers' {base}-{base + 3} is in use"), last
    assert "WORKER_PORT_BASE" in last  # the hint names the Makefile's variable
    assert not (tmp_path / "s" / "state.json").exists()


@pytest.mark.needs("dynamo")
def test_a_real_deployment_binds_the_chosen_ports(fp8_bundle, k5_bundle, tmp_path):
    """One worker on BASE (system server) and BASE+1 (request plane); deploy-dynamo's replacement,
    started while the old worker still holds BASE+1, takes free ports and serves."""
    import psutil

    from eagle3_trt.testing.servers import dynamo_served

    base = _free_base(2)
    with dynamo_served(fp8_bundle, tmp_path / "state", "--worker-port-base", str(base), workers=1) as (dep, out):
        (w,) = dep.workers
        assert w.port == base and f"metrics http://127.0.0.1:{base}/metrics" in out
        with urllib.request.urlopen(f"http://127.0.0.1:{base}/health", timeout=10) as r:
            assert r.status == 200
        listening = {c.laddr.port for c in psutil.Process(w.pid).net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}
        assert {base, base + 1} <= listening, listening  # the system server and the request plane
        r = _cli("deploy-dynamo", str(k5_bundle), "--state-dir", str(tmp_path / "state"), timeout=400)
        assert r.returncode == 0, r.stdout + r.stderr
        (new,) = Deployment.load(tmp_path / "state").workers  # type: ignore[union-attr]
        assert new.pid != w.pid and new.alive() and new.bundle == str(k5_bundle.resolve())
    assert port_is_free(base) and port_is_free(base + 1)
