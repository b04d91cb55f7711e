"""`eagle3-trt train-draft`: train or fine-tune an EAGLE-3 head on your own prompts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from eagle3_trt.errors import UserError
from eagle3_trt.procs import torchrun_env
from eagle3_trt.speculative.registry import DEFAULT_METHOD, trainable_methods
from eagle3_trt.train.from_cache import train_draft_from_cache
from eagle3_trt.train.traffic_command import TRAFFIC_ONLY, train_from_traffic_cmd
from eagle3_trt.train.train_draft import TrainDraftOptions, summary_lines, train_draft

# the registered methods whose heads draft from mask slots (their training hooks say so): --mask-token-id applies to them
MASK_SLOT_METHODS = [name for name, t in trainable_methods().items() if getattr(t, "mask_slots", False)]


def _aux(value: str | None) -> tuple[int, ...] | None:
    if not value:
        return None
    try:
        return tuple(int(x) for x in value.split(","))
    except ValueError:
        raise UserError("--aux-layers", f"{value!r} is not a comma-separated list of layer numbers", "e.g. --aux-layers 1,15,28") from None


@click.command("train-draft")
@click.option(
    "--target",
    "target",
    default=None,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Target HF checkpoint directory (BF16, or a ModelOpt FP8/NVFP4 export: dequantized for training). Required without --traffic.",
)
@click.option(
    "--data",
    "data",
    default=None,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help='JSONL with "text", "turns" (user prompts) or "messages" per line, or a plain .txt file. Required without --traffic.',
)
@click.option(
    "--traffic",
    "traffic",
    default=None,
    type=click.Path(path_type=Path),
    help="Captured traffic (the DIR of serve --capture): fine-tune --from BUNDLE's head on its prompts and write a new bundle (-o NEW).",
)
@click.option(
    "--from",
    "from_bundle",
    default=None,
    type=click.Path(path_type=Path),
    help="With --traffic: the bundle that served the traffic; its target regenerates the responses and its head is the starting point.",
)
@click.option("--holdout-fraction", default=0.2, show_default=True, type=float, help="With --traffic: share of prompt groups held back for `gate --traffic`.")
@click.option("--endpoint", default=None, help="With --traffic: regenerate on a running OpenAI-compatible server (base URL, e.g. http://127.0.0.1:8080/v1).")
@click.option("--endpoint-model", default="eagle3", show_default=True, help="With --endpoint: the served model name.")
@click.option("--allow-other-bundles", is_flag=True, help="With --traffic: use records another bundle served (you vouch it served the same target).")
@click.option("--min-records", default=8, show_default=True, type=int, help="With --traffic: fewest training records (after the hold-back) to train on.")
@click.option(
    "--replay-fraction",
    default=0.5,
    show_default=True,
    type=float,
    help="With --traffic: general prompts (the bundle's calibration set, regenerated) mixed in per traffic prompt, against forgetting.",
)
@click.option(
    "--init",
    "init",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Existing EAGLE-3 head to fine-tune (SafeAILab, ModelOpt or speculators layout); keeps its draft vocabulary.",
)
@click.option(
    "-o",
    "--output",
    "out",
    default=None,
    type=click.Path(path_type=Path),
    help="Output draft directory (with --traffic: the new bundle; default <FROM>-traffic-<digest>).",
)
@click.option("--steps", default=2000, show_default=True, type=int, help="Optimizer steps.")
@click.option("--max-draft-len", default=3, show_default=True, type=int, help="Draft steps unrolled in training (TTT) and drafted in the evaluation.")
@click.option(
    "--draft-vocab", default=32000, show_default=True, type=int, help="Draft vocabulary size (most frequent tokens of the data); ignored with --init."
)
@click.option("--device", default="auto", show_default=True, type=click.Choice(["auto", "cpu", "cuda"]))
@click.option("--resume", is_flag=True, help="Continue from the checkpoint in <output>.work/ of an interrupted run with the same inputs.")
@click.option(
    "--generate",
    is_flag=True,
    help="Train on the target's own output: it answers prompt-only chats (turns), and continues the first 64 tokens of each text window.",
)
@click.option("--gen-tokens", default=256, show_default=True, type=int, help="Longest generated answer/continuation with --generate.")
@click.option("--seq-len", default=512, show_default=True, type=int, help="Training window in tokens.")
@click.option("--batch-size", default=8, show_default=True, type=int)
@click.option("--lr", default=None, type=float, help="Peak learning rate [default: 3e-4, 1e-4 with --init].")
@click.option("--aux-layers", default=None, help="Capture layers, TensorRT-LLM convention (outputs of layers i) [default: the head's, else 1,L/2-1,L-4].")
@click.option("--eval-samples", default=16, show_default=True, type=int, help="Held-out prompts for the acceptance measurement.")
@click.option("--eval-tokens", default=64, show_default=True, type=int, help="Tokens generated per held-out prompt.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--threads", default=None, type=int, help="torch CPU threads (1 is fastest on a busy shared machine).")
@click.option(
    "--parallel",
    default="auto",
    show_default=True,
    type=click.Choice(["auto", "ddp", "fsdp"]),
    help="Under torchrun --nproc-per-node N: DDP (each process holds the head) or FSDP (head sharded); auto picks DDP when the head's training state fits half a GPU.",
)
@click.option(
    "--hidden-states",
    "hidden_states",
    default=None,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Train from this hidden-state cache (eagle3-trt hidden-states collect/convert) instead of running the target; --target gives its config, tokenizer, embedding and lm_head.",
)
@click.option(
    "--heldout-hidden-states",
    "heldout_hidden_states",
    default=None,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="With --hidden-states: a cache to measure held-out teacher-forced accuracy on.",
)
@click.option(
    "--method",
    default=DEFAULT_METHOD,
    show_default=True,
    type=click.Choice(sorted(trainable_methods())),
    help="What to train (speculative/registry.py's methods that train a head): "
    + "; ".join(f"{name} = {getattr(t, 'summary', name) if t is not None else 'an EAGLE-3 head (TTT)'}" for name, t in trainable_methods().items())
    + ".",
)
@click.option(
    "--mask-token-id",
    default=None,
    type=int,
    help=f"With --method {' or '.join(MASK_SLOT_METHODS) or '(none registered)'}: the mask slots' token id [default: as the method's trainer picks it].",
)
@click.option("--save-every", default=200, show_default=True, type=int, help="Checkpoint every N steps (what --resume continues from).")
@click.option("--overwrite", is_flag=True, help="Replace an existing output directory.")
@click.option("--keep-work", is_flag=True, help="Keep <output>.work/ (hidden-state cache, checkpoints) after success.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
# Every option but --aux-layers and --json is a TrainDraftOptions field of the same name.
def train_draft_cmd(aux_layers: str | None, as_json: bool, traffic: Path | None, **options: Any) -> None:
    """Train (or fine-tune with --init) an EAGLE-3 draft head for TARGET on your prompts.

    The target teacher-forces the data (or answers the prompts with --generate); the outputs of
    its three capture layers are cached under <output>.work/, and the head is trained with
    EAGLE-3's training-time test over --max-draft-len steps. The result is a SafeAILab /
    TensorRT-LLM layout head (LlamaForCausalLMEagle3: fc, midlayer.*, norm, lm_head, d2t, t2d)
    with train_report.json, whose held-out acceptance is measured by greedy speculative decoding.

    With --traffic DIR --from BUNDLE: fine-tune BUNDLE's head on the prompts captured by
    serve --capture (responses regenerated by BUNDLE's target, greedy; a seeded share of the prompt
    groups held back for gate --traffic) and write a new bundle whose manifest names its parent.
    """
    traffic_opts = {k: options.pop(k) for k in TRAFFIC_ONLY}
    if traffic is not None:
        if torchrun_env()[1] > 1:
            raise UserError("--traffic", "runs as one process, not under torchrun", "run train-draft --traffic without torchrun")
        if options["parallel"] != "auto":
            raise UserError("--parallel", "does not apply with --traffic", "leave it out")
        train_from_traffic_cmd(traffic, traffic_opts, options, aux_layers, as_json)
        return
    given = ["--from" if k == "from_bundle" else f"--{k.replace('_', '-')}" for k, v in traffic_opts.items() if v != TRAFFIC_ONLY[k]]
    if given:
        raise UserError(given[0], "only applies with --traffic", "pass --traffic DIR --from BUNDLE, or leave it out")
    if options["hidden_states"] is not None:
        for name in ("data", "generate"):
            if options[name]:
                raise UserError(f"--{name}", "does not apply with --hidden-states", "the token windows come from the cache")
    elif options["heldout_hidden_states"] is not None:
        raise UserError("--heldout-hidden-states", "only applies with --hidden-states", "pass --hidden-states DIR too")
    for name in ("target", "out") if options["hidden_states"] is not None else ("target", "data", "out"):
        if options[name] is None:
            raise UserError(
                "--output" if name == "out" else f"--{name}", "is required", "train-draft --target DIR --data FILE -o OUT, or --traffic DIR --from BUNDLE"
            )
    if options["method"] != DEFAULT_METHOD and options["hidden_states"] is not None:
        raise UserError("--method", f"{options['method']} trains from the target's own forward, not from --hidden-states", "drop --hidden-states")
    if options["mask_token_id"] is not None and options["method"] not in MASK_SLOT_METHODS:
        raise UserError("--mask-token-id", f"only applies to a method with mask slots (--method {' or '.join(MASK_SLOT_METHODS)})", "leave it out")
    opts = TrainDraftOptions(**options, aux_layers=_aux(aux_layers), quiet=as_json)
    if opts.hidden_states is not None:
        report = train_draft_from_cache(opts)
    else:
        report = train_draft(opts)
    if "rank" in report:  # a torchrun worker other than rank 0: rank 0 reports
        return
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    for line in summary_lines(report):
        click.echo(line)
    click.echo(f"wrote {opts.out} (report: {opts.out / 'train_report.json'})")
