"""CLI command ``deploy`` (registered by eagle3_trt/cli.py); the work is in deploy.py."""

from __future__ import annotations

from pathlib import Path

import click

from eagle3_trt.errors import UserError
from eagle3_trt.runtime.llm_api import SERVED_MODEL_NAME
from eagle3_trt.triton_serving.deploy import LOAD_TIMEOUT_S, DeployResult, deploy
from eagle3_trt.triton_serving.server import DRAIN_S


@click.command("deploy")
@click.argument("new", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--repo", required=True, type=click.Path(file_okay=False, path_type=Path), help="the model repository `eagle3-trt package` wrote and `serve` serves"
)
@click.option("--name", "model_name", default=SERVED_MODEL_NAME, show_default=True, help="the Triton model that gets the new version")
@click.option("--state-dir", default=".serve", show_default=True, type=click.Path(path_type=Path), help="where `serve` recorded the running server")
@click.option("--rollback", is_flag=True, help="serve the version before the served one again (the served one is kept on disk as rolled-back-N)")
@click.option("--offline", is_flag=True, help="no server running: change the repository on disk only; the next `serve` serves the highest version")
@click.option("--timeout", "timeout_s", default=LOAD_TIMEOUT_S, show_default=True, help="seconds to wait for the new version to load")
@click.option(
    "--drain",
    "drain_s",
    default=DRAIN_S,
    show_default=True,
    type=click.FloatRange(0, 600),
    help="seconds the replaced version's requests in flight get to finish; then each gets an UNAVAILABLE error to retry",
)
def deploy_cmd(new: Path | None, repo: Path, model_name: str, state_dir: Path, rollback: bool, offline: bool, timeout_s: float, drain_s: float) -> None:
    """Add bundle NEW as the next version of the served Triton model: new requests go to it, requests
    in flight finish on the old one. --rollback returns to the previous version."""
    if rollback and new is not None:
        raise UserError("--rollback", f"takes no bundle (got {new})", "`eagle3-trt deploy --rollback --repo REPO`")
    if not rollback and new is None:
        raise UserError("NEW", "missing: the bundle to deploy", "`eagle3-trt deploy NEW --repo REPO`, or --rollback")
    r = deploy(new, repo, name=model_name, state_dir=state_dir, rollback=rollback, offline=offline, timeout_s=timeout_s, drain_s=drain_s)
    verb = "rolled back" if rollback else "deployed"
    click.echo(f"{verb} '{r.model}': version {r.version} ({r.bundle}) replaces version {r.previous}")
    if r.loaded:
        click.echo(f"  version {r.version} is ready and takes new requests ({r.seconds:.1f} s)")
        click.echo(f"  version {r.previous}: {_previous(r)}")
    else:
        click.echo(f"  on disk only (--offline): `eagle3-trt serve {repo}` will serve version {r.version}")
    if r.retired is not None and r.retired.left:
        raise UserError(
            f"version {r.previous}",
            f"{len(r.retired.left)} process(es) still running after SIGKILL: {', '.join(r.retired.left)}",
            "end them (another user's process needs that user or root)",
        )
    if not rollback:
        click.echo(f"  undo with: eagle3-trt deploy --rollback --repo {repo}" + ("" if str(state_dir) == ".serve" else f" --state-dir {state_dir}"))


def _previous(r: DeployResult) -> str:
    """What became of the replaced version: unloaded by Triton, retired by its own instance, or killed."""
    ret = r.retired
    if ret is None or not ret.processes:
        return f"{r.previous_state} (no process of it was running)"
    if ret.killed:
        return f"unloaded by force: still running {ret.waited_s:.0f} s after the deploy (its drain window and wait over), killed {', '.join(ret.killed)}"
    if ret.left:
        return f"NOT unloaded: {', '.join(ret.left)} still running"
    if r.previous_state in ("unavailable", "unloaded"):
        return f"unloaded ({ret.waited_s:.1f} s)"
    return (
        f"unloaded: its backend stub and runtime ended with nothing in flight ({ret.waited_s:.1f} s); Triton's index lists it "
        f"{r.previous_state} until the gRPC streams that sent it requests close, with no process or memory of it left"
    )
