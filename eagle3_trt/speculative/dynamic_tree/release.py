"""Which TensorRT-LLM releases run the EAGLE-3 dynamic tree (``use_dynamic_tree``,
``dynamic_tree_max_topK``, ``max_total_draft_tokens``; speculative/dynamic_tree/builder.py) on the PyTorch backend.

Sources (NVIDIA/TensorRT-LLM): the PyTorch dynamic-tree worker (tensorrt_llm/_torch/speculative/
eagle3_dynamic_tree.py) came with PR #11982 (opened 2026-03-06, reverted) and PR #13081 "Revert
revert of EAGLE3 dynamic tree speculative decoding support" (merged 2026-04-15); the 1.3.0rc27 and
1.4.0rc1 API reference pages (llm-api/reference/Eagle3DecodingConfig.html) list all three fields.
TensorRT-LLM 1.2's release branch predates both PRs: its EagleDecodingConfig has use_dynamic_tree
and dynamic_tree_max_topK only for the old TensorRT-engine flow, so a 1.2 PyTorch server would not
draft the tree the bundle was measured with. As for the other 1.3 rows of pipeline/trtllm_versions.py,
which 1.3.0rc first carries it is not pinned down; 1.3.0rc0 and later are given it, and an early
rc without the worker fails loudly at load rather than silently serving something else.
"""

from __future__ import annotations

from typing import Any

from packaging.version import Version

from eagle3_trt.errors import UserError

DYNAMIC_TREE_SINCE = "1.3.0rc0"
DYNAMIC_TREE_KEYS = ("use_dynamic_tree", "dynamic_tree_max_topK", "max_total_draft_tokens")


def dynamic_tree_for_release(spec: dict[str, Any], version: str | None, where: str = "speculative_config") -> dict[str, Any]:
    """``spec`` unchanged where the release runs the dynamic tree; a UserError for 1.2 (only the
    version number can tell: 1.2 has fields of the same names for the TensorRT-engine flow)."""
    if not spec.get("use_dynamic_tree") or version is None or Version(version) >= Version(DYNAMIC_TREE_SINCE):
        return spec
    raise UserError(
        f"{where}.use_dynamic_tree",
        f"TensorRT-LLM {version} has no dynamic tree on the PyTorch backend (it came with 1.3, PR #13081)",
        "recommend --write it only for TensorRT-LLM 1.3 or newer, or drop use_dynamic_tree / dynamic_tree_max_topK / max_total_draft_tokens",
    )


def drop_dynamic_tree_for_launch(spec: dict[str, Any], version: str | None) -> tuple[dict[str, Any], list[str]]:
    """A launch band's file for a release without the dynamic tree (1.2): the three keys left out
    with a note, so the same bundle still serves there as the chain (``dynamic_tree_for_release``
    refuses it when deploying to that release)."""
    if not spec.get("use_dynamic_tree") or version is None or Version(version) >= Version(DYNAMIC_TREE_SINCE):
        return spec, []
    spec = {k: v for k, v in spec.items() if k not in DYNAMIC_TREE_KEYS}
    return spec, [f"TensorRT-LLM {version}: no dynamic tree on the PyTorch backend (1.3+); served as the chain of max_draft_len"]
