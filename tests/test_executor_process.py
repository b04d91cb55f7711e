"""Issue 32: ``ReferenceLLM`` runs its engine in a worker process, as TensorRT-LLM's executor runs a
single GPU's model (``GenerationExecutorProxy``, tensorrt_llm/executor/executor.py @ed53795b), unless
``TLLM_WORKER_USE_SINGLE_PROCESS=1`` keeps it on a thread of the caller's process.

Real runtime, real worker process, real asyncio loops on the tiny FP8 bundle."""

from __future__ import annotations

import asyncio
import os
import shutil

import pytest

from eagle3_trt.errors import UserError
from eagle3_trt.runtime.factory import open_llm

PROMPTS = ("Count to five:", "The ocean is", "A hash table")


def _children() -> set[int]:
    """This process's child pids (from /proc: no psutil needed)."""
    me = str(os.getpid())
    out = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me:
                out.add(int(d))
    return out


def _stream_all(llm, prompts, sp):
    async def one(ids):
        steps = []
        async for out in llm.generate_async(ids, sp, streaming=True):
            steps.append((list(out.outputs[0].token_ids), out.outputs[0].text, out.outputs[0].finish_reason))
        return steps

    async def main():
        return await asyncio.gather(*(one(p) for p in prompts))

    return asyncio.run(main())


@pytest.fixture(scope="module")
def pair(fp8_bundle):
    before = _children()
    proc = open_llm(fp8_bundle, "reference", device="cpu", torch_threads=1)
    thread = open_llm(fp8_bundle, "reference", device="cpu", torch_threads=1, single_process=True)
    yield proc, thread, before
    proc.shutdown()
    thread.shutdown()


def test_worker_is_a_separate_process_and_streams_the_same_tokens(pair):
    proc, thread, before = pair
    assert thread.worker_pid is None
    assert proc.worker_pid is not None and proc.worker_pid != os.getpid()
    assert proc.worker_pid in _children() - before
    prompts = [proc.tokenizer.encode(t) for t in PROMPTS]
    for sp in (
        proc.sampling_params_cls(max_tokens=14, top_k=1, return_perf_metrics=True),
        proc.sampling_params_cls(max_tokens=14, top_k=1, stop=" the", eagle3_speculative=False),
        proc.sampling_params_cls(max_tokens=14, temperature=0.8, seed=7),
    ):
        got, want = _stream_all(proc, prompts, sp), _stream_all(thread, prompts, sp)
        assert got == want  # every streamed step: tokens, text and finish reason
        assert all(s[-1][2] is not None for s in got)
    # perf metrics cross the process boundary intact
    a = proc.generate_async(prompts[0], proc.sampling_params_cls(max_tokens=10, top_k=1)).result(timeout=120).outputs[0]
    b = thread.generate_async(prompts[0], thread.sampling_params_cls(max_tokens=10, top_k=1)).result(timeout=120).outputs[0]
    pa, pb = a.request_perf_metrics, b.request_perf_metrics
    assert pa.speculative_decoding == pb.speculative_decoding and pa.eagle3_target_forwards == pb.eagle3_target_forwards
    assert pa.timing_metrics.arrival_time <= pa.timing_metrics.first_token_time <= pa.timing_metrics.last_token_time
    state = proc.speculation_state()
    assert state is not None and state["iterations"] > 0 and set(state) == set(thread.speculation_state())


def test_abort_ends_the_stream_in_the_worker(pair):
    proc, _, _ = pair
    ids = proc.tokenizer.encode(PROMPTS[0])

    async def main():
        out = proc.generate_async(ids, proc.sampling_params_cls(max_tokens=400, top_k=1), streaming=True)
        n = 0
        async for o in out:
            n += 1
            if n == 2:
                o.abort()
        return out

    out = asyncio.run(main())
    assert out.finished and out.outputs[0].finish_reason == "cancelled"
    assert len(out.outputs[0].token_ids) < 400


def test_bad_bundle_is_refused_in_the_parent_in_one_line(fp8_bundle, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(fp8_bundle, bad)
    weights = sorted((bad / "target").glob("*.safetensors"))
    assert weights
    for w in weights:
        w.unlink()
    before = _children()
    with pytest.raises(Exception) as thread_err:
        open_llm(bad, "reference", device="cpu", torch_threads=1, single_process=True)
    with pytest.raises(Exception) as proc_err:
        open_llm(bad, "reference", device="cpu", torch_threads=1)
    assert isinstance(proc_err.value, UserError) and type(proc_err.value) is type(thread_err.value)
    assert str(proc_err.value) == str(thread_err.value) and "\n" not in str(proc_err.value)
    assert "Traceback" not in str(proc_err.value)
    assert _children() - before == set()  # the worker that failed is reaped


def test_bad_manifest_is_a_user_error_before_any_process(tmp_path):
    (tmp_path / "empty").mkdir()
    before = _children()
    with pytest.raises(UserError):
        open_llm(tmp_path / "empty", "reference", device="cpu")
    assert _children() - before == set()


def test_dead_worker_fails_requests_and_refuses_new_ones(fp8_bundle):
    llm = open_llm(fp8_bundle, "reference", device="cpu", torch_threads=1)
    ids = llm.tokenizer.encode(PROMPTS[1])

    async def main():
        out = llm.generate_async(ids, llm.sampling_params_cls(max_tokens=2000, top_k=1), streaming=True)
        async for _ in out:
            os.kill(llm.worker_pid, 9)  # mid-request

    with pytest.raises(RuntimeError, match="exited"):
        asyncio.run(main())
    with pytest.raises(RuntimeError, match="exited"):
        llm.generate_async(ids, llm.sampling_params_cls(max_tokens=4))
    llm.shutdown()
    assert llm.worker_pid not in _children()


def test_shutdown_leaves_no_child_and_the_env_switch_keeps_the_thread(fp8_bundle, monkeypatch):
    before = _children()
    llm = open_llm(fp8_bundle, "reference", device="cpu", torch_threads=1)
    assert llm.worker_pid in _children()
    llm.shutdown()
    assert _children() - before == set()
    monkeypatch.setenv("TLLM_WORKER_USE_SINGLE_PROCESS", "1")
    t = open_llm(fp8_bundle, "reference", device="cpu", torch_threads=1)
    try:
        assert t.worker_pid is None and _children() - before == set()
    finally:
        t.shutdown()


_SIGTERM_SCRIPT = r"""
import asyncio, signal, sys
from eagle3_trt.runtime.factory import open_llm

got = []
signal.signal(signal.SIGTERM, lambda *a: got.append(1))  # a server draining on SIGTERM (Dynamo's worker)
llm = open_llm(sys.argv[1], "reference", device="cpu", torch_threads=1)
print("worker", llm.worker_pid, flush=True)

async def main():
    n = 0
    async for out in llm.generate_async(llm.tokenizer.encode("The ocean is"), llm.sampling_params_cls(max_tokens=48, top_k=1), streaming=True):
        if n == 0:
            print("streaming", flush=True)
            while not got:  # the group's SIGTERM arrives mid-request
                await asyncio.sleep(0.05)
        n += 1
    return out.outputs[0]

c = asyncio.run(main())
print("finished", c.finish_reason, len(c.token_ids), flush=True)
sys.stdin.readline()  # then killed with SIGKILL: the worker must follow by itself
"""


def _running(pid: int) -> bool:
    """Alive and not a zombie (an exited child init has not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_sigterm_to_the_group_lets_the_parent_drain_and_the_worker_follows_a_killed_parent(fp8_bundle):
    """`eagle3-trt deploy --dynamo` SIGTERMs a replaced worker's process group and lets it drain: the
    executor worker (in that group) must not die with it and fail the requests in flight. And when
    its parent is SIGKILLed (an orphaned Triton stub ended by `stop`), it exits by itself on EOF."""
    import signal
    import subprocess
    import sys
    import time

    p = subprocess.Popen(
        [sys.executable, "-c", _SIGTERM_SCRIPT, str(fp8_bundle)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    worker = 0
    try:
        worker = int(p.stdout.readline().split()[1])
        assert p.stdout.readline().strip() == "streaming"
        assert os.getpgid(worker) == p.pid  # the worker is in the group the signal reaches
        os.killpg(p.pid, signal.SIGTERM)
        line = p.stdout.readline().split()
        assert line[:2] == ["finished", "length"] and int(line[2]) == 48, line
        assert _running(worker)
        p.kill()
        p.wait(10)
        deadline = time.monotonic() + 15
        while _running(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(worker), "the worker outlived its killed parent"
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
        if worker and _running(worker):
            os.kill(worker, signal.SIGKILL)
