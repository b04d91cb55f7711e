"""The alpha report's files: report.json, summary.txt and alpha.png written, report.json read back."""

from __future__ import annotations

import json
from pathlib import Path

from eagle3_trt.atomic import staged_dir
from eagle3_trt.errors import UserError
from eagle3_trt.measure.alpha_report import summary_console
from eagle3_trt.measure.plots import plot_report


def read_report(path: Path) -> dict:
    """An alpha report.json, or a one-line UserError."""
    hint = "pass the report.json written by `eagle3-trt alpha`"
    if not path.is_file():
        raise UserError(path, "report not found", hint)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(path, f"not valid JSON ({e})", hint) from None
    if not isinstance(data, dict):
        raise UserError(path, "not an alpha report (expected a JSON object)", hint)
    return data


def report_curves(report: dict, where: str | Path) -> tuple[list[float], dict[int, list[float]]]:
    """(the run's cumulative acceptance, {K: cumulative acceptance measured at K} for every K of its
    sweep) from an alpha report.json, so ``recommend`` can choose any K the sweep measured."""
    try:
        prim = report["pairs"]["bundle"]
        cum = prim["overall"]["cumulative_acceptance"]
    except (KeyError, TypeError):
        raise UserError(
            where, "not an alpha report (pairs.bundle.overall.cumulative_acceptance missing)", "pass the report.json written by `eagle3-trt alpha`"
        ) from None
    by_k: dict[int, list[float]] = {}
    sweep = prim.get("sweep") or {}
    if not isinstance(sweep, dict):
        raise UserError(where, "pairs.bundle.sweep is not a K -> measurement map", "pass the report.json written by `eagle3-trt alpha`")
    for key, v in sweep.items():
        c = v.get("cumulative_acceptance") if isinstance(v, dict) else None
        if not str(key).isdigit() or not isinstance(c, list):
            raise UserError(
                where, f"sweep entry {key!r} has no per-position acceptance (cumulative_acceptance)", "re-run `eagle3-trt alpha --sweep ...` with this version"
            )
        by_k[int(key)] = c
    return cum, by_k


def write_report(report: dict, out: Path) -> Path:
    """report.json, summary.txt, alpha.png into ``out`` (written next to it, then renamed into place)."""
    out = Path(out)
    with staged_dir(out) as tmp:
        (tmp / "report.json").write_text(json.dumps(report, indent=1) + "\n")
        (tmp / "summary.txt").write_text(summary_console(report).export_text())
        plot_report(report, tmp / "alpha.png")
    return out
