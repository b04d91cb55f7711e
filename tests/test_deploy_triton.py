"""`eagle3-trt deploy` against a real tritonserver with 8 streaming gRPC clients running throughout.

Version 1 serves the tiny FP8 bundle (K=3); `deploy` adds the same pair at K=5 as version 2, then
`deploy --rollback` returns to version 1. Greedy output is the target's whatever the head, so each
response is checked against the reference runtime called directly on the bundle of the version
Triton says served it (``model_version`` of the gRPC response): the text, the token count, the
finish reason, and the draft/accepted token counts, which differ between K=3 and K=5.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from eagle3_trt.clients.llm_client import infer_inputs
from eagle3_trt.testing.reference_oracle import direct_generate
from eagle3_trt.testing.servers import run_cli as _cli
from eagle3_trt.testing.servers import serve_triton
from eagle3_trt.testing.servers import until as _until

pytestmark = [pytest.mark.triton, pytest.mark.needs("tritonserver", "tritonclient")]

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers.", "Explain caching."]
CLIENTS = 8  # back to back: requests are in flight when each change begins (asserted below)
MAX_TOKENS = 12


def _expected(bundle: Path, texts: list[str]) -> dict[str, tuple]:
    """prompt -> (text, tokens, finish reason, draft tokens, accepted tokens) from the reference runtime."""
    from eagle3_trt.runtime.loader import engine_from_bundle

    engine = engine_from_bundle(bundle, device="cpu")
    out = {}
    for text in texts:
        got, n, reason, stats = direct_generate(engine, text, MAX_TOKENS)
        out[text] = (got, n, reason, stats.draft_tokens, stats.accepted_tokens)
    return out


@dataclass
class Done:
    prompt: str
    t_send: float
    t_end: float
    versions: set[str]
    text: str
    n_tokens: int
    finish_reason: str | None
    draft: int | None
    accepted: int | None
    error: str | None = None


def _inputs(text: str):
    return infer_inputs(
        [
            ("text_input", np.array([text.encode()], dtype=np.object_), "BYTES"),
            ("streaming", np.array([True]), "BOOL"),
            ("sampling_param_max_tokens", np.array([MAX_TOKENS], dtype=np.int64), "INT64"),
            ("sampling_param_return_perf_metrics", np.array([True]), "BOOL"),
            ("sampling_param_exclude_input_from_output", np.array([True]), "BOOL"),
        ]
    )


def _client(url: str, i: int, texts: list[str], stop: threading.Event, done: list[Done]) -> None:
    """Stream requests back to back on one gRPC stream until ``stop``; every outcome goes to ``done``."""
    import tritonclient.grpc as g

    c = g.InferenceServerClient(url)
    q: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: q.put((result, error)))
    k = i
    try:
        while not stop.is_set():
            text = texts[k % len(texts)]
            k += 1
            d = Done(text, time.monotonic(), 0.0, set(), "", 0, None, None, None)
            c.async_stream_infer("eagle3", _inputs(text), enable_empty_final_response=True)
            while True:
                try:
                    result, error = q.get(timeout=120)
                except queue.Empty:
                    d.error = "no response within 120 s"
                    break
                if error is not None:
                    d.error = str(error)
                    break
                resp = result.get_response()
                d.versions.add(resp.model_version)
                names = {o.name for o in resp.outputs}
                if "text_output" in names:
                    d.text += result.as_numpy("text_output")[0].decode()
                    d.n_tokens += int(result.as_numpy("num_output_tokens")[0])
                if "finish_reason" in names:
                    d.finish_reason = result.as_numpy("finish_reason")[0].decode()
                if "total_draft_tokens" in names:
                    d.draft = int(result.as_numpy("total_draft_tokens")[0])
                    d.accepted = int(result.as_numpy("total_accepted_draft_tokens")[0])
                if resp.parameters["triton_final_response"].bool_param:
                    break
            d.t_end = time.monotonic()
            done.append(d)
            if d.error:
                return
    finally:
        c.stop_stream()
        c.close()


def test_deploy_and_rollback_drop_no_request(fp8_bundle, k5_bundle, tmp_path):
    from eagle3_trt.clients.chat import PromptFormatter
    from eagle3_trt.triton_serving.deploy import version_state

    chat = PromptFormatter(fp8_bundle)
    texts = [chat(p) for p in PROMPTS]
    want = {"1": _expected(fp8_bundle, texts), "2": _expected(k5_bundle, texts)}
    assert {w[3] for w in want["1"].values()} != {w[3] for w in want["2"].values()}, "K=3 and K=5 must be told apart"

    repo, state = tmp_path / "repo", tmp_path / "state"
    r = _cli("package", str(fp8_bundle), "-o", str(repo), "--torch-threads", "1")
    assert r.returncode == 0, r.stderr
    handle, _ = serve_triton(repo, state, "--timeout", "240")
    stop = threading.Event()
    done: list[Done] = []
    threads = [threading.Thread(target=_client, args=(handle.grpc_url, i, texts, stop, done), daemon=True) for i in range(CLIENTS)]
    try:
        for t in threads:
            t.start()
        _until(lambda: len(done) >= CLIENTS, 120, "the clients got no answers before the deploy")
        t_deploy = time.monotonic()
        r = _cli("deploy", str(k5_bundle), "--repo", str(repo), "--state-dir", str(state))
        t_deployed = time.monotonic()
        assert r.returncode == 0, r.stdout + r.stderr
        assert "deployed 'eagle3': version 2" in r.stdout and "version 2 is ready" in r.stdout, r.stdout
        _until(lambda: sum(d.t_send > t_deployed for d in done) >= CLIENTS, 120, "no answers after the deploy")

        t_rollback = time.monotonic()
        r = _cli("deploy", "--rollback", "--repo", str(repo), "--state-dir", str(state))
        t_rolled = time.monotonic()
        assert r.returncode == 0, r.stdout + r.stderr
        assert "rolled back 'eagle3': version 1" in r.stdout, r.stdout
        _until(lambda: sum(d.t_send > t_rolled for d in done) >= CLIENTS, 120, "no answers after the rollback")
        stop.set()
        for t in threads:
            t.join(timeout=150)
        # Triton 2.51 keeps a version loaded while a gRPC stream that sent it a request is open; once closed, it goes
        _until(lambda: version_state(handle, "eagle3", 2) == "unavailable", 60, "version 2 still loaded after its clients left")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=150)
        r = _cli("stop", "--state-dir", str(state))
        print(f"deploy {t_deployed - t_deploy:.1f} s, rollback {t_rolled - t_rollback:.1f} s, {len(done)} requests")
    assert r.returncode == 0 and "stopped" in r.stdout, r.stdout + r.stderr

    assert not [d.error for d in done if d.error], "a request failed"
    for d in done:
        assert len(d.versions) == 1, f"one request, one version: {d.versions}"
        v = next(iter(d.versions))
        text, n, reason, draft, accepted = want[v][d.prompt]
        assert (d.text, d.n_tokens, d.finish_reason) == (text, n, reason), f"version {v}"
        assert (d.draft, d.accepted) == (draft, accepted), f"version {v}: not what its bundle's head drafts"
    served = lambda d: next(iter(d.versions))  # noqa: E731
    # requests sent before the deploy finished on version 1, those sent after it on version 2; the same for the rollback
    assert {served(d) for d in done if d.t_send < t_deploy} == {"1"}
    assert {served(d) for d in done if t_deployed < d.t_send < t_rollback} == {"2"}
    assert {served(d) for d in done if d.t_send > t_rolled} == {"1"}
    # requests were in flight when each change began: they finished, on the version they started on
    assert [d for d in done if d.t_send < t_deploy < d.t_end]
    assert [d for d in done if d.t_send < t_rollback < d.t_end and served(d) == "2"]


ABANDONING_CLIENT = """
import os, queue, sys
import numpy as np
import tritonclient.grpc as g
q = queue.Queue()
c = g.InferenceServerClient(sys.argv[1])
c.start_stream(callback=lambda result, error: q.put((result, error)))
t = g.InferInput("text_input", [1], "BYTES")
t.set_data_from_numpy(np.array([b"Hello there"], dtype=np.object_))
m = g.InferInput("sampling_param_max_tokens", [1], "INT32")  # config.pbtxt declares INT64: tritonserver refuses it
m.set_data_from_numpy(np.array([4], np.int32))
c.async_stream_infer("eagle3", [t, m])
result, error = q.get(timeout=60)
print("refused:", error.message() if error is not None else None, flush=True)
os._exit(0)  # gone without stop_stream()
"""


def _abandon_a_refused_stream(url: str) -> None:
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", ABANDONING_CLIENT, url], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "refused:" in r.stdout and "INT32" in r.stdout, r.stdout + r.stderr


def test_versions_held_by_abandoned_and_idle_streams_are_unloaded(fp8_bundle, k5_bundle, tmp_path):
    """tritonserver 2.51 keeps a stream's first request, and with it the model version, until the
    stream closes; a stream whose request it refused (INT32 where config.pbtxt says INT64) and whose
    client left without stop_stream() never does. deploy, deploy --rollback and stop still leave
    exactly one loaded version, no stub or runtime worker of the one replaced, and stop exits 0."""
    from eagle3_trt.procs import pid_alive
    from eagle3_trt.triton_serving.deploy import version_processes, version_state

    repo, state = tmp_path / "repo", tmp_path / "state"
    assert _cli("package", str(fp8_bundle), "-o", str(repo), "--torch-threads", "1").returncode == 0
    handle, _ = serve_triton(repo, state, "--timeout", "240")
    kept = None
    try:
        import tritonclient.grpc as g

        _abandon_a_refused_stream(handle.grpc_url)
        # and a stream that finished a request and stays open (the other way a stream holds a version)
        q: queue.Queue = queue.Queue()
        kept = g.InferenceServerClient(handle.grpc_url)
        kept.start_stream(callback=lambda result, error: q.put((result, error)))
        kept.async_stream_infer("eagle3", _inputs("Hello"), enable_empty_final_response=True)
        while not (r := q.get(timeout=60))[1] and not r[0].get_response().parameters["triton_final_response"].bool_param:
            pass
        assert r[1] is None, r[1]
        v1_stubs, v1_workers = version_processes(handle, "eagle3", 1)
        assert len(v1_stubs) == 1 and len(v1_workers) == 1

        r = _cli("deploy", str(k5_bundle), "--repo", str(repo), "--state-dir", str(state), "--drain", "1")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "version 1: unloaded" in r.stdout, r.stdout
        assert not any(pid_alive(p) for p in v1_stubs + v1_workers), "version 1's stub or runtime outlived the deploy"
        assert version_state(handle, "eagle3", 2) == "ready" and version_state(handle, "eagle3", 1) != "ready"
        v2_stubs, v2_workers = version_processes(handle, "eagle3", 2)
        assert len(v2_stubs) == 1 and len(v2_workers) == 1

        _abandon_a_refused_stream(handle.grpc_url)  # now version 2 is held the same way
        r = _cli("deploy", "--rollback", "--repo", str(repo), "--state-dir", str(state), "--drain", "1")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "rolled back 'eagle3': version 1" in r.stdout and "version 2: unloaded" in r.stdout, r.stdout
        assert not any(pid_alive(p) for p in v2_stubs + v2_workers), "version 2's stub or runtime outlived the rollback"
        stubs, workers = version_processes(handle, "eagle3", 1)
        assert len(stubs) == 1 and len(workers) == 1 and not set(stubs) & set(v1_stubs), "one fresh copy of version 1, not two"
        assert version_state(handle, "eagle3", 1) == "ready" and version_state(handle, "eagle3", 2) != "ready"
        assert version_processes(handle, "eagle3", 2) == ([], [])

        t0 = time.monotonic()
        r = _cli("stop", "--state-dir", str(state), "--drain", "1")
        took = time.monotonic() - t0
    finally:
        if kept is not None:
            kept.stop_stream()
            kept.close()
        _cli("stop", "--state-dir", str(state))
    assert r.returncode == 0 and "stopped tritonserver" in r.stdout, r.stdout + r.stderr
    assert "lost" not in r.stderr.replace("no request was lost", "") and "killed" not in r.stderr, r.stderr
    assert took < 1 + 20, f"stop took {took:.1f} s"
    from eagle3_trt.procs import cmdline_contains, group_members

    assert group_members(handle.pid) == [] and cmdline_contains(handle.shm_prefix) == []
    assert not list(Path("/dev/shm").glob(handle.shm_prefix + "*"))
    print(f"stop took {took:.1f} s with versions held by an abandoned refused stream and an open one")
