"""Which TensorRT-LLM releases take ``sa_config`` (the suffix-automaton enhancer).

Source: ``Eagle3DecodingConfig.sa_config`` (``SAEnhancerConfig``) came with NVIDIA/TensorRT-LLM PR
#12130 and is in the 1.3.0rc27 API reference (llm-api/reference/Eagle3DecodingConfig.html); 1.2 has
no such field. Which 1.3.0rc first carries it is not pinned down, so 1.3.0rc0 is used, as for the
other 1.3 keys (pipeline/trtllm_versions.py). When TensorRT-LLM is installed, its field list decides.
"""

from __future__ import annotations

from typing import Any

from eagle3_trt.errors import UserError
from eagle3_trt.speculative.release_keys import release_lacks

SA_CONFIG_SINCE = "1.3.0rc0"


def sa_for_release(spec: dict[str, Any], version: str | None, spec_fields: frozenset[str] | None, where: str = "speculative_config") -> dict[str, Any]:
    """``spec`` unchanged where the release has the enhancer; a UserError otherwise (serving without
    it would not be what was measured)."""
    if spec.get("sa_config") is not None and release_lacks(SA_CONFIG_SINCE, "sa_config", version, spec_fields):
        raise UserError(
            f"{where}.sa_config",
            f"TensorRT-LLM {version or 'installed'} has no suffix-automaton enhancer (sa_config came with 1.3, PR #12130)",
            "remove sa_config from the bundle for this release, or use TensorRT-LLM 1.3 or newer",
        )
    return spec


def drop_sa_for_launch(spec: dict[str, Any], version: str | None) -> tuple[dict[str, Any], list[str]]:
    """A launch band's file for a release without sa_config (1.2): the enhancer left out with a note,
    so the same bundle still serves there (``sa_for_release`` refuses it when deploying to that release)."""
    if spec.get("sa_config") is None or not release_lacks(SA_CONFIG_SINCE, "sa_config", version, None):
        return spec, []
    spec = {k: v for k, v in spec.items() if k != "sa_config"}
    return spec, [f"TensorRT-LLM {version}: no suffix-automaton enhancer (sa_config is 1.3+); served without it"]
