"""The speculative sampling flags (core/spec_sampling.py) across TensorRT-LLM releases.

``allow_advanced_sampling`` is a DecodingBaseConfig field in 1.2 (llm_args.py, stored version with
the pre-#12905 ``acceptance_window`` fields: "If true, allows non-greedy sampling when speculation
is used. Only applicable to 1-model code paths"), 1.3 and 1.4 (1.3.0rc27 / 1.4.0rc1 API reference
pages). ``use_rejection_sampling`` (one-model rejection sampling, PR #11001 and successors, after
the 1.2 branch cut) and ``advanced_sampling_mode`` are in the 1.3.0rc27 and 1.4.0rc1 pages and not
in 1.2; which 1.3.0rc first carries them is not pinned down, so 1.3.0rc0 is used (as for the other
1.3 keys in pipeline/trtllm_versions.py). When TensorRT-LLM is installed, its field list decides.

A release without a key serves that key's default. Leaving out a key that holds its default is a
note; leaving out one that does not would serve temperature > 0 requests differently from what
the bundle was measured with, so deploying to that release is refused (the trtllm-serve launcher
files, written for every release band, leave it out with a note instead, like sa_config).
"""

from __future__ import annotations

from typing import Any

from eagle3_trt.errors import UserError
from eagle3_trt.speculative.release_keys import drop_lacking

SAMPLING_FLAGS_SINCE = "1.3.0rc0"  # use_rejection_sampling, advanced_sampling_mode
DEFAULTS: dict[str, Any] = {"use_rejection_sampling": False, "advanced_sampling_mode": "full"}
_EFFECT = {
    "use_rejection_sampling": "it verifies temperature > 0 requests by matching the target's samples instead (same distribution, other acceptance)",
    "advanced_sampling_mode": "it applies every request's top_k and top_p",
}


def sampling_for_release(
    spec: dict[str, Any], version: str | None, spec_fields: frozenset[str] | None = None, where: str = "speculative_config", launch: bool = False
) -> tuple[dict[str, Any], list[str]]:
    """``spec`` without the sampling keys ``version`` lacks, and notes; UserError when a left-out key
    held a value other than the release's default (``launch``: left out with a note instead)."""
    spec, dropped = drop_lacking(spec, dict.fromkeys(DEFAULTS, SAMPLING_FLAGS_SINCE), version, spec_fields)
    notes: list[str] = []
    for key, value in dropped:
        default = DEFAULTS[key]
        rel = f"TensorRT-LLM {version or 'installed'}"
        if value != default and not launch:
            raise UserError(
                f"{where}.{key}",
                f"{rel} has no {key} (1.3+); the bundle's temperature > 0 behaviour was measured with {key}: {value}, and {_EFFECT[key]}",
                f"deploy to TensorRT-LLM 1.3 or newer, or set {key}: {str(default).lower()} in llm_api_options.yaml and measure alpha again",
            )
        note = f"{rel}: {key} left out (the release has no such key)"
        notes.append(note + (f"; {_EFFECT[key]}" if value != default else ""))
    return spec, notes


__all__ = ["DEFAULTS", "SAMPLING_FLAGS_SINCE", "sampling_for_release"]
