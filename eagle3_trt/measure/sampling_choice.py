"""The speculative sampling flags ``recommend --write`` puts into a bundle (core/spec_sampling.py).

An alpha report measured at temperature > 0 records the flags it was served with
(``settings.spec_sampling``): those are written, so temperature > 0 requests are served as
measured. A greedy measurement does not depend on them; then the flags written are ones that
serve temperature > 0 requests as the target samples (allow_advanced_sampling on, mode full),
keeping the bundle's use_rejection_sampling (off unless set: exact-match verification, which every
release has and which needs no FlashInfer). The evidence goes into the manifest's recommendation
record beside the options, so the two agree.
"""

from __future__ import annotations

from typing import Any

from eagle3_trt.core.spec_sampling import SpecSamplingConfig
from eagle3_trt.formats.alpha_report import AlphaReport
from eagle3_trt.pipeline.llm_options import Eagle3Options


def sampling_choice(report: AlphaReport | None, spec: Eagle3Options) -> tuple[dict[str, Any], dict[str, Any]]:
    """(speculative_config fields to write, evidence for the manifest)."""
    measured = report.settings.spec_sampling if report is not None else None
    if report is not None and measured is not None:
        flags = SpecSamplingConfig(
            use_rejection_sampling=measured.use_rejection_sampling,
            allow_advanced_sampling=measured.allow_advanced_sampling,
            advanced_sampling_mode=measured.advanced_sampling_mode,  # type: ignore[arg-type]  # SpecSamplingConfig checks the name
        )
        why = f"the flags alpha measured temperature {report.settings.temperature} with"
    else:
        flags = SpecSamplingConfig(use_rejection_sampling=bool(spec.use_rejection_sampling), allow_advanced_sampling=True, advanced_sampling_mode="full")
        why = "measured greedily (the flags do not change greedy acceptance): flags that serve temperature > 0 as the target samples"
    fields = {
        "allow_advanced_sampling": flags.allow_advanced_sampling,
        "use_rejection_sampling": flags.use_rejection_sampling,
        "advanced_sampling_mode": flags.advanced_sampling_mode,
    }
    evidence = {"written": fields, "served_at_temperature_above_0": flags.served, "why": why}
    if (warning := flags.warning()) is not None:
        evidence["warning"] = warning
    return fields, evidence


__all__ = ["sampling_choice"]
