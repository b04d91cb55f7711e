"""CLI commands: ``package``, ``serve``, ``stop`` (registered by eagle3_trt/cli.py)."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import get_args

import click

from eagle3_trt.errors import UserError
from eagle3_trt.runtime.capture_cli import capture_options, capture_summary, from_options
from eagle3_trt.runtime.llm_api import SERVED_MODEL_NAME, DeviceName, RuntimeName
from eagle3_trt.triton_serving.package import package_bundle
from eagle3_trt.triton_serving.server import (
    DRAIN_MAX_S,
    DRAIN_S,
    EXIT_TIMEOUT_S,
    STOP_TIMEOUT_S,
    _check_can_start,
    start_server,
    stop_recorded,
    stop_server,
)


@click.command("package")
@click.argument("bundle", type=click.Path(file_okay=False, path_type=Path))
@click.option("-o", "--out", "out", required=True, type=click.Path(path_type=Path), help="model repository to write")
@click.option("--name", "model_name", default=SERVED_MODEL_NAME, show_default=True, help="Triton model name")
@click.option(
    "--runtime",
    type=click.Choice(get_args(RuntimeName)),
    default="reference",
    show_default=True,
    help="reference: the toolkit's PyTorch runtime (CPU or GPU); trtllm: TensorRT-LLM LLM() from the bundle's options",
)
@click.option("--device", type=click.Choice(get_args(DeviceName)), default="auto", show_default=True, help="reference runtime device")
@click.option("--torch-threads", type=click.IntRange(min=1), default=None, help="reference runtime on CPU: torch threads per model instance (default: torch's)")
@click.option("--instances", "instance_count", default=1, show_default=True, help="model instances (each loads the bundle on its own GPUs: see --gpus)")
@click.option(
    "--gpus",
    type=click.IntRange(min=1),
    default=None,
    help="GPUs on the serving node; each instance gets tensor_parallel_size of them (gpu_device_ids), and "
    "models x instances x TP must fit (required for trtllm with more than one instance)",
)
@click.option(
    "--decoupled/--no-decoupled",
    default=True,
    show_default=True,
    help="decoupled: streaming clients (generate_stream, gRPC streams); --no-decoupled: unary HTTP /infer and gRPC ModelInfer (upstream llmapi's default)",
)
@click.option("--with-unary", is_flag=True, help="also write <name>_unary, a non-decoupled twin, so one server answers both kinds of client")
@click.option(
    "--default-max-tokens", type=int, default=None, help="cap for a request without sampling_param_max_tokens (default: the rest of the context, as on Dynamo)"
)
@click.option("--with-baseline", is_flag=True, help="also write <name>_nospec, the same bundle served without the draft (A/B for the trtllm runtime)")
@click.option("--bundle-path", default=None, help="path to write into model.yaml instead of BUNDLE (repository used elsewhere, e.g. a container mount)")
@click.option(
    "--force",
    is_flag=True,
    help="overwrite this command's own models in REPO even where a file was edited since (other models are never touched)",
)
def package_cmd(
    bundle: Path,
    out: Path,
    model_name: str,
    runtime: RuntimeName,
    device: DeviceName,
    torch_threads: int | None,
    instance_count: int,
    gpus: int | None,
    decoupled: bool,
    with_unary: bool,
    default_max_tokens: int | None,
    with_baseline: bool,
    bundle_path: str | None,
    force: bool,
) -> None:
    """Write a Triton model repository (Python-backend model, llmapi tensor interface, upstream model.yaml) for BUNDLE."""
    models = package_bundle(
        bundle,
        out,
        model_name=model_name,
        runtime=runtime,
        device=device,
        torch_threads=torch_threads,
        instance_count=instance_count,
        gpus=gpus,
        decoupled=decoupled,
        with_unary=with_unary,
        default_max_tokens=default_max_tokens,
        with_baseline=with_baseline,
        bundle_path=bundle_path,
        force=force,
    )
    click.echo(f"repository: {out}")
    for m in models:
        what = ("speculation on" if m.speculation else "no speculation") + (", streaming" if m.decoupled else ", unary")
        gpu = f", GPUs per instance {m.gpu_device_ids}" if m.gpu_device_ids else ""
        click.echo(f"  model '{m.name}' ({what}{gpu}): {m.dir}")
    click.echo("  config.pbtxt validated against Triton's ModelConfig")
    click.echo(f"next: eagle3-trt serve {out}")


@click.command("serve")
@click.argument("repo", type=click.Path(file_okay=False, path_type=Path))
@click.option("--http-port", default=8000, show_default=True)
@click.option("--grpc-port", default=8001, show_default=True)
@click.option("--metrics-port", default=8002, show_default=True)
@click.option("--state-dir", default=".serve", show_default=True, type=click.Path(path_type=Path), help="server.json and the log go here")
@click.option("--timeout", "timeout_s", default=600.0, show_default=True, help="seconds to wait for readiness")
@click.option("--log-verbose", default=0, show_default=True)
@click.option("--foreground", is_flag=True, help="stay attached; Ctrl-C stops the server")
@capture_options
def serve_cmd(
    repo: Path,
    http_port: int,
    grpc_port: int,
    metrics_port: int,
    state_dir: Path,
    timeout_s: float,
    log_verbose: int,
    foreground: bool,
    capture_dir: Path | None,
    capture_max_mb: float | None,
    capture_redact: tuple[str, ...],
    capture_keep_mb: float | None,
    capture_keep_hours: float | None,
    capture_segment_s: float | None,
) -> None:
    """Start tritonserver on 127.0.0.1 with REPO, wait until it is ready, print the URLs."""
    capture = from_options(
        capture_dir, capture_max_mb, capture_redact, capture_keep_mb, capture_keep_hours, capture_segment_s
    )  # refused before anything starts
    # a server already running here, or a port taken, is refused before "starting" is printed
    # (start_server checks again: the ports may be taken in between)
    _check_can_start(state_dir.resolve(), http_port, grpc_port, metrics_port)
    t0 = time.monotonic()
    click.echo(f"starting tritonserver with {repo} (model load can take a while; log: {state_dir}/tritonserver.log)", err=True)
    h = start_server(
        repo,
        state_dir=state_dir,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        timeout_s=timeout_s,
        log_verbose=log_verbose,
        capture=capture,
    )
    click.echo(f"ready in {time.monotonic() - t0:.1f} s (pid {h.pid}); models: {', '.join(h.models)}")
    click.echo(f"  HTTP    {h.http_url}   (POST {h.http_url}/v2/models/{h.models[0] if h.models else SERVED_MODEL_NAME}/generate)")
    click.echo(f"  gRPC    {h.grpc_url}")
    click.echo(f"  metrics {h.metrics_url}")
    click.echo(f"  log     {h.log_file}")
    if capture is not None:
        click.echo(f"  capture {capture_summary(capture)}")
    if not foreground:
        click.echo("stop with: eagle3-trt stop" + ("" if str(state_dir) == ".serve" else f" --state-dir {state_dir}"))
        return
    try:
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        while h.alive():
            time.sleep(0.5)
        click.echo("tritonserver exited", err=True)
    except KeyboardInterrupt:
        pass
    finally:
        stop_server(h)


@click.command("stop")
@click.option("--state-dir", default=".serve", show_default=True, type=click.Path(path_type=Path))
@click.option(
    "--timeout",
    "timeout_s",
    default=STOP_TIMEOUT_S,
    show_default=True,
    help=f"seconds after SIGTERM before the server is killed (Triton itself waits at most {EXIT_TIMEOUT_S} s)",
)
@click.option(
    "--drain",
    "drain_s",
    default=DRAIN_S,
    show_default=True,
    type=click.FloatRange(min=0, max=DRAIN_MAX_S),
    help="seconds in-flight requests get to finish; then each one still open ends with a 'server is shutting down' error",
)
def stop_cmd(state_dir: Path, timeout_s: float, drain_s: float) -> None:
    """Stop the server started by `eagle3-trt serve` (recorded in STATE_DIR/server.json).

    Requests in flight get --drain seconds, then an error response saying the server is shutting
    down. Exit status 0: stopped cleanly (or nothing was running) and nothing of it is left.
    1: something had to be killed (the server past --timeout, or its backend processes still
    running after it exited; listed on stderr), and nothing of it is left now. 2: a process of it
    is still running (server.json is kept: run stop again once it is gone). Its shared-memory
    regions are removed in every case.
    """
    res = stop_recorded(state_dir, timeout_s, drain_s)
    for line in res.lines(timeout_s) if res is not None else []:
        click.echo(line, err=True)
    if res is not None and res.left:
        raise UserError(
            state_dir / "server.json",
            f"{len(res.left)} process(es) of tritonserver (pid {res.pid}) still running after SIGKILL: {', '.join(res.left)}",
            "end them (another user's process needs that user or root), then run `eagle3-trt stop` again",
        )
    if not res:
        click.echo("no server running")
        return
    if not res.clean:
        click.echo(f"stopped tritonserver (pid {res.pid}) by killing " + ("it" if res.killed else "what it left running"), err=True)
        raise SystemExit(1)
    click.echo(f"stopped tritonserver (pid {res.pid})")
