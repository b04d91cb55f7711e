"""CLI commands: ``serve-dynamo``, ``status-dynamo``, ``stop-dynamo`` (registered by eagle3_trt/cli.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import get_args

import click

from eagle3_trt.dynamo_serving.launcher import DEFAULT_HTTP_PORT, DEFAULT_STATE_DIR, STOP_GRACE_S, STOP_TIMEOUT_S, check_servable, start, status, stop_recorded
from eagle3_trt.runtime.capture_cli import capture_options, capture_summary, from_options
from eagle3_trt.runtime.llm_api import SERVED_MODEL_NAME, DeviceName

_STATE = click.option(
    "--state-dir",
    default=str(DEFAULT_STATE_DIR),
    show_default=True,
    type=click.Path(path_type=Path),
    help="state.json, the logs and the discovery store go here",
)


@click.command("serve-dynamo")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--workers", default=2, show_default=True, type=click.IntRange(min=1), help="reference-runtime workers behind the frontend")
@click.option("--http-port", default=DEFAULT_HTTP_PORT, show_default=True, help="the frontend's OpenAI port (127.0.0.1)")
@click.option(
    "--worker-port-base",
    type=int,
    default=None,
    help="fixed worker ports: worker i's /health and /metrics on BASE+2i, its TCP request plane on BASE+2i+1 (default: free ports drawn at start)",
)
@click.option("--model-name", default=SERVED_MODEL_NAME, show_default=True, help="the model name clients send")
@click.option("--device", type=click.Choice(get_args(DeviceName)), default="cpu", show_default=True)
@click.option("--torch-threads", type=click.IntRange(min=1), default=None, help="per worker (default: CPU cores / workers)")
@click.option("--no-speculation", is_flag=True, help="serve the target alone (A/B baseline)")
@click.option("--migration-limit", default=3, show_default=True, help="times the frontend moves a request off a failed worker")
@click.option("--timeout", "timeout_s", default=300.0, show_default=True, help="seconds to wait for every worker to register")
@_STATE
@capture_options
def serve_dynamo_cmd(
    bundle: Path,
    workers: int,
    http_port: int,
    worker_port_base: int | None,
    model_name: str,
    device: str,
    torch_threads: int | None,
    no_speculation: bool,
    migration_limit: int,
    timeout_s: float,
    state_dir: Path,
    capture_dir: Path | None,
    capture_max_mb: float | None,
    capture_redact: tuple[str, ...],
    capture_keep_mb: float | None,
    capture_keep_hours: float | None,
    capture_segment_s: float | None,
) -> None:
    """Start NVIDIA Dynamo's OpenAI frontend and N reference-runtime workers for BUNDLE on 127.0.0.1.

    File discovery and the TCP request plane: no etcd, no NATS. Prints the OpenAI URL."""
    capture = from_options(
        capture_dir, capture_max_mb, capture_redact, capture_keep_mb, capture_keep_hours, capture_segment_s
    )  # refused before anything starts
    check_servable(bundle)  # before the 'starting' line: a refusal is the only line printed
    t0 = time.monotonic()
    click.echo(f"starting Dynamo: frontend + {workers} worker(s) for {bundle} (logs: {state_dir})", err=True)
    dep = start(
        bundle,
        workers=workers,
        state_dir=state_dir,
        http_port=http_port,
        model_name=model_name,
        torch_threads=torch_threads,
        device=device,
        speculation=not no_speculation,
        migration_limit=migration_limit,
        timeout_s=timeout_s,
        capture=capture,
        worker_port_base=worker_port_base,
    )
    click.echo(f"ready in {time.monotonic() - t0:.1f} s: model '{dep.model}' on {len(dep.workers)} worker(s)")
    click.echo(f"  OpenAI  {dep.url}   (POST {dep.url}/chat/completions, {dep.url}/completions)")
    for w in dep.workers:
        click.echo(f"  {w.role}  pid {w.pid}, metrics http://127.0.0.1:{w.port}/metrics")
    if capture is not None:
        click.echo(f"  capture {capture_summary(capture)}")
    suffix = "" if state_dir == DEFAULT_STATE_DIR else f" --state-dir {state_dir}"
    click.echo(f"status: eagle3-trt status-dynamo{suffix}    stop: eagle3-trt stop-dynamo{suffix} (or make stop)")


@click.command("status-dynamo")
@_STATE
def status_dynamo_cmd(state_dir: Path) -> None:
    """One line per process started by serve-dynamo; exit 1 when one is dead.

    A process that runs but does not answer its health check also gives exit 1."""
    dep, lines, ok = status(state_dir)
    if dep is None:
        click.echo("no Dynamo deployment running")
        raise SystemExit(1)
    click.echo(f"model '{dep.model}' from {dep.bundle}")
    for ln in lines:
        click.echo(ln)
    if not ok:
        raise SystemExit(1)


@click.command("stop-dynamo")
@_STATE
@click.option(
    "--grace",
    "grace_s",
    default=STOP_GRACE_S,
    show_default=True,
    type=click.FloatRange(min=0),
    help="seconds requests in flight get to finish once the frontend stops taking new ones; what is left then ends with an error",
)
@click.option("--timeout", "timeout_s", default=STOP_TIMEOUT_S, show_default=True, help="seconds after the grace period before a process is killed")
def stop_dynamo_cmd(state_dir: Path, grace_s: float, timeout_s: float) -> None:
    """Stop what serve-dynamo started and remove its discovery store.

    The frontend stops taking requests first (new ones get 503); requests in flight get --grace
    seconds to finish, and those still running then end with an error (a streaming client gets an
    error event after the tokens it has, never finish_reason "stop"). Stderr says how many were cut off.

    Exit 0 when every process exited and none of the deployment's process groups is left; 1 when a
    process had to be killed after --timeout or one is still alive (the state file is then kept)."""
    res = stop_recorded(state_dir, grace_s, timeout_s)
    if res is None:
        click.echo("no Dynamo deployment running")
        return
    if res.inflight or res.cut_off:
        drained = max(res.inflight - res.cut_off, 0)
        click.echo(f"drained for {res.waited_s:.1f} s: {drained} of {res.inflight} request(s) in flight finished", err=True)
    if res.cut_off:
        click.echo(
            f"cut off {res.cut_off} request(s) still running after the {grace_s:g} s grace period: their clients got an error, "
            "not a finished answer (a longer --grace lets them finish)",
            err=True,
        )
    if res.killed:
        click.echo(f"killed {', '.join(res.killed)}: not exited {timeout_s:.0f} s after the grace period", err=True)
    if res.left:
        click.echo(f"still alive: {'; '.join(res.left)} (state kept in {state_dir})", err=True)
    if not res.clean:
        click.echo(f"stopped Dynamo uncleanly: {', '.join(res.stopped) or 'nothing'} exited", err=True)
        raise SystemExit(1)
    click.echo(f"stopped Dynamo ({', '.join(res.stopped)})")
