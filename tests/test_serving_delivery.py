"""How ``LlmServing`` (triton_serving/job.py) touches a request's sink (issue 32): every response,
every cancellation poll and every error comes from the serving loop's one thread, and a sink is
never polled once its final response went out (Triton frees the sender with it: polling it then
crashed tritonserver 2.51), without a lock held across a send. Real runtime (ReferenceLLM on the
tiny bundle); the sink stands in for Triton's response sender and records who called it when."""

from __future__ import annotations

import threading
import time

import pytest


class _RecordingSink:
    def __init__(self, cancel_after: int | None = None):
        self.calls: list[tuple[str, int]] = []  # (what, thread id)
        self.done = threading.Event()
        self.cancel_after = cancel_after  # report the client gone after this many responses

    def emit(self, e):
        self.calls.append(("final" if e.final else "emit", threading.get_ident()))
        if e.final:
            self.done.set()
        time.sleep(0.002)  # a send takes a while: polls due meanwhile must wait for it, not race it

    def fail(self, message, cancelled=False, bad_request=False, unavailable=False):
        self.calls.append(("fail", threading.get_ident()))
        self.done.set()

    def is_cancelled(self):
        self.calls.append(("poll", threading.get_ident()))
        n = sum(1 for c, _ in self.calls if c == "emit")
        return self.cancel_after is not None and n >= self.cancel_after


@pytest.fixture(scope="module")
def serving(fp8_bundle):
    from eagle3_trt.runtime.factory import open_llm
    from eagle3_trt.triton_serving.job import LlmServing

    llm = open_llm(fp8_bundle, "reference", device="cpu", torch_threads=1)
    sv = LlmServing(
        llm,
        max_seq_len=512,
        max_draft_len=3,
        speculation=True,
        default_max_tokens=16,
        cancel_period_ms=1,  # a poll between almost every two responses
        decoupled=True,
        on_done=lambda s: None,
        log=print,
    )
    yield sv
    sv.shutdown()


def test_one_thread_and_no_poll_after_the_final_response(serving):
    from eagle3_trt.runtime.request_contract import ClientRequest
    from eagle3_trt.testing.servers import until
    from eagle3_trt.triton_serving.request_params import GenRequest

    sinks = [_RecordingSink() for _ in range(6)] + [_RecordingSink(cancel_after=2) for _ in range(2)]
    for i, s in enumerate(sinks):
        serving.submit(
            GenRequest(prompt=f"Count to {i + 3}:", sampling=ClientRequest(max_tokens=24), streaming=True, speculative=i % 2 == 0), s, "", time.monotonic_ns()
        )
    assert all(s.done.wait(120) for s in sinks)
    time.sleep(0.1)  # polls that would still come
    threads = {t for s in sinks for _, t in s.calls}
    assert len(threads) == 1 and threading.get_ident() not in threads, threads
    for s in sinks:
        kinds = [c for c, _ in s.calls]
        assert kinds[-1] in ("final", "fail") and kinds.count("final") + kinds.count("fail") == 1, kinds
        assert "poll" in kinds  # the cancellation timer ran while the request was in flight
    for s in sinks[6:]:  # the client went away: the poll that saw it ended the request with an error
        kinds = [c for c, _ in s.calls]
        assert kinds[-1] == "fail" and kinds[-2] == "poll", kinds
    until(lambda: serving.in_flight() == 0, 10, f"{serving.in_flight()} requests still tracked after their final responses")
