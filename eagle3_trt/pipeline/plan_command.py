"""The plan command (registered in eagle3_trt/cli.py): a module of its own because planning reads config
files only, and a mistyped model must be refused before torch loads; compile's module (commands.py) reaches
the speculation registry, which imports the model core (torch)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from eagle3_trt.convert.prompts import SHIPPED_PROMPTS, load_prompts
from eagle3_trt.errors import UserError
from eagle3_trt.pipeline.gpus import GPUS
from eagle3_trt.pipeline.plan_presets import plan_for_preset, preset_configs
from eagle3_trt.pipeline.plan_report import format_plan, plan_steps
from eagle3_trt.pipeline.presets import Preset, load_preset, load_preset_file
from eagle3_trt.pipeline.reference_memory import MEASURE_BATCH, MEASURE_MAX_TOKENS, MEASURE_PROMPT_TOKENS, measure_plan
from eagle3_trt.pipeline.train_plan import format_train_plan, make_train_plan


@click.command("plan")
@click.argument("model", required=False)
@click.option(
    "--preset-file",
    default=None,
    type=click.Path(dir_okay=False),
    help="a preset YAML file of your own instead of MODEL (its checkpoints' config.json files are read)",
)
@click.option("--gpu", "gpu", type=click.Choice(sorted(GPUS)), default="h100", show_default=True, help="GPU model of every GPU")
@click.option("--gpus", "num_gpus", type=int, default=1, show_default=True, help="GPUs on the node")
@click.option(
    "--quant",
    type=click.Choice(["fp8", "nvfp4", "bf16", "native"]),
    default=None,
    help="target weights (default: the preset's for the GPU generation; native keeps an already-quantized target as shipped)",
)
@click.option("--tp", type=int, default=None, help="tensor parallel size (default: the smallest that fits)")
@click.option("--pp", type=int, default=1, show_default=True, help="pipeline parallel size (not with speculation)")
@click.option("--max-seq-len", type=int, default=None, help="tokens per sequence (default: the preset's)")
@click.option("--max-batch-size", type=int, default=None, help="default: the most full-length sequences that fit, capped at 128")
@click.option("--train", is_flag=True, help="also plan retraining the head: hidden-state storage, GPU memory per rank per backend, time")
@click.option("--records", type=int, default=None, help="with --train: training records (token windows)")
@click.option("--train-seq-len", type=int, default=2048, show_default=True, help="with --train: tokens per record")
@click.option("--epochs", type=int, default=1, show_default=True, help="with --train: passes over the records")
@click.option("--train-batch-size", type=int, default=8, show_default=True, help="with --train: train-draft's global --batch-size")
@click.option(
    "--measure", is_flag=True, help="also plan measuring acceptance (alpha, gate) with the reference runtime: memory per GPU and time per 1,000 prompts"
)
@click.option("--measure-tp", type=int, default=None, help="with --measure: ranks the target is split over (default: the fewest that fit)")
@click.option("--measure-batch", type=int, default=MEASURE_BATCH, show_default=True, help="with --measure: alpha's --batch-size")
@click.option("--measure-prompt-tokens", type=int, default=MEASURE_PROMPT_TOKENS, show_default=True, help="with --measure: tokens per prompt")
@click.option("--measure-max-tokens", type=int, default=MEASURE_MAX_TOKENS, show_default=True, help="with --measure: alpha's --max-tokens")
@click.option("--json", "as_json", is_flag=True, help="print the plan as JSON")
def plan_cmd(
    model: str | None,
    preset_file: str | None,
    gpu: str,
    num_gpus: int,
    quant: str | None,
    tp: int | None,
    pp: int,
    max_seq_len: int | None,
    max_batch_size: int | None,
    train: bool,
    records: int | None,
    train_seq_len: int,
    epochs: int,
    train_batch_size: int,
    as_json: bool,
    measure: bool = False,
    measure_tp: int | None = None,
    measure_batch: int = MEASURE_BATCH,
    measure_prompt_tokens: int = MEASURE_PROMPT_TOKENS,
    measure_max_tokens: int = MEASURE_MAX_TOKENS,
) -> None:
    """Plan MODEL (a registry preset) or --preset-file on --gpus N x --gpu from config files alone:
    memory, TP layout, KV cache, batch sizes, and the steps `make engine` will run."""
    if bool(model) == bool(preset_file):
        raise UserError(
            "MODEL/--preset-file",
            "both given" if model else "neither given",
            "pass a registry preset name (eagle3-trt presets) or --preset-file PATH, exactly one",
        )
    if (records is not None) != train:
        raise UserError(
            "--records" if records is not None else "--train", "--train and --records N go together", "e.g. plan llama3.3-70b --train --records 50000"
        )
    preset = load_preset_file(Path(preset_file)) if preset_file else model
    assert preset is not None
    plan = plan_for_preset(preset, gpu, num_gpus, quant, tp, max_seq_len=max_seq_len, max_batch_size=max_batch_size, pp=pp)
    p = preset if isinstance(preset, Preset) else load_preset(preset)
    cal = p.calibration
    # the build's default --calib (quantize.DEFAULT_CALIB_FILE); a preset asking for more than it holds needs the user's data
    shipped = len(load_prompts(SHIPPED_PROMPTS, cal.num_samples, option="--calib"))
    steps = plan_steps(plan, cal.num_samples, cal.max_length, shipped)
    if not measure and (
        measure_tp is not None or (measure_batch, measure_prompt_tokens, measure_max_tokens) != (MEASURE_BATCH, MEASURE_PROMPT_TOKENS, MEASURE_MAX_TOKENS)
    ):
        raise UserError("--measure-*", "sizes the measurement --measure plans", "add --measure")
    if min(measure_batch, measure_prompt_tokens, measure_max_tokens) < 1:
        raise UserError("--measure-batch/--measure-prompt-tokens/--measure-max-tokens", "must be at least 1", "e.g. --measure-batch 16")
    mplan = None
    if measure:
        target_cfg, draft_cfg = preset_configs(p, isinstance(preset, Preset))
        mplan = measure_plan(
            target_cfg,
            draft_cfg,
            GPUS[gpu],
            num_gpus,
            plan.max_draft_len or p.max_draft_len,
            tp=measure_tp,
            batch=measure_batch,
            prompt_tokens=measure_prompt_tokens,
            max_tokens=measure_max_tokens,
        )
    tplan = None
    if train:
        assert records is not None
        target_cfg, draft_cfg = preset_configs(p, isinstance(preset, Preset))
        tplan = make_train_plan(plan, target_cfg, draft_cfg, records, train_seq_len, epochs, train_batch_size)
    if as_json:
        extra = {**({"train": tplan.to_dict()} if tplan else {}), **({"measure": mplan.to_dict()} if mplan else {})}
        click.echo(json.dumps({**plan.to_dict(), "steps": steps, **extra}, indent=2))
        return
    click.echo(format_plan(plan))
    click.echo("steps of `make engine`:")
    for i, s in enumerate(steps, 1):
        click.echo(f"  {i}. {s}")
    if tplan is not None:
        click.echo(format_train_plan(tplan, plan))
    for line in mplan.lines() if mplan is not None else []:
        click.echo(line)
