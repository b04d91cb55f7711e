"""Which speculation method and K to deploy at each concurrency, from the measured acceptance of
several bundles of one target (``alpha BUNDLE --against OTHER``; ``recommend`` for one bundle).

Each bundle serves one method (the registry's ``method_from_options`` on its speculative_config:
every method registered in speculative/registry.py ``METHODS``). Its measured
cumulative acceptance gives E_K for every K up to the K it was measured at (``cost_model.curves_by_k``);
the cost model prices one iteration of that method through the method's own hook
(``speculative/<method>/cost.py`` ``step_seconds``: the chain K sequential draft forwards, a parallel
drafter one draft forward for all K tokens, the dynamic tree its layer-wise expansion) at each batch size. At
each concurrency the (bundle, K) with the highest predicted speedup wins; when none reaches 1.0,
speculation off is the choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eagle3_trt.measure.bundle_costs import bundle_cost_inputs
from eagle3_trt.measure.cost_model import CostParams, curves_by_k, model_costs, predict
from eagle3_trt.pipeline.bundle import Bundle
from eagle3_trt.speculative.registry import method_class


def estimator_replays(method: str) -> bool:
    """Whether the alpha estimator (measure/estimator.py) replays ``method`` (a registry name): the
    chain and the suffix-automaton enhancer (the estimator walks the chain, replaying SA), and any
    method whose class hands it its later draft slots (``teacher_forced_feed``: e.g. mask
    slots); any other (the dynamic tree) is measured by running speculative generation."""
    return method in ("chain", "sa") or getattr(method_class(method), "teacher_forced_feed", None) is not None


@dataclass(frozen=True)
class Candidate:
    """One bundle as the method choice sees it: its label, method, options, the acceptance curve per
    K it was measured with, and the cost model's inputs read from it."""

    label: str
    method: str
    curves: dict[int, list[float]]  # K -> cumulative acceptance that K is predicted from
    costs: dict[str, Any]  # cost_model.recommend's keyword inputs (bundle_costs.bundle_cost_inputs)
    options: Any = None  # the bundle's speculative_config (the dynamic tree's hook reads its topK / nodes)


def candidate(label: str, b: Bundle, measurement: dict, *, gpu: str | None = None, tp: int | None = None) -> Candidate:
    """A Candidate from a bundle and its alpha measurement (``report["pairs"]["bundle"]``: overall
    cumulative acceptance and, with a sweep, the curve measured at each K)."""
    cum = measurement["overall"]["cumulative_acceptance"]
    by_k = {int(k): v["cumulative_acceptance"] for k, v in (measurement.get("sweep") or {}).items()}
    costs = bundle_cost_inputs(b, gpu=gpu, tp=tp)
    return Candidate(label, costs["method"], curves_by_k(cum, by_k), costs, costs["options"])


@dataclass(frozen=True)
class Choice:
    """The best (bundle, K) at one concurrency, or speculation off (``label`` None, speedup 1.0)."""

    concurrency: int
    label: str | None
    method: str | None
    k: int | None
    speedup: float
    by_bundle: dict[str, tuple[int, float]]  # label -> (its best K, its predicted speedup) here

    def to_dict(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "deploy": self.label,
            "method": self.method,
            "k": self.k,
            "predicted_speedup": round(self.speedup, 4),
            "by_bundle": {lab: {"k": k, "predicted_speedup": round(s, 4)} for lab, (k, s) in self.by_bundle.items()},
        }


def choose(cands: Sequence[Candidate], batches: Sequence[int], params: CostParams | None = None) -> list[Choice]:
    """Per batch size (concurrency): each bundle's best K by predicted speedup (ties: the smaller K),
    and the best bundle overall, or speculation off when no bundle's best reaches 1.0."""
    params = params or CostParams()
    out: list[Choice] = []
    priced = [(c, *model_costs(c.costs)) for c in cands]
    for bs in sorted(set(int(b) for b in batches)):
        by: dict[str, tuple[int, float]] = {}
        for c, gpu, tp, tcost, dcost in priced:
            preds = [predict(c.curves[k], gpu, tcost, dcost, tp, bs, k, params, method=c.method, options=c.options) for k in sorted(c.curves)]
            best = max(preds, key=lambda p: (p.speedup, -p.k))
            by[c.label] = (best.k, best.speedup)
        win = max(cands, key=lambda c: by[c.label][1])
        k, s = by[win.label]
        out.append(Choice(bs, win.label, win.method, k, s, by) if s > 1.0 else Choice(bs, None, None, None, 1.0, by))
    return out
