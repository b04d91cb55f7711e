"""The build stage's compile command (registered in eagle3_trt/cli.py; plan is in plan_command.py)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from eagle3_trt.errors import UserError
from eagle3_trt.pipeline import compile as comp
from eagle3_trt.pipeline.gpus import GPUS


@click.command("compile")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--target-gpu",
    default=None,
    type=click.Choice(sorted(GPUS)),
    help="check the bundle against this GPU (CPU-only CI); on a GPU machine it must match the GPU present",
)
@click.option("--check-only", is_flag=True, help="run the checks that need neither TensorRT-LLM nor a GPU, then stop")
@click.option(
    "--trtllm-version",
    "for_release",
    metavar="VERSION",
    help="with --check-only: check the options as this TensorRT-LLM release loads them (e.g. 1.2.1; keys it lacks are left out with a note, or refused)",
)
@click.option("--prompts", type=int, default=16, show_default=True, help="prompts for the acceptance measurement")
@click.option("--max-tokens", type=int, default=128, show_default=True, help="tokens generated per prompt")
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON")
def compile_cmd(bundle: Path, target_gpu: str | None, check_only: bool, for_release: str | None, prompts: int, max_tokens: int, as_json: bool) -> None:
    """Load BUNDLE in TensorRT-LLM (EAGLE-3 one-model, CUDA graphs), run a smoke generation and a
    short acceptance measurement, and record results, GPU and versions in its manifest.json."""
    if check_only:
        pf = comp.preflight(bundle, target_gpu, require_runtime=False, detected=comp.detect_gpus(), for_release=for_release)
        summary = comp.preflight_summary(pf)
        if as_json:
            click.echo(json.dumps(summary, indent=2, default=str))
        else:
            gpu = pf.gpu.label if pf.gpu else "no GPU named (pass --target-gpu)"
            click.echo(f"checks passed for {bundle} on {gpu}: " + "; ".join(pf.checks))
            for n in summary["notes"]:
                click.echo(f"  note: {n}")
        return
    if for_release is not None:
        raise UserError("--trtllm-version", f"{for_release}", "only with --check-only; a compile loads the installed release")
    rec = comp.compile_bundle(bundle, target_gpu, prompts=prompts, max_tokens=max_tokens, log=lambda s: click.echo(s, err=True))
    if as_json:
        click.echo(json.dumps(rec, indent=2, default=str))
        return
    acc = rec.get("acceptance", {})
    click.echo(
        f"compiled {bundle} on {rec['gpu']['name']} (SM{rec['gpu']['sm']}), TensorRT-LLM {rec['versions']['tensorrt_llm']}: "
        f"load {rec['timings'].get('load_s')} s, alpha {acc.get('alpha')}, acceptance length {acc.get('acceptance_length')}, "
        f"{acc.get('tokens_per_s')} tok/s; recorded in manifest.json"
    )
