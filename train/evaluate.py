"""Held-out acceptance of a draft head, measured by real greedy speculative decoding.

A linear chain of K drafts per iteration, verified by one target pass, exactly like
TensorRT-LLM's one-model EAGLE-3 with greedy sampling: the draft's step 1 runs over every newly
accepted position with the target's aux states (its "real" KV cache); steps 2..K extend a
scratch copy of that cache with their own outputs, which is discarded after verification.
The output equals plain greedy decoding of the target (tests check it), so the figure is the
speed-up the head buys, not an estimate from teacher forcing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import torch

from eagle3_trt.core.draft import Eagle3Draft
from eagle3_trt.train.hidden_states import TargetRunner


@dataclass
class AcceptanceReport:
    max_draft_len: int
    prompts: int
    tokens: int  # generated tokens
    iterations: int  # target verification passes
    acceptance_length: float  # generated tokens per target forward, prefill included (1 = no gain)
    per_step: list[float]  # P(draft k accepted | drafts < k accepted)
    accepted_hist: list[int] = field(default_factory=list)  # iterations by number of accepted drafts

    def to_dict(self) -> dict:
        return asdict(self)


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Temporarily set torch's intra-op threads. Batch-1 decoding on a CPU gains nothing from
    more than one thread, and on a shared machine spinning workers make each tiny GEMM ~1000x
    slower (measured: 12 ms vs 11 us for a 4x64x192 Linear with 2 threads on a busy 2-core box)."""
    old = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


@torch.no_grad()
def speculative_generate(runner: TargetRunner, draft: Eagle3Draft, prompt: list[int], max_new_tokens: int,
                         max_draft_len: int, stop_ids: tuple[int, ...] = ()) -> tuple[list[int], list[int]]:
    """(generated tokens, accepted-draft count per iteration)."""
    from transformers import DynamicCache

    dev = draft.fc.weight.device
    dt = draft.fc.weight.dtype
    embed = runner.embed

    def emb(tokens: list[int]) -> torch.Tensor:
        return embed(torch.tensor([tokens], device=dev)).to(dt)

    cache = DynamicCache()
    p, cache = runner.run(torch.tensor([prompt], device=dev), cache, use_cache=True)
    n = len(prompt)  # positions in the target's cache; `nxt` (the newest token) is not in it yet
    nxt = int(p.logits[0, -1].argmax())
    # draft context: position i sees aux_i and the embedding of token i+1
    h, dlogits, real_kv = draft(emb(list(prompt[1:]) + [nxt]), draft.fuse(p.aux.to(dt)), torch.arange(n, device=dev)[None])
    out: list[int] = [nxt]
    accepted: list[int] = []
    while len(out) < max_new_tokens and nxt not in stop_ids:
        # draft a chain of K tokens; steps 2..K extend a scratch copy of the real cache
        d = int(draft.to_target_ids(dlogits[0, -1].argmax()))
        drafts = [d]
        hid, kv = h[:, -1:], real_kv
        for k in range(1, max_draft_len):
            hid, lg, kv = draft(emb([d]), hid, torch.tensor([[n - 1 + k]], device=dev), past=kv)
            d = int(draft.to_target_ids(lg[0, -1].argmax()))
            drafts.append(d)
        # one target pass over [nxt, d1..dK] verifies all of them
        p, cache = runner.run(torch.tensor([[nxt] + drafts], device=dev), cache, use_cache=True)
        greedy = p.logits[0].argmax(-1).tolist()
        a = 0
        while a < len(drafts) and drafts[a] == greedy[a]:
            a += 1
        accepted.append(a)
        new = drafts[:a] + [greedy[a]]
        cache.crop(n + 1 + a)
        # draft step 1 over the positions that just became real: n..n+a
        m = 1 + a
        causal = torch.cat([torch.ones(m, n, dtype=torch.bool, device=dev),
                            torch.ones(m, m, dtype=torch.bool, device=dev).tril()], dim=1)[None]
        h, dlogits, real_kv = draft(emb(new), draft.fuse(p.aux[:, :m].to(dt)),
                                    torch.arange(n, n + m, device=dev)[None], past=real_kv, mask=causal)
        n += 1 + a
        out.extend(new)
        nxt = new[-1]
        if any(t in stop_ids for t in new):
            break
    for i, t in enumerate(out):  # stop where a server would
        if t in stop_ids:
            out = out[: i + 1]
            break
    return out[:max_new_tokens], accepted


def measure_acceptance(runner: TargetRunner, draft: Eagle3Draft, prompts: list[list[int]], max_new_tokens: int,
                       max_draft_len: int, stop_ids: tuple[int, ...] = (),
                       on_prompt: Callable[[int], None] | None = None) -> AcceptanceReport:
    hist = [0] * (max_draft_len + 1)
    tokens = 0
    on_cpu = draft.fc.weight.device.type == "cpu"
    with torch_threads(1 if on_cpu else None):
        for i, pr in enumerate(prompts):
            out, acc = speculative_generate(runner, draft, pr, max_new_tokens, max_draft_len, stop_ids)
            tokens += len(out)
            for a in acc:
                hist[a] += 1
            if on_prompt:
                on_prompt(i + 1)
    iters = sum(hist)
    reached = [sum(hist[j:]) for j in range(max_draft_len + 1)]
    per_step = [reached[k + 1] / reached[k] if reached[k] else 0.0 for k in range(max_draft_len)]
    # generated tokens per target forward, the prefill (which yields the first token) included,
    # as runtime.stats counts it: K = 0 gives exactly 1
    al = tokens / (iters + len(prompts)) if prompts else 1.0
    return AcceptanceReport(max_draft_len=max_draft_len, prompts=len(prompts), tokens=tokens, iterations=iters,
                            acceptance_length=round(al, 4), per_step=[round(x, 4) for x in per_step], accepted_hist=hist)
