"""The dynamic tree as a method: its setup checks, its draft loop and its verification rules."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eagle3_trt.core.method_api import Drafted, DraftingEngine
from eagle3_trt.core.requests import BatchState, Row
from eagle3_trt.core.sampling import SamplingParams
from eagle3_trt.core.spec_sampling import SpecSamplingConfig
from eagle3_trt.core.tree import DraftTree
from eagle3_trt.errors import UserError
from eagle3_trt.speculative.dynamic_tree import cost
from eagle3_trt.speculative.dynamic_tree.builder import DynamicTreeConfig, check_target
from eagle3_trt.speculative.dynamic_tree.drafting import draft_dynamic_tree


@dataclass(frozen=True)
class DynamicTreeMethod:
    """``DynamicTreeConfig`` (dynamic_tree_max_topK, max_total_draft_tokens)."""

    config: DynamicTreeConfig
    name = "dynamic-tree"
    step_seconds = staticmethod(cost.step_seconds)  # the cost model's hook (registry.step_cost)

    @classmethod
    def from_options(cls, spec: Any, at_bundle_k: bool) -> DynamicTreeMethod | None:
        # at another K the bundle's max_total_draft_tokens may not fit, so a K override
        # (alpha --max-draft-len) measures the chain
        if getattr(spec, "use_dynamic_tree", None) and getattr(spec, "dynamic_tree_max_topK", None) and at_bundle_k:
            return cls(DynamicTreeConfig(spec.dynamic_tree_max_topK, spec.max_total_draft_tokens))
        return None

    def served_sampling(self, flags: SpecSamplingConfig) -> SpecSamplingConfig:
        return flags

    def start(self, engine: DraftingEngine, rows: list[Row], tree: DraftTree, tree_spec: Any, params: SamplingParams) -> _DynamicTreeRun:
        """(dynamic_tree_max_topK, max_total_draft_tokens) for this run, or the one-line reason
        TensorRT-LLM refuses the combination. Sampled requests get the tree too: drafted by top-K,
        verified by sampling the target along it (core/verify.py). (The suffix-automaton enhancer is
        refused with it by the options schema: one method per engine.)"""
        cfg, draft = self.config, engine.draft
        assert draft is not None  # a run starts only with a draft
        if tree_spec is not None:
            raise UserError(
                "use_dynamic_tree", "a static tree (eagle_choices) and the dynamic tree are mutually exclusive", "drop the tree or the dynamic tree"
            )
        check_target(engine.target.hf.config)
        if cfg.topk > draft.config.draft_vocab_size:
            raise UserError("dynamic_tree_max_topK", f"{cfg.topk} exceeds the draft vocabulary ({draft.config.draft_vocab_size})", "use a smaller top-K")
        return _DynamicTreeRun(cfg.topk, cfg.total(engine.max_draft_len))


class _DynamicTreeRun:
    # sampled rows: the dynamic tree's target-only rejection kernel draws the same tokens as
    # matching the target's samples (core/verify.py)
    match_samples = True

    def __init__(self, topk: int, total: int) -> None:
        self.topk, self.total = topk, total

    def draft(self, engine: DraftingEngine, rows: list[Row], st: BatchState, tree: DraftTree, k_eff: list[int], active: list[bool]) -> Drafted:
        """Top-K of the draft's softmax at any temperature (``sample`` in eagle3_dynamic_tree.py @057c8a65)."""
        d = engine.drafter()
        node_tok, trees = d.run_with(
            rows,
            st,
            lambda root_h, root_logits: draft_dynamic_tree(d.draft, d.embed, d.d2t_ids, rows, st, self.topk, tree.max_depth, self.total, root_h, root_logits),
        )
        T = node_tok.shape[1]
        return Drafted(node_tok, [[None] * T for _ in rows], list(trees))

    def tree_valid(self, first: bool) -> bool:
        """A row's first decode verifies drafts TensorRT-LLM made in the prefill iteration, for which
        the dynamic tree has no stored tree (``build_dynamic_tree(...[num_contexts:])``,
        ``scatter_to_slot_storage(gen_slots)`` in _torch/speculative/eagle3_dynamic_tree.py
        @057c8a65): verification accepts only the bonus token (``verifyDynamicTreeGreedyKernel`` /
        the rejection kernel with ``treeValid`` false, dynamicTreeKernels.cu @84e55f93)."""
        return not first

    def after_verify(self, gen: Sequence[int], accepted: Mapping[int, Sequence[int]]) -> None:
        return None
