"""The eagle3-trt command line: one entry point for every stage of the pipeline."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import click

from eagle3_trt import __version__
from eagle3_trt.errors import GateFailed, UserError

PIPELINE = """\
EAGLE-3 speculative decoding for TensorRT-LLM (PyTorch runtime, one-model) and Triton.

\b
Pipeline (each stage reads only the previous stage's files):
  presets -> checkpoints -> quantized checkpoints -> bundle -> Triton repository -> server -> clients/bench
\b
  eagle3-trt engine --model tiny     validate the target/draft pair, quantize with ModelOpt
                                     (FP8 Hopper, NVFP4 Blackwell), write an engine bundle
  eagle3-trt alpha BUNDLE            measure acceptance (alpha) before deploying
  eagle3-trt package BUNDLE -o REPO  write a Triton model repository
  eagle3-trt serve REPO              start Triton on 127.0.0.1
  eagle3-trt bench --url ...         TTFT / ITL / throughput / alpha, speculation on vs off

An "engine" here is a directory (TensorRT-LLM removed its TensorRT-engine path, which never
supported EAGLE-3): quantized target + draft checkpoints, llm_api_options.yaml, manifest.json.
"""

# Commands that live next to the code they drive: (module, attribute).
EXTRA_COMMANDS = [
    ("eagle3_trt.build.commands", "plan_cmd"),
    ("eagle3_trt.build.commands", "compile_cmd"),
    ("eagle3_trt.runtime.commands", "alpha_cmd"),
    ("eagle3_trt.runtime.commands", "gate_cmd"),
    ("eagle3_trt.runtime.commands", "recommend_cmd"),
    ("eagle3_trt.triton_repo.commands", "package_cmd"),
    ("eagle3_trt.triton_repo.commands", "serve_cmd"),
    ("eagle3_trt.triton_repo.commands", "stop_cmd"),
    ("eagle3_trt.clients.commands", "generate_cmd"),
    ("eagle3_trt.clients.commands", "bench_cmd"),
    ("eagle3_trt.train.commands", "train_draft_cmd"),
]


@click.group(help=PIPELINE, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="eagle3-trt")
def cli() -> None:
    pass


def _console():
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True)


@cli.command("presets")
def presets_cmd() -> None:
    """List the model presets."""
    from eagle3_trt.build.presets import available, load_preset

    for name in available():
        p = load_preset(name)
        click.echo(f"{name:14s} K={p.max_draft_len} max_seq_len={p.max_seq_len:<6d} {p.description}")


@cli.command("validate")
@click.option("--target", "target_dir", required=True, type=click.Path(file_okay=False), help="target HF checkpoint dir")
@click.option("--draft", "draft_dir", required=True, type=click.Path(file_okay=False), help="EAGLE-3 draft dir (SafeAILab, ModelOpt or speculators layout)")
@click.option("--max-seq-len", default=8192, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
def validate_cmd(target_dir: str, draft_dir: str, max_seq_len: int, as_json: bool) -> None:
    """Check that a target and an EAGLE-3 draft belong together (no quantization)."""
    from eagle3_trt.convert.draft_format import load_draft
    from eagle3_trt.convert.target import read_target
    from eagle3_trt.convert.validate import validate_pair

    for p in (target_dir, draft_dir):
        if not Path(p).is_dir():
            raise UserError(p, "directory does not exist", "pass a local checkpoint directory")
    rep = validate_pair(read_target(Path(target_dir)), load_draft(Path(draft_dir)), max_seq_len)
    if as_json:
        click.echo(json.dumps(rep.to_dict(), indent=2))
        return
    for c in rep.checks:
        click.echo(f"ok    {c['check']:11s} {c['detail']}")
    for w in rep.warnings:
        click.echo(f"warn  {w}")


@cli.command("engine")
@click.option("--model", "model", default="tiny", show_default=True, help="preset name (eagle3-trt presets)")
@click.option("--target", "target", default=None, help="local target checkpoint dir (overrides the preset)")
@click.option("--draft", "draft", default=None, help="local EAGLE-3 draft dir (overrides the preset)")
@click.option("--target-gpu", default=None, help="GPU the bundle is for: h100, h200, b200, ... (default: detected GPU, else the preset's)")
@click.option("--gpus", type=int, default=None, help="GPUs to plan for (default: the preset's)")
@click.option("--tp", type=int, default=None, help="tensor-parallel size (default: the planner's choice)")
@click.option("--quant", type=click.Choice(["fp8", "nvfp4", "bf16"]), default=None, help="target format (default: the preset's for the GPU generation)")
@click.option("--kv-cache", type=click.Choice(["fp8", "auto"]), default=None, help="KV cache format (default: the preset's)")
@click.option("--quantize-draft", is_flag=True, help="quantize the draft head too (default: BF16 draft)")
@click.option("--draft-quant", type=click.Choice(["fp8", "nvfp4"]), default=None, help="draft format with --quantize-draft (default: the target's)")
@click.option("--calib", "calib_file", default=None, help="calibration prompts (JSONL with 'turns' or 'text', or .txt); default: shipped set")
@click.option("--calib-samples", type=int, default=None, help="number of calibration prompts")
@click.option("--calib-max-length", type=int, default=None, help="tokens per calibration prompt")
@click.option("--max-draft-len", type=int, default=None, help="draft length K (default: the preset's)")
@click.option("-o", "--out", default=None, help="bundle dir (default: engines/<preset>-<quant>-<gpu>)")
@click.option("--force", is_flag=True, help="rebuild even when the inputs are unchanged")
@click.option("--dry-run", is_flag=True, help="configs only: plan, validate and write options + manifest, no weights")
@click.option("--json", "as_json", is_flag=True, help="print the manifest as JSON on stdout")
def engine_cmd(model: str, as_json: bool, **kw) -> None:
    """Validate, quantize and export a target + EAGLE-3 draft into an engine bundle."""
    from eagle3_trt.build.bundle import EngineRequest, build_bundle
    from eagle3_trt.build.presets import load_preset

    if kw["target_gpu"] is None:
        kw["target_gpu"] = _detected_gpu()
    req = EngineRequest(preset=load_preset(model), **kw)
    con = _console()
    with _progress(con) as progress:
        res = build_bundle(req, progress=progress, log=lambda m: con.print(f"[yellow]{m}[/]"))
    if as_json:
        click.echo(json.dumps(res.manifest, indent=2))
    _print_summary(con, res)


def _detected_gpu() -> str | None:
    try:
        mod = importlib.import_module("eagle3_trt.build.compile")
    except ModuleNotFoundError:
        return None
    detect = getattr(mod, "detect_gpu", None)
    found = detect() if detect else None
    return found[0] if found else None


class _progress:
    """rich progress for build stages; build_bundle asks for a ticker per stage."""

    def __init__(self, console):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.p = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                          TimeElapsedColumn(), console=console, transient=False)
        self.last = None

    def __enter__(self):
        self.p.__enter__()
        return self

    def __exit__(self, *exc):
        if self.last is not None and exc[0] is None:
            self.p.update(self.last, completed=self.p.tasks[self.last].total or 1)
        return self.p.__exit__(*exc)

    def __call__(self, stage: str, total: int | None = None):
        if self.last is not None:
            t = self.p.tasks[self.last]
            self.p.update(self.last, completed=t.total or t.completed)
        task = self.p.add_task(stage, total=total or 1)
        self.last = task
        return lambda: self.p.advance(task)


def _print_summary(con, res) -> None:
    m = res.manifest
    q = m["quant"]
    if res.cache_hit:
        con.print(f"[green]cache hit[/]: inputs and options unchanged (fingerprint {m['fingerprint'][:12]}); bundle not rebuilt")
    con.print(f"[bold]bundle[/]: {res.bundle}")
    con.print(f"  for {m['target_gpu']['name']} (SM{m['target_gpu']['sm']}): target {q['target']}, draft {q['draft']}, KV cache {q['kv_cache']}; K={m['max_draft_len']}, aux layers {m['aux_layer_ids']}")
    if m.get("dry_run"):
        con.print("  [yellow]dry run[/]: configs only, no weights were read or written")
    plan = m.get("plan") or {}
    if plan:
        con.print(f"  plan: {plan['num_gpus']}x {plan['gpu']}, TP{plan['tp']} x {plan['instances']} instance(s), max batch {plan['max_batch_size']}, KV cache {plan['kv_tokens']} tokens per instance")
    con.print(f"  validated: {', '.join(m['validation']['checks'])}")
    for w in res.warnings or m["validation"]["warnings"]:
        con.print(f"  [yellow]warning[/]: {w}")
    cal = m.get("calibration", {})
    if cal.get("prompts_used"):
        con.print(f"  calibration: {cal['prompts_used']} prompts, {cal['tokens']} tokens from {cal['file']}")
    t = m.get("timings", {})
    con.print(f"  took {t.get('total_s', 0):.1f} s" + ("" if not res.cache_hit else " (original build)"))
    acc = m.get("acceptance")
    if acc:
        con.print(f"  acceptance (K={acc['max_draft_len']}, {acc['prompts']} held-out prompts, greedy, this bundle's weights): "
                  f"alpha {acc['alpha']:.2f}, acceptance length {acc['acceptance_length']:.2f} tokens per target forward")


def _register_extra() -> None:
    for mod_name, attr in EXTRA_COMMANDS:
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as e:
            if e.name and mod_name.startswith(e.name):
                continue  # that part of the toolkit is not present in this build
            raise
        cmd = getattr(mod, attr, None)
        if cmd is not None:
            cli.add_command(cmd)


def main(argv: list[str] | None = None) -> int:
    _register_extra()
    try:
        cli.main(args=argv, standalone_mode=False)
    except UserError as e:
        click.echo(f"error: {e.line()}", err=True)
        return e.exit_code
    except GateFailed as e:
        click.echo(f"gate failed: {e}", err=True)
        return GateFailed.exit_code
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as e:
        e.show()
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
