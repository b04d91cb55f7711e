"""Suffix-automaton (SA) draft enhancer, as TensorRT-LLM's ``Eagle3DecodingConfig.sa_config``.

Ground truth (read through the search index, NVIDIA/TensorRT-LLM):

- ``tensorrt_llm/_torch/speculative/sa_enhancer.py`` @ 1a487b3f2593ca6fc7b86c542ba0be9442ca94e8,
  ``SADraftEnhancer.maybe_override_all_draft_tokens``: per request, when the suffix match length is
  ``>= threshold`` ALL K neural draft tokens are replaced by the SA's K tokens
  (``torch.where(match_len >= threshold, sa_draft_tokens, draft_tokens)``); no merging. The neural
  draft loop still runs first ("so that neural draft layers never see SA tokens").
- ``tensorrt_llm/_torch/speculative/suffix_automaton.py`` @ aba252566a7bd1a8abb8815cf46d3b7d6e2aa360:
  the automaton is built from the request's context tokens and extended with each step's accepted
  tokens; the lookup finds the longest suffix of the text that also occurs earlier, and the draft is
  the (up to K) tokens that followed that earlier occurrence (``get_draft_tokens(pos, K)``, positions
  it cannot fill stay 0). The Python fallback there takes the oldest occurrence within a 1024-token
  window.
- The native kernel (what TensorRT-LLM runs; the module above requires it):
  ``cpp/tensorrt_llm/kernels/speculativeDecoding/suffixAutomaton/suffixAutomaton.h`` @ 1503aa80
  ``lookup()`` walks the suffix links up from the whole text's state to the first state whose ``pos``
  is not the last index; ``pos`` is set when a state is created and copied to its clones, so it is
  the end of the state's first occurrence: the oldest occurrence over the whole text, no window, as
  here (``firstpos``). ``getDraftTokens`` copies min(K, tokens after it); in a loop of period p < K
  only p tokens exist after the oldest match, so the SA proposes p real tokens. The slots it does not
  fill keep what the [batch, K] buffer held before (``suffixAutomatonKernels.cu`` @ 1503aa80); here
  they hold the pad id.
- ``tensorrt_llm/llmapi/llm_args.py`` (``SAEnhancerConfig``): ``threshold`` PositiveInt, default 4;
  ``enable_global_pool``: "each request searches all active SA states for the longest match, not
  just its own" (``SADecodingConfig`` adds: suffix matching capped at 64 tokens per request).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from eagle3_trt.errors import UserError

GLOBAL_POOL_MAX_SUFFIX = 64  # SADecodingConfig.enable_global_pool: "suffix matching is capped at 64 tokens"


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

    def match(self, query: Sequence[int]) -> tuple[int, int]:
        """(length, end index of its oldest occurrence here) of the longest suffix of ``query`` that is a
        substring of this text (the global pool's cross-request search)."""
        v, n = 0, 0
        for t in query:
            while v and t not in self._next[v]:
                v = self._link[v]
                n = self._len[v]
            if t in self._next[v]:
                v, n = self._next[v][t], n + 1
        return (n, self._first[v]) if n else (0, -1)

    def continuation(self, end: int, k: int) -> list[int]:
        """The (up to) ``k`` tokens that followed index ``end``."""
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


@dataclass(frozen=True)
class SAProposal:
    match_len: int
    tokens: list[int]  # exactly K (unfilled positions carry the pad id, as TensorRT-LLM leaves 0)


def propose(own: SuffixAutomaton, k: int, pad: int, pool: Sequence[SuffixAutomaton] = ()) -> SAProposal:
    """The SA's K draft tokens for a request whose automaton is ``own``; with ``pool`` (the other
    requests' automata, enable_global_pool) the longest match over all of them wins, own first on ties."""
    n, end = own.longest_suffix_match()
    best, src = n, own
    if pool:
        query = own.tokens[-GLOBAL_POOL_MAX_SUFFIX:]
        for other in pool:
            m, e = other.match(query)
            if m > best and e + 1 < len(other.tokens):  # a match with nothing after it proposes nothing
                best, end, src = m, e, other
    toks = src.continuation(end, k) if best else []
    return SAProposal(best, toks + [pad] * (k - len(toks)))


def overrides(p: SAProposal, threshold: int) -> bool:
    """TensorRT-LLM's rule: the SA tokens replace all K neural tokens when match length >= threshold."""
    return p.match_len >= threshold
