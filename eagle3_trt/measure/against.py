"""``eagle3-trt alpha BUNDLE --against OTHER``: two bundles of one target measured on the same prompts
(or the same captured requests), compared turn by turn, and which to deploy.

Works for any two bundles of the same target: EAGLE-3 FP8 against BF16, two K, two heads, EAGLE-3
against another registered method. The targets must be the same checkpoint (``sources.target.files`` of the two
manifests: the BF16 source's file digests; a quantized target built from it is the same target),
else the comparison is refused in one line: another target's acceptance says nothing about this one.

Both bundles are measured alike (``alpha_run.run_alpha`` on the same records, the same turns and
max_tokens; greedy, so the continuations are the target's own). Each turn is then paired by
(record id, turn) and, per category (the prompt set's ``category``; ``uncategorized`` without one)
and overall:

- AL (tokens per target forward) and alpha (accepted / drafted) of each, and the paired difference
  A - B with its 95% interval: core/paired_ci.py's percentile bootstrap, resampling prompts (a
  conversation's turns move together), so prompt-to-prompt spread stays out of the difference;
- the predicted speedup of each at ``--concurrency``: the cost model (measure/cost_model.py) prices
  one iteration of each bundle's method through the method's hook at the K it was measured at,
  S = AL * T_base / T_iter(AL); the difference's interval is the same bootstrap with S applied to
  each side's resampled AL (``transform_a``/``transform_b``);
- per concurrency, the method and K to deploy (measure/method_choice.py), speculation off where
  neither pays.

Which to deploy at ``--concurrency``: the per-concurrency choice there (each bundle at its best K),
speculation off when neither reaches 1.0x; the line also gives the measured comparison at the K
each bundle was measured at and whether its interval excludes 0 (a difference beyond noise) or not.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_trt.core.paired_ci import PairedDiff, paired_ratio_diff
from eagle3_trt.errors import IncompleteMeasurement, UserError
from eagle3_trt.formats.against_report import AgainstComparison, OtherFigures
from eagle3_trt.formats.alpha_report import report_json
from eagle3_trt.measure.acceptance import incomplete
from eagle3_trt.measure.alpha_run import run_alpha
from eagle3_trt.measure.bundle_costs import method_of, recommendation_batches
from eagle3_trt.measure.cost_model import CostParams, model_costs, predict_from_tokens
from eagle3_trt.measure.method_choice import Candidate, candidate, choose, estimator_replays
from eagle3_trt.pipeline.bundle import Bundle, open_bundle

UNCATEGORIZED = "uncategorized"


def check_same_target(a: Bundle, b: Bundle) -> None:
    """One line when ``a`` and ``b`` were built from different target checkpoints (manifest
    ``sources.target``: the file digests of the BF16 source; its path, for the message)."""
    ta, tb = a.manifest.sources.target, b.manifest.sources.target
    if {n: f.sha256 for n, f in ta.files.items()} != {n: f.sha256 for n, f in tb.files.items()}:
        raise UserError(
            str(b.path),
            f"serves another target ({tb.path}) than {a.path} ({ta.path}): the target checkpoints' file digests differ (manifest.json sources.target.files)",
            "compare two bundles built from the same target",
        )


def labels(a: Bundle, b: Bundle) -> tuple[str, str]:
    """Short names for the two bundles: their folder names, else their paths."""
    la, lb = Path(a.path).name, Path(b.path).name
    return (la, lb) if la != lb else (str(a.path), str(b.path))


@dataclass(frozen=True)
class Side:
    """One bundle as compared: label, method, the K it was measured at, and its cost inputs."""

    label: str
    method: str
    k: int
    cand: Candidate

    def speedup(self, concurrency: int, params: CostParams) -> Callable[[float], float]:
        """AL -> predicted speedup of this bundle's method at K and ``concurrency``."""
        gpu, tp, tcost, dcost = model_costs(self.cand.costs)
        return lambda al: predict_from_tokens(al, gpu, tcost, dcost, tp, concurrency, self.k, params, method=self.method, options=self.cand.options).speedup


def _turns(measurement: dict) -> dict[tuple[str, str, int, int], dict]:
    """Each measured turn by (record id, category, turn, occurrence): both bundles measure the same
    records in the same order, and a prompt file may repeat an id (raw lines are numbered, chat
    records carry their question_id), so repeats are told apart by their order."""
    seen: dict[tuple[str, str, int], int] = {}
    out = {}
    for r in measurement["requests"]:
        key = (str(r["id"]), str(r.get("category") or UNCATEGORIZED), int(r["turn"]))
        seen[key] = seen.get(key, 0) + 1
        out[(*key, seen[key])] = r
    return out


def _row(name: str, pairs: list[tuple[dict, dict]], a: Side, b: Side, concurrency: int, params: CostParams, group_of: Callable[[dict], Hashable]) -> dict:
    """One category's figures: both sides' AL, alpha and predicted speedup, and the paired differences."""
    groups = [group_of(ra) for ra, _ in pairs]  # resampled together: a conversation's turns, a prompt's requests

    def diff(num: str, den: str, **kw: Any) -> PairedDiff:
        return paired_ratio_diff(
            [ra[num] for ra, _ in pairs], [ra[den] for ra, _ in pairs], [rb[num] for _, rb in pairs], [rb[den] for _, rb in pairs], groups=groups, **kw
        )

    al = diff("generated_tokens", "target_forwards")
    alpha = diff("accepted_tokens", "draft_tokens")
    sp = diff("generated_tokens", "target_forwards", transform_a=a.speedup(concurrency, params), transform_b=b.speedup(concurrency, params))
    return {
        "category": name,
        "turns": len(pairs),
        "prompts": al.n_groups,
        "acceptance_length": al.to_dict(),
        "alpha": alpha.to_dict(),
        "predicted_speedup": sp.to_dict(),
    }


def compare(
    a: Bundle,
    b: Bundle,
    meas_a: dict,
    meas_b: dict,
    *,
    concurrency: int,
    k_a: int,
    k_b: int,
    params: CostParams | None = None,
    group_of: Callable[[dict], Hashable] | None = None,
    paired_by: str = "prompt (record id; a conversation's turns resampled together)",
) -> AgainstComparison:
    """The ``against`` section of the report from the two measurements (``report["pairs"]["bundle"]``
    of each bundle's alpha run): per category rows, the per-concurrency method choice, the verdict.
    ``group_of(turn)``: the unit the bootstrap resamples (default: the prompt record)."""
    params = params or CostParams()
    la, lb = labels(a, b)
    ca, cb = candidate(la, a, meas_a), candidate(lb, b, meas_b)
    sa, sb = Side(la, ca.method, k_a, ca), Side(lb, cb.method, k_b, cb)
    ta, tb = _turns(meas_a), _turns(meas_b)
    paired = [(ta[key], tb[key]) for key in ta if key in tb]
    if not paired:
        raise UserError("--against", f"{la} and {lb} measured no turn in common", "measure both on the same prompts")
    cats: dict[str, list[tuple[dict, dict]]] = {}
    for ra, rb in paired:
        cats.setdefault(ra.get("category") or UNCATEGORIZED, []).append((ra, rb))
    group_of = group_of or (lambda r: (r["id"], r.get("category")))  # a prompt record: its turns together
    rows = [_row("overall", paired, sa, sb, concurrency, params, group_of)]
    if len(cats) > 1 or UNCATEGORIZED not in cats:
        rows += [_row(c, v, sa, sb, concurrency, params, group_of) for c, v in sorted(cats.items())]
    batches = sorted(set(recommendation_batches(a)) | set(recommendation_batches(b)) | {concurrency})
    table = choose([ca, cb], batches, params)
    section = {
        "bundles": {
            "a": {"label": la, "path": str(a.path), "method": sa.method, "k": k_a, "fingerprint": a.manifest.fingerprint},
            "b": {"label": lb, "path": str(b.path), "method": sb.method, "k": k_b, "fingerprint": b.manifest.fingerprint},
        },
        "concurrency": concurrency,
        "gpu": ca.costs["gpu"].name,
        "tp": ca.costs["tp"],
        "paired_by": paired_by,
        "unpaired_turns": {"a": len(ta) - len(paired), "b": len(tb) - len(paired)},
        "rows": rows,
        "per_concurrency": [c.to_dict() for c in table],
        "other_measurement": {
            "label": meas_b["label"],
            "overall": _figures(meas_b["overall"]),
            "by_category": {c: _figures(f) for c, f in meas_b["by_category"].items()},
            "seconds": meas_b["seconds"],
            "sweep": {int(k): v["cumulative_acceptance"] for k, v in (meas_b.get("sweep") or {}).items()},
        },
    }
    section["deploy"] = verdict(section)
    return AgainstComparison.model_validate(section)


def _figures(f: dict) -> dict:
    return {k: f[k] for k in OtherFigures.model_fields}


def verdict(section: dict) -> dict:
    """Which bundle to deploy at the section's concurrency: the per-concurrency choice there (each
    bundle at its best K from its measured acceptance; speculation off when neither reaches 1.0x),
    with the measured comparison at the K each was measured at and whether its paired interval
    excludes 0 (a difference beyond the prompts' noise) or not."""
    bun, conc = section["bundles"], section["concurrency"]
    row = next(c for c in section["per_concurrency"] if c["concurrency"] == conc)
    ov = section["rows"][0]["predicted_speedup"]
    lo, hi = ov["ci"]
    beyond = lo > 0 or hi < 0
    measured = (
        f"measured at K={bun['a']['k']} / K={bun['b']['k']}: {bun['a']['label']} {ov['a']:.2f}x, {bun['b']['label']} {ov['b']:.2f}x, "
        f"difference A-B {ov['diff']:+.2f} [{lo:+.2f}, {hi:+.2f}] (95%, " + ("beyond noise)" if beyond else "within noise: the interval includes 0)")
    )
    if row["deploy"] is None:
        line = f"deploy at concurrency {conc}: neither, speculation off (no bundle at any measured K reaches 1.0x); {measured}"
        return {"choice": None, "label": None, "k": None, "beyond_noise": beyond, "line": line}
    side = "a" if row["deploy"] == bun["a"]["label"] else "b"
    line = f"deploy at concurrency {conc}: {row['deploy']} ({row['method']}, K={row['k']}): predicted {row['predicted_speedup']:.2f}x; {measured}"
    return {"choice": side, "label": row["deploy"], "k": row["k"], "beyond_noise": beyond, "line": line}


def _ci(d: dict, fmt: str) -> str:
    lo, hi = d["ci"]
    return f"{d['diff']:+{fmt}} [{lo:+{fmt}}, {hi:+{fmt}}]"


def choice_lines(per_concurrency: list[dict], labels: list[str]) -> list[str]:
    """The per-concurrency table (``Choice.to_dict`` rows): the bundle, method and K to deploy, or off."""
    deploys = [f"{c['deploy']} ({c['method']})" if c["deploy"] else "off (no speculation)" for c in per_concurrency]
    w = max(len(d) for d in [*deploys, "deploy"]) + 2
    cw = [max(len(lab), 12) + 2 for lab in labels]
    out = [
        "method and K per concurrency (predicted speedup; best K per bundle):",
        f"{'concurrency':>11}  {'deploy':<{w}}{'K':>2} {'speedup':>8}   " + "".join(f"{lab:<{n}}" for lab, n in zip(labels, cw)).rstrip(),
    ]
    for c, deploy in zip(per_concurrency, deploys):
        by = c["by_bundle"]
        cols = "".join(f"{'K=' + str(by[lab]['k']) + ' ' + format(by[lab]['predicted_speedup'], '.2f') + 'x':<{n}}" for lab, n in zip(labels, cw)).rstrip()
        out.append(f"{c['concurrency']:>11}  {deploy:<{w}}{c['k'] or '-':>2} {c['predicted_speedup']:>7.2f}x   {cols}")
    return out


def method_choice_from_report(report: Any, gpu: str | None, tp: int | None, batches: list[int]) -> tuple[list[dict], list[str]] | None:
    """``recommend --report`` on an ``alpha --against`` report: the method and K per concurrency over
    both bundles again, at ``gpu`` / ``tp`` (each bundle's own when None): (the rows, their lines);
    None when the report has no against section."""
    j = report if isinstance(report, dict) else report_json(report)
    sec = j.get("against")
    if not sec:
        return None
    paths = [sec["bundles"][s]["path"] for s in ("a", "b")]
    for p in paths:
        if not Path(p).is_dir():
            raise UserError(
                p, "the bundle the alpha --against report compared is not here", "run recommend where both bundles are, or measure alpha --against again"
            )
    a, b = open_bundle(Path(paths[0])), open_bundle(Path(paths[1]))
    other = sec["other_measurement"]
    cands = [
        candidate(sec["bundles"]["a"]["label"], a, j["pairs"]["bundle"], gpu=gpu, tp=tp),
        candidate(
            sec["bundles"]["b"]["label"],
            b,
            {"overall": other["overall"], "sweep": {k: {"cumulative_acceptance": v} for k, v in other["sweep"].items()}},
            gpu=gpu,
            tp=tp,
        ),
    ]
    rows = [c.to_dict() for c in choose(cands, batches)]
    return rows, choice_lines(rows, [c.label for c in cands])


def summary_lines(comparison: AgainstComparison) -> list[str]:
    """The side-by-side table, the per-concurrency choice and the verdict, as printed."""
    section = comparison.model_dump()
    bun = section["bundles"]
    a, b = bun["a"], bun["b"]
    out = [
        f"A = {a['label']} ({a['method']}, K={a['k']}), B = {b['label']} ({b['method']}, K={b['k']}): "
        f"{section['rows'][0]['turns']} turns paired by prompt ({section['rows'][0]['prompts']} prompts)",
        f"predicted speedup at concurrency {section['concurrency']} on {section['gpu']} (TP{section['tp']}); 95% paired bootstrap intervals over prompts",
        "",
        f"{'category':<16}{'turns':>6}  {'AL A':>5} {'AL B':>5}  {'AL A-B [95%]':<22}{'alpha A':>8} {'alpha B':>7}  {'alpha A-B [95%]':<24}"
        f"{'speedup A':>9} {'speedup B':>9}  speedup A-B [95%]",
    ]
    for r in section["rows"]:
        al, al_, sp = r["acceptance_length"], r["alpha"], r["predicted_speedup"]
        out.append(
            f"{r['category'][:16]:<16}{r['turns']:>6}  {al['a']:>5.2f} {al['b']:>5.2f}  {_ci(al, '.2f'):<22}{al_['a']:>8.3f} {al_['b']:>7.3f}  "
            f"{_ci(al_, '.3f'):<24}{sp['a']:>8.2f}x {sp['b']:>8.2f}x  {_ci(sp, '.2f')}"
        )
    out += ["", *choice_lines(section["per_concurrency"], [a["label"], b["label"]])]
    out += ["", section["deploy"]["line"]]
    return out


def run_against(
    bundle: Path,
    other: Path,
    prompts_file: Path,
    *,
    max_draft_len: int | None,
    concurrency: int,
    progress: Callable[[str], None] | None = None,
    **alpha_kwargs: Any,
) -> tuple[Any, AgainstComparison, IncompleteMeasurement | None]:
    """Measure ``bundle`` and ``other`` on ``prompts_file`` alike; (``bundle``'s alpha report with the
    comparison in its ``against`` section, the comparison, the error to raise once they are written when
    either bundle measured fewer turns than asked). ``alpha_kwargs``: run_alpha's measuring options."""
    a, b = open_bundle(Path(bundle)), open_bundle(Path(other))
    check_same_target(a, b)  # before any model is loaded
    reports = []
    for x in (a, b):
        k = int(max_draft_len or x.k)
        # every K up to the measured one, where the estimator replays the method (one continuation serves all)
        sweep = tuple(range(1, k + 1)) if estimator_replays(method_of(x)) else ()
        if progress is not None:
            progress(f"measuring {x.path}")
        reports.append(
            run_alpha(
                Path(x.path),
                Path(prompts_file),
                bf16=False,
                diagnostics=False,
                max_draft_len=k,
                sweep=sweep,
                concurrency=concurrency,
                progress=progress,
                **alpha_kwargs,
            )
        )
    rep_a, rep_b = reports
    # run_alpha's report: a dict, or formats.alpha_report.AlphaReport (read through its JSON form either way)
    ja, jb = (r if isinstance(r, dict) else report_json(r) for r in (rep_a, rep_b))
    section = compare(
        a,
        b,
        ja["pairs"]["bundle"],
        jb["pairs"]["bundle"],
        concurrency=concurrency,
        k_a=int(ja["settings"]["max_draft_len"]),
        k_b=int(jb["settings"]["max_draft_len"]),
    )
    if isinstance(rep_a, dict):
        rep_a["against"] = section.model_dump()
    else:
        rep_a.against = section
    shorts = [
        incomplete(p.get("requests_asked"), len(p["requests"]), p["skipped"], f"{prompts_file} ({x.path})")
        for x, p in ((a, ja["pairs"]["bundle"]), (b, jb["pairs"]["bundle"]))
    ]
    return rep_a, section, next((e for e in shorts if e is not None), None)
