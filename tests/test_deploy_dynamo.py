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

    llm = open_llm(bundle, "reference", device="cpu", torch_threads=1)
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
