"""CLI command ``deploy-dynamo`` (registered by eagle3_trt/cli.py); the work is in rolling.py."""

from __future__ import annotations

from pathlib import Path

import click

from eagle3_trt.dynamo_serving.drain import MAX_DRAIN_S
from eagle3_trt.dynamo_serving.launcher import DEFAULT_STATE_DIR
from eagle3_trt.dynamo_serving.rolling import roll_workers
from eagle3_trt.errors import UserError


@click.command("deploy-dynamo")
@click.argument("new", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--state-dir", default=str(DEFAULT_STATE_DIR), show_default=True, type=click.Path(path_type=Path), help="where serve-dynamo recorded the deployment"
)
@click.option("--rollback", is_flag=True, help="serve the bundle deployed before the current one again")
@click.option(
    "--drain",
    "drain_s",
    default=MAX_DRAIN_S,
    show_default=True,
    type=click.FloatRange(min=0, max=MAX_DRAIN_S),
    help="seconds a replaced worker's requests in flight get to finish; then what is left ends with an error the frontend migrates",
)
@click.option("--timeout", "timeout_s", default=300.0, show_default=True, help="seconds a replacement worker gets to come up")
def deploy_dynamo_cmd(new: Path | None, state_dir: Path, rollback: bool, drain_s: float, timeout_s: float) -> None:
    """Serve bundle NEW on a serve-dynamo deployment: workers are replaced one at a time, each drained before it stops."""
    if rollback and new is not None:
        raise UserError("--rollback", f"takes no bundle (got {new})", "`eagle3-trt deploy-dynamo --rollback`")
    if not rollback and new is None:
        raise UserError("NEW", "missing: the bundle to deploy", "`eagle3-trt deploy-dynamo NEW`, or --rollback")
    r = roll_workers(state_dir, new, rollback=rollback, drain_s=drain_s, timeout_s=timeout_s)
    click.echo(f"{'rolled back' if rollback else 'deployed'}: {r.bundle} replaces {r.previous} ({r.seconds:.1f} s)")
    for old, fresh in r.replaced:
        click.echo(f"  {old}; {fresh} serves")
    if r.killed:
        click.echo(f"  killed after the drain window: {', '.join(r.killed)}", err=True)
