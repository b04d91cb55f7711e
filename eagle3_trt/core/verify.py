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
    tree_valid: bool = True,
) -> tuple[list[int], int | None, int]:
    """(accepted node path, bonus token or None when the path ends in a stop token, positions offered).

    ``greedy``: the argmax of every row of ``logits`` (greedy decoding), computed once per step.
    ``match``: sampling verified by walking the drafts with the target's own samples (TensorRT-LLM's
    allow_advanced_sampling without use_rejection_sampling, see core/spec_sampling.py; and its
    dynamic tree), not by rejection sampling against a draft distribution.
    ``tree_valid`` False: TensorRT-LLM holds no tree for the row (a dynamic tree on the request's
    first decode): only the target's token at the root is emitted.
    """
    if tree is None or k_eff == 0:
        return [], _target_token(r, logits, 0, greedy), 0
    if not tree_valid:
        # verifyDynamicTreeGreedyKernel / verifyDynamicTreeRejectionKernel with treeValid false
        # (dynamicTreeKernels.cu @84e55f93; search-index id 56989014770): the root's token alone
        return [], _target_token(r, logits, 0, greedy), min(1, k_eff)
    if r.params.greedy:
        assert greedy is not None  # computed by _step for greedy batches
        return _walk(r, logits, node_tok, tree, k_eff, greedy)
    if match:
        return _walk(r, logits, node_tok, tree, k_eff, None)
    return _accept_sampled(r, logits, node_tok, q_full, k_eff)


def _target_token(r: Row, logits: torch.Tensor, row: int, greedy: list[int] | None) -> int:
    """The target's token at ``logits[row]``: its argmax (greedy) or a sample with the request's
    temperature / top-k / top-p."""
    if greedy is not None:
        return greedy[row]
    return sample_token(logits[row], r.params, r.gen)


def _walk(r: Row, logits: torch.Tensor, node_tok: list[int], tree: DraftTree, k_eff: int, greedy: list[int] | None) -> tuple[list[int], int | None, int]:
    """Walk down the tree while a child holds the target's token at its parent (its argmax, or one
    sample per visited node), then emit the target's token at the last accepted node.

    Greedy: ``verifyDynamicTreeGreedyKernel`` (children in node order). Sampled, on a chain:
    TensorRT-LLM's ``_sample_and_accept_draft_tokens_base`` (accept while the draft equals the
    target's sample). Sampled, on a dynamic tree: both of TensorRT-LLM's paths give this walk's
    distribution: without rejection sampling it samples the target at every node and runs the
    greedy kernel on the samples (``_sample_and_accept_dynamic_tree``, eagle3_dynamic_tree.py
    @057c8a65); with it, the target-only ``verifyDynamicTreeRejectionKernel`` accepts the first
    sibling whose cumulative target probability passes one uniform draw and otherwise samples the
    target with the tried siblings removed: the emitted token is a target sample either way, and a
    child is accepted exactly when that sample is its token (sibling tokens are distinct top-K).
    """
    path: list[int] = []
    cur = -1  # root
    while True:
        y = _target_token(r, logits, 1 + cur if cur >= 0 else 0, greedy)
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
