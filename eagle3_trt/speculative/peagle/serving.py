"""Which engines serve a P-EAGLE head, and how each is told (the method's release table).

- vLLM: ``--speculative-config`` ``{"method": "eagle3", "model": <head>, "num_speculative_tokens": K,
  "parallel_drafting": true}``: what ``SpeculatorsConfig.build_vllm_speculative_config``
  (``vllm/transformers_utils/configs/speculators/base.py`` @ 052316aeab2a1b2a9076518f20fe776052b947c9)
  derives from a speculators ``peagle`` head itself; written out so that the launcher does not depend on
  vLLM detecting the method from the checkpoint. The mask token is the head's ``mask_token_id``
  (``_init_parallel_drafting_params``, llm_base_proposer.py @ 00c4f22dae4795e34658bead82fa071e6bb7ae39).
- SGLang, TensorRT-LLM: none (see speculative/peagle/__init__.py); ``compile`` and Triton refuse a P-EAGLE
  head in one line (formats.draft_producers, on the EAGLE-3 path every TensorRT-LLM build takes).
"""

from __future__ import annotations

from typing import Any

from eagle3_trt.errors import UserError

NOT_SERVED = {
    "tensorrt_llm": "no TensorRT-LLM release serves P-EAGLE (_torch/speculative/pard.py @ 051edebb: PARD drafts without target hidden states)",
    "sglang": "sgl-project/sglang has no P-EAGLE algorithm (speculative/spec_info.py @ 009db01a: EAGLE, EAGLE3)",
}


def vllm_speculative_config(draft_path: str, k: int) -> dict[str, Any]:
    """vLLM's --speculative-config for a P-EAGLE head at ``draft_path`` drafting ``k`` tokens per step."""
    if k < 1:
        raise UserError("num_speculative_tokens", f"{k}: P-EAGLE drafts at least one token", "use K >= 1")
    return {"method": "eagle3", "model": draft_path, "num_speculative_tokens": int(k), "parallel_drafting": True}


def serving_table(draft_path: str, k: int) -> dict[str, Any]:
    """What a P-EAGLE bundle says about each engine: vLLM's config, the others' one-line reason."""
    return {"vllm": vllm_speculative_config(draft_path, k), **{name: {"served": False, "why": why} for name, why in NOT_SERVED.items()}}
