"""The one alpha bar: read by `gate`, bench's verdict and the build's held-out check.

Kept apart from gate.py so that bench and the build summary read it without loading a model.
"""

from __future__ import annotations

DEFAULT_GATE_THRESHOLD = 0.55


def alpha_shortfall(alpha: float | None, threshold: float = DEFAULT_GATE_THRESHOLD) -> str | None:
    """The one alpha bar (``gate``, ``bench``'s verdict, the build's held-out check): None when
    ``alpha`` clears ``threshold``, else why it does not."""
    if alpha is None:
        return "alpha unavailable"
    if alpha < threshold:
        return f"alpha {alpha:.3f} < threshold {threshold:g}"
    return None


def build_acceptance_verdict(alpha: float, bundle: str, rerun: str, threshold: float = DEFAULT_GATE_THRESHOLD) -> str:
    """The line a build that measured acceptance ends with: alpha, the bar, PASS/FAIL and what it
    means (``gate`` on the same prompts would exit 0 or 3; the user's traffic is what counts)."""
    why = alpha_shortfall(alpha, threshold)
    verdict = f"PASS: alpha {alpha:.3f} >= threshold {threshold:g}" if why is None else f"FAIL: {why}"
    would = "pass it" if why is None else "fail it (exit 3)"
    return (
        f"gate: {verdict} on the held-out prompts: `eagle3-trt gate`'s alpha check would {would} on them; "
        f"check your own traffic with `eagle3-trt gate {bundle} --prompts FILE` (rerun this check: {rerun})"
    )
