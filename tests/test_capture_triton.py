"""`eagle3-trt serve --capture` against a real tritonserver (nvidia-pytriton's build) with the tiny FP8 bundle.

Two servers, started and stopped with the CLI: one capturing (with a redaction pattern and a cap a
few records wide), one not (while this process's environment carries capture settings, which must
not leak into it). Clients: the project's gRPC client (tritonclient underneath) and tritonclient's
HTTP client. The records are compared with what the clients received.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from eagle3_trt.clients.llm_client import infer_inputs
from eagle3_trt.formats.traffic import read_traffic, segments
from eagle3_trt.runtime.capture import CAPTURE_ENV, REDACTED, CaptureConfig
from eagle3_trt.testing.served_traffic import captured_records as _records
from eagle3_trt.testing.servers import serve_triton, stop_triton

pytestmark = [pytest.mark.triton, pytest.mark.needs("tritonserver")]

REPO_ROOT = Path(__file__).resolve().parents[1]
SECRET = "sk-live-4f9a8b7c6d5e"
CAP_MB = 0.009  # about eight records of the tiny model


def _serve(bundle: Path, tmp: Path, *extra: str, env: dict | None = None):
    from eagle3_trt.triton_serving.package import package_bundle

    package_bundle(bundle, tmp / "repo", torch_threads=1)
    return serve_triton(tmp / "repo", tmp / "state", *extra, env=env)


def _stop(tmp: Path) -> None:
    stop_triton(tmp / "state")


@pytest.fixture(scope="module")
def capturing(fp8_bundle, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("capture-triton")
    cap = tmp / "cap"
    h, out = _serve(fp8_bundle, tmp, "--capture", str(cap), "--capture-max-mb", str(CAP_MB), "--capture-redact", r"sk-live-[0-9a-f]+")
    assert f"capture {cap} (cap {CAP_MB:g} MB, redacting 1 pattern(s))" in out
    yield h, cap
    _stop(tmp)


@pytest.fixture(scope="module")
def tok(fp8_bundle):
    from eagle3_trt.pipeline.bundle import open_bundle
    from eagle3_trt.runtime.capture import load_tokenizer

    return load_tokenizer(open_bundle(fp8_bundle).tokenizer_dir)


def _manifest_fingerprint(bundle: Path) -> str:
    return json.loads((bundle / "manifest.json").read_text())["fingerprint"]


def _raw_grpc(url: str, prompt: str, max_tokens: int, request_id: str, category: str) -> str:
    import queue

    import numpy as np
    import tritonclient.grpc as g

    q: queue.Queue = queue.Queue()
    c = g.InferenceServerClient(url)
    try:
        c.start_stream(callback=lambda result, error: q.put((result, error)))
        inputs = infer_inputs(
            [
                ("text_input", np.array([prompt.encode()], dtype=np.object_), "BYTES"),
                ("sampling_param_max_tokens", np.array([max_tokens], dtype=np.int64), "INT64"),
                ("sampling_param_exclude_input_from_output", np.array([True]), "BOOL"),
            ]
        )
        c.async_stream_infer("eagle3", inputs, request_id=request_id, parameters={"eagle3_category": category})
        result, error = q.get(timeout=120)
        assert error is None, error
        return result.as_numpy("text_output").reshape(-1)[0].decode()
    finally:
        c.stop_stream()
        c.close()


def test_records_are_what_the_clients_received(capturing, fp8_bundle, tok):
    from eagle3_trt.clients.chat import PromptFormatter
    from eagle3_trt.clients.llm_client import GenerationParams, LLMClient

    h, cap = capturing
    chat = PromptFormatter(fp8_bundle)(f"My key is {SECRET}. Write a haiku about the sea.")
    plain = "List three prime numbers."
    with LLMClient(h.grpc_url, timeout_s=120) as c:
        got = [
            c.generate(chat, GenerationParams(max_tokens=12), stream=True),
            c.generate(plain, GenerationParams(max_tokens=10, temperature=0.7, top_p=0.9, seed=5), stream=False),
            c.generate(plain, GenerationParams(max_tokens=8, speculative=False), stream=True),
        ]
    # tritonclient's own gRPC stream, with a request id of the client's choosing
    raw_text = _raw_grpc(h.grpc_url, plain, 6, "client-req-7", "code")
    # HTTP /generate as curl sends it, the category as a JSON key
    body = {"text_input": plain, "sampling_param_max_tokens": 5, "sampling_param_exclude_input_from_output": True, "eagle3_category": "math"}
    req = urllib.request.Request(f"{h.http_url}/v2/models/eagle3/generate", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        http_text = json.loads(r.read())["text_output"]
    bad = urllib.request.Request(
        f"{h.http_url}/v2/models/eagle3/generate", data=json.dumps({**body, "eagle3_category": ""}).encode(), headers={"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(bad, timeout=120)
    assert e.value.code == 400 and "eagle3_category" in e.value.read().decode()
    want = 5
    recs = _records(cap, want)
    assert len(recs) == want, [r.request_id for r in recs]
    fp = _manifest_fingerprint(fp8_bundle)
    for r, res in zip(recs, got):
        assert (r.model, r.model_version, r.frontend, r.bundle_fingerprint) == ("eagle3", "1", "triton", fp)
        assert r.output_text == res.text and len(r.output_ids) == res.n_tokens and r.finish_reason == res.finish_reason
        assert r.acceptance.speculative == res.perf["speculative_decoding"]
        assert r.acceptance.draft_tokens == res.perf["total_draft_tokens"]
        assert r.acceptance.accepted_draft_tokens == res.perf["total_accepted_draft_tokens"]
        assert r.acceptance.completion_tokens == res.n_tokens
        assert r.acceptance.acceptance_length == pytest.approx(res.perf["acceptance_length"], rel=1e-5)
    a, b, c_ = recs[:3]
    # redacted before the first byte: the text, the ids, every file of the directory
    assert a.redacted and a.chat and a.prompt_text == chat.replace(SECRET, REDACTED)
    assert a.prompt_ids == tok.encode(a.prompt_text, add_special_tokens=False) and SECRET not in tok.decode(a.prompt_ids)
    blob = b"".join(p.read_bytes() for p in cap.rglob("*") if p.is_file())
    assert SECRET.encode() not in blob and b"4f9a8b7c6d5e" not in blob
    # as the model saw them
    assert not b.redacted and not b.chat and b.prompt_text == plain and b.prompt_ids == tok.encode(plain)
    assert (b.sampling.temperature, b.sampling.top_p) == pytest.approx((0.7, 0.9)) and (b.sampling.max_tokens, b.sampling.seed) == (10, 5)  # FP32 on the wire
    assert not c_.acceptance.speculative and c_.acceptance.draft_tokens == 0 and c_.sampling.max_tokens == 8
    assert recs[3].request_id == "client-req-7" and recs[3].output_text == raw_text and len(recs[3].output_ids) == 6
    assert recs[3].category == "code" and recs[4].category == "math" and recs[4].output_text == http_text
    assert [r.category for r in recs[:3]] == [None, None, None]


def test_at_the_cap_serving_goes_on(capturing):
    from eagle3_trt.clients.llm_client import GenerationParams, LLMClient

    h, cap = capturing
    log = Path(h.log_file)
    with LLMClient(h.grpc_url, timeout_s=120) as c:
        for i in range(30):
            res = c.generate(f"Count to {i}.", GenerationParams(max_tokens=16), stream=True)
            assert res.n_tokens == 16
            if "capture stopped" in log.read_text():
                break
        else:
            pytest.fail("the cap was never reached")
        n = len(_records(cap, 1))
        for i in range(3):  # past the cap: still served, nothing more written
            assert c.generate(f"Again {i}.", GenerationParams(max_tokens=8), stream=True).n_tokens == 8
    time.sleep(1.0)
    assert len(read_traffic(cap)) == n
    assert sum(p.stat().st_size for p in segments(cap)) <= CAP_MB * 1e6
    lines = [ln for ln in log.read_text().splitlines() if "capture stopped" in ln]
    assert len(lines) == 1 and f"reached --capture-max-mb {CAP_MB:g}" in lines[0] and "serving continues" in lines[0]


def test_capture_off_writes_nothing(fp8_bundle, tmp_path):
    """No --capture: nothing is written, even with capture settings in the launching environment."""
    from eagle3_trt.clients.llm_client import GenerationParams, LLMClient

    stray = tmp_path / "stray-capture"
    env = {**os.environ, CAPTURE_ENV: CaptureConfig(dir=stray).to_env()}
    before = set(REPO_ROOT.iterdir())
    h, out = _serve(fp8_bundle, tmp_path, env=env)
    try:
        assert "  capture " not in out
        with LLMClient(h.grpc_url, timeout_s=120) as c:
            for p in ("Hello.", "Write a haiku about the sea."):
                assert c.generate(p, GenerationParams(max_tokens=8), stream=True).n_tokens == 8
        time.sleep(1.0)
    finally:
        _stop(tmp_path)
    assert not stray.exists()
    made = {p.relative_to(tmp_path) for p in tmp_path.rglob("*") if "__pycache__" not in p.parts and not p.is_dir()}
    assert not [p for p in made if p.name.startswith("traffic-")]
    assert not [p for p in made if p.parts[0] == "repo" and p.name not in ("config.pbtxt", "model.py", "model.yaml", "eagle3.yaml", "eagle3-package.json")]
    assert set(REPO_ROOT.iterdir()) == before


def test_two_servers_sharing_a_capture_directory_keep_the_newest_records(fp8_bundle, tmp_path):
    """Two tritonservers (several instances of one need GPUs) capture into one directory with
    retention on and segments closing every 0.5 s (``--capture-segment-s``), each sent requests from
    two clients at once: afterwards no record newer than the oldest surviving one is missing, and
    both servers' leases are gone once they stop."""
    from concurrent.futures import ThreadPoolExecutor

    from eagle3_trt.testing.served_traffic import newer_missing

    cap = tmp_path / "cap"
    opts = ("--capture", str(cap), "--capture-keep-mb", "0.006", "--capture-segment-s", "0.5")
    a, b = tmp_path / "a", tmp_path / "b"
    ha, out = _serve(fp8_bundle, a, *opts)
    try:
        assert "keeping the newest 0.006 MB" in out
        hb, _ = _serve(fp8_bundle, b, *opts)
        sent: dict[str, float] = {}
        try:

            def ask(i: int) -> None:
                sent[f"req-{i:03d}"] = time.time()
                _raw_grpc((ha if i % 2 else hb).grpc_url, f"request {i:03d}: name a colour.", 3, f"req-{i:03d}", "test")

            writers: set[str] = set()
            with ThreadPoolExecutor(4) as pool:
                for fut in [pool.submit(ask, i) for i in range(40)]:
                    fut.result()
                    writers |= {p.name.split("-")[1] for p in cap.glob(".writer-*.lease")}
            assert len(writers) == 2, writers
            time.sleep(1.0)  # past a flush
        finally:
            _stop(b)
    finally:
        _stop(a)
    recs = read_traffic(cap)
    assert 4 < len(recs) < 30  # retention ran (about 8 records fit in 6 kB)
    late = newer_missing({r.request_id: r.time_unix for r in recs}, sent)
    assert not late, f"{len(late)} records newer than the oldest kept are missing: {late[:5]}"
    assert not list(cap.glob(".*.lease")), "a stopped server left a lease"
