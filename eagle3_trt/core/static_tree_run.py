"""The engine's own drafting as a ``MethodRun`` (core/method_api.py): TensorRT-LLM's one-model
EAGLE-3 chain, or a static tree (``eagle_choices``). Every EAGLE-family method drafts with it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from eagle3_trt.core.method_api import Drafted, DraftingEngine
from eagle3_trt.core.requests import BatchState, Row
from eagle3_trt.core.tree import DraftTree


class StaticTreeRun:
    """The run of the engine's method ``None`` (and of speculative/eagle3). Verification
    rejection-samples unless the served flags say match (core/spec_sampling.py)."""

    match_samples = False

    def draft(self, engine: DraftingEngine, rows: list[Row], st: BatchState, tree: DraftTree, k_eff: list[int], active: list[bool]) -> Drafted:
        # TensorRT-LLM with allow_advanced_sampling but not use_rejection_sampling drafts greedily at any temperature
        greedy_draft = engine.spec_sampling().served == "match"
        node_tok, q_full = engine.drafter(greedy_draft=greedy_draft).run(rows, st, tree, k_eff)
        return Drafted(node_tok, q_full)

    def tree_valid(self, first: bool) -> bool:
        return True

    def after_verify(self, gen: Sequence[int], accepted: Mapping[int, Sequence[int]]) -> None:
        return None
