"""Each speculation mode against the neural chain on the same turns: acceptance-length difference
with a paired bootstrap interval (core/paired_ci.py), so a mode "wins" only beyond run-to-run noise."""

from __future__ import annotations

from eagle3_trt.core.paired_ci import paired_ratio_diff
from eagle3_trt.measure.acceptance import Measurement


def add_vs_chain(out: dict, measured: dict[str, Measurement]) -> None:
    """``out[mode]["vs_chain"]``: AL(mode) - AL(chain) pooled over the turns both measured, and its
    95% paired percentile-bootstrap interval over turns (fixed seed: the same report every run)."""
    chain = measured.get("chain")
    if chain is None:
        return
    base = {(r.record_id, r.turn): r.stats for r in chain.results}
    for mode, m in measured.items():
        pairs = [(r.stats, base[(r.record_id, r.turn)]) for r in m.results if (r.record_id, r.turn) in base]
        if mode == "chain" or not pairs:
            continue
        d = paired_ratio_diff(
            [a.generated_tokens for a, _ in pairs],
            [a.target_forwards for a, _ in pairs],
            [b.generated_tokens for _, b in pairs],
            [b.target_forwards for _, b in pairs],
        )
        out[mode]["vs_chain"] = d.to_dict()
