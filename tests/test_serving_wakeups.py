"""Issue 32: the GIL hand-offs per decoding step between the runtime's scheduler thread and the serving loop.

* ``ReferenceLLM`` wakes every consumer a scheduler round served with one ``call_soon_threadsafe`` per
  event loop at the round's end (not one per request), and each stream still gets every update, in order.
* The serving loop's selector (``triton_serving/event_loop.py``) skips every other non-blocking poll, so a
  wake-up and the task it resumes run under one hold of the GIL, yet a ready file descriptor is still
  seen while callbacks keep the loop busy, and cross-thread callbacks run.
Real runtime on the tiny bundle and real asyncio loops; the loop subclass only counts calls."""

from __future__ import annotations

import asyncio
import selectors
import socket
import threading

import pytest


class _CountingLoop(asyncio.SelectorEventLoop):
    def __init__(self, selector=None):
        super().__init__(selector)
        self.threadsafe_calls = 0

    def call_soon_threadsafe(self, *args, **kwargs):
        self.threadsafe_calls += 1
        return super().call_soon_threadsafe(*args, **kwargs)


@pytest.fixture(scope="module")
def llm(fp8_bundle):
    from eagle3_trt.runtime.factory import open_llm

    llm = open_llm(fp8_bundle, "reference", device="cpu", torch_threads=1, speculation=False)
    yield llm
    llm.shutdown()


def test_one_wakeup_per_round_for_all_streams(llm):
    prompts = [llm.tokenizer.encode(t) for t in ("Count to five:", "The ocean is", "A hash table", "Clean code")]
    sp = llm.sampling_params_cls(max_tokens=12, top_k=1)
    expected = [list(llm.generate_async(p, sp).result(timeout=120).outputs[0].token_ids) for p in prompts]
    loop = _CountingLoop()
    updates = [0] * len(prompts)

    async def stream(i, ids):
        seen: list[int] = []
        async for out in llm.generate_async(ids, sp, streaming=True):
            updates[i] += 1
            toks = out.outputs[0].token_ids
            assert toks[: len(seen)] == seen  # cumulative: every earlier token kept, in order
            seen = list(toks)
        return seen

    async def main():
        return await asyncio.gather(*(stream(i, p) for i, p in enumerate(prompts)))

    try:
        got = loop.run_until_complete(main())
    finally:
        loop.close()
    assert got == expected
    # speculation off: one token per step, so each stream got one update per token; the four
    # streams share each round's wake-up (a few more when a round found a consumer not yet parked)
    assert sum(updates) >= 4 * 12
    assert loop.threadsafe_calls <= 12 + 4, (loop.threadsafe_calls, updates)


def test_ready_first_selector_polls_every_other_time():
    from eagle3_trt.triton_serving.event_loop import ReadyFirstSelector

    calls: list[float | None] = []

    class Spy(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
        def select(self, timeout=None):
            calls.append(timeout)
            return super().select(timeout)

    class Observed(ReadyFirstSelector, Spy):  # ReadyFirstSelector's super().select is Spy's: the real polls
        pass

    sel = Observed()
    a, b = socket.socketpair()
    try:
        sel.register(a, selectors.EVENT_READ)
        b.send(b"x")
        results = [len(sel.select(0)) for _ in range(6)]
        assert len(sel.select(None)) == 1  # a blocking select always polls
        assert results == [0, 1, 0, 1, 0, 1]  # the ready socket is seen every second non-blocking poll
        assert calls == [0, 0, 0, None]
    finally:
        sel.close()
        a.close()
        b.close()


def test_serving_event_loop_sees_io_while_busy_and_runs_threadsafe_callbacks():
    from eagle3_trt.triton_serving.event_loop import serving_event_loop

    loop = serving_event_loop()
    a, b = socket.socketpair()
    a.setblocking(False)
    seen_at: list[int] = []
    ticks = 0

    async def busy():  # keeps a callback ready on every iteration
        nonlocal ticks
        while not seen_at or len(from_thread) < 1:
            ticks += 1
            await asyncio.sleep(0)
            assert ticks < 1000, "the ready socket was never seen"

    from_thread: list[str] = []
    try:
        loop.add_reader(a, lambda: seen_at.append(ticks) or a.recv(1))
        b.send(b"x")
        t = threading.Thread(target=lambda: loop.call_soon_threadsafe(from_thread.append, "ran"))
        t.start()
        loop.run_until_complete(busy())
        t.join()
    finally:
        loop.remove_reader(a)
        loop.close()
        a.close()
        b.close()
    assert seen_at and seen_at[0] <= 2  # seen within two iterations of a busy loop
    assert from_thread == ["ran"]
