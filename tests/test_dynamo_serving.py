"""End to end against NVIDIA Dynamo: its real OpenAI frontend and 2 reference-runtime workers on 127.0.0.1
(file discovery, TCP request plane), started and stopped once for the module with the CLI.

Clients are the `openai` package and raw HTTP. The oracle for greedy output is ReferenceLLM called
directly in this process on the token ids the frontend would send (chat template applied by the
tokenizer). The worker-kill test runs last: it leaves one worker.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from eagle3_trt.testing.pytest_guard import require

require("dynamo", "openai")
import openai

from eagle3_trt.dynamo_serving.launcher import Deployment, free_port
from eagle3_trt.runtime.factory import open_llm
from eagle3_trt.runtime.llm_api import RequestPerfMetrics, SamplingParams, SpeculativeDecodingMetrics, spec_stats

REPO_ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["The capital of France is", "Write a haiku about the sea.", "List three prime numbers:", "Explain caching in one line."]
TIMEOUT = 60


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eagle3_trt.cli", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def dep(fp8_bundle, tmp_path_factory):
    state = tmp_path_factory.mktemp("dynamo") / "state"
    port = free_port()
    r = _cli("serve-dynamo", str(fp8_bundle), "--workers", "2", "--http-port", str(port), "--state-dir", str(state), "--torch-threads", "1", "--timeout", "240")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"http://127.0.0.1:{port}/v1" in r.stdout
    d = Deployment.load(state)
    assert d is not None and len(d.workers) == 2
    yield d
    r = _cli("stop-dynamo", "--state-dir", str(state))
    assert r.returncode == 0 and "stopped Dynamo" in r.stdout, r.stdout + r.stderr
    assert not any(p.alive() for p in d.procs)
    assert not Path(d.discovery_dir).exists() and not (state / "state.json").exists()


@pytest.fixture(scope="module")
def direct(fp8_bundle):
    # the oracle runs the engine on a thread (test_executor_process.py: the worker streams the same tokens)
    llm = open_llm(fp8_bundle, "reference", device="cpu", torch_threads=1, single_process=True)
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def client(dep):
    return openai.OpenAI(base_url=dep.url, api_key="unused", timeout=TIMEOUT, max_retries=0)


def _greedy(llm, ids, n) -> str:
    return llm.generate_async(list(ids), SamplingParams(max_tokens=n, temperature=0.0)).result(timeout=TIMEOUT).outputs[0].text


def _chat_ids(llm, text):
    return llm.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False)


def _metrics(dep) -> dict[str, float]:
    """Sum of each eagle3_* counter per worker: {"worker-0/eagle3_draft_tokens_total": x, ...}."""
    out: dict[str, float] = {}
    for w in dep.workers:
        if not w.alive():
            continue
        with urllib.request.urlopen(f"http://127.0.0.1:{w.port}/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                m = re.match(r"(eagle3_\w+_total)(\{[^}]*\})? ([0-9.e+]+)$", line)
                if m:
                    key = f"{w.role}/{m.group(1)}"
                    out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


def _total(m: dict[str, float], name: str) -> float:
    return sum(v for k, v in m.items() if k.endswith("/" + name))


def test_completions_greedy_equal_direct_runtime(client, direct):
    for p in PROMPTS[:2]:
        want = _greedy(direct, direct.tokenizer.encode(p), 12)
        r = client.completions.create(model="eagle3", prompt=p, max_tokens=12, temperature=0)
        assert r.choices[0].text == want and r.choices[0].finish_reason in ("length", "stop")
        assert r.usage.completion_tokens == 12 or r.choices[0].finish_reason == "stop"
        s = client.completions.create(model="eagle3", prompt=p, max_tokens=12, temperature=0, stream=True)
        assert "".join(c.choices[0].text for c in s if c.choices) == want


def test_chat_greedy_equal_direct_runtime(client, direct):
    q = "What is the capital of France?"
    ids = _chat_ids(direct, q)
    want = _greedy(direct, ids, 16)
    r = client.chat.completions.create(model="eagle3", messages=[{"role": "user", "content": q}], max_tokens=16, temperature=0)
    assert r.choices[0].message.content == want and r.usage.prompt_tokens == len(ids)
    s = client.chat.completions.create(model="eagle3", messages=[{"role": "user", "content": q}], max_tokens=16, temperature=0, stream=True)
    assert "".join((c.choices[0].delta.content or "") for c in s if c.choices) == want


def test_stop_string_cuts_text(client, direct):
    p = PROMPTS[0]
    full = _greedy(direct, direct.tokenizer.encode(p), 16)
    stop = full.strip().split()[1] if len(full.strip().split()) > 1 else full.strip()[:2]
    r = client.completions.create(model="eagle3", prompt=p, max_tokens=16, temperature=0, stop=[stop])
    assert r.choices[0].text == full[: full.index(stop)] and r.choices[0].finish_reason == "stop"


def test_speculative_stats_in_response_and_metrics(client, dep, fp8_bundle):
    before = _metrics(dep)
    r = client.completions.create(model="eagle3", prompt=PROMPTS[2], max_tokens=20, temperature=0, extra_body={"nvext": {"extra_fields": ["engine_data"]}})
    st = r.model_extra["nvext"]["engine_data"]["eagle3"]
    assert st["speculative"] and st["draft_tokens"] > 0 and 0 <= st["accepted_draft_tokens"] <= st["draft_tokens"]
    assert st["completion_tokens"] == r.usage.completion_tokens
    k = 3  # the tiny preset's max_draft_len
    assert 1.0 <= st["acceptance_length"] <= k + 1
    # The same definition as the Triton model's acceptance_length and core/stats.py: prefill included.
    assert st["acceptance_length"] == round(st["completion_tokens"] / st["target_forwards"], 4)
    assert st["target_forwards"] < st["completion_tokens"] + 2  # speculation needed no more forwards than tokens
    after = _metrics(dep)
    assert _total(after, "eagle3_draft_tokens_total") - _total(before, "eagle3_draft_tokens_total") == st["draft_tokens"]
    assert _total(after, "eagle3_accepted_draft_tokens_total") - _total(before, "eagle3_accepted_draft_tokens_total") == st["accepted_draft_tokens"]
    assert _total(after, "eagle3_output_tokens_total") - _total(before, "eagle3_output_tokens_total") == st["completion_tokens"]


def test_acceptance_length_counts_the_prefill_forward():
    # A request seen through Triton and Dynamo: 30 tokens from 18 target forwards (prefill + 17
    # verification steps whose lengths sum to 29). Triton reports 30/18; Dynamo reported 29/17.
    perf = RequestPerfMetrics(
        speculative_decoding=SpeculativeDecodingMetrics(
            total_draft_tokens=49, total_accepted_draft_tokens=12, eagle3_acceptance_lengths=[1, 1, 1, 1, 2, 4, 2, 1, 1, 2, 2, 1, 3, 2, 1, 2, 2]
        ),
        eagle3_target_forwards=18,
    )
    st = spec_stats(perf, 30, True).as_dict()
    assert st["acceptance_length"] == round(30 / 18, 4) and st["target_forwards"] == 18
    assert spec_stats(RequestPerfMetrics(eagle3_target_forwards=8), 8, False).as_dict()["acceptance_length"] == 1.0


def test_32_concurrent_requests_spread_over_both_workers(client, dep, direct):
    prompts = [f"{PROMPTS[i % 4]} {i}" for i in range(32)]
    want = {p: _greedy(direct, direct.tokenizer.encode(p), 8) for p in prompts}
    before = _metrics(dep)

    def one(p):
        return client.completions.create(model="eagle3", prompt=p, max_tokens=8, temperature=0).choices[0].text

    with cf.ThreadPoolExecutor(32) as ex:
        got = dict(zip(prompts, ex.map(one, prompts, timeout=TIMEOUT * 2)))
    assert got == want
    after = _metrics(dep)
    per_worker = {w.role: after.get(f"{w.role}/eagle3_requests_total", 0) - before.get(f"{w.role}/eagle3_requests_total", 0) for w in dep.workers}
    assert sum(per_worker.values()) == 32 and min(per_worker.values()) >= 8, per_worker


def _post(url: str, body: bytes) -> tuple[int, str]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.mark.parametrize(
    "body,expect",
    [
        (json.dumps({"model": "no-such-model", "prompt": "hi", "max_tokens": 4}), ("404", "not found")),
        (json.dumps({"model": "eagle3", "prompt": "hi", "max_tokens": -1}), ("400", "-1")),
        (json.dumps({"model": "eagle3", "prompt": "x " * 50_000, "max_tokens": 4}), ("400", "max_seq_len")),
        ('{"model": "eagle3", "prompt": "hi",', ("400", "json")),
        (json.dumps({"model": "eagle3", "prompt": "hi", "max_tokens": 4, "n": 2}), ("400", "n=2")),
        (json.dumps({"model": "eagle3", "prompt": "hi", "max_tokens": 4, "frequency_penalty": 0.5}), ("400", "frequency_penalty")),
        (json.dumps({"model": "eagle3", "prompt": "hi", "max_tokens": 100_000}), ("400", "max_seq_len")),
        # Answered 200 without logprobs / without the prompt text before they were refused.
        (json.dumps({"model": "eagle3", "prompt": "hi", "max_tokens": 4, "logprobs": 2}), ("400", "logprobs=2")),
        (json.dumps({"model": "eagle3", "prompt": "hi", "max_tokens": 4, "echo": True}), ("400", "echo")),
    ],
    ids=["unknown-model", "negative-max-tokens", "100k-char-prompt", "malformed-json", "n2", "penalty", "max-tokens-over-context", "logprobs", "echo"],
)
def test_bad_requests_get_a_clear_4xx(dep, body, expect):
    code, text = _post(f"{dep.url}/completions", body.encode())
    assert str(code) == expect[0] and expect[1].lower() in text.lower(), (code, text[:300])
    code, _ = _post(f"{dep.url}/completions", json.dumps({"model": "eagle3", "prompt": "hi", "max_tokens": 2}).encode())
    assert code == 200  # the frontend is still up


def test_chat_logprobs_refused(dep):
    body = {"model": "eagle3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "logprobs": True, "top_logprobs": 2}
    code, text = _post(f"{dep.url}/chat/completions", json.dumps(body).encode())
    assert code == 400 and "logprobs" in text, (code, text[:300])
    body.pop("top_logprobs")
    body["logprobs"] = False  # asking for none is fine
    code, text = _post(f"{dep.url}/chat/completions", json.dumps(body).encode())
    assert code == 200, (code, text[:300])


def test_start_failures_are_one_line(dep, fp8_bundle, tmp_path):
    r = _cli("serve-dynamo", str(tmp_path / "missing"), "--state-dir", str(tmp_path / "s1"))
    assert r.returncode == 2 and "not an engine bundle" in r.stderr and len(r.stderr.strip().splitlines()) == 1  # refused before the banner
    r = _cli("serve-dynamo", str(fp8_bundle), "--http-port", str(dep.frontend.port), "--state-dir", str(tmp_path / "s2"))
    assert r.returncode == 2 and "port in use" in r.stderr.splitlines()[-1]
    broken = tmp_path / "broken"  # a manifest and options but no weights: the worker dies while loading
    broken.mkdir()
    for name in ("manifest.json", "llm_api_options.yaml"):
        (broken / name).write_text((fp8_bundle / name).read_text())
    r = _cli("serve-dynamo", str(broken), "--workers", "1", "--http-port", str(free_port()), "--state-dir", str(tmp_path / "s3"), "--timeout", "120")
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and last.startswith("error: worker-0: exited during startup"), r.stderr[-2000:]
    assert not (tmp_path / "s3" / "state.json").exists() and not (tmp_path / "s3" / "discovery").exists()


def test_serve_dynamo_again_while_running_says_where_and_how_to_stop(dep, fp8_bundle):
    """A second serve-dynamo on the running deployment's state directory: one line with its URL, each
    process's pid and port, the bundle, and the command that stops it; nothing of it is touched."""
    r = _cli("serve-dynamo", str(fp8_bundle), "--state-dir", dep.state_dir, "--http-port", str(free_port()))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    procs = ", ".join(f"{p.role} pid {p.pid} port {p.port}" for p in dep.procs)
    assert r.stderr.strip().splitlines()[-1] == (
        f"error: {dep.state_dir}: a Dynamo deployment is already running from this state directory ({dep.url}; {procs}; bundle {dep.bundle}) "
        f"(hint: stop it first: eagle3-trt stop-dynamo --state-dir {dep.state_dir}, or pass another --state-dir and --http-port)"
    ), r.stderr
    assert all(p.alive() for p in dep.procs) and Path(dep.discovery_dir).is_dir()
    assert Deployment.load(Path(dep.state_dir)) == dep


def test_kill_one_worker_mid_run(dep, client):
    """SIGKILL a worker while 8 streams run: every request ends (migrated or failed) within the
    timeout, the frontend keeps serving on the other worker, and status-dynamo shows the dead one."""
    victim = dep.workers[1]

    def stream(i):
        t0 = time.monotonic()
        try:
            s = client.completions.create(model="eagle3", prompt=f"{PROMPTS[i % 4]} {i}", max_tokens=200, temperature=0, stream=True)
            n = sum(1 for _ in s)
            return "ok", n, time.monotonic() - t0
        except openai.APIError as e:
            return f"error {type(e).__name__}", 0, time.monotonic() - t0

    with cf.ThreadPoolExecutor(8) as ex:
        futs = [ex.submit(stream, i) for i in range(8)]
        time.sleep(1.5)
        os.kill(victim.pid, signal.SIGKILL)
        results = [f.result(timeout=TIMEOUT * 2) for f in futs]
    assert all(dt < TIMEOUT for _, _, dt in results), results
    assert sum(1 for r in results if r[0] == "ok") >= 4, results
    for i in range(4):
        r = client.completions.create(model="eagle3", prompt=PROMPTS[i], max_tokens=4, temperature=0)
        assert r.choices[0].text is not None
    r = _cli("status-dynamo", "--state-dir", dep.state_dir)
    assert r.returncode == 1 and f"{victim.role}" in r.stdout and "DEAD" in r.stdout, r.stdout
    assert "worker-0" in r.stdout and re.search(r"worker-0\s+pid \d+\s+up", r.stdout), r.stdout
