"""The live check end to end: `serve --capture` on a real tritonserver, greedy requests over gRPC with
tritonclient, then `alpha BUNDLE --traffic DIR` agrees with what the server reported for each request.

The bundle is the embedded tiny pair (trained target and head, so acceptance is far from zero),
built by the pipeline; the server is started and stopped with the CLI.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.triton, pytest.mark.needs("tritonserver")]

REPO_ROOT = Path(__file__).resolve().parents[1]
HELD = json.loads((REPO_ROOT / "models" / "tiny" / "heldout_prompts.json").read_text())["prompts"]


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eagle3_trt.cli", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    from eagle3_trt.pipeline.builder import EngineRequest, build_bundle
    from eagle3_trt.pipeline.presets import load_preset

    out = tmp_path_factory.mktemp("tiny") / "bundle"
    return build_bundle(EngineRequest(preset=load_preset("tiny"), target_gpu="h100", quant="bf16", out=str(out))).bundle


def test_alpha_traffic_agrees_with_what_triton_served(bundle, tmp_path):
    import transformers

    from eagle3_trt.clients.llm_client import GenerationParams, LLMClient
    from eagle3_trt.triton_serving.server import ServerHandle, free_ports

    repo, state, cap = tmp_path / "repo", tmp_path / "state", tmp_path / "capture"
    r = _cli("package", str(bundle), "-o", str(repo))
    assert r.returncode == 0, r.stderr
    http, grpc, metrics = free_ports(3)
    ports = ("--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics))
    r = _cli("serve", str(repo), "--state-dir", str(state), *ports, "--timeout", "240", "--capture", str(cap))
    assert r.returncode == 0, r.stdout + r.stderr
    handle = ServerHandle.load(state)
    tok = transformers.AutoTokenizer.from_pretrained(bundle / "tokenizer")
    served = []
    try:
        with LLMClient(handle.grpc_url, timeout_s=120) as c:
            for p in HELD[:10]:
                res = c.generate(tok.decode(p[:24]), GenerationParams(max_tokens=16))
                assert res.finish_reason in ("stop", "length") and res.perf["speculative_decoding"]
                served.append((res.n_tokens, float(res.perf["acceptance_length"])))
    finally:
        r = _cli("stop", "--state-dir", str(state))  # the capture's last flush happens as the model unloads
        assert r.returncode == 0, r.stdout + r.stderr

    rep_dir = tmp_path / "rep"
    r = _cli("alpha", str(bundle), "--traffic", str(cap), "--device", "cpu", "-o", str(rep_dir))
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads((rep_dir / "report.json").read_text())
    c = rep["comparison"]
    assert rep["records"] == rep["compared"] == 10 and rep["skipped"]["other_bundles"] == {}
    # the server's own figures (what the client got back) are the captured ones
    recs = json.loads("[" + ",".join(ln for f in sorted(cap.glob("traffic-*.jsonl")) for ln in f.read_text().splitlines()) + "]")
    got = sorted((r["acceptance"]["completion_tokens"], round(r["acceptance"]["completion_tokens"] / r["acceptance"]["target_forwards"], 4)) for r in recs)
    assert got == sorted((n, round(al, 4)) for n, al in served)
    # ... and the offline measurement agrees with them: every greedy request identical, within the printed interval
    assert c["greedy"] == {"requests": 10, "identical": 10, "differ": []}
    assert c["ci"][0] <= 0.0 <= c["ci"][1] and c["diff"] == 0.0 and not c["beyond_sampling_noise"]
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("offline vs served: "))
    assert (
        f"vs {c['served_acceptance_length']:.4f}, diff +0.0000, 95% CI [+0.0000, +0.0000] (10 requests from 10 distinct prompts): within sampling noise" in line
    )
    assert c["served_acceptance_length"] > 1.3  # the trained head is accepted: the check is not about AL 1 vs 1
