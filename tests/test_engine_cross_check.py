"""Cross-check of the one speculative decoding loop (core.engine) against an independent,
deliberately naive re-derivation of greedy EAGLE-3 chain decoding.

The re-derivation below shares nothing with the engine but the draft module: the target is the
plain Hugging Face model, recomputed over the whole sequence every iteration (no KV cache, no
masks, aux states from ``output_hidden_states``: id i = ``hidden_states[i + 1]``), and the
draft's step 1 is recomputed over the whole accepted prefix every iteration (no cache
rollback). If the engine's cache bookkeeping, masks, positions, draft-input pairing or accept
rule drift, the accept lengths (and usually the tokens) disagree. Run on the embedded trained
pair, so that most drafts are accepted and long accepted runs are covered, not only rejections.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

from eagle3_trt.convert.draft_format import load_draft
from eagle3_trt.convert.embedded import embedded_pair, heldout_prompts
from eagle3_trt.convert.load import load_engine
from eagle3_trt.core.draft import Eagle3Draft
from eagle3_trt.core.engine import SamplingParams
from eagle3_trt.speculative.dynamic_tree.method import DynamicTreeMethod
from eagle3_trt.speculative.sa.method import SuffixAutomatonMethod

K, MAX_NEW = 3, 40


@torch.no_grad()
def naive_chain(hf, draft: Eagle3Draft, aux_ids, prompt: list[int], max_new: int, k: int) -> tuple[list[int], list[int], int]:
    """(generated tokens, accepted drafts per verification, target forwards) of greedy chain
    speculative decoding."""
    emb = hf.get_input_embeddings()

    def target(seq: list[int]):
        out = hf(input_ids=torch.tensor([seq]), output_hidden_states=True, use_cache=False)
        return out.logits[0].argmax(-1).tolist(), torch.cat([out.hidden_states[i + 1] for i in aux_ids], dim=-1)

    seq = list(prompt)  # tokens whose aux states are known (the target has seen them)
    greedy, aux = target(seq)
    nxt = greedy[-1]
    out, accepted, forwards = [nxt], [], 1
    while len(out) < max_new:
        k_eff = min(k, max_new - len(out) - 1)  # the engine drafts no further than the token budget
        forwards += 1
        if k_eff == 0:
            greedy, aux = target(seq + [nxt])
            seq.append(nxt)
            nxt = greedy[-1]
            out.append(nxt)
            continue
        # draft step 1 at every known position p: aux state of p with the embedding of token p+1
        n = len(seq)
        h, lg, kv = draft(emb(torch.tensor([seq[1:] + [nxt]])), draft.fuse(aux), torch.arange(n)[None])
        drafts = [int(draft.to_target_ids(lg[0, -1].argmax()))]
        hid = h[:, -1:]
        for j in range(1, k_eff):  # steps 2..K feed the draft's own hidden state back
            hid, lg, kv = draft(emb(torch.tensor([[drafts[-1]]])), hid, torch.tensor([[n - 1 + j]]), past=kv)
            drafts.append(int(draft.to_target_ids(lg[0, -1].argmax())))
        greedy, aux = target(seq + [nxt] + drafts)
        verify = greedy[n:]  # the target's choice after nxt, after d1, ...
        a = 0
        while a < len(drafts) and drafts[a] == verify[a]:
            a += 1
        accepted.append(a)
        seq += [nxt] + drafts[:a]
        aux = aux[:, : len(seq)]
        nxt = verify[a]
        out += drafts[:a] + [nxt]
    return out[:max_new], accepted, forwards


@pytest.fixture(scope="module")
def pair():
    t, d = embedded_pair("tiny")
    prompts = heldout_prompts(t.parent)
    if not prompts:
        raise AssertionError("every embedded pair ships held-out prompts")
    return t, d, prompts[:3]


def _check(eng, hf, draft, aux_ids, prompts) -> int:
    accepted_total = 0
    for p in prompts:
        res = eng.generate([p], SamplingParams(max_tokens=MAX_NEW))[0]
        toks, acc, forwards = naive_chain(hf, draft, aux_ids, p, MAX_NEW, K)
        hist = [acc.count(a) for a in range(K + 1)]
        assert (res.stats.accept_hist + [0] * (K + 1))[: K + 1] == hist, (res.stats.accept_hist, acc)
        assert res.stats.accepted_tokens == sum(acc)
        assert res.stats.target_forwards == forwards
        assert res.token_ids == toks
        accepted_total += sum(acc)
    return accepted_total


@pytest.fixture(scope="module")
def models(pair):
    t, d, _ = pair
    ck = load_draft(d)
    hf = LlamaForCausalLM.from_pretrained(str(t), dtype=torch.float32).eval()
    return hf, Eagle3Draft.from_checkpoint(ck, torch.float32), tuple(ck.config.aux_layer_ids)


def test_engine_accept_lengths_match_the_naive_chain(pair, models):
    t, d, prompts = pair
    hf, draft, aux = models
    eng = load_engine(t, d, dtype=torch.float32, max_draft_len=K)
    eng.eos_token_ids = ()  # run to the token budget: more iterations to compare
    accepted = _check(eng, hf, draft, aux, prompts)
    assert accepted >= len(prompts) * 5  # long accepted runs were compared, not only rejections


def test_the_cross_check_catches_a_drifted_engine(pair, models):
    """The check can fail: an engine that captures the wrong aux layers (a typical drift, e.g. an
    off-by-one in the layer convention) disagrees with the re-derivation."""
    t, d, prompts = pair
    hf, draft, aux = models
    eng = load_engine(t, d, dtype=torch.float32, max_draft_len=K, aux_layer_ids=[i + 1 for i in aux])
    eng.eos_token_ids = ()
    with pytest.raises(AssertionError):
        _check(eng, hf, draft, aux, prompts)


# ---- the modes: the engine against eagle3_trt/testing/mode_oracle.py (written from TensorRT-LLM's source) ----
@pytest.mark.parametrize(
    "mode,kw",
    [
        ("sa", {"threshold": 2}),
        ("sa", {"threshold": 2, "global_pool": True}),
        ("dynamic-tree", {"topk": 4, "nodes": 8}),
    ],
    ids=["sa", "sa-global-pool", "dynamic-tree"],
)
def test_modes_match_the_oracle(pair, models, mode, kw):
    """Per request: tokens, target forwards and accepted drafts per verification, in one batch (the SA
    draft buffer and the global pool are per batch)."""
    from eagle3_trt.speculative.dynamic_tree.builder import DynamicTreeConfig
    from eagle3_trt.speculative.sa.automaton import SAConfig
    from eagle3_trt.testing.mode_oracle import agreement

    t, d, prompts = pair
    hf, draft, aux = models
    eng = load_engine(t, d, dtype=torch.float32, max_draft_len=K)
    if mode == "sa":
        eng.method = SuffixAutomatonMethod(SAConfig(threshold=kw["threshold"], enable_global_pool=kw.get("global_pool", False)))
    else:
        eng.method = DynamicTreeMethod(DynamicTreeConfig(kw["topk"], kw["nodes"]))
    r = agreement(eng, hf, draft, aux, prompts, mode, 32, **kw)
    assert r["agree"] == r["requests"] == len(prompts), r
