"""The suffix-automaton enhancer as a method: the chain drafts, ``SAEnhancer`` overrides (the rules
and their TensorRT-LLM sources: speculative/sa/automaton.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from eagle3_trt.core.method_api import Drafted, DraftingEngine
from eagle3_trt.core.requests import BatchState, Row
from eagle3_trt.core.sampling import SamplingParams
from eagle3_trt.core.spec_sampling import SpecSamplingConfig
from eagle3_trt.core.static_tree_run import StaticTreeRun
from eagle3_trt.core.tree import DraftTree
from eagle3_trt.errors import UserError
from eagle3_trt.speculative.sa import cost
from eagle3_trt.speculative.sa.automaton import SAConfig, SAEnhancer, without_rejection_sampling


@dataclass(frozen=True)
class SuffixAutomatonMethod:
    """``sa_config``: ``SAConfig`` (threshold, enable_global_pool)."""

    config: SAConfig
    name = "sa"
    step_seconds = staticmethod(cost.step_seconds)  # the cost model's hook (registry.step_cost): the chain's

    @classmethod
    def from_options(cls, spec: Any, at_bundle_k: bool) -> SuffixAutomatonMethod | None:
        sa = getattr(spec, "sa_config", None)
        if sa is None:
            return None
        # served as TensorRT-LLM serves the bundle's sa_config: the suffix-automaton enhancer overrides the chain
        return cls(SAConfig(threshold=sa.threshold, enable_global_pool=sa.enable_global_pool))

    def served_sampling(self, flags: SpecSamplingConfig) -> SpecSamplingConfig:
        """TensorRT-LLM's llm_args ``validate_rejection_sampling_config``: sa_config turns
        use_rejection_sampling off."""
        return without_rejection_sampling(flags)

    def start(self, engine: DraftingEngine, rows: list[Row], tree: DraftTree, tree_spec: Any, params: SamplingParams) -> _SARun:
        if not tree.is_chain:
            # TensorRT-LLM's enhancer overrides a [batch, K] linear draft only (sa_enhancer.py)
            raise UserError("sa_config", "the suffix-automaton enhancer works on a chain draft", "drop the tree (tree=None) or sa_config")
        return _SARun(SAEnhancer(self.config, [r.prompt for r in rows], tree.size))  # seeded with the prompts before the prefill


class _SARun(StaticTreeRun):
    def __init__(self, enhancer: SAEnhancer) -> None:
        self.enhancer = enhancer

    def draft(self, engine: DraftingEngine, rows: list[Row], st: BatchState, tree: DraftTree, k_eff: list[int], active: list[bool]) -> Drafted:
        d = super().draft(engine, rows, st, tree, k_eff, active)
        # SADraftEnhancer.maybe_override_all_draft_tokens: all K tokens, stale buffer slots included;
        # sampled requests are matched against the target's samples (no rejection sampling with SA).
        # It overrides drafts of generation rows only (next_draft_tokens[num_contexts:]), so the
        # enhancer has no drafts for a row's first decode.
        for b in range(len(rows)):
            toks = self.enhancer.drafts(b)
            if toks is not None and active[b] and k_eff[b] > 0:
                d.node_tok[b] = torch.tensor(toks)
        return d

    def after_verify(self, gen: Sequence[int], accepted: Mapping[int, Sequence[int]]) -> None:
        # SADraftEnhancer.extend_and_prepare after verification: this iteration's generation rows, in batch order
        self.enhancer.update(gen, accepted)


def sa_config_of(method: object) -> SAConfig | None:
    """The ``sa_config`` an engine serving ``method`` applies (None: not the SA enhancer): what the
    alpha estimator replays (measure/estimator.py)."""
    return method.config if isinstance(method, SuffixAutomatonMethod) else None
