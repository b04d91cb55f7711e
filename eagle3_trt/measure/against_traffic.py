"""``alpha BUNDLE --against OTHER --traffic DIR``: the two bundles compared on captured requests.

Every greedy request of the capture (whichever bundle of this target served it: the token ids are the
target's, ``traffic_measure.prepare`` refuses another tokenizer's) is measured offline on exactly the
token ids the model saw, with its served cap, by both bundles alike: through the estimator where it
replays the bundle's method (measure/method_choice.estimator_replays: one continuation serves every
K up to the bundle's), else by running speculative generation. Sampled requests are left out: the
two bundles would draw different samples, so their turns would not pair. Requests pair by request
id; the bootstrap resamples prompt groups (traffic_measure.prompt_groups: the same or a
near-duplicate prompt is one unit), per category where the capture records one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from eagle3_trt.core.engine import SamplingParams
from eagle3_trt.errors import UserError
from eagle3_trt.formats.against_report import AgainstComparison
from eagle3_trt.formats.traffic import TrafficRecord, iter_traffic
from eagle3_trt.measure.acceptance import Measurement, TurnResult
from eagle3_trt.measure.against import UNCATEGORIZED, check_same_target, compare
from eagle3_trt.measure.bundle_costs import method_of
from eagle3_trt.measure.method_choice import estimator_replays
from eagle3_trt.measure.traffic_measure import measure_items, prepare, prompt_groups
from eagle3_trt.pipeline.bundle import Bundle, open_bundle
from eagle3_trt.runtime.loader import default_device, engine_from_bundle

PAIRED_BY = "captured request (request id; a prompt group's requests resampled together)"


def measure_on_traffic(
    b: Bundle, records: list[TrafficRecord], *, k: int, device: str | None, batch_size: int, source: str, say: Callable[[str], None]
) -> dict:
    """``b``'s measurement of the greedy captured requests, in the alpha report's pair form
    (``Measurement.to_dict``: one turn per request, id = request id)."""
    say(f"loading {b.path} ({b.label})")
    eng = engine_from_bundle(b, device=default_device(device), max_draft_len=k)
    items, skipped = prepare(records, eng, source=source)
    skipped += [f"{it.record.request_id}: sampled (temperature {it.record.sampling.temperature}): not paired" for it in items if not it.greedy]
    greedy = [it for it in items if it.greedy]
    if not greedy:
        raise UserError(source, f"holds no greedy request {b.path} can measure ({len(records)} read)", "capture greedy requests (temperature 0)")
    t0 = time.perf_counter()
    if estimator_replays(method_of(b)):
        measure_items(eng, greedy, k=k, sweep=tuple(range(1, k + 1)), batch_size=batch_size, say=say)
    else:
        say(f"the bundle serves {method_of(b)}: {len(greedy)} requests measured by speculative generation")
        for it in greedy:
            (res,) = eng.generate([list(it.record.prompt_ids)], SamplingParams(max_tokens=it.max_tokens))
            it.stats, it.output_ids = res.stats, list(res.token_ids)
    results = [
        TurnResult(it.record.request_id, it.record.category or UNCATEGORIZED, 1, len(it.record.prompt_ids), it.stats, it.output_ids, [], it.stats_by_k)
        for it in greedy
        if it.stats is not None
    ]
    return Measurement(b.label, results, skipped, time.perf_counter() - t0, chat_template=False).to_dict()


def run_against_traffic(
    bundle: Path,
    other: Path,
    traffic_dir: Path,
    *,
    max_draft_len: int | None,
    concurrency: int,
    device: str | None = None,
    batch_size: int = 16,
    progress: Callable[[str], None] | None = None,
) -> AgainstComparison:
    """Both bundles measured on the captured greedy requests; the comparison (measure/against.py)."""
    say = progress or (lambda m: None)
    a, o = open_bundle(Path(bundle)), open_bundle(Path(other))
    check_same_target(a, o)  # before anything is read or loaded
    records = list(iter_traffic(Path(traffic_dir)))
    if not records:
        raise UserError(traffic_dir, "holds no captured request", "pass a capture directory (serve --capture DIR)")
    group = prompt_groups(records)
    group_by_id = {r.request_id: group[id(r)] for r in records}
    meas = [measure_on_traffic(x, records, k=int(max_draft_len or x.k), device=device, batch_size=batch_size, source=str(traffic_dir), say=say) for x in (a, o)]
    return compare(
        a,
        o,
        meas[0],
        meas[1],
        concurrency=concurrency,
        k_a=int(max_draft_len or a.k),
        k_b=int(max_draft_len or o.k),
        group_of=lambda r: group_by_id[str(r["id"])],
        paired_by=PAIRED_BY,
    )
