"""Synthetic alpha reports for unit tests of what reads them (recommend's choices, the gate replay).

Each builder starts from a complete report of zero counts, merges the fields a test sets, and
validates the result through the schema (formats/alpha_report.py), so a test can only build a report
``alpha`` could have written."""

from __future__ import annotations

import copy
from typing import Any

from eagle3_trt.formats.alpha_report import KIND, SCHEMA, TRAFFIC_KIND, AlphaReport, TrafficAlphaReport

_FIGURES: dict[str, Any] = {
    "requests": 0,
    "alpha": 0.0,
    "acceptance_length": 1.0,
    "draft_tokens": 0,
    "accepted_tokens": 0,
    "target_forwards": 0,
    "generated_tokens": 0,
    "drafted_per_position": [],
    "reached_per_position": [],
    "accepted_per_position": [],
    "cumulative_acceptance": [],
    "conditional_acceptance": [],
    "accept_hist": [],
    "request_acceptance_length": [],
    "wall_time_s": 0.0,
}
_MODE_FIGURES: dict[str, Any] = {
    "acceptance_length": 1.0,
    "alpha": 0.0,
    "tokens_verified_per_forward": 1.0,
    "requests": 0,
    "generated_tokens": 0,
    "target_forwards": 0,
    "draft_tokens": 0,
    "accepted_tokens": 0,
}
_TURN: dict[str, Any] = {
    "category": "general",
    "turn": 0,
    "prompt_tokens": 0,
    "generated_tokens": 0,
    "draft_tokens": 0,
    "accepted_tokens": 0,
    "target_forwards": 0,
    "alpha": 0.0,
    "acceptance_length": 1.0,
    "accepted_per_position": [],
    "drafted_per_position": [],
}
_SETTINGS: dict[str, Any] = {
    "prompts": "synthetic",
    "records": 0,
    "limit": None,
    "turns": "all",
    "max_tokens": 16,
    "max_draft_len": 3,
    "method": "estimator",
    "device": "cpu",
    "decoding": "greedy",
    "batch_size": 16,
    "sweep": [],
    "chat_template": "per record",
}


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def alpha_report(
    *, settings: dict[str, Any] | None = None, modes: dict[str, dict[str, Any]] | None = None, requests: list[dict[str, Any]] | None = None
) -> AlphaReport:
    """An ``alpha --prompts`` report: ``settings`` over the defaults; ``modes``: name -> the mode's
    fields (its ``overall`` figures merged over zeros; ``sa_config``, ``dynamic_tree``, ``vs_chain`` as
    given); ``requests``: the bundle pair's turns (each merged over a zero turn, ids given in order)."""
    raw: dict[str, Any] = {
        "schema": SCHEMA,
        "kind": KIND,
        "bundle": "synthetic",
        "settings": _merged(_SETTINGS, settings or {}),
        "pairs": {
            "bundle": {
                "label": "synthetic",
                "overall": dict(_FIGURES),
                "by_category": {},
                "requests": [_merged({**_TURN, "id": f"r{i}"}, r) for i, r in enumerate(requests or [])],
                "skipped": [],
                "seconds": 0.0,
            }
        },
        "delta": {},
        "diagnostics": [],
        "timings": {"load_s": 0.0},
    }
    if modes is not None:
        raw["modes"] = {
            name: {"method": "estimator", "by_category": {}, **m, "overall": _merged(_MODE_FIGURES, m.get("overall", {}))} for name, m in modes.items()
        }
    return AlphaReport.model_validate(raw)


def traffic_report(*, requests: list[dict[str, Any]] | None = None, max_draft_len: int = 3) -> TrafficAlphaReport:
    """An ``alpha --traffic`` report of zero counts holding ``requests`` (request_id, accepted_seq_by_k)."""
    served = {"requests": 0, "acceptance_length": 1.0, "alpha": 0.0, "completion_tokens": 0, "target_forwards": 0}
    raw: dict[str, Any] = {
        "schema": SCHEMA,
        "kind": TRAFFIC_KIND,
        "bundle": "synthetic",
        "bundle_fingerprint": "0" * 64,
        "traffic": "synthetic",
        "max_draft_len": max_draft_len,
        "records": 0,
        "compared": 0,
        "prompts": {"chat": 0, "raw": 0},
        "skipped": {"other_bundles": {}, "unmeasurable": []},
        "per_k": {},
        "offline": {"requests": 0, "alpha": 0.0, "acceptance_length": 1.0, "generated_tokens": 0, "target_forwards": 0},
        "served": served,
        "comparison": {
            "offline_acceptance_length": 1.0,
            "served_acceptance_length": 1.0,
            "diff": 0.0,
            "ci": [0.0, 0.0],
            "level": 0.95,
            "n": 0,
            "prompts": 0,
            "tolerance": 0.02,
            "beyond_sampling_noise": False,
            "greedy": {"requests": 0, "identical": 0, "differ": []},
            "sampled": 0,
        },
        "drift": {"window": 1, "windows": [], "by_category": {}},
        "requests": requests or [],
        "seconds": 0.0,
    }
    return TrafficAlphaReport.model_validate(raw)
