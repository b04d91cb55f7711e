"""An independent re-derivation of TensorRT-LLM's speculation modes (the EAGLE-3 chain, the chain with
the suffix-automaton enhancer, the dynamic tree), written from TensorRT-LLM's source to check the
reference runtime (core/engine.py) against. It shares nothing with the engine but the draft module:

- the target is the plain Hugging Face model, recomputed over the whole sequence for every
  verified path (no KV cache, no tree mask: a node's token is checked by running the target over
  prompt + accepted text + the node's path), aux states from ``output_hidden_states``;
- the draft's context pass runs over the whole accepted prefix every iteration, and each tree node
  is drafted by running the draft along its own path from the context (a chain per node);
- the suffix "automaton" is a brute-force search over the text;
- requests of a batch advance in lockstep, one decode iteration each per round, as TensorRT-LLM's
  in-flight batch does once all of them are past their prefill.

Rules, each from NVIDIA/TensorRT-LLM's source (file @ commit or search-index id):

Dynamic tree (``_torch/speculative/eagle3_dynamic_tree.py`` @057c8a65):
  - ``_sample_softmax_topk``: the K best of softmax(draft logits) at the root, score = probability;
  - ``_select_topk_draft_tokens``: at layer i the K expanded nodes give K children each, score =
    child probability x parent score; the K best of the K*K are expanded next; the history holds
    K + K*K*(D-1) candidates in layer order (``update_draft_tokens_and_scores``), a candidate's
    parent is history index ``topk_indices + K**2 * (i-1) + K`` of the previous layer;
  - ``_resample_final_tokens``: the N best of the history, sorted by history index;
  - ``buildDynamicTreeKernel`` (dynamicTreeKernels.cu @84e55f93): a node's parent is found through
    the parent buffer; children are linked in node order;
  - ``verifyDynamicTreeGreedyKernel``: from the root, the first child (node order) equal to the
    target's token at the current node is accepted; ``treeValid`` false (no tree was stored: the
    request's first decode, since trees are built for ``[num_contexts:batch_size]`` only) emits the
    root's token alone.
  Ties between equal scores: the earlier history index first (torch.topk leaves them unspecified).

Suffix-automaton enhancer (``sa_enhancer.py`` @1a487b3f, ``suffix_automaton.py`` search-index id
51911646148, ``suffixAutomaton.h``/``suffixAutomatonKernels.cu`` @1503aa80, global search id
52336512831):
  - each request's text starts as its prompt; after each decode iteration the tokens it accepted
    (accepted drafts + the bonus token) are appended; the token its prefill sampled never is;
  - lookup: the longest suffix of the text that also ends at an earlier index; its oldest
    occurrence; the draft is what followed it, at most K tokens, written into the row's slot of a
    [batch, K] buffer (zeros at first) indexed by the request's position among the iteration's
    decoding requests; slots not written keep their contents; no match writes nothing;
  - the next iteration's K drafts are that buffer row when the match length is >= threshold;
    the drafts of a request's first decode (made in its prefill iteration) are never replaced;
  - global pool: the last min(64, len) tokens of the own text are searched in every request's text
    of the batch (finished ones included), a match needing a token after it; the longest match
    wins, then the own text, then the longer continuation, then the later request of the batch.

Greedy only (the target's argmax): sampled outputs depend on the random stream, not on these rules.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from eagle3_trt.convert.draft_format import load_draft
from eagle3_trt.convert.embedded import embedded_pair
from eagle3_trt.convert.load import load_engine
from eagle3_trt.convert.prompts import load_prompt_records
from eagle3_trt.core.draft import Eagle3Draft
from eagle3_trt.core.engine import SamplingParams  # the engine is what is checked, not used by the oracle
from eagle3_trt.measure.acceptance import encode_raw
from eagle3_trt.speculative.dynamic_tree.builder import DynamicTreeConfig
from eagle3_trt.speculative.dynamic_tree.method import DynamicTreeMethod
from eagle3_trt.speculative.sa.automaton import SAConfig
from eagle3_trt.speculative.sa.method import SuffixAutomatonMethod


@dataclass
class OracleResult:
    tokens: list[int]
    accepted: list[int] = field(default_factory=list)  # accepted drafts per verification
    target_forwards: int = 1


@dataclass
class _Req:
    prompt: list[int]
    seq: list[int]  # tokens the target has seen
    nxt: int  # the last emitted token (the root)
    res: OracleResult
    done: bool = False
    text: list[int] = field(default_factory=list)  # the suffix automaton's text
    sa_next: list[int] | None = None  # drafts the automaton gives the next iteration


class ModeOracle:
    """``run(prompts)``: per request, the greedy tokens, accepted drafts per verification and target
    forwards of ``mode`` ("chain", "sa", "dynamic-tree") as TensorRT-LLM runs it on a batch."""

    def __init__(
        self,
        hf: Any,
        draft: Eagle3Draft,
        aux_ids: Sequence[int],
        k: int,
        max_new: int,
        mode: str = "chain",
        stop_ids: Sequence[int] = (),
        topk: int = 10,
        nodes: int | None = None,
        threshold: int = 4,
        global_pool: bool = False,
    ) -> None:
        if mode not in ("chain", "sa", "dynamic-tree"):
            raise ValueError(f"unknown mode {mode!r}")
        self.hf, self.draft, self.aux_ids, self.k, self.max_new, self.mode = hf, draft, tuple(aux_ids), k, max_new, mode
        self.stop = frozenset(stop_ids)
        self.topk, self.nodes = topk, (nodes if nodes is not None else topk * k)
        self.threshold, self.global_pool = threshold, global_pool
        self.emb = hf.get_input_embeddings()

    # ---- the target, recomputed from scratch ---------------------------------------------------
    def _target(self, seqs: list[list[int]]) -> tuple[list[int], list[torch.Tensor]]:
        """(argmax after each sequence, aux states of every position of each), right-padded batch."""
        n = max(len(s) for s in seqs)
        ids = torch.tensor([s + [0] * (n - len(s)) for s in seqs])
        att = torch.tensor([[1] * len(s) + [0] * (n - len(s)) for s in seqs])
        out = self.hf(input_ids=ids, attention_mask=att, output_hidden_states=True, use_cache=False)
        aux = torch.cat([out.hidden_states[i + 1] for i in self.aux_ids], dim=-1)
        return [int(out.logits[b, len(s) - 1].argmax()) for b, s in enumerate(seqs)], [aux[b, : len(s)] for b, s in enumerate(seqs)]

    # ---- the draft ----------------------------------------------------------------------------
    def _context(self, q: _Req) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """Draft step 1 over the whole accepted prefix: (hidden, logits) at the root, and its KV."""
        _, aux = self._target([q.seq])
        n = len(q.seq)
        h, lg, kv = self.draft(self.emb(torch.tensor([q.seq[1:] + [q.nxt]])), self.draft.fuse(aux[0][None]), torch.arange(n)[None])
        return h[:, -1:], lg[0, -1], kv

    def _along(self, ctx: tuple[torch.Tensor, torch.Tensor, Any], n: int, path: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The draft's (hidden, logits) at the end of ``path`` (target ids), run as a chain from the root."""
        hid, lg, kv = ctx
        for j, t in enumerate(path):
            hid, lgs, kv = self.draft(self.emb(torch.tensor([[t]])), hid, torch.tensor([[n + j]]), past=kv)
            lg = lgs[0, -1]
        return hid, lg

    def _to_target(self, draft_ids: torch.Tensor) -> list[int]:
        return [int(x) for x in self.draft.to_target_ids(draft_ids)]

    # ---- the modes ------------------------------------------------------------------------------
    def run(self, prompts: Sequence[Sequence[int]]) -> list[OracleResult]:
        greedy, _ = self._target([list(p) for p in prompts])
        reqs = [_Req(list(p), list(p), g, OracleResult([g]), text=list(p)) for p, g in zip(prompts, greedy)]
        buf = [[0] * self.k for _ in reqs]  # the SA draft buffer, by decoding position
        first = True
        for q in reqs:
            q.done = q.nxt in self.stop or len(q.res.tokens) >= self.max_new
        while True:
            live = [q for q in reqs if not q.done]
            if not live:
                break
            accepted = {id(q): self._iteration(q, first) for q in live}
            first = False
            if self.mode == "sa":
                for q in live:
                    q.text += accepted[id(q)]
                for i, q in enumerate(live):
                    n, end, src = self._sa_lookup(q, reqs)
                    if n:
                        cont = src[end + 1 : end + 1 + self.k]
                        buf[i][: len(cont)] = cont
                    q.sa_next = list(buf[i]) if n >= self.threshold else None
        return [q.res for q in reqs]

    def _iteration(self, q: _Req, first: bool) -> list[int]:
        """One decode iteration of a request; returns the tokens it accepted (drafts + bonus)."""
        k_eff = min(self.k, self.max_new - len(q.res.tokens) - 1)  # drafts never go past the token budget
        q.res.target_forwards += 1
        if k_eff == 0:
            (y,), _ = self._target([q.seq + [q.nxt]])
            return self._emit(q, [], y)
        if self.mode == "dynamic-tree":
            return self._tree_iteration(q, k_eff, first)
        ctx = self._context(q)
        n = len(q.seq)
        drafts = self._to_target(ctx[1].argmax()[None])
        hid, kv = ctx[0], ctx[2]
        for j in range(1, k_eff):  # steps 2..K feed the draft's own hidden state back
            hid, lg, kv = self.draft(self.emb(torch.tensor([[drafts[-1]]])), hid, torch.tensor([[n - 1 + j]]), past=kv)
            drafts += self._to_target(lg[0, -1].argmax()[None])
        if self.mode == "sa" and q.sa_next is not None:
            drafts = q.sa_next[:k_eff]
        base = q.seq + [q.nxt]
        verify, _ = self._target([base + drafts[:j] for j in range(k_eff + 1)])
        a = 0
        while a < k_eff and drafts[a] == verify[a]:
            a += 1
            if drafts[a - 1] in self.stop:
                break
        q.res.accepted.append(a)
        return self._emit(q, drafts[:a], verify[a] if not (a and drafts[a - 1] in self.stop) else None)

    def _emit(self, q: _Req, acc: list[int], bonus: int | None) -> list[int]:
        toks = acc + ([bonus] if bonus is not None else [])
        q.seq += [q.nxt] + acc
        for t in toks:
            if q.done:
                break
            q.res.tokens.append(t)
            q.done = t in self.stop or len(q.res.tokens) >= self.max_new
        if toks:
            q.nxt = toks[-1]
        return toks

    def _tree_iteration(self, q: _Req, k_eff: int, first: bool) -> list[int]:
        K, D, N = self.topk, self.k, self.nodes
        base = q.seq + [q.nxt]
        if first:  # no tree stored for this request yet (its drafts come from its prefill): the root's token alone
            (y,), _ = self._target([base])
            q.res.accepted.append(0)
            return self._emit(q, [], y)
        ctx = self._context(q)
        n = len(q.seq)
        # history: per candidate its draft-vocab id, score and parent history index (-1: the root)
        p0 = torch.softmax(ctx[1].float(), dim=-1)
        top = _best(p0, K)
        hist_tok = [int(t) for t in top]
        hist_score = [float(p0[t]) for t in top]
        hist_parent = [-1] * K
        expanded = list(range(K))  # history indices of the nodes run at the next layer
        for _layer in range(1, D):
            cand: list[tuple[int, float, int]] = []
            for h in expanded:
                path = self._path(h, hist_tok, hist_parent)
                _, lg = self._along(ctx, n, self._to_target(torch.tensor(path)))
                p = torch.softmax(lg.float(), dim=-1)
                for t in _best(p, K):
                    cand.append((int(t), float(torch.tensor(hist_score[h], dtype=torch.float32) * p[t]), h))
            start = len(hist_tok)
            for t, s, par in cand:
                hist_tok.append(t)
                hist_score.append(s)
                hist_parent.append(par)
            scores = torch.tensor([s for _, s, _ in cand], dtype=torch.float32)
            expanded = [start + int(i) for i in _best(scores, K)]
        chosen = sorted(int(i) for i in _best(torch.tensor(hist_score, dtype=torch.float32), N))
        node_of = {h: i for i, h in enumerate(chosen)}
        parent = [node_of.get(hist_parent[h], -1) if hist_parent[h] >= 0 else -1 for h in chosen]
        depth = [len(self._path(h, hist_tok, hist_parent)) for h in chosen]
        tok = self._to_target(torch.tensor([hist_tok[h] for h in chosen]))
        paths = [[tok[i] for i in self._node_path(i, parent)] for i in range(len(chosen))]
        verify, _ = self._target([base] + [base + p for p in paths])  # verify[0]: root, verify[1 + i]: node i
        cur, acc = -1, []
        while True:
            y = verify[0 if cur < 0 else 1 + cur]
            kids = [i for i in range(len(chosen)) if parent[i] == cur and depth[i] <= k_eff and tok[i] == y]
            if not kids:
                break
            cur = kids[0]
            acc.append(y)
            if y in self.stop:
                y = -1
                break
        q.res.accepted.append(len(acc))
        return self._emit(q, acc, None if y == -1 else y)

    @staticmethod
    def _path(h: int, hist_tok: list[int], hist_parent: list[int]) -> list[int]:
        out = []
        while h >= 0:
            out.append(hist_tok[h])
            h = hist_parent[h]
        return out[::-1]

    @staticmethod
    def _node_path(i: int, parent: list[int]) -> list[int]:
        out = []
        while i >= 0:
            out.append(i)
            i = parent[i]
        return out[::-1]

    # ---- the suffix search ------------------------------------------------------------------------
    def _sa_lookup(self, q: _Req, reqs: list[_Req]) -> tuple[int, int, list[int]]:
        """(match length, end index of its oldest occurrence, the text it is in)."""
        if not self.global_pool:
            n, e = _longest_earlier(q.text, q.text)
            return n, e, q.text
        query = q.text[-64:]
        best: tuple[int, int, int, int] | None = None
        hit: tuple[int, int, list[int]] = (0, -1, q.text)
        for c, o in enumerate(reqs):
            n, e = _longest_earlier(query, o.text)
            if n:
                key = (n, int(o is q), len(o.text) - (e + 1), c)
                if best is None or key > best:
                    best, hit = key, (n, e, o.text)
        return hit


def _best(scores: torch.Tensor, k: int) -> list[int]:
    """Indices of the k largest scores, ties to the smaller index."""
    order = sorted(range(scores.shape[0]), key=lambda i: (-float(scores[i]), i))
    return order[:k]


def _longest_earlier(query: list[int], text: list[int]) -> tuple[int, int]:
    """The longest suffix of ``query`` that ends in ``text`` at an index with a token after it, and
    the smallest such end index; (0, -1) when none. With ``query`` = ``text``: the longest suffix of
    the text that also ends earlier."""
    best, at = 0, -1
    for e in range(len(text) - 1):
        m = 0
        while m < len(query) and m <= e and text[e - m] == query[len(query) - 1 - m]:
            m += 1
        if m > best:
            best, at = m, e
    return best, at


__all__ = ["ModeOracle", "OracleResult"]


def agreement(
    engine: Any, hf: Any, draft: Eagle3Draft, aux_ids: Sequence[int], prompts: Sequence[Sequence[int]], mode: str, max_new: int, batch: int = 16, **kw: Any
) -> dict:
    """Per request, whether ``engine`` (core/engine.py, configured for ``mode`` by the caller) and
    the oracle give the same tokens, target forwards and accepted drafts per verification, run in
    batches of ``batch`` prompts in their order (as ``alpha`` measures); with both ALs."""
    agree, gen_tok, gen_fwd, orc_tok, orc_fwd = [], 0, 0, 0, 0
    for s in range(0, len(prompts), batch):
        part = [list(p) for p in prompts[s : s + batch]]
        got = engine.generate(part, SamplingParams(max_tokens=max_new))
        with torch.no_grad():
            want = ModeOracle(hf, draft, aux_ids, engine.max_draft_len, max_new, mode, stop_ids=engine.eos_token_ids, **kw).run(part)
        for g, o in zip(got, want):
            hist = [o.accepted.count(a) for a in range(engine.max_draft_len + 1)]
            agree.append(
                g.token_ids == o.tokens and g.stats.target_forwards == o.target_forwards and (g.stats.accept_hist + [0] * len(hist))[: len(hist)] == hist
            )
            gen_tok, gen_fwd = gen_tok + g.stats.generated_tokens, gen_fwd + g.stats.target_forwards
            orc_tok, orc_fwd = orc_tok + len(o.tokens), orc_fwd + o.target_forwards
    return {"requests": len(agree), "agree": sum(agree), "engine_al": gen_tok / gen_fwd, "oracle_al": orc_tok / orc_fwd}


def main(argv: Sequence[str] | None = None) -> None:
    """python -m eagle3_trt.testing.mode_oracle [prompt files...]: the embedded tiny pair's modes
    (K=3; sa threshold 4, and 2 with the global pool; dynamic tree topK 10, 30 nodes; 64 tokens),
    engine against oracle per request, on raw-completion prompts."""
    from transformers import LlamaForCausalLM  # heavy: only the command-line run loads the HF target

    ap = argparse.ArgumentParser(prog="python -m eagle3_trt.testing.mode_oracle")
    ap.add_argument("files", nargs="*", default=["examples/repeat_code.jsonl", "examples/code_edit.jsonl"])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--modes", default="chain,sa,sa-pool,dynamic-tree")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)  # many small recomputations: threads only contend
    t, d = embedded_pair("tiny")
    ck = load_draft(d)
    hf = LlamaForCausalLM.from_pretrained(str(t), dtype=torch.float32).eval()
    draft = Eagle3Draft.from_checkpoint(ck, torch.float32)
    eng = load_engine(t, d, dtype=torch.float32, max_draft_len=3)
    setups = {
        "chain": ("chain", None, None, {}),
        "sa": ("sa", SAConfig(threshold=4), None, {"threshold": 4}),
        "sa-pool": ("sa", SAConfig(threshold=2, enable_global_pool=True), None, {"threshold": 2, "global_pool": True}),
        "dynamic-tree": ("dynamic-tree", None, DynamicTreeConfig(10, 30), {"topk": 10, "nodes": 30}),
    }
    for name in a.modes.split(","):
        mode, sa, dyn, kw = setups[name]
        eng.method = SuffixAutomatonMethod(sa) if sa is not None else DynamicTreeMethod(dyn) if dyn is not None else None
        for f in a.files:
            prompts = [encode_raw(eng.tokenizer, r.first) for r in load_prompt_records(f)]
            r = agreement(eng, hf, draft, eng.target.aux_layer_ids, prompts, mode, a.max_tokens, **kw)
            print(f"{name:13s} {f}: {r['agree']}/{r['requests']} requests agree; AL engine {r['engine_al']:.3f} oracle {r['oracle_al']:.3f}", flush=True)


if __name__ == "__main__":
    main()
