"""The suffix-automaton enhancer's options as a bundle writes them (``speculative_config.sa_config``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SAEnhancerOptions(BaseModel):
    """TensorRT-LLM 1.3+ ``SAEnhancerConfig`` (tensorrt_llm/llmapi/llm_args.py): the suffix automaton's
    tokens replace the neural draft when its match is >= threshold tokens (speculative/sa/automaton.py)."""

    model_config = ConfigDict(extra="forbid")

    threshold: int = Field(4, ge=1, description="minimum suffix-match length for the automaton to override the draft")
    enable_global_pool: bool = Field(False, description="search every active request's automaton, not only the request's own")
