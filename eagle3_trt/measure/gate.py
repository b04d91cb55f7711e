"""The pre-deployment gate: alpha of the bundle as built, and the speedup the cost model predicts from it."""

from __future__ import annotations

from pathlib import Path

from eagle3_trt.convert.prompts import load_prompt_records, use_chat_template
from eagle3_trt.core.stats import AggregateStats
from eagle3_trt.errors import UserError
from eagle3_trt.measure.acceptance import measure
from eagle3_trt.measure.bundle_costs import bundle_cost_inputs
from eagle3_trt.measure.cost_model import CostParams, Prediction, model_costs, predict
from eagle3_trt.measure.gate_verdict import DEFAULT_GATE_THRESHOLD, alpha_shortfall
from eagle3_trt.pipeline.bundle import Bundle, open_bundle
from eagle3_trt.pipeline.gpus import GpuSpec
from eagle3_trt.runtime.loader import default_device, engine_from_bundle
from eagle3_trt.speculative.registry import DEFAULT_METHOD


def run_gate(
    bundle: Path,
    prompts_file: Path,
    *,
    threshold: float = DEFAULT_GATE_THRESHOLD,
    concurrency: int = 1,
    max_tokens: int = 64,
    limit: int | None = None,
    turns: str = "first",
    device: str | None = None,
    batch_size: int = 16,
    chat_template: bool | None = None,
) -> dict:
    """alpha of the bundle as built and the predicted speedup at ``concurrency``; 'passed' says if both clear the bar."""
    if not 0 <= threshold <= 1:
        raise UserError("--threshold", f"{threshold} is not a probability", "use e.g. 0.55")
    if concurrency < 1:
        raise UserError("--concurrency", f"{concurrency}", "concurrency is at least 1")

    b = open_bundle(Path(bundle))
    k = b.k
    records = load_prompt_records(Path(prompts_file), limit)
    use_chat_template(records, chat_template, source=prompts_file)  # before any model is loaded
    eng = engine_from_bundle(b, device=default_device(device))
    m = measure(eng, records, label=b.label, max_tokens=max_tokens, turns=turns, batch_size=batch_size, k=k, chat_template=chat_template)
    short = m.incomplete(str(prompts_file))
    if short is not None:  # a verdict on fewer turns than asked is no verdict on the file
        raise short
    ov = m.overall()
    pred, gpu, tp = _predicted_speedup(b, ov, concurrency)
    reasons = []
    if (why := alpha_shortfall(ov.alpha, threshold)) is not None:
        reasons.append(why)
    if pred.speedup < 1.0:
        reasons.append(f"predicted speedup {pred.speedup:.2f}x < 1 at concurrency {concurrency} on {gpu.name} (K={k})")
    return {
        "bundle": str(b.path),
        "prompts": str(prompts_file),
        "turns_measured": len(m.results),
        "turns_asked": m.asked,
        "turns_skipped": m.missing,
        "alpha": ov.alpha,
        "acceptance_length": ov.acceptance_length,
        "cumulative_acceptance": ov.cumulative_acceptance,
        "by_category": {c: a.alpha for c, a in m.by_category().items()},
        "threshold": threshold,
        "concurrency": concurrency,
        "max_draft_len": k,
        # what the bundle's options serve and the gate measured: the chain, or the method they select
        # (e.g. sa after recommend --write wrote sa_config)
        "mode": getattr(eng.method, "name", DEFAULT_METHOD),  # as alpha_run names what it served
        "gpu": gpu.name,
        "tp": tp,
        "predicted_speedup": pred.speedup,
        "prediction": pred.to_dict(),
        "passed": not reasons,
        "reasons": reasons,
        # the bundle was calibrated on fewer prompts than its build asked for (manifest calibration.shortfall)
        "calibration_shortfall": b.manifest.calibration.shortfall,
    }


def _predicted_speedup(b: Bundle, ov: AggregateStats, concurrency: int) -> tuple[Prediction, GpuSpec, int]:
    """(the cost model's prediction at the bundle's K and ``concurrency``, the GPU, TP) for the measured acceptance."""
    k = b.k
    ci = bundle_cost_inputs(b)
    gpu, tp, tcost, dcost = model_costs(ci)
    cum = ov.cumulative_acceptance + [0.0] * (k - len(ov.cumulative_acceptance))
    # priced by the bundle's method's own cost hook (speculative/<method>/cost.py)
    return predict(cum, gpu, tcost, dcost, tp, concurrency, k, CostParams(), method=ci["method"], options=ci["options"]), gpu, tp
