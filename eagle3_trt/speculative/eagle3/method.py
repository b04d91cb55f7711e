"""The EAGLE-3 chain / static tree as a registered method (its run is core/drafting.StaticTreeRun)."""

from __future__ import annotations

from typing import Any

from eagle3_trt.core.method_api import DraftingEngine, MethodRun
from eagle3_trt.core.requests import Row
from eagle3_trt.core.sampling import SamplingParams
from eagle3_trt.core.spec_sampling import SpecSamplingConfig
from eagle3_trt.core.static_tree_run import StaticTreeRun
from eagle3_trt.core.tree import DraftTree
from eagle3_trt.speculative.eagle3 import cost


class Eagle3Chain:
    """The neural chain (a static tree when the request names one): what the engine does with no
    method, as an object for callers that pick methods by name (``alpha --modes chain``)."""

    name = "chain"
    step_seconds = staticmethod(cost.step_seconds)  # the cost model's hook (registry.step_cost)

    @classmethod
    def from_options(cls, spec: Any, at_bundle_k: bool) -> Eagle3Chain | None:
        return None  # the default: chosen when no other method is selected (registry.method_from_options)

    def served_sampling(self, flags: SpecSamplingConfig) -> SpecSamplingConfig:
        return flags

    def start(self, engine: DraftingEngine, rows: list[Row], tree: DraftTree, tree_spec: Any, params: SamplingParams) -> MethodRun:
        return StaticTreeRun()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Eagle3Chain)

    def __hash__(self) -> int:
        return hash(self.name)
