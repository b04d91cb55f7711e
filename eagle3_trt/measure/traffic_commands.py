"""The ``--traffic`` forms of ``alpha`` and ``gate`` (issue 23 B, D), called from measure/commands.py.

``eagle3-trt alpha BUNDLE --traffic DIR``: measure/traffic_alpha.py; writes OUT/report.json,
prints per-K figures, the offline-vs-served line and the drift summary; exit 3 when the offline
acceptance differs from the served one beyond sampling noise (the live check failed).

``eagle3-trt gate NEW --against OLD --traffic DIR``: measure/traffic_gate.py; prints one verdict
line, writes the JSON report (--json-out) through the atomic writer; exit 0 only on PASS, 3 on
FAIL, 2 on bad input.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import click
from click.core import ParameterSource

from eagle3_trt.atomic import check_writable, write_json
from eagle3_trt.errors import GateFailed, UserError
from eagle3_trt.formats.alpha_report import REPORT_FILE, report_json
from eagle3_trt.measure.acceptance import incomplete
from eagle3_trt.measure.traffic_alpha import run_alpha_traffic, summary_lines
from eagle3_trt.measure.traffic_gate import run_traffic_gate, verdict_line
from eagle3_trt.pipeline.bundle import open_bundle

ALPHA_TRAFFIC_OPTIONS = ("traffic_dir", "device", "tp", "batch_size", "sweep", "tolerance", "window", "out", "as_json")
GATE_TRAFFIC_OPTIONS = (
    "tp",
    "against",
    "traffic_dir",
    "margin",
    "seed",
    "holdout_fraction",
    "json_out",
    "allow_other_bundles",
    "threshold",
    "concurrency",
    "device",
    "as_json",
)


def refuse_other_options(ctx: click.Context, allowed: Iterable[str], mode: str) -> None:
    """An option given on the command line that the ``mode`` form does not read: one line, not ignored."""
    ok = set(allowed)
    opts = [p for p in ctx.command.params if isinstance(p, click.Option) and p.name]
    for p in opts:
        if p.name not in ok and ctx.get_parameter_source(p.name) == ParameterSource.COMMANDLINE:
            reads = ", ".join(max(q.opts, key=len) for q in opts if q.name in ok)
            raise UserError(max(p.opts, key=len), f"does not apply with {mode}", f"drop it; {mode} reads {reads}")


def alpha_traffic(
    ctx: click.Context,
    bundle: str,
    traffic_dir: str,
    *,
    device: str | None,
    batch_size: int,
    sweep: tuple[int, ...],
    tolerance: float,
    window: int | None,
    out: str | None,
    as_json: bool,
) -> None:
    refuse_other_options(ctx, ALPHA_TRAFFIC_OPTIONS, "--traffic")
    open_bundle(Path(bundle))  # a one-line error before any model is loaded
    dest = Path(out) if out else Path("reports") / f"alpha-traffic-{Path(bundle).resolve().name}"
    check_writable(dest)
    rep = run_alpha_traffic(
        Path(bundle),
        Path(traffic_dir),
        device=device,
        batch_size=batch_size,
        sweep=sweep,
        tolerance=tolerance,
        window=window,
        progress=lambda m: click.echo(m, err=True),
    )
    write_json(dest / REPORT_FILE, report_json(rep))
    if as_json:
        click.echo(json.dumps(report_json(rep), indent=1))
    else:
        for line in summary_lines(rep):
            click.echo(line)
        click.echo(f"report: {dest}/{REPORT_FILE}")
    long_ = rep.skipped.beyond_max_seq_len  # written, and said in one line with a non-zero exit
    short = incomplete(rep.compared + len(long_), rep.compared, long_, traffic_dir) if long_ else None
    if short is not None:
        raise short
    if rep.comparison.beyond_sampling_noise:
        raise GateFailed("")  # the comparison line said it


def gate_traffic(
    ctx: click.Context,
    new: str,
    against: str | None,
    traffic_dir: str | None,
    *,
    margin: float,
    seed: int | None,
    holdout_fraction: float | None,
    json_out: str | None,
    allow_other_bundles: bool,
    threshold: float,
    concurrency: int,
    device: str | None,
    as_json: bool,
) -> None:
    if against is None or traffic_dir is None:
        missing = "--against OLD" if against is None else "--traffic DIR"
        raise UserError(missing.split()[0], "missing", "gate a new bundle on traffic with: gate NEW --against OLD --traffic DIR")
    refuse_other_options(ctx, GATE_TRAFFIC_OPTIONS, "--against/--traffic")
    dest = Path(json_out) if json_out else Path("reports") / f"gate-{Path(new).resolve().name}-vs-{Path(against).resolve().name}.json"
    check_writable(dest)
    res = run_traffic_gate(
        Path(new),
        Path(against),
        Path(traffic_dir),
        margin=margin,
        seed=seed,
        holdout_fraction=holdout_fraction,
        threshold=threshold,
        concurrency=concurrency,
        device=device,
        allow_other_bundles=allow_other_bundles,
        progress=lambda m: click.echo(m, err=True),
    )
    write_json(dest, res)
    if as_json:
        click.echo(json.dumps(res, indent=1))
    click.echo(f"report: {dest}")
    click.echo(verdict_line(res))  # the last line printed
    if not res["passed"]:
        raise GateFailed("")  # the verdict line is printed
