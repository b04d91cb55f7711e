"""Per-request results of the reference runtime on one bundle pair, for every method, in one process
group: what tests/test_tensor_parallel.py compares between TP=1 (called in-process) and TP=2
(``python -m torch.distributed.run --nproc-per-node 2 -m eagle3_trt.testing.tp_check ...``, one
launch for every mode, rank 0 writing the JSON).

Modes: the chain, the suffix automaton (sa), the dynamic tree, P-EAGLE (the P-EAGLE bundle's own
method), all greedy by speculative generation; and the chain sampled at ``TEMPERATURE``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from eagle3_trt.atomic import write_json
from eagle3_trt.convert.prompts import load_prompt_records
from eagle3_trt.formats.alpha_report import AlphaReport, report_json
from eagle3_trt.measure.acceptance import Measurement, measure
from eagle3_trt.measure.against import run_against
from eagle3_trt.measure.alpha_run import run_alpha
from eagle3_trt.measure.gate import run_gate
from eagle3_trt.runtime.distributed import tp_session
from eagle3_trt.runtime.loader import engine_from_bundle
from eagle3_trt.speculative.dynamic_tree.builder import DynamicTreeConfig
from eagle3_trt.speculative.dynamic_tree.method import DynamicTreeMethod
from eagle3_trt.speculative.sa.automaton import SAConfig
from eagle3_trt.speculative.sa.method import SuffixAutomatonMethod

TEMPERATURE = 0.8


def _requests(m: Measurement) -> list[dict[str, Any]]:
    return [
        {"id": r.record_id, "tokens": list(r.continuation), "target_forwards": r.stats.target_forwards, "accepted_seq": list(r.stats.accepted_seq)}
        for r in m.results
    ]


_REQUEST_FIELDS = ("id", "turn", "generated_tokens", "target_forwards", "accepted_seq", "accepted_seq_by_k")


def _report_requests(report: AlphaReport | dict[str, Any]) -> list[dict[str, Any]]:
    data = report_json(report) if isinstance(report, AlphaReport) else report
    return [{f: r.get(f) for f in _REQUEST_FIELDS} for r in data["pairs"]["bundle"]["requests"]]


def _untimed(x: Any) -> Any:
    """``x`` without wall-clock figures (they differ from run to run)."""
    if isinstance(x, dict):
        return {k: _untimed(v) for k, v in x.items() if not any(w in str(k) for w in ("time", "wall", "load_s", "elapsed", "seconds"))}
    if isinstance(x, list):
        return [_untimed(v) for v in x]
    return x


def commands(bundle: Path, other: Path, prompts: Path, max_tokens: int) -> dict[str, Any]:
    """What the measuring commands compute from these runs: alpha's estimator with a K sweep, the gate's
    verdict figures, and alpha --against's comparison of two bundles of one target."""
    out: dict[str, Any] = {}
    swept = run_alpha(bundle, prompts, max_tokens=max_tokens, sweep=(1, 2, 3), bf16=False, diagnostics=False)
    out["alpha_sweep"] = _report_requests(swept)
    g = run_gate(bundle, prompts, max_tokens=max_tokens)
    out["gate"] = {k: g[k] for k in ("alpha", "acceptance_length", "cumulative_acceptance", "predicted_speedup", "passed", "turns_measured")}
    report, section, _incomplete = run_against(bundle, other, prompts, max_draft_len=None, concurrency=1, max_tokens=max_tokens)
    out["against"] = {"requests": _report_requests(report), "section": _untimed(section.model_dump())}
    return out


def run(bundle: Path, peagle_bundle: Path, prompts: Path, max_tokens: int, sampled_prompts: Path) -> dict[str, Any]:
    """mode -> per-request (id, generated tokens, target forwards, accepted length per verification)."""
    records = load_prompt_records(prompts, None)
    out: dict[str, Any] = {}
    eng = engine_from_bundle(bundle, device="cpu")

    def one(label: str, engine: Any, method: Any = None, temperature: float = 0.0, recs: Any = records) -> None:
        with engine.using(method):
            m = measure(engine, recs, label=label, max_tokens=max_tokens, method="generate", temperature=temperature, batch_size=4)
        out[label] = _requests(m)

    one("chain", eng)
    one("sa", eng, SuffixAutomatonMethod(SAConfig(threshold=2)))
    one("dynamic_tree", eng, DynamicTreeMethod(DynamicTreeConfig(2, None)))
    one("sampled", eng, temperature=TEMPERATURE, recs=load_prompt_records(sampled_prompts, None))
    del eng
    peng = engine_from_bundle(peagle_bundle, device="cpu")
    out["peagle"] = _requests(measure(peng, records, label="peagle", max_tokens=max_tokens, method="generate", batch_size=4))
    del peng
    out.update(commands(bundle, peagle_bundle, prompts, max_tokens))
    return out


def main(argv: list[str]) -> int:
    bundle, peagle_bundle, prompts, max_tokens, sampled, dest = argv
    with tp_session(1, "cpu"):  # under torchrun: every rank computes, rank 0 writes
        res = run(Path(bundle), Path(peagle_bundle), Path(prompts), int(max_tokens), Path(sampled))
        write_json(Path(dest), res)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
