"""The draft loop of TensorRT-LLM's dynamic tree (speculative/dynamic_tree/builder.py): D - 1 draft passes over the
K nodes each row expands per depth, every row with its own tree (per-row ancestor masks).

Follows ``Eagle3OneModelDynamicTreeWorker._forward_draft_loop`` (tensorrt_llm/_torch/speculative/
eagle3_dynamic_tree.py @057c8a65): the expanded nodes of depth i are drafted with their own token,
their parent's draft hidden state and position root + i; a node's mask row is its parent's row
plus itself (``_build_mask_and_position``). TensorRT-LLM re-runs every earlier expanded node at
each layer (a growing context); here their keys and values are kept instead, which gives the same
outputs for the K new queries.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from eagle3_trt.core.draft import Eagle3Draft
from eagle3_trt.core.requests import BatchState, Row
from eagle3_trt.core.tree import DraftTree
from eagle3_trt.speculative.dynamic_tree.builder import DynamicTreeBuilder


def draft_dynamic_tree(
    draft: Eagle3Draft,
    embed: Callable[[torch.Tensor], torch.Tensor],
    d2t_ids: torch.Tensor,
    rows: list[Row],
    st: BatchState,
    topk: int,
    depth: int,
    total: int,
    root_h: torch.Tensor,
    root_logits: torch.Tensor,
) -> tuple[torch.Tensor, list[DraftTree]]:
    """(node target ids [B, total] on CPU, each row's tree). ``st.d_kv`` / ``st.d_valid`` hold the
    committed draft context; the caller rolls the draft cache back afterwards."""
    assert st.d_valid is not None and st.d_kv is not None  # set by Drafter._commit_pending
    B, K, dev = len(rows), topk, root_h.device
    builder = DynamicTreeBuilder(K, B)
    tok = builder.first(torch.softmax(root_logits.float(), dim=-1).cpu())
    hid = root_h[:, None, :].expand(B, K, -1)  # depth-1 nodes: the root's draft output
    anc = torch.eye(K, dtype=torch.bool)[None].expand(B, K, K)  # [B, K queries, tree nodes run so far + K]
    past_valid = st.d_valid.cpu()
    kv = st.d_kv
    root_qpos = torch.tensor([len(r.tokens) - 2 for r in rows])  # draft position of the root query
    for layer in range(1, depth):
        mask = torch.cat([past_valid[:, None, :].expand(B, K, -1), anc], dim=-1).to(dev)
        pos = (root_qpos[:, None] + layer).expand(B, K).to(dev)
        hq, lq, kv = draft(embed(d2t_ids[tok.to(d2t_ids.device)]), hid, pos, past=kv, mask=mask)
        tok, parent_slot = builder.next(torch.softmax(lq.float(), dim=-1).cpu())
        if layer == depth - 1:
            break
        bidx = torch.arange(B)[:, None]
        hid = hq[bidx, parent_slot.to(dev)]
        # the new nodes' rows: their parent's row (over every node run so far) plus themselves
        parent_rows = anc[bidx, parent_slot]
        anc = torch.cat([parent_rows, torch.eye(K, dtype=torch.bool)[None].expand(B, K, K)], dim=-1)
    node_tok = torch.zeros(B, total, dtype=torch.long)
    trees = []
    for b, (tree, ids) in enumerate(builder.trees(total)):
        node_tok[b] = d2t_ids[torch.tensor(ids, device=d2t_ids.device)].cpu()
        trees.append(tree)
    return node_tok, trees
