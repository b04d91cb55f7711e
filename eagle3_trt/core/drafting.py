"""The drafting half of a speculative step: commit the draft inputs pending since the last step, then
draft the static tree (a chain is a tree) depth by depth. See core/engine.py for the semantics."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

from eagle3_trt.core.draft import Eagle3Draft
from eagle3_trt.core.requests import BatchState, Row
from eagle3_trt.core.sampling import process_logits
from eagle3_trt.core.target import TargetModel
from eagle3_trt.core.tree import DraftTree

_T = TypeVar("_T")


@dataclass
class Drafter:
    """What drafting reads from the engine, taken fresh for each step (``d2t_ids`` changes in place
    during distillation)."""

    draft: Eagle3Draft
    target: TargetModel
    embed: Callable[[torch.Tensor], torch.Tensor]  # SpeculativeEngine.draft_embedding
    d2t_ids: torch.Tensor  # draft id -> target id
    pad_token_id: int
    # TensorRT-LLM with allow_advanced_sampling but not use_rejection_sampling drafts greedily at any
    # temperature (core/spec_sampling.py); verification then matches the target's samples
    greedy_draft: bool = False

    def run(self, rows: list[Row], st: BatchState, tree: DraftTree, k_eff: list[int]) -> tuple[torch.Tensor, list[list[torch.Tensor | None]]]:
        """Commit pending draft inputs (step 1 at every newly accepted position), then draft the tree.

        Returns (node target ids [B, T] on CPU, per row per node the draft distribution over target
        ids for sampling, else None).
        """
        return self.run_with(rows, st, lambda root_h, root_logits: self._draft_tree(rows, st, tree, k_eff, root_h, root_logits))

    def run_with(self, rows: list[Row], st: BatchState, draft_from_root: Callable[[torch.Tensor, torch.Tensor], _T]) -> _T:
        """Commit pending draft inputs, call ``draft_from_root(root hidden, root logits)`` (a method's
        own draft loop over the committed context, e.g. the dynamic tree's), then roll the draft
        cache back to the committed (target-hidden) entries."""
        root_h, root_logits = self._commit_pending(rows, st)
        assert st.d_kv is not None and st.d_valid is not None  # set by _commit_pending
        committed = st.d_valid.shape[1]
        out = draft_from_root(root_h, root_logits)
        st.d_kv = (st.d_kv[0][:, :, :committed], st.d_kv[1][:, :, :committed])
        return out

    def _commit_pending(self, rows: list[Row], st: BatchState) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft pass over every row's pending inputs, appended to the draft cache; returns the
        draft's (hidden state, logits) at each row's last pending position: the tree's root."""
        draft, dev, B = self.draft, self.target.device, len(rows)
        lens = [len(r.pend_tok) if not r.finished else 0 for r in rows]
        m = max(lens)
        A = self.target.hidden_size * len(self.target.aux_layer_ids)
        aux = torch.zeros(B, m, A, dtype=self.target.dtype, device=dev)
        tok = torch.full((B, m), self.pad_token_id, dtype=torch.long)
        pos = torch.zeros(B, m, dtype=torch.long)
        for b, r in enumerate(rows):
            if lens[b]:
                assert r.pend_aux is not None  # pending tokens always come with their aux states
                aux[b, : lens[b]] = r.pend_aux
                tok[b, : lens[b]] = torch.tensor(r.pend_tok)
                pos[b] = r.pend_pos + torch.arange(m)
                r.pend_aux, r.pend_tok = None, []
        qvalid = torch.arange(m)[None] < torch.tensor(lens)[:, None]
        new_allowed = (torch.tril(torch.ones(m, m, dtype=torch.bool))[None] & qvalid[:, None, :]) | torch.eye(m, dtype=torch.bool)[None]
        past_valid = st.d_valid.cpu() if st.d_valid is not None else torch.zeros(B, 0, dtype=torch.bool)
        mask = torch.cat([past_valid[:, None, :].expand(B, m, -1), new_allowed], dim=-1).to(dev)
        h, dlogits, kv = draft(self.embed(tok), draft.fuse(aux), pos.to(dev), past=st.d_kv, mask=mask)
        st.d_kv = kv
        st.d_valid = torch.cat([past_valid, qvalid], dim=1).to(dev)
        last = torch.tensor([max(n - 1, 0) for n in lens])
        bidx = torch.arange(B)
        return h[bidx, last], dlogits[bidx, last]

    def _draft_tree(
        self, rows: list[Row], st: BatchState, tree: DraftTree, k_eff: list[int], root_h: torch.Tensor, root_logits: torch.Tensor
    ) -> tuple[torch.Tensor, list[list[torch.Tensor | None]]]:
        """Tokens of every tree node within max(k_eff), one draft pass per depth over the tree's KV."""
        draft, dev, B = self.draft, self.target.device, len(rows)
        assert st.d_valid is not None  # set by _commit_pending
        T, D = tree.size, max(k_eff)
        node_tok = torch.zeros(B, T, dtype=torch.long)
        q_full: list[list[torch.Tensor | None]] = [[None] * T for _ in range(B)]
        out_h: dict[int, torch.Tensor] = {-1: root_h}
        out_logits: dict[int, torch.Tensor] = {-1: root_logits}
        anc = tree.ancestors()
        temp_nodes: list[int] = []
        temp_kv = None  # draft KV of the tree nodes drafted so far (set after the first depth)
        root_qpos = torch.tensor([len(r.tokens) - 2 for r in rows])  # draft position of the root query
        for depth in range(1, D + 1):
            self._choose_tokens(rows, tree, k_eff, depth, out_logits, node_tok, q_full)
            if depth == D:
                break
            # one draft pass for the nodes of this depth that have children within D
            queries = [i for i in tree.expanded(D) if tree.depth[i] == depth]
            if not queries:
                break
            n = len(queries)
            emb = self.embed(node_tok[:, queries])
            hid = torch.stack([out_h[tree.parent[i]] for i in queries], dim=1)
            qpos = root_qpos[:, None] + depth
            temp_cols = torch.zeros(n, len(temp_nodes) + n, dtype=torch.bool)
            for qi, i in enumerate(queries):
                for ti, j in enumerate(temp_nodes + queries):
                    temp_cols[qi, ti] = bool(anc[i, j])
            mask = torch.cat([st.d_valid.cpu()[:, None, :].expand(B, n, -1), temp_cols[None].expand(B, -1, -1)], dim=-1)
            hq, lq, kv = draft(emb, hid, qpos.expand(B, n).to(dev), past=st.d_kv if not temp_nodes else temp_kv, mask=mask.to(dev))
            temp_kv = kv
            temp_nodes.extend(queries)
            for qi, i in enumerate(queries):
                out_h[i], out_logits[i] = hq[:, qi], lq[:, qi]
        return node_tok, q_full

    def _choose_tokens(
        self,
        rows: list[Row],
        tree: DraftTree,
        k_eff: list[int],
        depth: int,
        out_logits: dict[int, torch.Tensor],
        node_tok: torch.Tensor,
        q_full: list[list[torch.Tensor | None]],
    ) -> None:
        """Choose the tokens of this depth's nodes from their parents' draft logits (greedy: the
        parent's top ranks; sampling, on a chain: one sample per row, its distribution kept)."""
        prm = rows[0].params
        T = tree.size
        for parent in sorted({tree.parent[i] for i in range(T) if tree.depth[i] == depth}):
            kids = tree.children(parent)
            lg = out_logits[parent]
            if prm.greedy or self.greedy_draft:
                top = torch.topk(lg, tree.max_rank_after(parent), dim=-1).indices
                for c in kids:
                    node_tok[:, c] = self.d2t_ids[top[:, tree.rank[c]]].cpu()
            else:
                (c,) = kids
                for b, r in enumerate(rows):
                    if r.finished or depth > k_eff[b]:
                        continue
                    qd = process_logits(lg[b], prm.temperature, prm.top_k, prm.top_p)
                    did = int(torch.multinomial(qd, 1, generator=r.gen))
                    node_tok[b, c] = int(self.d2t_ids[did])
                    qf = torch.zeros(self.target.vocab_size, device=self.target.device)
                    qf[self.d2t_ids] = qd
                    q_full[b][c] = qf
