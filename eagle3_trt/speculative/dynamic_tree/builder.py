"""TensorRT-LLM's EAGLE-3 dynamic tree (``use_dynamic_tree``): each row's draft tree is built anew
every step from the draft's own probabilities (the EAGLE-2 algorithm), instead of a fixed shape.

Ground truth (NVIDIA/TensorRT-LLM):
- tensorrt_llm/_torch/speculative/eagle3_dynamic_tree.py @057c8a65 (``Eagle3OneModelDynamicTreeWorker``:
  ``_sample_softmax_topk``, ``_select_topk_draft_tokens``, ``update_draft_tokens_and_scores``,
  ``resampling_final_draft_tokens``, ``_build_mask_and_position``, ``_forward_draft_loop``);
- cpp/tensorrt_llm/kernels/speculativeDecoding/dynamicTreeKernels.cu @84e55f93
  (``buildDynamicTreeKernel``: parents, mask, positions, first-child/next-sibling lists;
  ``verifyDynamicTreeGreedyKernel``: the acceptance walk);
- tensorrt_llm/llmapi/llm_args.py @00043967 (``EagleDecodingConfig.validate_eagle_config``: the ranges);
- docs/source/features/speculative-decoding.md @04c8822c ("Dynamic tree mode is currently not
  supported for models that use sliding window attention or MLA").

The algorithm, with K = dynamic_tree_max_topK, D = max_draft_len, N = max_total_draft_tokens:

1. Layer 0: softmax of the draft's logits at the root (the last accepted token); its top-K tokens
   are the depth-1 candidates, score = their probability. All K are expanded.
2. Layer i = 1..D-1: one draft pass over the K expanded nodes of depth i (token = the node's,
   hidden state = its parent's draft output, position = root + i, attending to the committed
   context, its ancestors among the tree nodes and itself). Each gives its top-K children by
   softmax, score = child probability x parent score (a product of probabilities, not log-probs):
   K x K candidates, all kept in the history; the K best scores among them are the nodes expanded
   at the next layer.
3. History = K + K*K*(D-1) candidates in layer order (within a layer: parent slot, then child
   rank). The N with the best scores are the tree, ordered by history index (so depth-major and
   every parent before its children: a child's score never exceeds its parent's).
4. Verification: one target forward over [root, the N nodes]; node positions = root + depth; each
   node attends to the context, the root, its ancestors and itself. Greedy walk: from the root,
   among the current node's children in node order accept the first whose token is the target's
   argmax at the current node; stop when none matches; the bonus token is the argmax at the last
   accepted node.

Ties: torch.topk leaves their order unspecified; here the earlier history index wins (a stable
sort), which also guarantees every chosen node's parent is chosen. TensorRT-LLM's dynamic tree also
refuses ``sa_config`` and relaxed acceptance (eagle3_dynamic_tree.py ``__init__``).

5. Trees are built and stored for generation rows only (``build_dynamic_tree(...[num_contexts:
   batch_size])``, ``scatter_to_slot_storage(gen_slots)``; a freed slot is ``mark_invalid``,
   spec_tree_manager.py search-index id 57752493241): on a request's first decode after its
   prefill ``has_tree`` is false and the verify kernels emit the root's token alone
   (``treeValid``). So topK = 1 is not the chain: its first decode accepts nothing.
6. Temperature > 0: the draft side is unchanged (top-K of the draft's softmax, no temperature);
   the target is sampled along the tree (core/verify.py ``_walk``), which is what both of
   TensorRT-LLM's sampled paths draw (``_sample_and_accept_dynamic_tree`` and the target-only
   ``verifyDynamicTreeRejectionKernel``, search-index id 56989014770).
"""

from __future__ import annotations

import torch

from eagle3_trt.core.tree import DraftTree
from eagle3_trt.speculative.dynamic_tree.rules import DynamicTreeConfig, check_dynamic_tree, check_target, dynamic_tree_refusal

__all__ = ["DynamicTreeBuilder", "DynamicTreeConfig", "check_dynamic_tree", "check_target", "dynamic_tree_refusal", "tree_from_parents"]


def _best(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest scores per row, best first; ties go to the smaller index."""
    return torch.sort(-scores, dim=-1, stable=True).indices[:, :k]


class DynamicTreeBuilder:
    """One step's trees for a batch, built layer by layer from the draft's probabilities.

    ``first(p)`` with the root's probabilities [B, V] returns the K depth-1 tokens (all expanded);
    ``next(p)`` with the probabilities of the K expanded nodes [B, K, V] returns the K tokens
    expanded at the next depth and, per token, the slot (0..K-1) of its parent among the nodes just
    run; ``trees(N)`` picks the N best candidates of the history and returns, per row, the tree
    (a DraftTree whose node order is TensorRT-LLM's) and its draft token ids.
    Tokens are ids of the probabilities' vocabulary (the draft's; the caller maps them through d2t).
    """

    def __init__(self, topk: int, batch: int) -> None:
        self.K, self.B = topk, batch
        self.tokens: list[torch.Tensor] = []  # per layer [B, K] (layer 0) or [B, K*K]
        self.scores: list[torch.Tensor] = []
        self.expanded: list[torch.Tensor] = []  # per layer: history indices [B, K] of the nodes run at the next layer
        self._prev_scores: torch.Tensor | None = None

    @property
    def history_size(self) -> int:
        return sum(t.shape[1] for t in self.tokens)

    def first(self, probs: torch.Tensor) -> torch.Tensor:
        assert not self.tokens, "first() starts a step"
        top = _best(probs.float(), self.K)
        sc = torch.gather(probs.float(), 1, top)
        self.tokens.append(top)
        self.scores.append(sc)
        self.expanded.append(torch.arange(self.K).expand(self.B, -1).clone())
        self._prev_scores = sc
        return top

    def next(self, probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        assert self._prev_scores is not None, "first() comes first"
        K, B = self.K, self.B
        p = probs.float()
        child = _best(p.reshape(B * K, -1), K).reshape(B, K, K)  # per expanded slot, its top-K children
        child_p = torch.gather(p, 2, child)
        tok = child.reshape(B, K * K)
        sc = (child_p * self._prev_scores[:, :, None]).reshape(B, K * K)
        offset = self.history_size
        self.tokens.append(tok)
        self.scores.append(sc)
        sel = _best(sc, K)
        self.expanded.append(offset + sel)
        self._prev_scores = torch.gather(sc, 1, sel)
        return torch.gather(tok, 1, sel), sel // K

    def parent_of(self, b: int, h: int) -> int:
        """History index of candidate ``h``'s parent (-1: the root)."""
        K = self.K
        if h < K:
            return -1
        layer, j = divmod(h - K, K * K)
        return int(self.expanded[layer][b, j // K])

    def trees(self, n: int) -> list[tuple[DraftTree, list[int]]]:
        toks, scores = torch.cat(self.tokens, dim=1), torch.cat(self.scores, dim=1)
        if not 1 <= n <= toks.shape[1]:
            raise ValueError(f"{n} nodes asked of a history of {toks.shape[1]}")
        chosen = torch.sort(_best(scores, n), dim=-1).values
        out = []
        for b in range(self.B):
            hist = [int(h) for h in chosen[b]]
            node_of = {h: i for i, h in enumerate(hist)}
            parent = [node_of[self.parent_of(b, h)] if self.parent_of(b, h) >= 0 else -1 for h in hist]
            out.append((tree_from_parents(parent), [int(toks[b, h]) for h in hist]))
        return out


def tree_from_parents(parent: list[int]) -> DraftTree:
    """A DraftTree in the given node order (parents first): each node's rank is its position among
    its siblings in node order, which is the order TensorRT-LLM's verification walks them in
    (``buildDynamicTreeKernel`` links children first-to-last by node index)."""
    paths: list[tuple[int, ...]] = []
    depth: list[int] = []
    rank: list[int] = []
    seen: dict[int, int] = {}
    for i, p in enumerate(parent):
        if p >= i:
            raise ValueError(f"node {i}'s parent {p} does not come before it")
        r = seen.get(p, 0)
        seen[p] = r + 1
        rank.append(r)
        paths.append((*paths[p], r) if p >= 0 else (r,))
        depth.append(depth[p] + 1 if p >= 0 else 1)
    return DraftTree(tuple(paths), tuple(parent), tuple(depth), tuple(rank))
