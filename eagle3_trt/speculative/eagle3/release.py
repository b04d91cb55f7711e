"""``spec_dec_variant`` and ``eagle3_model_arch`` across TensorRT-LLM releases.

What the sources say (NVIDIA/TensorRT-LLM; the git mirror is too large to fetch here, so read through
the search index and the published API reference):

- ``eagle3_model_arch``: ``Literal["llama3", "mistral_large3"] = "llama3"``, "The model
  architecture of the eagle3 model" (``EagleDecodingConfig``, tensorrt_llm/llmapi/llm_args.py
  @00043967; 1.3.0rc27 and 1.4.0rc1 Eagle3DecodingConfig reference pages). It picks the draft
  module TensorRT-LLM builds (``get_draft_model`` under tensorrt_llm/_torch/models, read through the
  search index, path and commit not reported: "llama3" -> ``Eagle3ForCausalLM``, which "handles both Llama3 and DeepSeekV3 architectures";
  "mistral_large3" -> ``MistralLarge3EagleForCausalLM``; llm_args.py then captures layer {-1} when
  ``eagle3_layers_to_capture`` is unset). Which release first has it is not pinned down (it came
  with Mistral Large 3, December 2025, around the 1.2 branch cut), so 1.2 is treated as lacking it
  and 1.3.0rc0 as the first with it, the same band as the other 1.3 keys (pipeline/trtllm_versions.py).
- ``spec_dec_variant``: ``Annotated[int, Gt(gt=0)] = 3`` in the 1.4.0rc1 Eagle3DecodingConfig
  reference page (a DecodingBaseConfig field, listed after ``enable_penalty``); absent from the
  1.3.0rc27 page and from llm_args.py @00043967. Its description is not readable in the index, so
  the toolkit checks only what the signature says (a positive integer), never sets it itself, and
  passes a value the user wrote through unchanged.

A release without a key serves that key's default. Leaving out ``eagle3_model_arch: llama3`` (the
default, and the architecture of every draft this toolkit builds and measures) or
``spec_dec_variant`` (not modelled by the reference runtime, so alpha does not depend on it) is a
note naming the release; leaving out ``eagle3_model_arch: mistral_large3`` would load the draft as
a Llama-3 EAGLE-3 head, not what was measured, so it is refused (the trtllm-serve launch files,
written for every release band, leave it out with a note instead, like sa_config).
"""

from __future__ import annotations

from typing import Any

from eagle3_trt.errors import UserError
from eagle3_trt.speculative.release_keys import drop_lacking

EAGLE3_MODEL_ARCH_SINCE = "1.3.0rc0"
SPEC_DEC_VARIANT_SINCE = "1.4.0rc1"
SINCE = {"eagle3_model_arch": EAGLE3_MODEL_ARCH_SINCE, "spec_dec_variant": SPEC_DEC_VARIANT_SINCE}
DEFAULTS: dict[str, Any] = {"eagle3_model_arch": "llama3", "spec_dec_variant": 3}


def variant_for_release(
    spec: dict[str, Any], version: str | None, spec_fields: frozenset[str] | None = None, where: str = "speculative_config", launch: bool = False
) -> tuple[dict[str, Any], list[str]]:
    """``spec`` without the keys ``version`` lacks, and a note for each; UserError for
    ``eagle3_model_arch`` other than llama3 on a release without it (``launch``: a note instead)."""
    spec, dropped = drop_lacking(spec, SINCE, version, spec_fields)
    notes: list[str] = []
    for key, value in dropped:
        rel = f"TensorRT-LLM {version or 'installed'}"
        if key == "eagle3_model_arch" and value != DEFAULTS[key]:
            if not launch:
                raise UserError(
                    f"{where}.{key}",
                    f"{rel} has no {key} (documented from 1.3); it would build the draft as a Llama-3 EAGLE-3 head, not {value}",
                    "deploy to TensorRT-LLM 1.3 or newer for this draft",
                )
            notes.append(f"{rel}: {key}: {value} left out (the release has no such key): it loads the draft as a Llama-3 EAGLE-3 head")
            continue
        notes.append(f"{rel}: {key}: {value} left out (the release has no such key; it serves the default, {DEFAULTS[key]})")
    return spec, notes


__all__ = ["DEFAULTS", "EAGLE3_MODEL_ARCH_SINCE", "SPEC_DEC_VARIANT_SINCE", "variant_for_release"]
