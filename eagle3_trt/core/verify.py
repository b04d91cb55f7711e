"""Verification of one step's drafted tokens against the target's logits: greedy matching over a tree,
or speculative rejection sampling over a chain (see core/engine.py)."""

from __future__ import annotations

import torch

from eagle3_trt.core.requests import Row
from eagle3_trt.core.sampling import process_logits, sample_token
from eagle3_trt.core.tree import DraftTree


def accept(
    r: Row,
    logits: torch.Tensor,
    node_tok: list[int],
    q_full: list[torch.Tensor | None],
    tree: DraftTree | None,
    k_eff: int,
    greedy: list[int] | None = None,
    match: bool = False,
) -> tuple[list[int], int | None, int]:
    """(accepted node path, bonus token or None when the path ends in a stop token, positions offered).

    ``greedy``: the argmax of every row of ``logits`` (greedy decoding), computed once per step.
    ``match``: sampling verified by matching the target's own samples (TensorRT-LLM's
    allow_advanced_sampling without use_rejection_sampling, see core/spec_sampling.py), not by
    rejection sampling.
    """
    if tree is None or k_eff == 0:
        return [], (greedy[0] if greedy is not None else sample_token(logits[0], r.params, r.gen)), 0
    if r.params.greedy:
        assert greedy is not None  # computed by _step for greedy batches
        return _accept_greedy(r, node_tok, tree, k_eff, greedy)
    if match:
        return _accept_match(r, logits, node_tok, k_eff)
    return _accept_sampled(r, logits, node_tok, q_full, k_eff)


def _accept_match(r: Row, logits: torch.Tensor, node_tok: list[int], k_eff: int) -> tuple[list[int], int | None, int]:
    """Sampling on a chain as TensorRT-LLM's ``_sample_and_accept_draft_tokens_base`` does it: the
    target samples one token per position (temperature / top-k / top-p) and a draft token is
    accepted while it equals that sample; the first differing sample (or the one after the last
    draft token) is emitted. Every emitted token is a target sample given the emitted prefix."""
    path: list[int] = []
    prm = r.params
    for d in range(k_eff + 1):
        p = process_logits(logits[d], prm.temperature, prm.top_k, prm.top_p)  # row d predicts chain node d
        y = int(torch.multinomial(p, 1, generator=r.gen))
        if d == k_eff or node_tok[d] != y:
            return path, y, min(d + 1, k_eff)
        path.append(d)
        if y in r.stop_ids:
            return path, None, len(path)
    raise AssertionError("unreachable: the loop returns at d == k_eff")


def _accept_greedy(r: Row, node_tok: list[int], tree: DraftTree, k_eff: int, greedy: list[int]) -> tuple[list[int], int | None, int]:
    """Walk down the tree while a child holds the target's argmax at its parent."""
    path: list[int] = []
    cur = -1  # root
    while True:
        y = greedy[1 + cur if cur >= 0 else 0]
        nxt = next((c for c in tree.children(cur) if tree.depth[c] <= k_eff and node_tok[c] == y), None)
        if nxt is None:
            return path, y, min(len(path) + 1, k_eff)
        path.append(nxt)
        cur = nxt
        if y in r.stop_ids:
            return path, None, len(path)


def _accept_sampled(r: Row, logits: torch.Tensor, node_tok: list[int], q_full: list[torch.Tensor | None], k_eff: int) -> tuple[list[int], int | None, int]:
    """Sampling on a chain: standard speculative rejection sampling."""
    path: list[int] = []
    prm = r.params
    for d in range(1, k_eff + 1):
        node = d - 1
        p = process_logits(logits[node], prm.temperature, prm.top_k, prm.top_p)  # row `node` = parent of `node`
        q = q_full[node]
        assert q is not None  # the drafter samples every chain node within k_eff and keeps its distribution
        x = node_tok[node]
        u = float(torch.rand((), generator=r.gen, device=p.device))
        if float(q[x]) > 0 and u * float(q[x]) < float(p[x]):
            path.append(node)
            if x in r.stop_ids:
                return path, None, len(path)
            continue
        resid = (p - q).clamp(min=0)
        tot = float(resid.sum())
        dist = resid / tot if tot > 0 else p
        return path, int(torch.multinomial(dist, 1, generator=r.gen)), d
    p = process_logits(logits[k_eff], prm.temperature, prm.top_k, prm.top_p)
    return path, int(torch.multinomial(p, 1, generator=r.gen)), k_eff
