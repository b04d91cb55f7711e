"""End-to-end against a real tritonserver (nvidia-pytriton's build) on 127.0.0.1 with the tiny FP8 bundle.

One server for the whole module, started and stopped with the CLI (`package`, `serve`,
`stop`). Clients are Triton's own gRPC/HTTP clients, through this project's client library
or raw. The reference runtime called directly in this process is the oracle for greedy output.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from eagle3_trt.testing.reference_oracle import direct_generate as _direct
from eagle3_trt.testing.servers import run_cli, serve_triton


def _have_tritonserver() -> bool:
    import importlib.util
    import shutil

    return bool(shutil.which("tritonserver") or importlib.util.find_spec("pytriton"))


pytestmark = [pytest.mark.triton, pytest.mark.needs("tritonserver")]

REPO_ROOT = Path(__file__).resolve().parents[1]
_cli = run_cli
PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers.", "Explain caching."]


@pytest.fixture(scope="module")
def server(fp8_bundle, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("triton")
    repo, state = tmp / "repo", tmp / "state"
    # The decoupled model (streaming) and its unary twin (HTTP /infer, gRPC ModelInfer): one server start.
    r = _cli("package", str(fp8_bundle), "-o", str(repo), "--with-unary")
    assert r.returncode == 0, r.stderr
    handle, out = serve_triton(repo, state, "--timeout", "240")
    assert f"http://127.0.0.1:{handle.http_port}" in out and f"127.0.0.1:{handle.grpc_port}" in out
    assert handle.shm_prefix.startswith("eagle3_") and list(Path("/dev/shm").glob(handle.shm_prefix + "*"))
    yield handle
    r = _cli("stop", "--state-dir", str(state))
    assert r.returncode == 0 and "stopped" in r.stdout, r.stdout + r.stderr
    assert not handle.alive()
    assert not (state / "server.json").exists()
    assert not list(Path("/dev/shm").glob(handle.shm_prefix + "*"))  # no shared-memory region left behind


@pytest.fixture(scope="module")
def engine(fp8_bundle):
    from eagle3_trt.runtime.loader import engine_from_bundle

    return engine_from_bundle(fp8_bundle, device="cpu")


@pytest.fixture(scope="module")
def chat(fp8_bundle):
    from eagle3_trt.clients.chat import PromptFormatter

    return PromptFormatter(fp8_bundle)


def _client(server, http=False):
    from eagle3_trt.clients.llm_client import LLMClient

    return LLMClient(server.http_url if http else server.grpc_url, http=http, timeout_s=120)


def _metrics(server):
    from eagle3_trt.clients.prom import read_counters

    return read_counters(server.metrics_url, "eagle3")


# ---- generation ----------------------------------------------------------------------------------
@pytest.mark.parametrize("speculate", [True, False])
def test_greedy_matches_reference_runtime(server, engine, chat, speculate):
    from eagle3_trt.clients.llm_client import GenerationParams

    text = chat(PROMPTS[0])
    want_text, want_n, want_reason, want_stats = _direct(engine, text, 12, speculate)
    with _client(server) as c:
        res = c.generate(text, GenerationParams(max_tokens=12, speculative=None if speculate else False))
    assert (res.text, res.n_tokens, res.finish_reason) == (want_text, want_n, want_reason)
    assert res.perf["speculative_decoding"] is speculate
    if speculate:
        # the same draft and accepted counts as the runtime called directly, and the rate is their ratio
        assert res.perf["total_draft_tokens"] == want_stats.draft_tokens > 0
        assert res.perf["total_accepted_draft_tokens"] == want_stats.accepted_tokens
        assert res.perf["acceptance_rate"] == pytest.approx(want_stats.accepted_tokens / want_stats.draft_tokens, rel=1e-6)
    else:
        assert res.perf["total_draft_tokens"] == 0


def test_streaming_grpc_and_http_agree(server, chat):
    from eagle3_trt.clients.llm_client import GenerationParams

    text = chat(PROMPTS[1])
    p = GenerationParams(max_tokens=10)
    with _client(server) as g, _client(server, http=True) as h:
        whole = g.generate(text, p)
        s_grpc = g.generate(text, p, stream=True)
        whole_http = h.generate(text, p)
        s_http = h.generate(text, p, stream=True)
    assert len(whole.chunks) == 1 and whole.chunks[0].final
    for r in (s_grpc, s_http):
        assert len(r.chunks) >= 2  # one response per decoding step
        assert all(not c.final for c in r.chunks[:-1]) and r.chunks[-1].final
        assert r.chunks[-1].finish_reason in ("length", "stop")
        assert sum(c.n_tokens for c in r.chunks) == whole.n_tokens
    assert whole.text == s_grpc.text == whole_http.text == s_http.text
    assert whole.n_tokens == whole_http.n_tokens == 10 or whole.finish_reason == "stop"


def test_prompt_echo_and_raw_http_generate(server, chat):
    """The documented curl request, sent as raw JSON: the llmapi default echoes the prompt."""
    import requests

    text = chat(PROMPTS[2])
    url = f"{server.http_url}/v2/models/eagle3/generate"
    r = requests.post(url, json={"text_input": text, "sampling_param_max_tokens": 4}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["text_output"].startswith(text) and body["finish_reason"] in ("length", "stop")
    r2 = requests.post(url, json={"text_input": text, "sampling_param_max_tokens": 4, "sampling_param_exclude_input_from_output": True}, timeout=60)
    assert body["text_output"] == text + r2.json()["text_output"]
    # Streaming over HTTP: server-sent events, the last carries finish_reason.
    events = []
    with requests.post(
        f"{server.http_url}/v2/models/eagle3/generate_stream",
        stream=True,
        timeout=60,
        json={"text_input": text, "sampling_param_max_tokens": 4, "streaming": True, "sampling_param_exclude_input_from_output": True},
    ) as s:
        for line in s.iter_lines():
            if line.startswith(b"data:"):
                events.append(json.loads(line[5:]))
    assert len(events) >= 2 and "finish_reason" in events[-1]
    assert "".join(e["text_output"] for e in events) == r2.json()["text_output"]


def test_stop_string_cuts_output(server, chat):
    from eagle3_trt.clients.llm_client import GenerationParams

    text = chat(PROMPTS[0])
    with _client(server) as c:
        full = c.generate(text, GenerationParams(max_tokens=12))
        assert len(full.text) >= 4
        stop = full.text[2:4]
        cut = c.generate(text, GenerationParams(max_tokens=12, stop=(stop,)), stream=True)
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.index(stop)]


# ---- unary calls (the non-decoupled twin) ---------------------------------------------------------
def test_unary_http_infer_grpc_model_infer_and_generate(server, chat):
    """Triton refuses unary calls on a decoupled model; the unary twin answers them with the same text."""
    import requests
    import tritonclient.grpc as tg
    import tritonclient.http as th

    from eagle3_trt.clients.llm_client import GenerationParams

    text = chat(PROMPTS[0])
    with _client(server) as c:
        want = c.generate(text, GenerationParams(max_tokens=6))
    got = {}
    for mod, url in ((th, server.http_url[len("http://") :]), (tg, server.grpc_url)):
        cl = mod.InferenceServerClient(url)
        t = mod.InferInput("text_input", [1], "BYTES")
        t.set_data_from_numpy(np.array([text.encode()], dtype=np.object_))
        mt = mod.InferInput("sampling_param_max_tokens", [1], "INT64")
        mt.set_data_from_numpy(np.array([6], np.int64))
        ex = mod.InferInput("sampling_param_exclude_input_from_output", [1], "BOOL")
        ex.set_data_from_numpy(np.array([True]))
        res = cl.infer("eagle3_unary", [t, mt, ex])
        got[mod.__name__] = (res.as_numpy("text_output")[0].decode(), int(res.as_numpy("num_output_tokens")[0]))
        with pytest.raises(Exception, match="decoupled"):
            cl.infer("eagle3", [t, mt, ex])
        cl.close()
    assert got["tritonclient.http"] == got["tritonclient.grpc"] == (want.text, want.n_tokens)
    r = requests.post(
        f"{server.http_url}/v2/models/eagle3_unary/generate",
        timeout=60,
        json={"text_input": text, "sampling_param_max_tokens": 6, "sampling_param_exclude_input_from_output": True},
    )
    assert r.status_code == 200 and r.json()["text_output"] == want.text, r.text
    r = requests.post(f"{server.http_url}/v2/models/eagle3_unary/generate", timeout=60, json={"text_input": text, "streaming": True})
    assert r.status_code == 400 and r.json()["error"].startswith("streaming: this model is not decoupled"), r.text


# ---- bad input: an error naming the field; the server keeps serving --------------------------------
def _inputs(*items: tuple[str, np.ndarray, str]):
    from eagle3_trt.clients.llm_client import infer_inputs

    return infer_inputs(list(items))


def _grpc_raw(server, inputs: list[tuple[str, np.ndarray, str]], request_id: str = "") -> str | None:
    """Send raw tensors over a gRPC stream; the error message, or None on success."""
    import queue

    import tritonclient.grpc as g

    q: queue.Queue = queue.Queue()
    c = g.InferenceServerClient(server.grpc_url)
    c.start_stream(callback=lambda result, error: q.put((result, error)))
    try:
        c.async_stream_infer("eagle3", _inputs(*inputs), request_id=request_id, enable_empty_final_response=True)
        while True:
            r, e = q.get(timeout=60)
            if e is not None:
                return e.message()
            if r.get_response().parameters["triton_final_response"].bool_param:
                return None
    finally:
        c.stop_stream()
        c.close()


def _text(s: str):
    return ("text_input", np.array([s.encode()], dtype=np.object_), "BYTES")


@pytest.mark.parametrize(
    "inputs, field",
    [
        ([("sampling_param_max_tokens", np.array([4], np.int64), "INT64")], "text_input"),  # missing
        ([_text("hi"), ("sampling_param_max_tokens", np.array([4.0], np.float32), "FP32")], "sampling_param_max_tokens"),  # dtype
        ([_text("")], "text_input"),  # empty prompt
        ([_text("hi"), ("sampling_param_max_tokens", np.array([0], np.int64), "INT64")], "sampling_param_max_tokens"),
        ([_text("hi"), ("sampling_param_max_tokens", np.array([600], np.int64), "INT64")], "sampling_param_max_tokens"),  # > max_seq_len 512
        ([_text("hi"), ("sampling_param_temperature", np.array([-0.5], np.float32), "FP32")], "sampling_param_temperature"),
        ([_text("hi"), ("sampling_param_top_p", np.array([-0.1], np.float32), "FP32")], "sampling_param_top_p"),  # 0 is greedy
        ([_text("hi"), ("sampling_param_top_p", np.array([1.5], np.float32), "FP32")], "sampling_param_top_p"),
        # 64-bit values arrive whole and are refused, never wrapped into range
        ([_text("hi"), ("sampling_param_max_tokens", np.array([2**32 + 5], np.int64), "INT64")], "sampling_param_max_tokens: 4294967301 is out of range"),
        ([_text("hi"), ("sampling_param_max_tokens", np.array([2**31], np.int64), "INT64")], "sampling_param_max_tokens: 2147483648 is out of range"),
        ([_text("hi"), ("sampling_param_top_k", np.array([2**32 + 5], np.int64), "INT64")], "sampling_param_top_k: 4294967301 is out of range"),
        ([_text("hi"), ("sampling_param_top_k", np.array([2**31], np.int64), "INT64")], "sampling_param_top_k: 2147483648 is out of range"),
        ([_text("hi"), ("sampling_param_stop", np.array([b"x", b""], dtype=np.object_), "BYTES")], "sampling_param_stop: stop string 1 is empty"),
        # upstream's INT32: Triton itself refuses the type, naming the input (the README says so)
        ([_text("hi"), ("sampling_param_max_tokens", np.array([4], np.int32), "INT32")], "data-type is 'INT32', but model 'eagle3' expects 'INT64'"),
    ],
    ids=[
        "missing-text",
        "wrong-dtype",
        "empty-prompt",
        "max-tokens-0",
        "max-tokens-over-limit",
        "neg-temperature",
        "top-p-0",
        "top-p-1.5",
        "max-tokens-2^32+5",
        "max-tokens-2^31",
        "top-k-2^32+5",
        "top-k-2^31",
        "empty-stop-string",
        "int32-max-tokens",
    ],
)
def test_bad_input_grpc(server, inputs, field):
    err = _grpc_raw(server, inputs)
    assert err is not None and field in err, err
    assert _grpc_raw(server, [_text("hi"), ("sampling_param_max_tokens", np.array([2], np.int64), "INT64")]) is None


@pytest.mark.parametrize(
    "payload, status, says",
    [
        ({"sampling_param_max_tokens": 4}, 400, "text_input"),
        ({"text_input": "   "}, 400, "text_input: is empty or only whitespace"),
        ({"text_input": ["a", "b"]}, 400, "text_input: exactly one prompt"),
        ({"text_input": "hi", "sampling_param_max_tokens": 100000}, 400, "sampling_param_max_tokens"),
        ({"text_input": "hi", "sampling_param_temperature": -1.0}, 400, "sampling_param_temperature"),
        ({"text_input": "hi", "sampling_param_top_p": 2.0}, 400, "sampling_param_top_p"),
        ({"text_input": "hi", "max_tokens": 3}, 400, "max_tokens: not an input of this model (did you mean sampling_param_max_tokens?)"),
        ({"text_input": "hi", "foo": 1}, 400, "foo: not an input"),
        # what tritonserver's own JSON reader answered with a 500: the HTTP front's 400 (http_front.py)
        ({"text_input": 5}, 400, "text_input: is the integer 5, but the input is TYPE_STRING; send a JSON string"),
        ({"text_input": "hi", "sampling_param_max_tokens": 1.5}, 400, "sampling_param_max_tokens: is the number 1.5, but the input is TYPE_INT64"),
        ({"text_input": "hi", "sampling_param_max_tokens": "many"}, 400, "sampling_param_max_tokens: is a string, but the input is TYPE_INT64"),
        ({"text_input": "hi", "foo": {"a": 1}}, 400, "parameter 'foo' has invalid type"),
    ],
    ids=[
        "missing-text",
        "blank-prompt",
        "two-prompts",
        "max-tokens-over-limit",
        "neg-temperature",
        "top-p-2",
        "typo-max_tokens",
        "unknown-key",
        "triton-text-number",
        "triton-max-tokens-float",
        "triton-max-tokens-string",
        "triton-object-param",
    ],
)
def test_bad_input_http(server, payload, status, says):
    import requests

    r = requests.post(f"{server.http_url}/v2/models/eagle3/generate", json=payload, timeout=60)
    assert r.status_code == status and says in r.json()["error"], r.text
    ok = requests.post(f"{server.http_url}/v2/models/eagle3/generate", json={"text_input": "hi", "sampling_param_max_tokens": 2}, timeout=60)
    assert ok.status_code == 200, ok.text


def _post_raw(url: str, body: bytes) -> tuple[int, dict]:
    """A raw HTTP POST (urllib, the JSON text as written): (status, JSON body)."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize("field", ["sampling_param_max_tokens", "sampling_param_top_k"])
@pytest.mark.parametrize("value", ["4294967301", "2147483648"])
def test_http_integers_that_would_wrap_are_refused(server, field, value):
    """JSON integers past 32 bits reach the model whole (INT64 inputs) and are refused by name; before,
    Triton's reader served 4294967301 as 5 and 2147483648 as -2147483648."""
    url = f"{server.http_url}/v2/models/eagle3/generate"
    status, body = _post_raw(url, f'{{"text_input": "hi", "{field}": {value}}}'.encode())
    assert status == 400 and body["error"].startswith(f"{field}: {value} is out of range"), body
    # in range: served, the reply as long as asked
    status, body = _post_raw(url, b'{"text_input": "hi", "sampling_param_max_tokens": 3, "sampling_param_top_k": 5, "sampling_param_temperature": 0.7}')
    assert status == 200 and body["finish_reason"] in ("length", "stop"), body


def test_http_empty_stop_string_refused(server):
    status, body = _post_raw(f"{server.http_url}/v2/models/eagle3/generate", b'{"text_input": "hi", "sampling_param_stop": ["x", ""]}')
    assert status == 400 and body["error"].startswith("sampling_param_stop: stop string 1 is empty"), body


def test_grpc_normal_integers_and_client_adapts_to_int64(server, chat):
    """tritonclient with INT64 values in range is served; this project's client reads the declared
    type (INT64 here) from the model's metadata."""
    from eagle3_trt.clients.llm_client import GenerationParams

    ok = [_text("hi"), ("sampling_param_max_tokens", np.array([3], np.int64), "INT64"), ("sampling_param_top_k", np.array([5], np.int64), "INT64")]
    assert _grpc_raw(server, ok) is None
    with _client(server) as c:
        res = c.generate(chat(PROMPTS[0]), GenerationParams(max_tokens=3, top_k=5, temperature=0.7))
        assert c._grpc_int_types() == {"sampling_param_max_tokens": "INT64", "sampling_param_top_k": "INT64"}
    assert res.n_tokens <= 3


def test_bad_input_counted_as_rejected(server):
    before = _metrics(server).requests.get("rejected", 0)
    assert "text_input" in (_grpc_raw(server, [_text("")]) or "succeeded")
    assert _wait(lambda: _metrics(server).requests.get("rejected", 0) == before + 1)


# ---- concurrency, cancellation -------------------------------------------------------------------
def test_serve_again_while_running_says_where_and_how_to_stop(server):
    """The newcomer's second `serve`: one line naming the running server (pid, ports, state
    directory, repository) and the command that stops it; the running server keeps serving."""
    import urllib.request

    r = _cli("serve", server.repo, "--state-dir", server.state_dir, "--timeout", "30")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        f"error: {server.state_dir}/server.json: a server is already running here: tritonserver pid {server.pid}, HTTP {server.http_port}, "
        f"gRPC {server.grpc_port}, metrics {server.metrics_port} on 127.0.0.1, repository {server.repo} "
        f"(hint: stop it with `eagle3-trt stop --state-dir {server.state_dir}`, or pass another --state-dir and free ports)"
    ), r.stderr
    with urllib.request.urlopen(f"{server.http_url}/v2/health/ready", timeout=10) as resp:
        assert resp.status == 200 and server.alive()


def test_16_concurrent_streams(server, chat):
    from eagle3_trt.clients.llm_client import GenerationParams

    p = GenerationParams(max_tokens=4)
    with _client(server) as c:  # sequential references, one per distinct prompt
        want = {q: c.generate(chat(q), p) for q in PROMPTS}
    results: dict[int, object] = {}
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            with _client(server) as c:
                results[i] = c.generate(chat(PROMPTS[i % 4]), p, stream=True)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(results) == 16
    for i, r in results.items():
        ref = want[PROMPTS[i % 4]]
        assert (r.text, r.n_tokens, r.finish_reason) == (ref.text, ref.n_tokens, ref.finish_reason)
        assert sum(ch.n_tokens for ch in r.chunks) == r.n_tokens
    assert _wait(lambda: _metrics(server).active == 0)


def _wait(pred, timeout: float = 20.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


def test_client_cancel_frees_request(server, chat):
    from eagle3_trt.clients.llm_client import GenerationParams, LLMClient

    before = _metrics(server)
    c = LLMClient(server.grpc_url)
    it = c.stream(chat(PROMPTS[3]), GenerationParams(max_tokens=300))
    got = [next(it), next(it)]
    assert not got[-1].final
    c.close(cancel=True)
    assert _wait(lambda: _metrics(server).requests.get("cancelled", 0) == before.requests.get("cancelled", 0) + 1)
    after = _metrics(server)
    assert after.active == 0
    assert after.tokens_on - before.tokens_on < 300  # stopped early, not run to completion


def test_http_stream_disconnect_frees_request(server, chat):
    import requests

    before = _metrics(server)
    with requests.post(
        f"{server.http_url}/v2/models/eagle3/generate_stream",
        stream=True,
        timeout=60,
        json={"text_input": chat(PROMPTS[2]), "streaming": True, "sampling_param_max_tokens": 300},
    ) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith(b"data:"))
    # The connection is closed here, mid-stream.
    assert _wait(lambda: _metrics(server).requests.get("cancelled", 0) == before.requests.get("cancelled", 0) + 1)
    after = _metrics(server)
    assert after.active == 0 and after.tokens_on - before.tokens_on < 300


def test_killed_client_frees_request(server, chat):
    """A client process that dies mid-stream: the server notices and frees the request."""
    before = _metrics(server)
    script = textwrap.dedent(f"""
        import sys
        from eagle3_trt.clients.llm_client import GenerationParams, LLMClient
        c = LLMClient({server.grpc_url!r})
        for ch in c.stream({chat(PROMPTS[1])!r}, GenerationParams(max_tokens=300)):
            print("chunk", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "chunk"
        proc.stdout.readline()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    assert _wait(lambda: _metrics(server).requests.get("cancelled", 0) == before.requests.get("cancelled", 0) + 1, 30)
    assert _metrics(server).active == 0


# ---- metrics -------------------------------------------------------------------------------------
def test_metrics_track_responses(server, chat):
    from eagle3_trt.clients.llm_client import GenerationParams

    before = _metrics(server)
    with _client(server) as c:
        on = c.generate(chat(PROMPTS[2]), GenerationParams(max_tokens=8))
        off = c.generate(chat(PROMPTS[2]), GenerationParams(max_tokens=8, speculative=False))
    assert _wait(lambda: _metrics(server).requests.get("ok", 0) >= before.requests.get("ok", 0) + 2)
    d = _metrics(server).minus(before)
    assert d.draft == on.perf["total_draft_tokens"] > 0
    assert d.accepted == on.perf["total_accepted_draft_tokens"]
    assert d.tokens_on == on.n_tokens and d.tokens_off == off.n_tokens
    assert d.spec_off_requests == 1
    # One histogram sample per verification step (a step that drafted), each = accepted + 1;
    # per-position counters add up to the drafted tokens. Forwards = n / AL, prefill included.
    forwards = round(on.n_tokens / on.perf["acceptance_length"])
    assert 0 < d.al_count <= forwards - 1 and d.drafted_pos[1] == d.al_count
    assert d.al_sum == d.accepted + d.al_count
    assert sum(d.drafted_pos.values()) == d.draft
    assert len(d.drafted_pos) == 3 and d.drafted_pos[1] >= d.drafted_pos[2] >= d.drafted_pos[3]


# ---- CLI clients -----------------------------------------------------------------------------------
def test_generate_cli_grpc_stream_and_http(server, fp8_bundle):
    r = _cli("generate", "--url", server.grpc_url, "--stream", "--max-tokens", "5", "Say hi")
    assert r.returncode == 0, r.stderr
    assert "5 tokens" in r.stderr or "stop" in r.stderr
    r = _cli("generate", "--url", server.http_url, "--http", "--json", "--max-tokens", "5", "--bundle", str(fp8_bundle), "Say hi")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["tokens"] <= 5 and out["speculative_decoding"] is True
    r = _cli("generate", "--url", server.grpc_url, "--max-tokens", "0", "Say hi")
    assert r.returncode == 2 and "sampling_param_max_tokens" in r.stderr


def test_bench_cli_writes_report(server, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"turns": [q]}) for q in PROMPTS) + "\n")
    out = tmp_path / "report"
    r = _cli(
        "bench",
        "--url",
        server.grpc_url,
        "--metrics-url",
        server.metrics_url,
        "--prompts",
        str(prompts),
        "--concurrency",
        "1,2",
        "--requests",
        "2",
        "--max-tokens",
        "4",
        "--warmup",
        "1",
        "-o",
        str(out),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads((out / "bench.json").read_text())
    arms = {(a["concurrency"], a["speculative"]) for a in data["arms"]}
    assert arms == {(1, True), (1, False), (2, True), (2, False)}
    assert all(a["errors"] == 0 and a["requests"] == 2 for a in data["arms"])
    on = [a for a in data["arms"] if a["speculative"]]
    assert all(a["alpha_metrics"] is not None and a["alpha_responses"] is not None for a in on)
    assert data["gate"]["verdict"] in ("pass", "pass_with_switch_off", "fail") and "gate:" in r.stdout
    for f in ("summary.md", "latency_cdf.png", "itl_vs_concurrency.png", "throughput_vs_concurrency.png", "acceptance_by_position.png"):
        assert (out / f).stat().st_size > 0


def test_stop_input_cancels_by_request_id(server, chat):
    """Upstream's `stop` input: a second request with the same id cancels the first."""
    import queue

    import tritonclient.grpc as g

    q: queue.Queue = queue.Queue()
    a = g.InferenceServerClient(server.grpc_url)
    a.start_stream(callback=lambda result, error: q.put((result, error)))
    try:
        a.async_stream_infer(
            "eagle3",
            _inputs(_text(chat(PROMPTS[0])), ("streaming", np.array([True]), "BOOL"), ("sampling_param_max_tokens", np.array([300], np.int64), "INT64")),
            request_id="job-42",
            enable_empty_final_response=True,
        )
        r, e = q.get(timeout=60)
        assert e is None  # generating
        assert _grpc_raw(server, [_text("x"), ("stop", np.array([True]), "BOOL")], request_id="job-42") is None
        while True:
            r, e = q.get(timeout=60)
            if e is not None:
                assert "cancelled" in e.message().lower()
                break
            assert not r.get_response().parameters["triton_final_response"].bool_param, "ran to completion"
        err = _grpc_raw(server, [_text("x"), ("stop", np.array([True]), "BOOL")], request_id="nope")
        assert err is not None and "stop" in err and "nope" in err
    finally:
        a.stop_stream()
        a.close()


def test_a_second_package_or_serve_against_the_running_repository_is_refused_before_anything_is_written(server, fp8_bundle):
    """A second `make serve` (package, then serve) aimed at the running server's repository: refused,
    --force or not, and the repository is byte-for-byte what the server loaded (issue 21 C4)."""
    from eagle3_trt.triton_serving.server import free_ports

    repo = Path(server.repo)

    def files() -> dict[str, bytes]:  # Triton's Python backend writes __pycache__ itself
        return {p.relative_to(repo.parent).as_posix(): p.read_bytes() for p in sorted(repo.parent.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}

    before = files()
    for extra in ((), ("--force",), ("--with-baseline",)):
        r = _cli("package", str(fp8_bundle), "-o", str(repo), *extra)
        assert r.returncode == 2 and f"a running tritonserver (pid {server.pid}) serves this repository; nothing written" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    http, grpc, metrics = free_ports(3)
    r = _cli("serve", str(repo), "--state-dir", server.state_dir, "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics))
    assert r.returncode == 2 and "a server is already running here" in r.stderr, r.stderr
    assert files() == before and server.alive()
