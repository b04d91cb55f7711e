"""`eagle3-trt deploy-dynamo` against a real Dynamo frontend with 16 streaming clients running throughout.

serve-dynamo runs 2 workers on the tiny FP8 bundle (K=3); `deploy-dynamo` replaces them one at a
time with workers on the same pair at K=5, each drained before it stops; `--rollback` goes back.
Each answer is checked against the reference runtime called directly on the bundle whose draft
counts it reports (``nvext.engine_data``): the text and finish reason of greedy decoding, and the
draft/accepted token counts of that bundle's head.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from eagle3_trt.testing.servers import run_cli, serve_dynamo
from eagle3_trt.testing.servers import until as _until

PROMPTS = ["The capital of France is", "Write a haiku about the sea.", "List three prime numbers:", "Explain caching."]
CLIENTS = 16
MAX_TOKENS = 12


_cli = partial(run_cli, timeout=400)  # deploy-dynamo drains each worker


def _expected(bundle: Path) -> dict[str, tuple]:
    """prompt -> (text, finish reason, draft tokens, accepted draft tokens) from the reference runtime."""
    from eagle3_trt.runtime.factory import open_llm
    from eagle3_trt.runtime.llm_api import SamplingParams, spec_stats

    # the oracle runs the engine on a thread (test_executor_process.py: the worker streams the same tokens)
    llm = open_llm(bundle, "reference", device="cpu", torch_threads=1, single_process=True)
    try:
        out = {}
        for p in PROMPTS:
            o = llm.generate_async(llm.tokenizer.encode(p), SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, return_perf_metrics=True)).result(timeout=60)
            c = o.outputs[0]
            st = spec_stats(c.request_perf_metrics, len(c.token_ids), True).as_dict()
            out[p] = (c.text, c.finish_reason, st["draft_tokens"], st["accepted_draft_tokens"])
        return out
    finally:
        llm.shutdown()


@dataclass
class Done:
    prompt: str
    t_send: float
    t_end: float
    text: str = ""
    finish: str | None = None
    draft: int | None = None
    accepted: int | None = None
    error: str | None = None


def _client(url: str, i: int, stop: threading.Event, done: list[Done]) -> None:
    import openai

    client = openai.OpenAI(base_url=url, api_key="unused", timeout=120, max_retries=0)
    k = i
    while not stop.is_set():
        p = PROMPTS[k % len(PROMPTS)]
        k += 1
        d = Done(p, time.monotonic(), 0.0)
        try:
            s = client.completions.create(
                model="eagle3", prompt=p, max_tokens=MAX_TOKENS, temperature=0, stream=True, extra_body={"nvext": {"extra_fields": ["engine_data"]}}
            )
            for ch in s:
                for c in ch.choices:
                    d.text += c.text or ""
                    d.finish = c.finish_reason or d.finish
                st = ((ch.model_extra or {}).get("nvext") or {}).get("engine_data", {}).get("eagle3")
                if st:
                    d.draft, d.accepted = st["draft_tokens"], st["accepted_draft_tokens"]
        except openai.APIError as e:
            d.error = f"{type(e).__name__}: {e}"
        d.t_end = time.monotonic()
        done.append(d)
        if d.error:
            return


@pytest.mark.needs("dynamo", "openai")
def test_deploy_dynamo_replaces_workers_without_dropping_a_request(fp8_bundle, k5_bundle, tmp_path):
    from eagle3_trt.dynamo_serving.launcher import Deployment

    want = {3: _expected(fp8_bundle), 5: _expected(k5_bundle)}
    assert {w[2] for w in want[3].values()} != {w[2] for w in want[5].values()}, "K=3 and K=5 must be told apart"
    state = tmp_path / "state"
    dep, _ = serve_dynamo(fp8_bundle, state)
    old_pids = {w.pid for w in dep.workers}
    stop = threading.Event()
    done: list[Done] = []
    threads = [threading.Thread(target=_client, args=(dep.url, i, stop, done), daemon=True) for i in range(CLIENTS)]
    t_deploy = t_deployed = t_rollback = t_rolled = 0.0
    try:
        for t in threads:
            t.start()
        _until(lambda: len(done) >= CLIENTS, 120, "the clients got no answers before the deploy")
        t_deploy = time.monotonic()
        r = _cli("deploy-dynamo", str(k5_bundle), "--state-dir", str(state))
        t_deployed = time.monotonic()
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.count("drained and stopped") == 2, r.stdout
        mid = Deployment.load(state)
        assert mid is not None and mid.bundle == str(k5_bundle.resolve()) and not old_pids & {w.pid for w in mid.workers}
        _until(lambda: sum(d.t_send > t_deployed for d in done) >= CLIENTS, 120, "no answers after the deploy")
        t_rollback = time.monotonic()
        r = _cli("deploy-dynamo", "--rollback", "--state-dir", str(state))
        t_rolled = time.monotonic()
        assert r.returncode == 0, r.stdout + r.stderr
        _until(lambda: sum(d.t_send > t_rolled for d in done) >= CLIENTS, 120, "no answers after the rollback")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=150)
        r = _cli("stop-dynamo", "--state-dir", str(state))
        print(f"deploy {t_deployed - t_deploy:.1f} s, rollback {t_rolled - t_rollback:.1f} s, {len(done)} requests")
    assert r.returncode == 0, r.stdout + r.stderr

    assert not [d.error for d in done if d.error], "a request failed"
    k_of = {}
    for d in done:
        k = next((k for k in (3, 5) if want[k][d.prompt][2:] == (d.draft, d.accepted)), None)
        assert k is not None, f"draft counts {d.draft}/{d.accepted} are neither bundle's for {d.prompt!r}"
        assert (d.text, d.finish) == want[k][d.prompt][:2]
        k_of[id(d)] = k
    # before the deploy K=3 served; after it K=5; after the rollback K=3 again
    assert {k_of[id(d)] for d in done if d.t_send < t_deploy} == {3}
    assert {k_of[id(d)] for d in done if t_deployed < d.t_send < t_rollback} == {5}
    assert {k_of[id(d)] for d in done if d.t_send > t_rolled} == {3}


def _commands_named(text: str) -> list[str]:
    """The eagle3-trt commands a hint names (`eagle3-trt CMD ...`)."""
    import re

    return re.findall(r"`eagle3-trt ([a-z-]+)", text)


@pytest.mark.needs("dynamo", "openai")
def test_deploy_dynamo_finishes_the_roll_when_a_worker_dies_during_it(fp8_bundle, k5_bundle, tmp_path):
    """A worker killed while deploy-dynamo replaces another: the roll replaces the dead one too (on
    the new bundle), ends with as many workers as it had, state.json and deploy-history.json agree,
    --rollback works, and every hint names a command that exists."""
    import json
    import os
    import signal
    import subprocess
    import sys

    import openai

    from eagle3_trt.cli import LAZY_COMMANDS
    from eagle3_trt.dynamo_serving.launcher import Deployment
    from eagle3_trt.testing.servers import REPO_ROOT

    state = tmp_path / "state"
    dep, _ = serve_dynamo(fp8_bundle, state)
    try:
        r = _cli("deploy-dynamo", "--rollback", "--state-dir", str(state))
        assert r.returncode != 0 and "Traceback" not in r.stderr
        named = _commands_named(r.stderr)
        assert named and set(named) <= set(LAZY_COMMANDS), r.stderr
        victim = dep.workers[1]
        p = subprocess.Popen(
            [sys.executable, "-m", "eagle3_trt.cli", "deploy-dynamo", str(k5_bundle), "--state-dir", str(state)],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        _until(lambda: (state / "worker-2.log").exists() or p.poll() is not None, 120, "no replacement started")
        os.killpg(victim.pid, signal.SIGKILL)  # dies while worker-0's replacement comes up
        out, err = p.communicate(timeout=400)
        assert p.returncode == 0, out + err
        assert "was dead; replaced" in out and "drained and stopped" in out, out
        mid = Deployment.load(state)
        assert mid is not None and len(mid.workers) == 2 and all(w.alive() for w in mid.workers)
        assert {w.bundle for w in mid.workers} == {str(k5_bundle.resolve())} == {mid.bundle}
        hist = json.loads((state / "deploy-history.json").read_text())["bundles"]
        assert hist == [str(fp8_bundle.resolve()), str(k5_bundle.resolve())]
        client = openai.OpenAI(base_url=dep.url, api_key="unused", timeout=120, max_retries=0)
        assert client.completions.create(model="eagle3", prompt=PROMPTS[0], max_tokens=4, temperature=0).choices[0].text
        r = _cli("deploy-dynamo", "--rollback", "--state-dir", str(state))
        assert r.returncode == 0, r.stdout + r.stderr
        back = Deployment.load(state)
        assert back is not None and back.bundle == str(fp8_bundle.resolve()) and {w.bundle for w in back.workers} == {back.bundle}
        assert json.loads((state / "deploy-history.json").read_text())["bundles"] == [back.bundle]
        assert len(back.workers) == 2 and all(w.alive() for w in back.workers)
    finally:
        r = _cli("stop-dynamo", "--state-dir", str(state))
    assert r.returncode == 0, r.stdout + r.stderr
