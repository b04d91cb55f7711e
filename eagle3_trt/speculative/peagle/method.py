"""P-EAGLE as a method of the decoding loop (core/method_api.py): each step commits the verified draft
inputs as the EAGLE-3 chain does, then drafts the other K-1 tokens from the mask slots
(``draft.parallel_logits``): K tokens from one draft forward, as vLLM's parallel drafting serves them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from eagle3_trt.core.method_api import Drafted, DraftingEngine
from eagle3_trt.core.requests import BatchState, Row
from eagle3_trt.core.sampling import SamplingParams
from eagle3_trt.core.spec_sampling import SpecSamplingConfig
from eagle3_trt.core.tree import DraftTree
from eagle3_trt.errors import UserError
from eagle3_trt.speculative.peagle import cost
from eagle3_trt.speculative.peagle.draft import PEagleDraft, mask_feed, parallel_logits
from eagle3_trt.speculative.peagle.head import PEagleHead
from eagle3_trt.speculative.peagle.training import PEagleTraining


@dataclass(frozen=True)
class PEagleMethod:
    """Parallel drafting over a P-EAGLE head (``PEagleDraft``): K = the engine's ``max_draft_len``."""

    name = "peagle"
    step_seconds = staticmethod(cost.step_seconds)  # the cost model's hook (registry.step_cost): one draft forward for K tokens
    head: ClassVar[type[PEagleHead]] = PEagleHead  # its head format (speculative.registry.method_for_head)
    training: ClassVar[type[PEagleTraining]] = PEagleTraining  # train-draft --method peagle
    # why recommend writes no acceptance-rate switch-off for it (measure/method_gate.py): TensorRT-LLM's
    # gate is its executor's, and no TensorRT-LLM release serves P-EAGLE
    no_switch_off: ClassVar[str] = (
        "vLLM serves it (parallel_drafting), and vLLM has no acceptance-rate switch-off (TensorRT-LLM's acceptance_rate_* keys are its executor's)"
    )

    @staticmethod
    def engine_kwargs(draft: Any) -> dict[str, Any]:
        """What the decoding loop drafts a P-EAGLE head with: this method and the head's own embedding."""
        return {"method": PEagleMethod(), "draft_embed": draft.embed_tokens}

    @staticmethod
    def teacher_forced_feed(draft: Any) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """The estimator's hook (measure/estimator.py ``method_feed``): draft steps >= 2 are mask slots
        (``mask_token_id``, ``mask_hidden`` through fc), not the previous step's output."""
        return mask_feed(draft)

    @classmethod
    def from_options(cls, spec: Any, at_bundle_k: bool) -> PEagleMethod | None:
        # a bundle's speculative_config selects P-EAGLE with vLLM's key (config/speculative.py: parallel_drafting)
        return cls() if getattr(spec, "parallel_drafting", False) else None

    def served_sampling(self, flags: SpecSamplingConfig) -> SpecSamplingConfig:
        return flags

    def start(self, engine: DraftingEngine, rows: list[Row], tree: DraftTree, tree_spec: Any, params: SamplingParams) -> _PEagleRun:
        if not isinstance(engine.draft, PEagleDraft):
            raise UserError(
                "draft",
                "P-EAGLE drafting needs a P-EAGLE head (mask_hidden, mask_token_id)",
                "load a speculators P-EAGLE head (speculators_model_type: peagle)",
            )
        if not tree.is_chain or tree_spec is not None:
            raise UserError("tree", "P-EAGLE drafts a chain of K tokens (vLLM parallel drafting has no tree)", "drop the tree")
        if not params.greedy:
            raise UserError(
                "temperature",
                "P-EAGLE is measured with greedy decoding only (vLLM's probabilistic draft sampling is not implemented here)",
                "measure with temperature 0",
            )
        return _PEagleRun(engine.draft)


class _PEagleRun:
    match_samples = False

    def __init__(self, model: PEagleDraft) -> None:
        self.model = model  # the head (``draft`` is this run's MethodRun method)

    def draft(self, engine: DraftingEngine, rows: list[Row], st: BatchState, tree: DraftTree, k_eff: list[int], active: list[bool]) -> Drafted:
        drafter = engine.drafter(greedy_draft=True)
        K = tree.size  # a chain: node i is draft token i+1

        def from_root(root_h: torch.Tensor, root_logits: torch.Tensor) -> torch.Tensor:
            assert st.d_kv is not None and st.d_valid is not None  # committed by Drafter.run_with
            logits = [root_logits]
            if K > 1:
                root_pos = torch.tensor([len(r.tokens) - 2 for r in rows])  # the bonus slot's draft position
                masks = parallel_logits(self.model, drafter.embed, st.d_kv, st.d_valid, root_pos, K - 1)
                logits += [masks[:, i] for i in range(K - 1)]
            top = torch.stack([lg.argmax(dim=-1) for lg in logits], dim=1)  # vLLM _greedy_sample
            return drafter.d2t_ids[top].cpu()

        node_tok = drafter.run_with(rows, st, from_root)
        return Drafted(node_tok, [[None] * K for _ in rows])

    def tree_valid(self, first: bool) -> bool:
        return True

    def after_verify(self, gen: Sequence[int], accepted: Mapping[int, Sequence[int]]) -> None:
        return None
