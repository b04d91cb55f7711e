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

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from eagle3_trt.core.draft import Eagle3Draft
from eagle3_trt.core.drafting import Drafter
from eagle3_trt.core.method_api import Drafted, MethodRun, SpeculationMethod
from eagle3_trt.core.requests import BatchState, RequestResult, Row, StepOutput, emit, new_rows
from eagle3_trt.core.sampling import SamplingParams, process_logits, sample_token
from eagle3_trt.core.spec_sampling import REJECTION_SAMPLING, SpecSamplingConfig
from eagle3_trt.core.static_tree_run import StaticTreeRun
from eagle3_trt.core.stats import RequestStats
from eagle3_trt.core.target import TargetModel
from eagle3_trt.core.tree import DraftTree, parse_tree
from eagle3_trt.core.verify import accept
from eagle3_trt.errors import UserError

# the engine's API, imported from here by the runtime, training and tests
__all__ = ["RequestResult", "RequestStats", "SamplingParams", "SpeculativeEngine", "StepOutput", "process_logits"]


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
        method: SpeculationMethod | None = None,
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
        # the speculation method (core/method_api.py; eagle3_trt/speculative/registry.py builds it from a
        # bundle's options): None is TensorRT-LLM's EAGLE-3 chain, or a static tree when `tree` is given
        self.method: SpeculationMethod | None = method
        # TensorRT-LLM's speculative sampling flags (core/spec_sampling.py): how temperature > 0
        # requests are served while speculating. Default: both flags on (exact rejection sampling);
        # a bundle's options set TensorRT-LLM's own defaults when they name none (runtime/loader.py)
        self.sampling: SpecSamplingConfig = REJECTION_SAMPLING
        if draft is not None:
            n_aux = draft.fc.in_features // target.hidden_size
            if len(target.aux_layer_ids) != n_aux:
                raise UserError(
                    "aux_layer_ids",
                    f"{len(target.aux_layer_ids)} aux layers captured but the draft's fc fuses {n_aux}",
                    "pass the aux layer ids the draft was trained with",
                )
            self.refresh_draft_vocab()

    @contextmanager
    def using(self, method: SpeculationMethod | None) -> Iterator[SpeculativeEngine]:
        """Serve ``method`` inside the block (e.g. ``alpha --modes``), then the engine's own again."""
        own, self.method = self.method, method
        try:
            yield self
        finally:
            self.method = own

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
        rows: list[Row] = []
        for rows, _new in self._decode([list(p) for p in prompts], params, speculate, tree):  # noqa: B007 (the last step's rows)
            pass
        return [RequestResult(r.tokens[len(r.prompt) :], r.finish_reason, r.stats) for r in rows]

    def generate_with_aux(self, prompts: list[list[int]], params: SamplingParams) -> tuple[list[RequestResult], list[torch.Tensor]]:
        """Target-only (K = 0) generation that also returns, per request, the aux hidden states of every
        token fed to the target (prompt + continuation minus the last token): [len - 1, n_aux * H].

        The alpha estimator drafts over these instead of re-running the target teacher-forced.
        """
        sink: dict[int, list[torch.Tensor]] = {}
        rows: list[Row] = []
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

    def spec_sampling(self) -> SpecSamplingConfig:
        """The speculative sampling flags served now, as the method serves them (e.g. ``sa_config``
        turns use_rejection_sampling off: speculative/sa)."""
        return self.method.served_sampling(self.sampling) if self.method is not None else self.sampling

    @torch.inference_mode()  # no autograd state at all: measurably less per-op overhead than no_grad
    def _decode(
        self, prompts: list[list[int]], params: SamplingParams, speculate: bool, tree_spec: Any, aux_sink: dict[int, list[torch.Tensor]] | None = None
    ) -> Iterator[tuple[list[Row], list[list[int]]]]:
        if speculate and self.draft is not None:
            params = self.spec_sampling().served_params(params)  # e.g. greedy when allow_advanced_sampling is off
        tree = self._tree_for(speculate, tree_spec, params)
        if not prompts:
            return
        stop = frozenset(self.eos_token_ids) | frozenset(params.stop_token_ids)
        rows = new_rows(
            prompts, params, stop, max_seq_len=self.max_seq_len, vocab_size=self.target.vocab_size, device=self.device, speculation=tree is not None
        )
        if params.max_tokens == 0:
            for r in rows:
                r.finished, r.finish_reason = True, "length"
            yield rows, [[] for _ in rows]
            return

        st = BatchState(self.target.new_cache())
        st.aux_sink = aux_sink
        run: MethodRun | None = None
        if tree is not None:  # the method's state for this run, set up before the prefill (e.g. SA seeds its automata)
            run = self.method.start(self, rows, tree, tree_spec, params) if self.method is not None else StaticTreeRun()
        prefilled = self._prefill(rows, st, keep_draft_inputs=tree is not None)
        for r in rows:  # the prefill iteration drafts at its own K (core/engine.py _pad_to_k)
            r.drafts_k = self._iteration_k(r, tree)
        yield rows, prefilled
        first = True  # every row's first decode: its drafts come from its prefill iteration
        while not all(r.finished for r in rows):
            yield rows, self._step(rows, st, tree, run, first)
            first = False

    def _prefill(self, rows: list[Row], st: BatchState, keep_draft_inputs: bool) -> list[list[int]]:
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
            tok = sample_token(logits[b, 0], r.params, r.gen)
            r.stats.target_forwards += 1
            if st.aux_sink is not None:
                st.aux_sink[b] = [aux[b, S - len(r.prompt) :]]
            if keep_draft_inputs:
                n = len(r.prompt)
                r.pend_aux = aux[b, S - n :]
                r.pend_tok = r.prompt[1:] + [tok]
                r.pend_pos = 0
            new.append(emit(r, [tok], self.max_seq_len))
        return new

    # The draft length a server's scheduler allows this step (TensorRT-LLM's draft_len_schedule by batch
    # size, 0 once the acceptance gate has switched speculation off: core/speculation_control.py), set
    # by runtime/reference_llm.py before it steps a request; None: no cap. Row.k_cap caps one row.
    k_cap: int | None = None

    def _k_eff(self, r: Row, tree: DraftTree | None) -> int:
        if tree is None or r.finished:
            return 0
        caps = [c for c in (self.k_cap, r.k_cap) if c is not None]
        return max(0, min(tree.max_depth, r.params.max_tokens - r.generated - 1, self.max_seq_len - len(r.tokens) - 1, *caps))

    def _iteration_k(self, r: Row, tree: DraftTree | None) -> int | None:
        """The K this iteration's forward drafts the row's NEXT drafts with (the schedule's, not the
        row's max_tokens cap); None when nothing caps it (then every draft is real)."""
        caps = [c for c in (self.k_cap, r.k_cap) if c is not None]
        return min(tree.max_depth, *caps) if tree is not None and caps else None

    @staticmethod
    def _pad_to_k(rows: list[Row], tree: DraftTree, k_eff: list[int], d: Drafted) -> None:
        """TensorRT-LLM's one-model path drafts inside iteration i's forward with iteration i's K, and
        ``PyExecutor._handle_dynamic_draft_len`` (tensorrt_llm/_torch/pyexecutor/py_executor.py, main @
        0004396720054fd8e205cbf616f21f0b57c6b412) then fits each generation row's ``py_draft_tokens`` to
        iteration i+1's K: extended with ``DRAFT_BUFFER_PAD = 0`` when K rose, truncated when it fell.
        So a row verifies min(K_i, K_i+1) real drafts and token 0 in the rest (accepted only where the
        target's token is 0; counted as drafted). The chain's first m drafts do not depend on how many
        follow, so the drafts made here at the new K are cut to the real ones. A padded node's draft
        distribution (rejection sampling) is one-hot on token 0, the placeholder upstream writes for a
        row that enters with no real drafts (``py_needs_onehot_draft_probs``)."""
        for b, r in enumerate(rows):
            real = r.drafts_k
            if real is None or real >= k_eff[b]:
                continue
            for n, dep in enumerate(tree.depth):
                if dep > real:
                    d.node_tok[b, n] = 0
                    q = d.q_full[b][n]
                    if q is not None:
                        d.q_full[b][n] = torch.nn.functional.one_hot(torch.tensor(0, device=q.device), q.shape[-1]).to(q.dtype)

    def _step(self, rows: list[Row], st: BatchState, tree: DraftTree | None, run: MethodRun | None = None, first: bool = False) -> list[list[int]]:
        """One decode iteration: the method drafts (``run``, core/method_api.py), one target forward
        verifies. ``first``: the rows' first decode after their prefill, whose drafts TensorRT-LLM
        made in the prefill iteration (a method may refuse to accept them: ``run.tree_valid``)."""
        B, dev = len(rows), self.device
        active = [not r.finished for r in rows]
        k_eff = [self._k_eff(r, tree) for r in rows]
        T = tree.size if tree is not None and max(k_eff) > 0 else 0
        drafted = tree if T else None  # the tree of this step's draft tokens, None when none are drafted
        node_tok = torch.zeros(B, T, dtype=torch.long)
        q_full: list[list[torch.Tensor | None]] = [[None] * T for _ in range(B)]
        row_trees: list[DraftTree | None] = [drafted] * B  # a static tree is every row's; a dynamic tree is per row
        if drafted is not None:
            assert run is not None  # a run is started whenever there is a tree
            d = run.draft(self, rows, st, drafted, k_eff, active)
            if isinstance(run, StaticTreeRun) and drafted.is_chain:  # the EAGLE-3 chain: drafts made last iteration
                self._pad_to_k(rows, drafted, k_eff, d)
            node_tok, q_full = d.node_tok, d.q_full
            if d.row_trees is not None:
                row_trees = d.row_trees
            T = node_tok.shape[1]

        # Verification: one target forward over [root, tree nodes] (each row's own tree: per-row ancestor masks).
        root_pos = torch.tensor([len(r.tokens) - 1 for r in rows])
        ids = torch.cat([torch.tensor([[r.root if not r.finished else self.pad_token_id] for r in rows]), node_tok], dim=1)
        depth = torch.zeros(B, 1 + T, dtype=torch.long)
        anc = torch.eye(1 + T, dtype=torch.bool).repeat(B, 1, 1)
        anc[:, :, 0] = True
        shared: dict[int, torch.Tensor] = {}  # a static tree's mask, computed once
        for b, t in enumerate(row_trees):
            if t is not None:
                if id(t) not in shared:
                    shared[id(t)] = t.ancestors()
                depth[b, 1:] = torch.tensor(t.depth)
                anc[b, 1:, 1:] = shared[id(t)]
        pos = root_pos[:, None] + depth
        enabled = torch.zeros(B, 1 + T, dtype=torch.bool)
        for b in range(B):
            if active[b]:
                enabled[b] = depth[b] <= k_eff[b]
        new_allowed = (anc & enabled[:, None, :] & enabled[:, :, None]) | torch.eye(1 + T, dtype=torch.bool)[None]
        assert st.t_valid is not None  # set by _prefill
        past = st.t_valid.cpu()[:, None, :].expand(B, 1 + T, -1) & enabled[:, :, None]
        logits, aux = self.target.forward(ids, pos, torch.cat([past, new_allowed], dim=-1), st.cache)

        new_valid = torch.zeros(B, 1 + T, dtype=torch.bool)
        greedy = logits.argmax(-1).tolist() if rows[0].params.greedy else None  # one call for all rows and nodes
        # sampled: matched against the target's samples (allow_advanced_sampling without rejection sampling,
        # or sa_config), or a dynamic tree (its target-only rejection kernel draws the same tokens: core/verify.py)
        match = self.spec_sampling().served == "match" or (run is not None and run.match_samples)
        accepted_now: dict[int, list[int]] = {}
        out: list[list[int]] = []
        for b, r in enumerate(rows):
            if not active[b]:
                out.append([])
                continue
            r.stats.target_forwards += 1
            if st.aux_sink is not None:
                st.aux_sink[b].append(aux[b, :1])
            g = greedy[b] if greedy is not None else None
            tree_valid = run.tree_valid(first) if run is not None else True
            path, bonus, reached = accept(r, logits[b], node_tok[b].tolist(), q_full[b], row_trees[b], k_eff[b], g, match=match, tree_valid=tree_valid)
            accepted = len(path)
            new_valid[b, 0] = True
            for n in path:
                new_valid[b, 1 + n] = True
            toks = [int(node_tok[b, n]) for n in path] + ([bonus] if bonus is not None else [])
            if tree is not None and k_eff[b] > 0:
                r.stats.record_iteration(k_eff[b], reached, accepted)
                r.stats.verified_tokens += int(enabled[b, 1:].sum())
            cols = [0] + [1 + n for n in path]
            if tree is not None:
                # append: inputs not yet committed (no draft pass ran this step) must be kept
                if r.pend_tok:
                    assert r.pend_aux is not None  # pending tokens always come with their aux states
                    r.pend_aux = torch.cat([r.pend_aux, aux[b, cols]])
                else:
                    r.pend_aux, r.pend_pos = aux[b, cols], len(r.tokens) - 1
                r.pend_tok = r.pend_tok + toks
            accepted_now[b] = toks
            out.append(emit(r, toks, self.max_seq_len))
        st.append_target(new_valid.to(dev))
        for r in rows:  # this forward drafted the next step's drafts at this iteration's K (_pad_to_k)
            r.drafts_k = self._iteration_k(r, tree)
        if run is not None:
            run.after_verify([b for b in range(B) if active[b]], accepted_now)
        return out

    def draft_embedding(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings the draft reads: its own table when it ships one, else the target's."""
        ids = ids.to(self.device)
        return self.draft_embed(ids) if self.draft_embed is not None else self.target.embed(ids)

    _draft_embed = draft_embedding

    def drafter(self, greedy_draft: bool = False) -> Drafter:
        """The EAGLE-3 drafter over this engine's draft, taken fresh each step (``d2t`` changes in
        place during distillation). ``greedy_draft``: top-1 at any temperature."""
        assert self.draft is not None  # _tree_for drafts only with a draft
        return Drafter(self.draft, self.target, self._draft_embed, self._d2t_ids, self.pad_token_id, greedy_draft=greedy_draft)
