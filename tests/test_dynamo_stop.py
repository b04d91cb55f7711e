"""`stop-dynamo` under load: a cut-off answer never looks finished, and nothing of the deployment is left.

A real Dynamo frontend and 2 reference-runtime workers on 127.0.0.1 (started with the CLI, as in
test_dynamo_serving.py). 32 chat streams through the `openai` client, one raw SSE stream through
urllib and one non-streaming request run while `stop-dynamo --grace` is called after 1.5 s. Before the
fix every one of them got HTTP 200 and `finish_reason: "stop"` with a fraction of its tokens.

The oracle for a natural end is the reference runtime called directly in this process on the same
token ids (greedy): an answer that says "stop" must have exactly the tokens of that run, one that says
"length" exactly max_tokens; anything else must have ended with an error.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import re
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from eagle3_trt.procs import group_members, pid_alive
from eagle3_trt.runtime.factory import open_llm
from eagle3_trt.runtime.llm_api import SamplingParams
from eagle3_trt.testing.servers import run_cli as _cli
from eagle3_trt.testing.servers import serve_dynamo

LONG = 300  # tokens: far more than the grace period lets 33 streams on 2 CPU workers generate
SHORT = 32  # tokens: still being generated when the frontend stops, done within the grace period
N_SHORT = 8
GRACE_S = 15.0
TIMEOUT = 60


def _outcome(finish: str | None, tokens: int | None, error: str | None) -> dict:
    return {"finish": finish, "tokens": tokens, "error": error, "t_end": time.monotonic()}


def _raw_sse(url: str, body: dict) -> dict:
    """One streaming request read as SSE by hand: what a client the project did not write sees."""
    req = urllib.request.Request(f"{url}/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    finish = tokens = error = None
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT * 2) as r:
            assert r.status == 200
            for line in r:
                line = line.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                ev = json.loads(line[len("data: ") :])
                if "error" in ev:
                    error = f"event: {ev['error']}"
                    continue
                for ch in ev.get("choices") or []:
                    finish = ch.get("finish_reason") or finish
                if ev.get("usage"):
                    tokens = ev["usage"]["completion_tokens"]
    except (urllib.error.URLError, OSError) as e:  # an HTTP error status, or the connection dropped
        error = f"{type(e).__name__}: {e}"
    return _outcome(finish, tokens, error)


@pytest.mark.needs("dynamo", "openai")
def test_stop_under_load_never_reports_a_cut_off_answer_as_finished(fp8_bundle, tmp_path):
    import openai

    state = tmp_path / "state"
    dep, _ = serve_dynamo(fp8_bundle, state)
    client = openai.OpenAI(base_url=dep.url, api_key="unused", timeout=TIMEOUT * 2, max_retries=0)
    msgs = {i: [{"role": "user", "content": f"Tell me a long story about the number {i}."}] for i in range(32)}
    max_tokens = {i: SHORT if i < N_SHORT else LONG for i in msgs}

    # stop once every short answer is streaming: they are in flight when the frontend stops (a fixed
    # sleep let a fast machine finish them before the stop) and finish within the grace period
    started = {i: threading.Event() for i in msgs}

    def stream(i: int) -> dict:
        finish = tokens = None
        try:
            s = client.chat.completions.create(
                model="eagle3", messages=msgs[i], max_tokens=max_tokens[i], temperature=0, stream=True, stream_options={"include_usage": True}
            )
            for ch in s:
                started[i].set()
                tokens = ch.usage.completion_tokens if ch.usage else tokens
                finish = next((c.finish_reason for c in ch.choices if c.finish_reason), finish)
        except openai.APIError as e:
            return _outcome(finish, tokens, f"{type(e).__name__}: {e}")
        return _outcome(finish, tokens, None)

    def non_streaming() -> dict:
        try:
            c = client.chat.completions.create(model="eagle3", messages=msgs[31], max_tokens=LONG, temperature=0)
        except openai.APIStatusError as e:
            return _outcome(None, None, f"HTTP {e.status_code}: {e}")
        return _outcome(c.choices[0].finish_reason, c.usage.completion_tokens, None)

    raw_body = {"model": "eagle3", "messages": msgs[30], "max_tokens": LONG, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    with cf.ThreadPoolExecutor(34) as ex:
        futs = {i: ex.submit(stream, i) for i in msgs}
        futs["raw"] = ex.submit(_raw_sse, dep.url, raw_body)
        futs["non-streaming"] = ex.submit(non_streaming)
        for i in range(N_SHORT):
            assert started[i].wait(TIMEOUT), f"short answer {i} never started streaming"
        t_stop = time.monotonic()
        stopped = _cli("stop-dynamo", "--state-dir", str(state), "--grace", str(GRACE_S), "--timeout", "30", timeout=120)
        stop_s = time.monotonic() - t_stop
        got = {k: f.result(timeout=TIMEOUT) for k, f in futs.items()}

    # The oracle, run only for what claims a natural end (a greedy run of LONG tokens costs seconds).
    # the oracle runs the engine on a thread (test_executor_process.py: the worker streams the same tokens)
    direct = open_llm(fp8_bundle, "reference", device="cpu", torch_threads=1, single_process=True)
    try:
        natural: dict[object, int] = {}

        def natural_len(key: object) -> int:
            if key not in natural:
                m = msgs[30 if key == "raw" else 31 if key == "non-streaming" else key]  # type: ignore[index]
                ids = direct.tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=False)
                n = SHORT if key in range(N_SHORT) else LONG
                out = direct.generate_async(list(ids), SamplingParams(max_tokens=n, temperature=0.0)).result(timeout=TIMEOUT).outputs[0]
                natural[key] = len(out.token_ids)
            return natural[key]

        bad = {}
        for key, o in got.items():
            if o["error"] is not None:
                continue
            n_max = SHORT if key in range(N_SHORT) else LONG
            if o["finish"] == "length" and o["tokens"] == n_max:
                continue
            if o["finish"] == "stop" and o["tokens"] == natural_len(key) < n_max:
                continue
            bad[key] = o  # e.g. "stop" with fewer tokens than a natural end: a cut-off answer that looks finished
        assert not bad, f"answers that look finished but are not: {bad}"
    finally:
        direct.shutdown()

    errors = [k for k, o in got.items() if o["error"] is not None]
    drained = [k for k, o in got.items() if o["error"] is None and o["t_end"] > t_stop]
    assert errors, "the grace period is too short for LONG tokens: some answers must have been cut off"
    assert drained, f"no request finished during the {GRACE_S} s grace period: {got}"
    assert "raw" in errors and "non-streaming" in errors
    assert got["non-streaming"]["error"].startswith("HTTP 5"), got["non-streaming"]

    # stop-dynamo reports what it cut off (a request that ends between its count and its SIGTERM
    # is counted but completes, hence >=), exits 0, and leaves no process and no state behind.
    assert stopped.returncode == 0 and "stopped Dynamo" in stopped.stdout, stopped.stdout + stopped.stderr
    m = re.search(r"cut off (\d+) request\(s\)", stopped.stderr)
    assert m and len(errors) <= int(m.group(1)) <= len(got), stopped.stderr
    m = re.search(r"drained for [0-9.]+ s: (\d+) of (\d+) request\(s\) in flight finished", stopped.stderr)
    assert m and 1 <= int(m.group(1)) <= len(drained), stopped.stderr  # the drain let some finish
    assert stop_s < GRACE_S + 20, stop_s
    for p in dep.procs:
        assert not pid_alive(p.pid) and not group_members(p.pid), f"{p.role} (pid {p.pid}) or its process group is still alive"
    assert not (state / "state.json").exists() and not Path(dep.discovery_dir).exists()
