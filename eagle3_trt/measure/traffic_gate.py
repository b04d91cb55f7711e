"""``eagle3-trt gate NEW --against OLD --traffic DIR``: deploy a retrained head only when it wins on traffic.

The traffic's held-back split (formats/traffic_split.split_capture, read in bounded memory: deterministic for a seed, no
prompt on both sides, near-duplicates together, started from the sides NEW's own split recorded in
its ``traffic_split.json``: the part a head trained on this traffic never saw) is measured on both bundles, each record as it was served (measure/traffic_measure.py). The
gate passes only when all three hold:

1. NEW's acceptance length (AL, tokens per target forward, prefill counted) beats OLD's by the
   margin with confidence: the whole 95% paired-bootstrap interval of AL_new - AL_old over the
   held-back requests (core/paired_ci.py) lies above ``margin`` (tokens per forward);
2. lossless: on every greedy held-back request NEW's speculative output equals its target's
   own greedy output (target-only decoding), and that equals OLD's target output (a new head
   must not change the answers users get);
3. the seeds' gate still holds for NEW at its planned K on this traffic: alpha >= threshold
   (measure/gate_verdict.py), or the cost model predicts speculation at least breaks even
   (speedup >= 1 at ``concurrency``, measure/gate.py).

Refused in one line before any model is loaded: NEW built from another target than OLD (the
manifests' target source digests differ), traffic served by a bundle that is neither OLD, NEW nor
NEW's lineage parent (its target cannot be checked; ``--allow-other-bundles`` vouches for it, as
for ``train-draft --traffic``; a token id outside the target's vocabulary is refused either way), and a held-back split with fewer than
``MIN_HELDOUT`` distinct prompts (the split's prompt groups: a prompt sent twice, or a near-duplicate,
is one; the bootstrap resamples these groups, core/paired_ci.py): with fewer the percentile bootstrap's 95% interval under-covers
(its coverage rests on the per-request mean being near normal) and is as wide as the gains a
head retrain gives (a few tenths of a token per forward on requests whose AL spreads by about 1),
so no verdict either way would mean anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from eagle3_trt.core.paired_ci import paired_ratio_diff
from eagle3_trt.core.stats import aggregate
from eagle3_trt.errors import UserError
from eagle3_trt.formats.traffic import TrafficRecord
from eagle3_trt.formats.traffic_split import SPLIT_SIDES_FILE, SplitSides, read_split_sides, split_capture, split_traffic
from eagle3_trt.measure.gate import _predicted_speedup
from eagle3_trt.measure.gate_verdict import DEFAULT_GATE_THRESHOLD, alpha_shortfall
from eagle3_trt.measure.traffic_measure import TrafficItem, greedy_outputs, measure_items, prepare, prompt_groups
from eagle3_trt.pipeline.bundle import Bundle, open_bundle
from eagle3_trt.runtime.loader import default_device, engine_from_bundle

DEFAULT_MARGIN = 0.05  # tokens per target forward
DEFAULT_HOLDOUT_FRACTION = 0.2
MIN_HELDOUT = 20  # distinct held-back prompts (prompt groups; module docstring)


def target_digests(b: Bundle) -> dict[str, str]:
    return {name: d.sha256 for name, d in b.manifest.sources.target.files.items()}


def check_same_target(new: Bundle, old: Bundle) -> None:
    a, b = target_digests(new), target_digests(old)
    if a != b:
        diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        raise UserError(
            new.path,
            f"was built from another target than OLD {old.path} (manifest sources.target digests differ: {', '.join(diff[:3])})",
            "gate a new draft head against the bundle serving the same target",
        )


def _known_bundles(new: Bundle, old: Bundle) -> dict[str, str]:
    known = {old.manifest.fingerprint: "OLD", new.manifest.fingerprint: "NEW"}
    lineage = new.manifest.lineage
    if lineage is not None:
        known.setdefault(lineage.parent_fingerprint, "NEW's parent")
    return known


def split_settings(new: Bundle, seed: int | None, holdout_fraction: float | None) -> tuple[int, float]:
    """(seed, fraction) of the held-back split: NEW's lineage's (the split it was trained beside) unless
    given; a value that contradicts the lineage is refused, as that split would hold prompts NEW trained on."""
    lin = new.manifest.lineage
    if lin is None:
        return (0 if seed is None else seed), (DEFAULT_HOLDOUT_FRACTION if holdout_fraction is None else holdout_fraction)
    for opt, given, recorded in (("--seed", seed, lin.heldout_seed), ("--holdout-fraction", holdout_fraction, lin.heldout_fraction)):
        if given is not None and given != recorded:
            raise UserError(
                opt,
                f"{given} differs from the {recorded} NEW's manifest lineage records for its held-back split",
                "drop the option: that split would hold back prompts NEW was trained on",
            )
    return lin.heldout_seed, lin.heldout_fraction


def split_sides_of(new: Bundle) -> SplitSides | None:
    """The sides of the split NEW was trained beside (its ``SPLIT_SIDES_FILE``): the gate's split starts
    from them, so no prompt NEW trained on is held back however the capture grew. A NEW retrained on
    traffic without one is refused: a split drawn afresh could hold back prompts it trained on."""
    sides = read_split_sides(new.path / SPLIT_SIDES_FILE)
    if sides is None and new.manifest.lineage is not None:
        raise UserError(
            new.path / SPLIT_SIDES_FILE,
            "is missing: NEW was retrained on traffic, and without the sides of its split the gate could hold back prompts it trained on",
            "retrain NEW with this version's train-draft --traffic (it writes the file), or restore the file from where NEW was built",
        )
    return sides


class BundleCount:
    """How many records each bundle served, counted as the capture is read (``visit``)."""

    def __init__(self) -> None:
        self.by_fingerprint: dict[str, int] = {}

    def visit(self, r: TrafficRecord) -> None:
        self.by_fingerprint[r.bundle_fingerprint] = self.by_fingerprint.get(r.bundle_fingerprint, 0) + 1


def check_traffic_bundles(count: BundleCount, new: Bundle, old: Bundle, traffic_dir: Path) -> None:
    known = _known_bundles(new, old)
    unknown = {fp: n for fp, n in count.by_fingerprint.items() if fp not in known}
    if unknown:
        fp, n = max(unknown.items(), key=lambda kv: kv[1])
        raise UserError(
            traffic_dir,
            f"{sum(unknown.values())} of {sum(count.by_fingerprint.values())} records were served by bundle {fp[:12]} (and {len(unknown) - 1} other), "
            f"neither OLD ({old.manifest.fingerprint[:12]}) nor NEW ({new.manifest.fingerprint[:12]}): the gate cannot tell they come from this target",
            "gate on the traffic OLD served (serve --capture DIR), or pass --allow-other-bundles if that bundle served the same target",
        )


def heldout_records(
    records: Sequence[TrafficRecord], seed: int, holdout_fraction: float, traffic_dir: Path, *, from_lineage: bool = False
) -> list[TrafficRecord]:
    """The held-back split, refused when it has too few distinct prompts. ``from_lineage``: the fraction is
    the one NEW's manifest lineage records (train-draft --traffic chose it), which `gate --holdout-fraction`
    may not change (split_settings), so the hint names the option that sets it."""
    held = list(split_traffic(list(records), seed=seed, holdout_fraction=holdout_fraction).heldout)
    check_heldout(held, len(records), holdout_fraction, traffic_dir, from_lineage=from_lineage)
    return held


def check_heldout(held: Sequence[TrafficRecord], records: int, holdout_fraction: float, traffic_dir: Path, *, from_lineage: bool) -> None:
    """Refuse a held-back split with fewer than ``MIN_HELDOUT`` distinct prompts (``heldout_records``)."""
    distinct = len(set(prompt_groups(held).values()))
    if distinct < MIN_HELDOUT:
        raise UserError(
            traffic_dir,
            f"the held-back split has {len(held)} requests from {distinct} distinct prompts (of {records} requests, --holdout-fraction {holdout_fraction:g}); "
            f"the gate needs at least {MIN_HELDOUT} distinct prompts for a 95% interval of the AL difference narrow and reliable enough to decide "
            "(a prompt sent again adds no independent evidence)",
            "capture traffic with more distinct prompts, or retrain NEW with a larger `train-draft --traffic ... --holdout-fraction` "
            "(its manifest lineage fixes the split the gate uses)"
            if from_lineage
            else "capture traffic with more distinct prompts or raise --holdout-fraction",
        )


def _measure(b: Bundle, records: Sequence[TrafficRecord], *, device: str, batch_size: int, traffic_dir: Path, say, lossless: bool):
    say(f"loading {b.path} ({b.label})")
    eng = engine_from_bundle(b, device=device)
    items, skipped = prepare(records, eng, source=str(traffic_dir))
    measure_items(eng, items, k=b.k, batch_size=batch_size, say=say)
    spec: list[list[int]] = []
    if lossless:
        greedy = [it for it in items if it.greedy]
        say(f"speculative greedy generation of {len(greedy)} requests (lossless check)")
        spec = greedy_outputs(eng, greedy, speculate=True, batch_size=batch_size)
    return items, skipped, spec


def run_traffic_gate(
    new: Path,
    old: Path,
    traffic_dir: Path,
    *,
    margin: float = DEFAULT_MARGIN,
    seed: int | None = None,
    holdout_fraction: float | None = None,
    threshold: float = DEFAULT_GATE_THRESHOLD,
    concurrency: int = 1,
    device: str | None = None,
    batch_size: int = 16,
    allow_other_bundles: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """The gate's result dict; ``passed`` and ``reasons`` say the verdict (module docstring)."""
    say = progress or (lambda m: None)
    if margin < 0:
        raise UserError("--margin", f"{margin} is negative", "the AL gain NEW must show, in tokens per target forward, e.g. 0.05")
    if holdout_fraction is not None and not 0 < holdout_fraction < 1:
        raise UserError("--holdout-fraction", f"{holdout_fraction}", "a fraction in (0, 1), e.g. 0.2")
    if not 0 <= threshold <= 1:
        raise UserError("--threshold", f"{threshold} is not a probability", "use e.g. 0.55")
    if concurrency < 1:
        raise UserError("--concurrency", f"{concurrency}", "concurrency is at least 1")
    nb, ob = open_bundle(Path(new)), open_bundle(Path(old))
    check_same_target(nb, ob)
    seed, holdout_fraction = split_settings(nb, seed, holdout_fraction)
    # bounded memory: pass 1 keeps a digest per record (formats/traffic_split.split_capture); only the
    # held-back records, which are measured, are read back and kept
    count = BundleCount()
    previous = split_sides_of(nb)
    split = split_capture(Path(traffic_dir), seed=seed, holdout_fraction=holdout_fraction, previous=previous, visit=count.visit)
    if not allow_other_bundles:  # as train-draft --traffic: the user vouches the other bundles served this target
        check_traffic_bundles(count, nb, ob, Path(traffic_dir))
    held = list(split.heldout)
    check_heldout(held, split.records, holdout_fraction, Path(traffic_dir), from_lineage=nb.manifest.lineage is not None)
    device = default_device(device)
    t0 = time.perf_counter()
    old_items, old_skipped, _ = _measure(ob, held, device=device, batch_size=batch_size, traffic_dir=Path(traffic_dir), say=say, lossless=False)
    new_items, new_skipped, spec = _measure(nb, held, device=device, batch_size=batch_size, traffic_dir=Path(traffic_dir), say=say, lossless=True)
    pairs = _pairs(old_items, new_items)
    group_of = prompt_groups(held)
    pair_groups = [group_of[id(o.record)] for o, _ in pairs]
    if len(set(pair_groups)) < MIN_HELDOUT:
        first = (old_skipped + new_skipped + ["?"])[0]
        raise UserError(
            traffic_dir,
            f"only {len(pairs)} of the {len(held)} held-back requests, from {len(set(pair_groups))} distinct prompts, can be measured on both bundles "
            f"(first skipped: {first}); the gate needs at least {MIN_HELDOUT} distinct prompts",
            "capture more finished requests",
        )
    say(f"judging on {len(pairs)} held-back requests from {len(set(pair_groups))} distinct prompt groups (of {split.groups} groups in {split.records} records)")
    d = paired_ratio_diff(
        [n.stats.generated_tokens for o, n in pairs],  # type: ignore[union-attr]
        [n.stats.target_forwards for o, n in pairs],  # type: ignore[union-attr]
        [o.stats.generated_tokens for o, n in pairs],  # type: ignore[union-attr]
        [o.stats.target_forwards for o, n in pairs],  # type: ignore[union-attr]
        seed=seed,
        groups=pair_groups,
    )
    lossless = _lossless(new_items, spec, {id(o.record): o for o, _ in pairs})
    ov = aggregate(n.stats for _, n in pairs if n.stats is not None)
    pred, gpu, tp = _predicted_speedup(nb, ov, concurrency)
    short = alpha_shortfall(ov.alpha, threshold)
    seeds_holds = short is None or pred.speedup >= 1.0
    reasons = []
    if not d.lo > margin:
        reasons.append(f"AL gain {d.diff:+.3f} is not above the margin {margin:g} with 95% confidence (CI [{d.lo:+.3f}, {d.hi:+.3f}])")
    if lossless["not_lossless"]:
        reasons.append(f"NEW's speculative greedy output differs from its target's on {len(lossless['not_lossless'])} requests (not lossless)")
    if lossless["differs_from_old"]:
        reasons.append(f"NEW's target greedy output differs from OLD's on {len(lossless['differs_from_old'])} requests")
    if not seeds_holds:
        reasons.append(f"seeds' gate: {short} and predicted speedup {pred.speedup:.2f}x < 1 at concurrency {concurrency} on {gpu.name} (K={nb.k})")
    return {
        "schema": 1,
        "kind": "eagle3-trt gate --traffic report",
        "new": {"bundle": str(nb.path), "fingerprint": nb.manifest.fingerprint, "acceptance_length": d.a, "alpha": ov.alpha, "max_draft_len": nb.k},
        "old": {
            "bundle": str(ob.path),
            "fingerprint": ob.manifest.fingerprint,
            "acceptance_length": d.b,
            "alpha": aggregate(o.stats for o, _ in pairs if o.stats).alpha,
            "max_draft_len": ob.k,
        },
        "traffic": {
            "dir": str(traffic_dir),
            "records": split.records,
            "heldout": len(held),
            "heldout_prompts": len(set(group_of.values())),
            "judged_prompt_groups": d.n_groups,  # the held-back prompt groups measured on both bundles: the bootstrap's units
            "groups": split.groups,
            "seed": seed,
            "holdout_fraction": holdout_fraction,
        },
        "acceptance_length_gain": {
            **d.to_dict(),
            "margin": margin,
            "method": "paired percentile bootstrap over held-back prompt groups (cluster bootstrap: a prompt's requests resampled together)",
            "measured_on": f"{d.n} held-back requests from {d.n_groups} distinct prompts of {traffic_dir} (split seed {seed}, fraction {holdout_fraction:g})",
        },
        "per_request": [
            {"request_id": o.record.request_id, "greedy": o.greedy, "old_al": o.stats.acceptance_length, "new_al": n.stats.acceptance_length}  # type: ignore[union-attr]
            for o, n in pairs
        ],
        "lossless": lossless,
        "seeds_gate": {
            "alpha": ov.alpha,
            "threshold": threshold,
            "alpha_shortfall": short,
            "predicted_speedup": pred.speedup,
            "concurrency": concurrency,
            "gpu": gpu.name,
            "tp": tp,
            "holds": seeds_holds,
        },
        "skipped": sorted(set(old_skipped) | set(new_skipped)),
        "seconds": time.perf_counter() - t0,
        "passed": not reasons,
        "reasons": reasons,
    }


def _pairs(old_items: Sequence[TrafficItem], new_items: Sequence[TrafficItem]) -> list[tuple[TrafficItem, TrafficItem]]:
    # keyed by the record object both bundles measured (request ids need not be unique across servers)
    by_rec = {id(n.record): n for n in new_items if n.stats is not None}
    return [(o, by_rec[id(o.record)]) for o in old_items if o.stats is not None and id(o.record) in by_rec]


def _lossless(new_items: Sequence[TrafficItem], spec: Sequence[list[int]], old_by_rec: dict[int, TrafficItem]) -> dict:
    greedy = [it for it in new_items if it.greedy]
    not_lossless = [it.record.request_id for it, s in zip(greedy, spec) if s != it.output_ids]
    differs = [it.record.request_id for it in greedy if id(it.record) in old_by_rec and old_by_rec[id(it.record)].output_ids != it.output_ids]
    return {"greedy_requests": len(greedy), "not_lossless": not_lossless, "differs_from_old": differs}


def verdict_line(res: dict) -> str:
    g, ll, sg = res["acceptance_length_gain"], res["lossless"], res["seeds_gate"]
    n_ok = ll["greedy_requests"] - len(ll["not_lossless"])
    head = (
        f"gate: {'PASS' if res['passed'] else 'FAIL'} new AL {g['a']:.3f} vs old {g['b']:.3f} "
        f"({g['diff']:+.3f}, {round(g['level'] * 100)}% CI [{g['ci'][0]:+.3f}, {g['ci'][1]:+.3f}], margin {g['margin']:g}, "
        f"on {g['measured_on']}); "
        f"lossless {n_ok}/{ll['greedy_requests']} greedy; seeds' gate alpha {sg['alpha']:.3f} (threshold {sg['threshold']:g}), "
        f"speedup {sg['predicted_speedup']:.2f}x: {'holds' if sg['holds'] else 'fails'}"
    )
    return head + ("" if res["passed"] else " -- " + "; ".join(res["reasons"]))
