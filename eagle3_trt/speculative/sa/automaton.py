"""Suffix-automaton (SA) draft enhancer, as TensorRT-LLM's ``Eagle3DecodingConfig.sa_config``.

Ground truth (NVIDIA/TensorRT-LLM, read through the search index):

- ``tensorrt_llm/_torch/speculative/sa_enhancer.py`` @ 1a487b3f2593ca6fc7b86c542ba0be9442ca94e8,
  ``SADraftEnhancer``: ``extend_and_prepare`` runs after ``sample_and_accept_draft_tokens`` on the
  GENERATION rows only (``request_ids[num_contexts:]``, ``accepted_tokens[num_contexts:]``): each
  row's automaton is extended with the tokens accepted at that decode step, then looked up.
  ``maybe_override_all_draft_tokens`` then replaces ALL K neural draft tokens of a row whose match
  length is ``>= threshold`` (``torch.where``; no merging), and is applied to
  ``next_draft_tokens[num_contexts:]``: the drafts produced in a request's prefill iteration are
  never overridden. So: the drafts verified at a request's first decode are always neural.
- ``tensorrt_llm/_torch/speculative/suffix_automaton.py`` (``SuffixAutomatonManager``, search-index
  id 51911646148): ``prepare_resources`` builds each context request's automaton from
  ``req.get_tokens(0)`` (the prompt) before the prefill forward; the token sampled at prefill is a
  context row's output, never passed to ``extend``: the automaton holds prompt + the tokens accepted
  at decode steps (every output token but the first). ``_gpu_draft_tokens`` is one
  ``[max_num_requests, max_draft_len]`` buffer indexed by the row's position among the iteration's
  generation rows, zero-initialised.
- ``cpp/tensorrt_llm/kernels/speculativeDecoding/suffixAutomaton/suffixAutomatonKernels.cu`` @
  1503aa805f6b0cac3a9dbe3bf208a8c58274d34e (``suffixAutomatonExtendKernel``) and
  ``suffixAutomaton.h`` @ 1503aa80 (``lookup``, ``getDraftTokens``): ``lookup`` walks the suffix
  links from the whole text's state to the first state whose ``pos`` (set at creation, copied to
  clones: the end of the first occurrence) is not the last index; ``getDraftTokens`` writes
  min(K, tokens after the match) tokens and leaves the rest of the row's buffer as it was; with no
  match nothing is written. Those stale slots are verified as drafts when the match overrides.
- Global pool (``enable_global_pool``), suffixAutomatonKernels.cu search-index id 52336512831
  (``suffixAutomatonGlobalExtendKernel``, ``suffixAutomatonGlobalSearchKernel``) and
  suffixAutomatonKernels.h id 52367418376: every generation row is extended first, then each row
  takes the last min(64, len) tokens of its own text (``kMaxGlobalSuffixLen``) and every slot of
  the active mask is searched (``lookupWithSuffix``); the best is the longest match, then the own
  slot, then the longer continuation, then (tree reduction keeping the left operand on ties) the
  lower slot index; at most 1,024 slots. Completed requests stay searchable (``remove_request``
  retains their slot while the pool has room: ``effective_pool_size`` = max(64, max_batch_size)),
  and slots are popped from the end of ``list(range(pool_size))``.
  ``lookupWithSuffix`` itself is not in the index: here it is the longest suffix of the query
  that occurs in the slot's text with at least one token after its first occurrence (what
  ``lookup`` does for the own text).
- ``tensorrt_llm/llmapi/llm_args.py`` (search-index id 55143598664,
  ``validate_rejection_sampling_config``): with ``sa_config`` set, ``use_rejection_sampling`` is
  silently turned off, so sampled requests are verified by matching the target's samples
  (``without_rejection_sampling``). ``SAEnhancerConfig``: ``threshold`` PositiveInt, default 4.

Scope here: one ``SAEnhancer`` per decoded batch, as a server that starts with that batch (zero
buffer, empty retained pool); requests completed earlier in the batch stay in the pool.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from eagle3_trt.core.spec_sampling import SpecSamplingConfig
from eagle3_trt.errors import UserError

GLOBAL_POOL_MAX_SUFFIX = 64  # kMaxGlobalSuffixLen: the own suffix searched in the pool
GLOBAL_POOL_MAX_SLOTS = 1024  # SuffixAutomatonGlobalSearchParams: one CUDA thread per slot
DEFAULT_POOL_SIZE = 64  # suffix_automaton.py _DEFAULT_POOL_SIZE: pool = max(64, max_batch_size)


class SuffixAutomaton:
    """Incremental suffix automaton over token ids (states: len, suffix link, transitions, firstpos)."""

    def __init__(self, tokens: Iterable[int] = ()) -> None:
        self.tokens: list[int] = []
        self._len = [0]
        self._link = [-1]
        self._next: list[dict[int, int]] = [{}]
        self._first = [-1]  # end index of the first occurrence of the state's strings
        self._last = 0
        for t in tokens:
            self.extend(t)

    def extend(self, token: int) -> None:
        token = int(token)
        self.tokens.append(token)
        cur = self._new(self._len[self._last] + 1, len(self.tokens) - 1, {})
        p = self._last
        while p != -1 and token not in self._next[p]:
            self._next[p][token] = cur
            p = self._link[p]
        if p == -1:
            self._link[cur] = 0
        else:
            q = self._next[p][token]
            if self._len[p] + 1 == self._len[q]:
                self._link[cur] = q
            else:
                clone = self._new(self._len[p] + 1, self._first[q], dict(self._next[q]))
                self._link[clone] = self._link[q]
                while p != -1 and self._next[p].get(token) == q:
                    self._next[p][token] = clone
                    p = self._link[p]
                self._link[q] = self._link[cur] = clone
        self._last = cur

    def extend_many(self, tokens: Iterable[int]) -> None:
        for t in tokens:
            self.extend(t)

    def _new(self, length: int, first: int, nxt: dict[int, int]) -> int:
        self._len.append(length)
        self._link.append(-1)
        self._next.append(nxt)
        self._first.append(first)
        return len(self._len) - 1

    def longest_suffix_match(self) -> tuple[int, int]:
        """(length, end index of its oldest earlier occurrence) of the longest suffix of the text that
        also occurs earlier; (0, -1) when none does. It is the suffix link of the whole text's state:
        the longest suffix whose end positions include one before the last."""
        s = self._link[self._last] if self._last else -1
        if s <= 0:
            return 0, -1
        return self._len[s], self._first[s]

    def lookup_with_suffix(self, query: Sequence[int]) -> tuple[int, int]:
        """(length, end index of its oldest occurrence here) of the longest suffix of ``query`` that
        occurs in this text with at least one token after that occurrence; (0, -1) when none."""
        v, n = 0, 0
        for t in query:
            while v and t not in self._next[v]:
                v = self._link[v]
                n = self._len[v]
            if t in self._next[v]:
                v, n = self._next[v][t], n + 1
        # all strings of a state share their end positions: a suffix occurring only at the very end
        # has no continuation, so shorter suffixes (the suffix links) are tried
        while n and self._first[v] + 1 >= len(self.tokens):
            v = self._link[v]
            n = self._len[v]
        return (n, self._first[v]) if n else (0, -1)

    def continuation(self, end: int, k: int) -> list[int]:
        """The (up to) ``k`` tokens that followed index ``end`` (``getDraftTokens``)."""
        return self.tokens[end + 1 : end + 1 + k]


@dataclass(frozen=True)
class SAConfig:
    """``SAEnhancerConfig``'s two fields, checked as TensorRT-LLM checks them (threshold: PositiveInt)."""

    threshold: int = 4
    enable_global_pool: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, int) or self.threshold < 1:
            raise UserError(
                "sa_config.threshold", f"{self.threshold!r} is not a positive integer", "use a suffix-match length >= 1 (TensorRT-LLM's default is 4)"
            )


class SAEnhancer:
    """One decoded batch's SA enhancer: TensorRT-LLM's ``SADraftEnhancer`` over its
    ``SuffixAutomatonManager`` (see the module docstring for each rule's source).

    ``update(gen, accepted)`` after a decode step: ``gen`` are the batch's generation rows of that
    step in batch order (a row's position in it indexes the draft buffer), ``accepted[b]`` the
    tokens row b accepted (drafts + bonus). ``drafts(b)`` is then the K tokens that override row b's
    next neural drafts, or None (match below the threshold, or no decode step yet).
    """

    def __init__(self, cfg: SAConfig, prompts: Sequence[Sequence[int]], k: int) -> None:
        B = len(prompts)
        pool = max(DEFAULT_POOL_SIZE, B) if cfg.enable_global_pool else B
        if cfg.enable_global_pool and pool > GLOBAL_POOL_MAX_SLOTS:
            raise UserError(
                "sa_config.enable_global_pool",
                f"{B} requests at once need {pool} suffix-automaton slots; TensorRT-LLM's global search supports at most {GLOBAL_POOL_MAX_SLOTS}",
                f"use a batch of at most {GLOBAL_POOL_MAX_SLOTS} requests",
            )
        self.cfg, self.k = cfg, k
        self.automata = [SuffixAutomaton(p) for p in prompts]  # seeded with the prompt (prepare_resources)
        self.slot = [pool - 1 - b for b in range(B)]  # _free_slots.pop() from list(range(pool)), in batch order
        self.buf = [[0] * k for _ in range(B)]  # _gpu_draft_tokens: by generation-row position, zero-initialised
        self.match_len = [0] * B
        self._drafts: list[list[int] | None] = [None] * B

    def update(self, gen: Sequence[int], accepted: Mapping[int, Sequence[int]]) -> None:
        for b in gen:  # every generation row is extended before any lookup (two kernels in the global pool)
            self.automata[b].extend_many(accepted[b])
        for i, b in enumerate(gen):
            n, end, src = self._lookup(b)
            if n:
                c = src.continuation(end, self.k)
                self.buf[i][: len(c)] = c  # the rest of the row keeps the buffer's previous contents
            self.match_len[b] = n
            self._drafts[b] = list(self.buf[i]) if n >= self.cfg.threshold else None

    def drafts(self, b: int) -> list[int] | None:
        return self._drafts[b]

    def _lookup(self, b: int) -> tuple[int, int, SuffixAutomaton]:
        own = self.automata[b]
        if not self.cfg.enable_global_pool:
            n, end = own.longest_suffix_match()
            return n, end, own
        query = own.tokens[-GLOBAL_POOL_MAX_SUFFIX:]
        best: tuple[int, int, int, int] | None = None  # (match, own, continuation, -slot): larger wins
        hit = (0, -1, own)
        for c, a in enumerate(self.automata):  # active and completed requests alike: all keep their slot here
            n, end = a.lookup_with_suffix(query)
            if not n:
                continue
            key = (n, int(c == b), len(a.tokens) - (end + 1), -self.slot[c])
            if best is None or key > best:
                best, hit = key, (n, end, a)
        return hit


def without_rejection_sampling(s: SpecSamplingConfig) -> SpecSamplingConfig:
    """TensorRT-LLM's ``validate_rejection_sampling_config``: ``sa_config`` turns
    ``use_rejection_sampling`` off (silently there), so sampled requests accept exact matches only."""
    return replace(s, use_rejection_sampling=False) if s.use_rejection_sampling else s
