"""Issue 32: the GIL hand-offs per decoding step between the runtime's scheduler thread and the serving loop.

* ``ReferenceLLM`` wakes every consumer a scheduler round served with one ``call_soon_threadsafe`` per
  event loop at the round's end (not one per request), and each stream still gets every update, in order.
Real runtime on the tiny bundle and real asyncio loops; the loop subclass only counts calls."""

from __future__ import annotations

import asyncio

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
    # speculation off: one token per step, so each stream got one update per token (4 x 12); the four
    # streams share each round's wake-up. Rounds: about 12, a few more when the requests reached the
    # scheduler in different rounds; one wake-up per request and step would be about 48.
    assert sum(updates) >= 4 * 12
    assert loop.threadsafe_calls <= 24, (loop.threadsafe_calls, updates)
