"""The ``--against OTHER`` form of ``eagle3-trt alpha`` (called from measure/commands.py): measure both
bundles (measure/against.py), print the side-by-side table and the verdict, write the report."""

from __future__ import annotations

import json
from pathlib import Path

import click

from eagle3_trt.atomic import check_writable
from eagle3_trt.atomic.writers import staged_dir, write_json, write_text
from eagle3_trt.errors import UserError
from eagle3_trt.formats.alpha_report import report_json
from eagle3_trt.measure.against import run_against, summary_lines
from eagle3_trt.measure.against_traffic import run_against_traffic
from eagle3_trt.measure.report_files import write_report
from eagle3_trt.measure.traffic_commands import refuse_other_options
from eagle3_trt.progress import Bars

AGAINST_HELP = (
    "OTHER: a second bundle of the same target, measured on the same prompts (or captured --traffic); prints AL, alpha and the predicted "
    "speedup of both per category with paired 95% intervals, the method and K per concurrency, and which to deploy"
)
# the alpha options the --against --traffic form reads
AGAINST_TRAFFIC_OPTIONS = ("against", "traffic_dir", "max_draft_len", "device", "tp", "batch_size", "concurrency", "out", "as_json")
# the alpha options the --against form reads (any other given on the command line is refused in one line)
AGAINST_OPTIONS = (
    "tp",
    "against",
    "prompts_file",
    "max_tokens",
    "limit",
    "turns",
    "max_draft_len",
    "method",
    "device",
    "batch_size",
    "concurrency",
    "chat_template",
    "out",
    "as_json",
)


def default_out(bundle: str, other: str) -> Path:
    return Path("reports") / f"alpha-{Path(bundle).resolve().name}-vs-{Path(other).resolve().name}"


def alpha_against(ctx: click.Context, bundle: str, other: str, prompts_file: str | None, traffic_dir: str | None) -> None:
    """``alpha BUNDLE --against OTHER --prompts FILE``: OUT/report.json (BUNDLE's alpha report with the
    comparison under ``against``), summary.txt, alpha.png and against.txt (the lines printed)."""
    p = ctx.params
    if prompts_file is not None and traffic_dir is not None:
        raise UserError("--traffic", "does not go with --prompts", "pass --prompts FILE or --traffic DIR: both bundles are measured on it")
    dest = Path(p["out"]) if p["out"] else default_out(bundle, other)
    if traffic_dir is not None:
        refuse_other_options(ctx, AGAINST_TRAFFIC_OPTIONS, "--against --traffic")
        check_writable(dest)
        with Bars() as bars:
            section = run_against_traffic(
                Path(bundle),
                Path(other),
                Path(traffic_dir),
                max_draft_len=p["max_draft_len"],
                concurrency=p["concurrency"],
                device=p["device"],
                batch_size=p["batch_size"],
                progress=bars.say,
            )
        lines = summary_lines(section)
        with staged_dir(dest) as tmp:  # the comparison alone: an alpha --traffic report has no against section
            write_json(tmp / "against.json", section.model_dump())
            write_text(tmp / "against.txt", "\n".join(lines) + "\n")
        _show(lines, section.model_dump(), p["as_json"], f"{dest}/against.json, {dest}/against.txt")
        return
    if prompts_file is None:
        raise UserError("--prompts", "missing", "pass --prompts FILE or --traffic DIR: both bundles are measured on it")
    refuse_other_options(ctx, AGAINST_OPTIONS, "--against")
    check_writable(dest)
    with Bars() as bars:
        report, section, short = run_against(
            Path(bundle),
            Path(other),
            Path(prompts_file),
            max_draft_len=p["max_draft_len"],
            concurrency=p["concurrency"],
            progress=bars.say,
            tasks=bars.task,
            max_tokens=p["max_tokens"],
            limit=p["limit"],
            turns=p["turns"],
            method=p["method"],
            device=p["device"],
            batch_size=p["batch_size"],
            chat_template=p["chat_template"],
        )
    lines = summary_lines(section)
    write_report(report, dest)
    write_text(dest / "against.txt", "\n".join(lines) + "\n")
    _show(lines, report if isinstance(report, dict) else report_json(report), p["as_json"], f"{dest}/report.json (section against), {dest}/against.txt")
    if short is not None:  # written (each pair records its skipped turns), and said in one line with a non-zero exit
        raise short


def _show(lines: list[str], data: dict, as_json: bool, written: str) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=1))
        return
    for line in lines:
        click.echo(line)
    click.echo(f"report: {written}")
