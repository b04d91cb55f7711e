"""`eagle3-trt bench --openai-url` against NVIDIA Dynamo's real frontend and 2 reference-runtime workers
(started once for the module with the CLI, as in tests/test_dynamo_serving.py), plus the per-request
speculation switch (the ``eagle3_speculative=false`` annotation) at the engine and client level."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3_trt.testing.pytest_guard import require

require("dynamo", "openai")

from dynamo.llm.exceptions import InvalidArgument

from eagle3_trt.clients.llm_client import GenerationParams
from eagle3_trt.clients.openai_client import OpenAIClient, normalize_openai_url
from eagle3_trt.dynamo_serving.engine import Eagle3ReferenceEngine
from eagle3_trt.errors import UserError
from eagle3_trt.testing.servers import dynamo_served
from eagle3_trt.testing.servers import run_cli as _cli

REPO_ROOT = Path(__file__).resolve().parents[1]
PROMPTS = REPO_ROOT / "convert" / "data" / "calib_prompts.jsonl"


@pytest.fixture(scope="module")
def dep(fp8_bundle, tmp_path_factory):
    with dynamo_served(fp8_bundle, tmp_path_factory.mktemp("dynamo-bench") / "state") as (d, _):
        yield d


def _engine(fp8_bundle) -> Eagle3ReferenceEngine:
    e = Eagle3ReferenceEngine(fp8_bundle, served_model_name="eagle3", device="cpu", torch_threads=1, speculation=True)
    e.max_seq_len = 512  # what start() reads from the bundle; no model is loaded for request mapping
    return e


def test_speculation_annotation_maps_to_the_sampling_flag(fp8_bundle):
    e = _engine(fp8_bundle)
    req = {"token_ids": [1, 2, 3], "stop_conditions": {"max_tokens": 4}}
    assert e.sampling_params(req)[1].eagle3_speculative is True
    assert e.sampling_params({**req, "annotations": ["eagle3_speculative=false"]})[1].eagle3_speculative is False
    # the frontend's own annotations pass through untouched
    assert e.sampling_params({**req, "annotations": ["formatted_prompt", "eagle3_speculative=true"]})[1].eagle3_speculative is True
    for bad in ("eagle3_speculative", "eagle3_speculative=off"):
        with pytest.raises(InvalidArgument, match="eagle3_speculative=true or"):
            e.sampling_params({**req, "annotations": [bad]})


def test_openai_request_body_carries_the_switch_and_token_counts():
    c = OpenAIClient("127.0.0.1:1")
    assert c.url == "http://127.0.0.1:1/v1"
    on = c._body("hi", GenerationParams(max_tokens=4), streaming=True)
    off = c._body("hi", GenerationParams(max_tokens=4, speculative=False), streaming=True)
    assert "annotations" not in on["nvext"] and off["nvext"]["annotations"] == ["eagle3_speculative=false"]
    assert on["nvext"]["extra_fields"] == ["completion_token_ids", "engine_data"]
    assert on["messages"] == [{"role": "user", "content": "hi"}] and on["temperature"] == 0.0  # greedy, as on Triton
    raw = OpenAIClient("http://127.0.0.1:1/v1", chat=False)._body("hi", GenerationParams(temperature=0.7), streaming=False)
    assert raw["prompt"] == "hi" and raw["temperature"] == 0.7 and raw["nvext"]["extra_fields"] == ["engine_data"]
    with pytest.raises(UserError, match="/v1"):
        normalize_openai_url("http://127.0.0.1:8080/v2/models")


def test_client_stream_counts_tokens_and_switches_speculation(dep):
    with OpenAIClient(dep.url, chat=False) as c:
        s_on = c.generate("The capital of France is", GenerationParams(max_tokens=16), stream=True)
        s_off = c.generate("The capital of France is", GenerationParams(max_tokens=16, speculative=False), stream=True)
        unary = c.generate("The capital of France is", GenerationParams(max_tokens=16), stream=False)
    assert s_on.text == s_off.text == unary.text and s_on.n_tokens == unary.n_tokens == 16
    assert s_on.perf["speculative_decoding"] is True and s_on.perf["total_draft_tokens"] > 0
    assert s_off.perf["speculative_decoding"] is False and s_off.perf["total_draft_tokens"] == 0
    # one event per target forward (prefill included): several tokens when drafts are accepted, one without speculation
    assert sum(ch.n_tokens for ch in s_on.chunks) == 16 and len(s_on.chunks) == round(16 / s_on.perf["acceptance_length"])
    assert len(s_off.chunks) == 16 and all(ch.n_tokens == 1 for ch in s_off.chunks)


def test_bench_against_dynamo_writes_the_report(dep, fp8_bundle, tmp_path):
    out = tmp_path / "report"
    r = _cli(
        "bench",
        "--openai-url",
        dep.url,
        "--prompts",
        str(PROMPTS),
        "--concurrency",
        "1,2",
        "--requests",
        "4",
        "--max-tokens",
        "12",
        "--warmup",
        "1",
        "--bundle",
        str(fp8_bundle),
        "-o",
        str(out),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "greedy text on vs off: 0 of 8 differ" in r.stdout, r.stdout
    d = json.loads((out / "bench.json").read_text())
    assert d["environment"]["server_kind"] == "dynamo" and d["config"]["endpoint"] == "openai"
    assert d["environment"]["bundle"]["fingerprint"] and "error" not in d["environment"]["bundle"]
    assert [(a["concurrency"], a["speculative"], a["errors"]) for a in d["arms"]] == [(1, True, 0), (1, False, 0), (2, True, 0), (2, False, 0)]
    assert d["greedy_identity"]["compared"] == 8 and d["greedy_identity"]["diverged"] == 0
    for q in d["requests"]:
        assert q["ok"] and (q["n_tokens"] == 12 or q["finish_reason"] == "stop"), q
        if q["speculative"]:
            assert q["served_speculative"] is True and q["draft_tokens"] > 0 and 1.0 <= q["acceptance_length"] <= 4.0
        else:
            assert q["served_speculative"] is False and q["draft_tokens"] == 0
    on = [a for a in d["arms"] if a["speculative"]]
    assert all(a["alpha_responses"] is not None and a["al_responses"] is not None and a["itl_samples"] > 0 for a in on)
    summary = (out / "summary.md").read_text()
    assert "Server: Dynamo (OpenAI API, /v1/chat/completions)" in summary and "eagle3_speculative=false" in summary
    assert all((out / p).is_file() for p in ("latency_cdf.png", "itl_vs_concurrency.png", "throughput_vs_concurrency.png", "acceptance_by_position.png"))


def test_bench_fail_on_gate_prints_the_verdict_once(dep, tmp_path):
    """--fail-on-gate exits 3 with the summary's verdict line as the only verdict (it used to add
    "gate failed: gate failed: ..." on stderr)."""
    r = _cli(
        "bench",
        "--openai-url",
        dep.url,
        "--prompts",
        str(PROMPTS),
        "--concurrency",
        "1",
        "--requests",
        "2",
        "--max-tokens",
        "6",
        "--warmup",
        "0",
        "--alpha-threshold",
        "0.999",
        "--fail-on-gate",
        "-o",
        str(tmp_path / "report"),
    )
    both = r.stdout + r.stderr
    assert r.returncode == 3, both
    rec = json.loads((tmp_path / "report" / "bench.json").read_text())["gate"]["recommendation"]
    assert rec.startswith("do not enable speculation (alpha ") and "< threshold 0.999" in rec
    assert both.count(rec) == 1 and both.count("gate: FAIL") == 1 and "gate failed" not in both


def test_bench_openai_refuses_triton_options(dep, tmp_path):
    r = _cli("bench", "--openai-url", dep.url, "--url", "127.0.0.1:8001", "--prompts", str(PROMPTS))
    assert r.returncode == 2 and "not both" in r.stderr.strip().splitlines()[-1]
    r = _cli("bench", "--openai-url", dep.url, "--model", "nope", "--prompts", str(PROMPTS), "-o", str(tmp_path / "x"))
    assert r.returncode == 2 and "serve-dynamo" in r.stderr and "not listed" in r.stderr, r.stderr
