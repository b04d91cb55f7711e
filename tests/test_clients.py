"""Client library pieces that need no server: chat template, URL handling, Prometheus parsing,
benchmark statistics, the gate, greedy identity, and the report files; then the bench command
end to end against a real tritonserver (nvidia-pytriton's build) serving the tiny FP8 bundle.
(Other end-to-end client tests are in test_triton_server.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3_trt.clients.bench import BenchRun, parse_concurrency
from eagle3_trt.clients.bench_gate import evaluate_gate
from eagle3_trt.clients.bench_stats import MIN_P99_SAMPLES, ArmResult, RequestRecord, identity_check, percentile, summarize
from eagle3_trt.errors import UserError

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.mark.parametrize("tok_dir", ["tiny", pytest.param("llama3", marks=pytest.mark.needs("shared"))])
def test_chat_template_matches_transformers(tok_dir):
    from transformers import AutoTokenizer

    from eagle3_trt.clients.chat import ChatTemplate, format_prompt, tokenizer_dir

    d = Path(__file__).resolve().parents[1] / "convert" / "data" / "tiny_tokenizer" if tok_dir == "tiny" else SHARED / "data" / "llama3_tokenizer"
    t = ChatTemplate.from_dir(d)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir(d)))
    for system in (None, "Answer briefly."):
        for prompt in ("Hi", "  Multi\nline — ünïcode 🚀  "):
            msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
            want = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            assert format_prompt(t, prompt, system) == want
    assert format_prompt(t, "Hi").startswith(tok.bos_token)


def test_chat_template_missing_is_an_error(tmp_path):
    from eagle3_trt.clients.chat import ChatTemplate

    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
    with pytest.raises(UserError, match="no chat_template"):
        ChatTemplate.from_dir(tmp_path)
    with pytest.raises(UserError, match="no tokenizer_config.json"):
        ChatTemplate.from_dir(tmp_path / "nothing")


def test_url_normalization():
    from eagle3_trt.clients.llm_client import normalize_url

    assert normalize_url("grpc://127.0.0.1:8001", http=False) == "127.0.0.1:8001"
    assert normalize_url("http://127.0.0.1:8000/", http=True) == "http://127.0.0.1:8000"
    assert normalize_url("localhost:8000", http=True) == "http://localhost:8000"
    with pytest.raises(UserError):
        normalize_url("https://x:1", http=True)
    with pytest.raises(UserError):
        normalize_url("127.0.0.1:8000/v2", http=True)


# Shape of Triton 2.51's metrics page with the model's families (one pair of scrapes).
METRICS_BEFORE = """\
# HELP eagle3_requests_total Requests by outcome (ok, error, cancelled, rejected)
# TYPE eagle3_requests_total counter
eagle3_requests_total{model="eagle3",status="ok"} 2
eagle3_requests_total{model="other",status="ok"} 7
eagle3_generated_tokens_total{model="eagle3",speculation="on"} 20
eagle3_generated_tokens_total{model="eagle3",speculation="off"} 5
eagle3_draft_tokens_total{model="eagle3"} 30
eagle3_accepted_draft_tokens_total{model="eagle3"} 12
eagle3_acceptance_length_count{model="eagle3"} 10
eagle3_acceptance_length_sum{model="eagle3"} 22
eagle3_acceptance_length_bucket{model="eagle3",le="1"} 3
eagle3_drafted_tokens_by_position_total{model="eagle3",position="1"} 10
eagle3_drafted_tokens_by_position_total{model="eagle3",position="2"} 10
eagle3_accepted_tokens_by_position_total{model="eagle3",position="1"} 8
eagle3_accepted_tokens_by_position_total{model="eagle3",position="2"} 4
eagle3_active_requests{model="eagle3"} 0
nv_inference_count{model="eagle3",version="1"} 9
"""


def test_prometheus_counters_and_deltas():
    from eagle3_trt.clients.prom import SpecCounters, parse_text

    before = SpecCounters.from_samples(parse_text(METRICS_BEFORE), "eagle3")
    assert before.requests == {"ok": 2} and before.draft == 30 and before.tokens_off == 5
    after_text = (
        METRICS_BEFORE.replace("} 30", "} 60")
        .replace('_total{model="eagle3"} 12', '_total{model="eagle3"} 30')
        .replace('count{model="eagle3"} 10', 'count{model="eagle3"} 20')
        .replace('sum{model="eagle3"} 22', 'sum{model="eagle3"} 50')
    )
    d = SpecCounters.from_samples(parse_text(after_text), "eagle3").minus(before)
    assert d.draft == 30 and d.accepted == 18 and d.alpha == pytest.approx(0.6)
    assert d.acceptance_length == pytest.approx(2.8)  # (50 - 22) / (20 - 10)
    assert before.acceptance_by_position() == [0.8, 0.4]


def test_percentile_and_itl():
    assert percentile([], 50) is None
    assert percentile([5.0], 99) == 5.0
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile(list(range(101)), 99) == pytest.approx(99.0)
    r = RequestRecord(1, True, 0, ok=True, t_send=0.0, t_first=0.1, t_end=0.7, chunk_times=[0.1, 0.2, 0.5, 0.7], chunk_tokens=[1, 1, 3, 2], n_tokens=7)
    # gaps 0.1 (1 token), 0.3 over 3 tokens, 0.2 over 2 tokens: one sample per token
    assert r.itl_samples() == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.1, 0.1])
    assert r.ttft_s == pytest.approx(0.1) and r.latency_s == pytest.approx(0.7)


def test_summarize_alpha_and_acceptance_length():
    recs = [
        RequestRecord(
            2,
            True,
            0,
            ok=True,
            t_send=0,
            t_first=0.1,
            t_end=1.0,
            chunk_times=[0.1, 1.0],
            chunk_tokens=[1, 9],
            n_tokens=10,
            draft_tokens=12,
            accepted_tokens=6,
            acceptance_length=2.5,
        ),  # 4 forwards
        RequestRecord(
            2,
            True,
            1,
            ok=True,
            t_send=0,
            t_first=0.2,
            t_end=2.0,
            chunk_times=[0.2, 2.0],
            chunk_tokens=[1, 5],
            n_tokens=6,
            draft_tokens=12,
            accepted_tokens=0,
            acceptance_length=1.2,
        ),  # 5 forwards
        RequestRecord(2, True, 2, ok=False, error="boom"),
    ]
    a = summarize(recs, 2, True, wall_s=2.0)
    assert (a.requests, a.errors, a.output_tokens) == (3, 1, 16)
    assert a.alpha_responses == pytest.approx(6 / 24)
    assert a.al_responses == pytest.approx((9 + 5) / (3 + 4))  # tokens after prefill / verification forwards
    assert a.output_tokens_per_s == pytest.approx(8.0)
    assert a.ttft_p50_s == pytest.approx(0.15)
    off = summarize(recs[:2], 2, False, 2.0)
    assert off.alpha_responses is None and off.al_responses is None


def _arm(c, spec, p99, alpha=None):
    return ArmResult(c, spec, 4, 0, 1.0, 40, 0.1, 0.2, p99 / 2, p99, 1.0, 1.2, 40.0, None, None, alpha_metrics=alpha)


def test_gate_verdicts_and_switch_off_point():
    arms = [
        _arm(1, True, 0.010, 0.7),
        _arm(1, False, 0.020),
        _arm(4, True, 0.030, 0.7),
        _arm(4, False, 0.031),
        _arm(16, True, 0.080, 0.6),
        _arm(16, False, 0.050),
    ]
    g = evaluate_gate(arms)
    assert g.alpha == pytest.approx(2.0 / 3) and g.alpha_ok and g.alpha_source == "metrics endpoint"
    assert [r["itl_ok"] for r in g.per_concurrency] == [True, True, False]
    assert (g.verdict, g.switch_off_above) == ("pass_with_switch_off", 4)
    assert "switch it off above 4" in g.recommendation
    # The tolerance lets a small excess through.
    assert evaluate_gate(arms[:4] + [_arm(16, True, 0.052, 0.6), _arm(16, False, 0.050)], itl_tolerance=0.05).verdict == "pass"
    # Low alpha fails whatever the latency says; so does a loss at the lowest concurrency.
    low = evaluate_gate([_arm(1, True, 0.010, 0.3), _arm(1, False, 0.020)])
    assert low.verdict == "fail" and "alpha 0.300 < threshold 0.55" in low.recommendation
    worse = evaluate_gate([_arm(1, True, 0.030, 0.9), _arm(1, False, 0.020)])
    assert worse.verdict == "fail" and worse.switch_off_above is None
    # Speculation on, yet nothing drafted (a tripped acceptance gate): the reason names it.
    none = evaluate_gate([_arm(1, True, 0.010), _arm(1, False, 0.020)])
    assert none.alpha is None and none.verdict == "fail" and "acceptance_rate_threshold" in none.recommendation
    assert "acceptance_rate_threshold" not in low.recommendation


def test_concurrency_parsing():
    assert parse_concurrency("16,1,4,4") == [1, 4, 16]
    for bad in ("", "1,x", "0,2"):
        with pytest.raises(UserError, match="--concurrency"):
            parse_concurrency(bad)


def test_report_files(tmp_path):
    from eagle3_trt.clients.report import PLOTS, write_report

    recs = [
        RequestRecord(
            c,
            s,
            i,
            ok=True,
            t_send=0,
            t_first=0.05,
            t_end=0.3 + i / 10,
            chunk_times=[0.05, 0.3],
            chunk_tokens=[1, 3],
            n_tokens=4,
            request_index=i,
            text=f"answer {i}" + (" x" if (c, s, i) == (4, True, 2) else ""),
            finish_reason="length",
        )
        for c in (1, 4)
        for s in (True, False)
        for i in range(3)
    ]
    arms = [_arm(1, True, 0.01, 0.7), _arm(1, False, 0.02), _arm(4, True, 0.05, 0.7), _arm(4, False, 0.03)]
    arms[0].acceptance_by_position, arms[0].drafted_by_position = [0.8, 0.5, 0.2], [10, 10, 10]
    arms[1].itl_samples = 12  # a p99 from 12 samples must be flagged
    env = {
        "server": {"name": "triton", "version": "2.51.0"},
        "model_parameters": {"eagle3_runtime": "reference"},
        "bundle": {"path": "/b", "fingerprint": "abc123", "label": "tiny", "k": 3, "max_concurrency": None},
        "client": {"eagle3_trt": "0.1"},
    }
    run = BenchRun(
        {"url": "u", "model": "eagle3", "num_prompts": 3, "max_tokens": 4},
        arms,
        evaluate_gate(arms),
        recs,
        0.0,
        1.0,
        True,
        identity_check(recs, greedy=True),
        env,
    )
    out = write_report(run, tmp_path / "r")
    data = json.loads((out / "bench.json").read_text())
    assert data["gate"]["verdict"] == "pass_with_switch_off" and len(data["requests"]) == 12
    assert data["greedy_identity"]["compared"] == 6 and data["greedy_identity"]["diverged"] == 1
    assert data["environment"]["bundle"]["fingerprint"] == "abc123"
    md = (out / "summary.md").read_text()
    # The switch-off level is a failure of that level, not part of a PASS.
    assert "Gate: **SPECULATION ONLY UP TO CONCURRENCY 1**" in md and "PASS" not in md.split("## Results")[0]
    assert "C=4: 50.0 ms on vs 30.0 ms off -> **FAIL: speculation is slower here; switch it off**" in md
    assert "switch it off above 1" in md and "1: 0.800" in md
    assert "C=1 speculation off: ITL p99 from 12 samples" in md and f"fewer than {MIN_P99_SAMPLES} samples" in md
    assert "1 of 6 requests differ (16.7%)" in md and "first difference at character 8" in md
    assert "## Sample of generated text" in md and "answer 0" in md
    assert "triton 2.51.0" in md and "fingerprint `abc123`" in md
    for p in PLOTS:
        assert (out / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    write_report(run, out)  # replacing an existing report works and leaves no temp folders
    assert [p.name for p in tmp_path.iterdir()] == ["r"]


def test_identity_check():
    def rec(c, spec, i, text, ok=True):
        return RequestRecord(c, spec, i % 2, ok=ok, request_index=i, text=text)

    recs = [
        rec(1, True, 0, "The capital is Paris."),
        rec(1, False, 0, "The capital is Paris."),
        rec(1, True, 1, "Two plus two is four."),
        rec(1, False, 1, "Two plus two is 4."),
        rec(2, True, 0, "abc"),
        rec(2, False, 0, "abc", ok=False),  # a failed request is not compared
        rec(2, True, 1, "same"),
    ]  # no partner
    r = identity_check(recs, greedy=True)
    assert (r["compared"], r["diverged"]) == (2, 1) and r["rate"] == pytest.approx(0.5)
    ex = r["examples"][0]
    assert (ex["concurrency"], ex["request"], ex["first_difference_at_char"]) == (1, 1, 16)
    assert ex["on"].endswith("four.") and ex["off"].endswith("4.")
    assert identity_check(recs, greedy=False)["checked"] is False


def test_thin_p99_warning_threshold():
    a = _arm(1, True, 0.01)
    a.itl_samples, a.ttft_samples = MIN_P99_SAMPLES - 1, MIN_P99_SAMPLES
    assert a.thin_p99() == [f"ITL p99 from {MIN_P99_SAMPLES - 1} samples"]


def test_gate_leaves_levels_the_server_ran_without_speculation_out():
    off_by_server = _arm(16, True, 0.050, 0.7)
    off_by_server.served_without_speculation = 4  # all 4 requests came back with speculative_decoding false
    arms = [_arm(1, True, 0.010, 0.7), _arm(1, False, 0.020), off_by_server, _arm(16, False, 0.050)]
    g = evaluate_gate(arms)
    assert [r["itl_ok"] for r in g.per_concurrency] == [True, None]
    assert g.verdict == "pass" and "up to 1" in g.recommendation and "concurrency 16 the server already ran without speculation" in g.recommendation
    assert evaluate_gate([off_by_server, _arm(16, False, 0.050)]).verdict == "fail"


def test_throughput_and_itl_axes_start_at_zero(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from eagle3_trt.clients.report import _save_concurrency_plot

    fig, ax = plt.subplots()
    ax.plot([1, 4, 16], [950.0, 990.0, 1000.0], label="x")
    _save_concurrency_plot(fig, ax, [1, 4, 16], "tokens/s", "t", tmp_path / "p.png")
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] >= 1000.0


def test_bench_is_loopback_only_by_default(tmp_path):
    from click.testing import CliRunner

    from eagle3_trt.clients.commands import bench_cmd
    from eagle3_trt.clients.servers import is_loopback

    assert is_loopback("127.0.0.1:8001") and is_loopback("http://localhost:8002/metrics") and is_loopback("[::1]:8001")
    assert not is_loopback("10.1.2.3:8001") and not is_loopback("http://192.168.0.5:8002/metrics")
    p = tmp_path / "p.txt"
    p.write_text("hi\n")
    r = CliRunner().invoke(bench_cmd, ["--url", "10.1.2.3:8001", "--prompts", str(p), "--no-chat-template"])
    assert r.exit_code != 0 and "not a loopback address" in str(r.exception)


# ---- the bench command against a real server -------------------------------------------------------
REPO_ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eagle3_trt.cli", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def served(fp8_bundle, tmp_path_factory):
    from eagle3_trt.testing.servers import serve_triton

    tmp = tmp_path_factory.mktemp("bench-triton")
    r = _cli("package", str(fp8_bundle), "-o", str(tmp / "repo"))
    assert r.returncode == 0, r.stderr
    yield serve_triton(tmp / "repo", tmp / "state", "--timeout", "240")[0]
    _cli("stop", "--state-dir", str(tmp / "state"))


@pytest.mark.triton
@pytest.mark.needs("tritonserver")
def test_bench_report_for_a_go_no_go_decision(served, fp8_bundle, tmp_path):
    from eagle3_trt.pipeline.bundle import open_bundle

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"turns": [q]}) for q in ("What is the capital of France?", "List three primes.")) + "\n")
    out = tmp_path / "report"
    r = _cli(
        "bench",
        "--url",
        served.grpc_url,
        "--metrics-url",
        served.metrics_url,
        "--prompts",
        str(prompts),
        "--bundle",
        str(fp8_bundle),
        "--concurrency",
        "1,2",
        "--requests",
        "2",
        "--max-tokens",
        "6",
        "--warmup",
        "1",
        "-o",
        str(out),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads((out / "bench.json").read_text())
    idt = data["greedy_identity"]
    # Greedy on a float32 CPU runtime: speculation must not change a single character.
    assert idt["checked"] and idt["compared"] == 4 and idt["diverged"] == 0, idt
    assert all(q["text"] for q in data["requests"])
    env = data["environment"]
    assert env["bundle"]["fingerprint"] == open_bundle(fp8_bundle).manifest.fingerprint
    assert env["server"]["name"] == "triton" and env["server"]["version"]
    assert env["model_parameters"]["eagle3_bundle"] and env["client"]["eagle3_trt"]
    assert all(a["thin_p99"] for a in data["arms"])  # 2 requests of 6 tokens: every p99 is thin
    md = (out / "summary.md").read_text()
    assert "0 of 4 requests differ (0.0%). Identical everywhere." in md and "## Sample of generated text" in md
    assert "fewer than 100 samples" in md and f"fingerprint `{env['bundle']['fingerprint']}`" in md
    assert "greedy text on vs off: 0 of 4 differ" in r.stdout and "fewer than 100 samples" in r.stdout


def test_integer_inputs_follow_the_models_declared_type():
    """INT64 for this project's model, INT32 for upstream's llmapi model; a value that would not fit
    is refused by name before anything is sent (a narrower array would wrap it)."""
    import numpy as np

    from eagle3_trt.clients.llm_client import _int_tensor
    from eagle3_trt.errors import UserError

    name, arr, dt = _int_tensor("sampling_param_max_tokens", 2**32 + 5, "INT64")
    assert (dt, arr.dtype, int(arr[0])) == ("INT64", np.int64, 2**32 + 5)
    name, arr, dt = _int_tensor("sampling_param_top_k", 7, "INT32")
    assert (dt, arr.dtype, int(arr[0])) == ("INT32", np.int32, 7)
    with pytest.raises(UserError) as e:
        _int_tensor("sampling_param_top_k", 2**31, "INT32")
    assert e.value.where == "sampling_param_top_k" and "INT32" in e.value.what
