"""The alpha report's files: report.json (formats/alpha_report.py's schema, read back by its one reader),
summary.txt and alpha.png."""

from __future__ import annotations

from pathlib import Path

from eagle3_trt.atomic import staged_dir, write_json
from eagle3_trt.formats.alpha_report import REPORT_FILE, AlphaReport, report_json
from eagle3_trt.measure.alpha_report import summary_console
from eagle3_trt.measure.plots import plot_report


def write_report(report: AlphaReport, out: Path) -> Path:
    """report.json, summary.txt, alpha.png into ``out`` (written next to it, then renamed into place)."""
    out = Path(out)
    with staged_dir(out) as tmp:
        write_json(tmp / REPORT_FILE, report_json(report))
        (tmp / "summary.txt").write_text(summary_console(report).export_text())
        plot_report(report, tmp / "alpha.png")
    return out
