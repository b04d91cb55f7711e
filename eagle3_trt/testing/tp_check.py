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
from eagle3_trt.measure.acceptance import Measurement, measure
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
    return out


def main(argv: list[str]) -> int:
    bundle, peagle_bundle, prompts, max_tokens, sampled, dest = argv
    with tp_session(1, "cpu"):  # under torchrun: every rank computes, rank 0 writes
        res = run(Path(bundle), Path(peagle_bundle), Path(prompts), int(max_tokens), Path(sampled))
        write_json(Path(dest), res)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
