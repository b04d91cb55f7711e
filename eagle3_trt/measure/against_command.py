"""The ``--against OTHER`` form of ``eagle3-trt alpha`` (called from measure/commands.py): measure both
bundles (measure/against.py), print the side-by-side table and the verdict, write the report."""

from __future__ import annotations

import json
from pathlib import Path

import click

from eagle3_trt.atomic import check_writable
from eagle3_trt.atomic.writers import write_text
from eagle3_trt.errors import UserError
from eagle3_trt.measure.against import run_against, summary_lines
from eagle3_trt.measure.report_files import write_report
from eagle3_trt.measure.traffic_commands import refuse_other_options
from eagle3_trt.progress import Bars

AGAINST_HELP = (
    "OTHER: a second bundle of the same target, measured on the same prompts; prints AL, alpha and the predicted "
    "speedup of both per category with paired 95% intervals, the method and K per concurrency, and which to deploy"
)
# the alpha options the --against form reads (any other given on the command line is refused in one line)
AGAINST_OPTIONS = (
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
    refuse_other_options(ctx, AGAINST_OPTIONS, "--against")
    if traffic_dir is not None:
        raise UserError("--traffic", "does not go with --against yet", "capture the requests' prompts into a prompt file and pass --prompts FILE")
    if prompts_file is None:
        raise UserError("--prompts", "missing", "pass --prompts FILE: both bundles are measured on it")
    p = ctx.params
    dest = Path(p["out"]) if p["out"] else default_out(bundle, other)
    check_writable(dest)
    with Bars() as bars:
        report, section = run_against(
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
    if p["as_json"]:
        click.echo(json.dumps(report, indent=1))
        return
    for line in lines:
        click.echo(line)
    click.echo(f"report: {dest}/report.json (section against), {dest}/against.txt")
