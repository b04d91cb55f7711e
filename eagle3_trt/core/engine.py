"""Reference EAGLE-3 speculative decoding runtime (PyTorch, CPU or CUDA).

Semantics follow TensorRT-LLM's one-model EAGLE-3 (PyTorch backend):

- The target forward returns the hidden states of the captured aux layers. Draft step 1 runs,
  at every newly accepted position p, on [embedding of token p+1 ; fc(concat of aux states at p)]
  (the embedding is the target's ``embed_tokens`` unless the draft has its own: exactly when its
  target_hidden_size differs from its hidden_size, as in TensorRT-LLM); steps 2..K feed the draft's
  own output back in as the hidden state (pre-norm, or post-norm for ``return_hidden_post_norm``). Draft ids map to target ids
  through ``d2t``.
- Verification is ONE target forward over [last accepted token + drafted tokens] (a chain, or a
  static tree with a tree attention mask). Greedy: a draft token is accepted when it equals the
  target's argmax. Sampling: standard speculative rejection sampling (accept with
  min(1, p/q), on rejection resample from norm(max(0, p - q)), bonus token from p when all are
  accepted), with temperature / top-k / top-p applied to both p and q, so outputs follow the
  target's own sampling distribution exactly.
- KV caches of target and draft roll back rejected positions. Rows of a batch accept different
  numbers of tokens; rejected columns are masked out for the row (and cropped from the tail of
  the cache once no row needs them), which is a rollback without per-row cache surgery.
- ``speculate=False`` is K = 0 through the same loop: the verification block is the last token
  alone, i.e. one target forward per token.

Draft positions: the draft query that pairs the hidden state of position p with token p+1 sits at
position p (the hidden state's position), as in EAGLE's reference code.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from eagle3_trt.core.draft import Eagle3Draft
from eagle3_trt.core.stats import RequestStats
from eagle3_trt.core.target import TargetModel
from eagle3_trt.core.tree import DraftTree, parse_tree
from eagle3_trt.errors import UserError

__all__ = ["RequestResult", "RequestStats", "SamplingParams", "SpeculativeEngine", "StepOutput", "process_logits"]


@dataclass
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()  # the engine adds the tokenizer / generation_config eos ids itself

    def __post_init__(self) -> None:
        if self.max_tokens < 0:
            raise UserError("max_tokens", f"{self.max_tokens} is negative", "ask for 1 or more tokens")
        if self.temperature < 0:
            raise UserError("temperature", f"{self.temperature} is negative", "use 0 for greedy decoding")
        if not 0 < self.top_p <= 1:
            raise UserError("top_p", f"{self.top_p} is outside (0, 1]", "use 1.0 to disable nucleus sampling")
        if self.top_k < 0:
            raise UserError("top_k", f"{self.top_k} is negative", "use 0 to disable top-k")
        self.stop_token_ids = tuple(int(t) for t in self.stop_token_ids)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class StepOutput:
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None  # 'stop' | 'length'
    stats: RequestStats


@dataclass
class RequestResult:
    token_ids: list[int]
    finish_reason: str | None
    stats: RequestStats


def process_logits(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Probabilities after temperature, then top-k, then top-p (the order of HF's warpers)."""
    x = logits.float() / temperature
    if top_k and top_k < x.shape[-1]:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        sx, idx = torch.sort(x, dim=-1, descending=True)
        sp = torch.softmax(sx, dim=-1)
        before = torch.cumsum(sp, dim=-1) - sp  # mass of strictly more likely tokens
        drop = before >= top_p
        drop[..., 0] = False
        x = x.masked_fill(torch.zeros_like(drop).scatter(-1, idx, drop), float("-inf"))
    return torch.softmax(x, dim=-1)


@dataclass
class _Row:
    prompt: list[int]
    params: SamplingParams
    stats: RequestStats
    stop_ids: frozenset[int]
    gen: torch.Generator | None
    tokens: list[int] = field(default_factory=list)  # prompt + emitted
    finished: bool = False
    finish_reason: str | None = None
    root: int = -1  # last emitted token; not yet in the target cache
    # draft inputs not yet run through the draft: aux states of positions pend_pos.., next tokens
    pend_aux: torch.Tensor | None = None
    pend_tok: list[int] = field(default_factory=list)
    pend_pos: int = 0

    @property
    def generated(self) -> int:
        return len(self.tokens) - len(self.prompt)


class SpeculativeEngine:
    def __init__(
        self,
        target: TargetModel,
        draft: Eagle3Draft | None,
        tokenizer: Any = None,
        *,
        max_draft_len: int = 3,
        eos_token_ids: Iterable[int] = (),
        max_seq_len: int | None = None,
        draft_embed: torch.nn.Embedding | None = None,
        pad_token_id: int = 0,
    ) -> None:
        self.target = target
        self.draft = draft
        self.tokenizer = tokenizer
        self.max_draft_len = int(max_draft_len) if draft is not None else 0
        self.eos_token_ids = tuple(dict.fromkeys(int(t) for t in eos_token_ids))
        self.max_seq_len = int(max_seq_len or target.hf.config.max_position_embeddings)
        self.draft_embed = draft_embed
        self.pad_token_id = int(pad_token_id)
        self.device = target.device
        if draft is not None:
            n_aux = draft.fc.in_features // target.hidden_size
            if len(target.aux_layer_ids) != n_aux:
                raise UserError(
                    "aux_layer_ids",
                    f"{len(target.aux_layer_ids)} aux layers captured but the draft's fc fuses {n_aux}",
                    "pass the aux layer ids the draft was trained with",
                )
            self.refresh_draft_vocab()

    def refresh_draft_vocab(self) -> None:
        """Re-read the draft's ``d2t`` (draft id -> target id) after it changed in place (distillation)."""
        d = self.draft
        if d is None:
            raise ValueError("a target-only engine has no draft vocabulary")
        self._d2t_ids = (torch.arange(d.config.draft_vocab_size, device=self.device) + d.d2t.to(self.device)).long()

    # ---- public API -------------------------------------------------------------------------
    def stream(self, prompt_ids: list[int], params: SamplingParams, speculate: bool = True, tree: Any = None) -> Iterator[StepOutput]:
        """Generate for one request, yielding the tokens each target forward produced."""
        for rows, new in self._decode([list(prompt_ids)], params, speculate, tree):
            r = rows[0]
            if new[0] or r.finished:
                yield StepOutput(list(new[0]), r.finished, r.finish_reason, r.stats.snapshot())

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, speculate: bool = True, tree: list[tuple[int, ...]] | None = None
    ) -> list[RequestResult]:
        """Generate for a batch of requests (one shared SamplingParams; request i samples with seed + i)."""
        rows: list[_Row] = []
        for rows, _new in self._decode([list(p) for p in prompts], params, speculate, tree):  # noqa: B007 (the last step's rows)
            pass
        return [RequestResult(r.tokens[len(r.prompt) :], r.finish_reason, r.stats) for r in rows]

    def generate_with_aux(self, prompts: list[list[int]], params: SamplingParams) -> tuple[list[RequestResult], list[torch.Tensor]]:
        """Target-only (K = 0) generation that also returns, per request, the aux hidden states of every
        token fed to the target (prompt + continuation minus the last token): [len - 1, n_aux * H].

        The alpha estimator drafts over these instead of re-running the target teacher-forced.
        """
        sink: dict[int, list[torch.Tensor]] = {}
        rows: list[_Row] = []
        for rows, _new in self._decode([list(p) for p in prompts], params, False, None, aux_sink=sink):  # noqa: B007 (the last step's rows)
            pass
        res = [RequestResult(r.tokens[len(r.prompt) :], r.finish_reason, r.stats) for r in rows]
        A = self.target.hidden_size * len(self.target.aux_layer_ids)
        return res, [torch.cat(sink[b])[: len(r.tokens) - 1] if b in sink else torch.zeros(0, A) for b, r in enumerate(rows)]

    # ---- the decoding loop ------------------------------------------------------------------
    def _tree_for(self, speculate: bool, tree: Any, params: SamplingParams) -> DraftTree | None:
        if not speculate or self.draft is None:
            return None
        t = parse_tree(tree)
        if t is None:
            return DraftTree.chain(self.max_draft_len) if self.max_draft_len > 0 else None
        if not params.greedy and not t.is_chain:
            raise UserError(
                "tree", "tree drafting is implemented for greedy decoding only", "use temperature 0 with a tree, or a chain (tree=None) for sampling"
            )
        if t.max_rank_after(-1) > self.draft.config.draft_vocab_size:
            raise UserError("tree", "a node asks for more candidates than the draft vocabulary has", "use smaller ranks")
        return t

    @torch.inference_mode()  # no autograd state at all: measurably less per-op overhead than no_grad
    def _decode(
        self, prompts: list[list[int]], params: SamplingParams, speculate: bool, tree_spec: Any, aux_sink: dict[int, list[torch.Tensor]] | None = None
    ) -> Iterator[tuple[list[_Row], list[list[int]]]]:
        tree = self._tree_for(speculate, tree_spec, params)
        if not prompts:
            return
        now = time.time_ns()
        stop = frozenset(self.eos_token_ids) | frozenset(params.stop_token_ids)
        base_seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(6), "little")
        rows = []
        for i, p in enumerate(prompts):
            if not p:
                raise UserError("prompt", f"request {i} has no tokens", "send at least one prompt token")
            if len(p) >= self.max_seq_len:
                raise UserError(
                    "prompt", f"request {i} has {len(p)} tokens; max_seq_len is {self.max_seq_len}", "shorten the prompt or rebuild with a larger max_seq_len"
                )
            bad = [t for t in p if not 0 <= t < self.target.vocab_size]
            if bad:
                raise UserError("prompt", f"request {i} has token ids outside the vocabulary: {bad[:3]}", "tokenize with the bundle's tokenizer")
            gen = None
            if not params.greedy:
                gen = torch.Generator(device=self.device)
                gen.manual_seed(base_seed + i)
            rows.append(
                _Row(
                    prompt=list(p), params=params, stats=RequestStats(arrival_time_ns=now, speculation=tree is not None), stop_ids=stop, gen=gen, tokens=list(p)
                )
            )
        if params.max_tokens == 0:
            for r in rows:
                r.finished, r.finish_reason = True, "length"
            yield rows, [[] for _ in rows]
            return

        st = _BatchState(self.target.new_cache())
        st.aux_sink = aux_sink
        yield rows, self._prefill(rows, st, keep_draft_inputs=tree is not None)
        while not all(r.finished for r in rows):
            yield rows, self._step(rows, st, tree)

    def _prefill(self, rows: list[_Row], st: _BatchState, keep_draft_inputs: bool) -> list[list[int]]:
        B, S = len(rows), max(len(r.prompt) for r in rows)
        ids = torch.full((B, S), self.pad_token_id, dtype=torch.long)
        valid = torch.zeros(B, S, dtype=torch.bool)
        for b, r in enumerate(rows):
            ids[b, S - len(r.prompt) :] = torch.tensor(r.prompt)
            valid[b, S - len(r.prompt) :] = True
        pos = (valid.cumsum(-1) - 1).clamp(min=0)
        allowed = torch.tril(torch.ones(S, S, dtype=torch.bool))[None] & valid[:, None, :]
        allowed |= torch.eye(S, dtype=torch.bool)[None]  # padding queries attend to themselves (no empty rows)
        logits, aux = self.target.forward(ids, pos, allowed, st.cache, logits_at=torch.full((B, 1), S - 1))
        st.t_valid = valid.to(self.device)
        new = []
        for b, r in enumerate(rows):
            tok = self._sample(logits[b, 0], r)
            r.stats.target_forwards += 1
            if st.aux_sink is not None:
                st.aux_sink[b] = [aux[b, S - len(r.prompt) :]]
            if keep_draft_inputs:
                n = len(r.prompt)
                r.pend_aux = aux[b, S - n :]
                r.pend_tok = r.prompt[1:] + [tok]
                r.pend_pos = 0
            new.append(self._emit(r, [tok]))
        return new

    def _sample(self, logits: torch.Tensor, r: _Row) -> int:
        if r.params.greedy:
            return int(torch.argmax(logits))
        p = process_logits(logits, r.params.temperature, r.params.top_k, r.params.top_p)
        return int(torch.multinomial(p, 1, generator=r.gen))

    def _emit(self, r: _Row, toks: list[int]) -> list[int]:
        """Append tokens (truncated at the first stop token), update times and finish state."""
        out = []
        for t in toks:
            out.append(t)
            if t in r.stop_ids:
                r.finished, r.finish_reason = True, "stop"
                break
        r.tokens.extend(out)
        r.stats.generated_tokens += len(out)
        t = time.time_ns()
        if out:
            if not r.stats.first_token_time_ns:
                r.stats.first_token_time_ns = t
            r.stats.last_token_time_ns = t
        if not r.finished and (r.generated >= r.params.max_tokens or len(r.tokens) >= self.max_seq_len):
            r.finished, r.finish_reason = True, "length"
        if out:
            r.root = out[-1]
        if r.finished:
            r.pend_aux, r.pend_tok = None, []
        return out

    def _k_eff(self, r: _Row, tree: DraftTree | None) -> int:
        if tree is None or r.finished:
            return 0
        return max(0, min(tree.max_depth, r.params.max_tokens - r.generated - 1, self.max_seq_len - len(r.tokens) - 1))

    def _step(self, rows: list[_Row], st: _BatchState, tree: DraftTree | None) -> list[list[int]]:
        B, dev = len(rows), self.device
        active = [not r.finished for r in rows]
        k_eff = [self._k_eff(r, tree) for r in rows]
        T = tree.size if tree is not None and max(k_eff) > 0 else 0
        drafted = tree if T else None  # the tree of this step's draft tokens, None when none are drafted
        node_tok = torch.zeros(B, T, dtype=torch.long)
        q_full: list[list[torch.Tensor | None]] = [[None] * T for _ in range(B)]
        if drafted is not None:
            node_tok, q_full = self._draft(rows, st, drafted, k_eff)

        # Verification: one target forward over [root, tree nodes].
        root_pos = torch.tensor([len(r.tokens) - 1 for r in rows])
        ids = torch.cat([torch.tensor([[r.root if not r.finished else self.pad_token_id] for r in rows]), node_tok], dim=1)
        depth = torch.tensor([0] + (list(drafted.depth) if drafted is not None else []))
        pos = root_pos[:, None] + depth[None]
        enabled = torch.zeros(B, 1 + T, dtype=torch.bool)
        for b in range(B):
            if active[b]:
                enabled[b] = depth <= k_eff[b]
        anc = torch.eye(1 + T, dtype=torch.bool)
        anc[:, 0] = True
        if drafted is not None:
            anc[1:, 1:] = drafted.ancestors()
        new_allowed = (anc[None] & enabled[:, None, :] & enabled[:, :, None]) | torch.eye(1 + T, dtype=torch.bool)[None]
        assert st.t_valid is not None  # set by _prefill
        past = st.t_valid.cpu()[:, None, :].expand(B, 1 + T, -1) & enabled[:, :, None]
        logits, aux = self.target.forward(ids, pos, torch.cat([past, new_allowed], dim=-1), st.cache)

        new_valid = torch.zeros(B, 1 + T, dtype=torch.bool)
        greedy = logits.argmax(-1).tolist() if rows[0].params.greedy else None  # one call for all rows and nodes
        out: list[list[int]] = []
        for b, r in enumerate(rows):
            if not active[b]:
                out.append([])
                continue
            r.stats.target_forwards += 1
            if st.aux_sink is not None:
                st.aux_sink[b].append(aux[b, :1])
            path, bonus, reached = self._accept(r, logits[b], node_tok[b].tolist(), q_full[b], drafted, k_eff[b], greedy[b] if greedy is not None else None)
            accepted = len(path)
            new_valid[b, 0] = True
            for n in path:
                new_valid[b, 1 + n] = True
            toks = [int(node_tok[b, n]) for n in path] + ([bonus] if bonus is not None else [])
            if tree is not None and k_eff[b] > 0:
                r.stats.record_iteration(k_eff[b], reached, accepted)
            cols = [0] + [1 + n for n in path]
            if tree is not None:
                # append: inputs not yet committed (no draft pass ran this step) must be kept
                if r.pend_tok:
                    assert r.pend_aux is not None  # pending tokens always come with their aux states
                    r.pend_aux = torch.cat([r.pend_aux, aux[b, cols]])
                else:
                    r.pend_aux, r.pend_pos = aux[b, cols], len(r.tokens) - 1
                r.pend_tok = r.pend_tok + toks
            out.append(self._emit(r, toks))
        st.append_target(new_valid.to(dev))
        return out

    def _accept(
        self,
        r: _Row,
        logits: torch.Tensor,
        node_tok: list[int],
        q_full: list[torch.Tensor | None],
        tree: DraftTree | None,
        k_eff: int,
        greedy: list[int] | None = None,
    ) -> tuple[list[int], int | None, int]:
        """(accepted node path, bonus token or None when the path ends in a stop token, positions offered).

        ``greedy``: the argmax of every row of ``logits`` (greedy decoding), computed once per step.
        """
        path: list[int] = []
        cur = -1  # root
        if tree is None or k_eff == 0:
            return path, (greedy[0] if greedy is not None else self._sample(logits[0], r)), 0
        if r.params.greedy:
            assert greedy is not None  # computed by _step for greedy batches
            while True:
                y = greedy[1 + cur if cur >= 0 else 0]
                nxt = next((c for c in tree.children(cur) if tree.depth[c] <= k_eff and node_tok[c] == y), None)
                if nxt is None:
                    return path, y, min(len(path) + 1, k_eff)
                path.append(nxt)
                cur = nxt
                if y in r.stop_ids:
                    return path, None, len(path)
        # Sampling on a chain: standard speculative rejection sampling.
        prm = r.params
        for d in range(1, k_eff + 1):
            node = d - 1
            p = process_logits(logits[node], prm.temperature, prm.top_k, prm.top_p)  # row `node` = parent of `node`
            q = q_full[node]
            assert q is not None  # _draft samples every chain node within k_eff and keeps its distribution
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

    def draft_embedding(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings the draft reads: its own table when it ships one, else the target's."""
        ids = ids.to(self.device)
        return self.draft_embed(ids) if self.draft_embed is not None else self.target.embed(ids)

    _draft_embed = draft_embedding

    def _draft(self, rows: list[_Row], st: _BatchState, tree: DraftTree, k_eff: list[int]) -> tuple[torch.Tensor, list[list[torch.Tensor | None]]]:
        """Commit pending draft inputs (step 1 at every newly accepted position), then draft the tree.

        Returns (node target ids [B, T] on CPU, per row per node the draft distribution over target
        ids for sampling, else None).
        """
        draft, dev, B = self.draft, self.device, len(rows)
        assert draft is not None  # _tree_for drafts only with a draft
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
        h, dlogits, kv = draft(self._draft_embed(tok), draft.fuse(aux), pos.to(dev), past=st.d_kv, mask=mask)
        st.d_kv = kv
        st.d_valid = torch.cat([past_valid, qvalid], dim=1).to(dev)
        last = torch.tensor([max(n - 1, 0) for n in lens])
        bidx = torch.arange(B)
        root_h, root_logits = h[bidx, last], dlogits[bidx, last]

        T, D = tree.size, max(k_eff)
        node_tok = torch.zeros(B, T, dtype=torch.long)
        q_full: list[list[torch.Tensor | None]] = [[None] * T for _ in range(B)]
        prm = rows[0].params
        out_h: dict[int, torch.Tensor] = {-1: root_h}
        out_logits: dict[int, torch.Tensor] = {-1: root_logits}
        anc = tree.ancestors()
        temp_nodes: list[int] = []
        temp_kv = None  # draft KV of the tree nodes drafted so far (set after the first depth)
        committed = st.d_valid.shape[1]
        root_qpos = torch.tensor([len(r.tokens) - 2 for r in rows])  # draft position of the root query
        for depth in range(1, D + 1):
            # choose the tokens of this depth's nodes from their parents' draft logits
            for parent in sorted({tree.parent[i] for i in range(T) if tree.depth[i] == depth}):
                kids = tree.children(parent)
                lg = out_logits[parent]
                if prm.greedy:
                    top = torch.topk(lg, tree.max_rank_after(parent), dim=-1).indices
                    for c in kids:
                        node_tok[:, c] = self._d2t_ids[top[:, tree.rank[c]]].cpu()
                else:
                    (c,) = kids
                    for b, r in enumerate(rows):
                        if r.finished or depth > k_eff[b]:
                            continue
                        qd = process_logits(lg[b], prm.temperature, prm.top_k, prm.top_p)
                        did = int(torch.multinomial(qd, 1, generator=r.gen))
                        node_tok[b, c] = int(self._d2t_ids[did])
                        qf = torch.zeros(self.target.vocab_size, device=dev)
                        qf[self._d2t_ids] = qd
                        q_full[b][c] = qf
            if depth == D:
                break
            # one draft pass for the nodes of this depth that have children within D
            queries = [i for i in tree.expanded(D) if tree.depth[i] == depth]
            if not queries:
                break
            n = len(queries)
            emb = self._draft_embed(node_tok[:, queries])
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
        # roll the draft cache back to the committed (target-hidden) entries
        st.d_kv = (st.d_kv[0][:, :, :committed], st.d_kv[1][:, :, :committed])
        return node_tok, q_full


class _BatchState:
    """KV caches of one batch: target (HF DynamicCache) and draft (k, v), with per-row column validity."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache
        self.t_valid: torch.Tensor | None = None  # [B, C] bool
        self.d_kv: tuple[torch.Tensor, torch.Tensor] | None = None
        self.d_valid: torch.Tensor | None = None
        self.aux_sink: dict[int, list[torch.Tensor]] | None = None

    def append_target(self, new_valid: torch.Tensor) -> None:
        assert self.t_valid is not None  # set by _prefill
        self.t_valid = torch.cat([self.t_valid, new_valid], dim=1)
        used = self.t_valid.any(dim=0).nonzero()
        keep = int(used.max()) + 1 if used.numel() else 0
        if keep < self.t_valid.shape[1]:
            self.cache.crop(keep)
            self.t_valid = self.t_valid[:, :keep]
