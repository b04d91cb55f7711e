"""TensorRT-LLM's suffix-automaton draft enhancer (``Eagle3DecodingConfig.sa_config``): the EAGLE-3
chain whose K drafts a row's suffix match overrides. Reference algorithm and sources: automaton.py."""

from __future__ import annotations

from eagle3_trt.speculative.sa.method import SuffixAutomatonMethod, sa_config_of

__all__ = ["SuffixAutomatonMethod", "sa_config_of"]
