"""The eagle3-trt command line: one entry point for every stage of the pipeline."""

from __future__ import annotations

import difflib
import importlib
import json
import signal
import sys
from pathlib import Path

import click
from rich.console import Console

from eagle3_trt import __version__
from eagle3_trt.errors import GateFailed, RankFailed, SignalInterrupt, UserError
from eagle3_trt.progress import Bars

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

# Commands that live next to the code they drive: name -> (module, attribute, one-line help).
# Loaded lazily: a command's module is imported only when that command runs, because importing
# the stages pulls in torch, transformers and ModelOpt (seconds), and `eagle3-trt --help`,
# `presets` or a typo should answer at once. The one-line help is written here for the same
# reason (listing the commands must not import them); tests/test_bundle_contract.py checks it
# against each command's docstring. A module or attribute that is missing is an error, never a
# command that silently disappears from the CLI.
LAZY_COMMANDS: dict[str, tuple[str, str, str]] = {
    "plan": (
        "eagle3_trt.pipeline.plan_command",
        "plan_cmd",
        "Plan MODEL (a registry preset) or --preset-file on --gpus N x --gpu from config files alone: memory, TP layout, KV cache, batch sizes, "
        "and the steps `make engine` will run.",
    ),
    "compile": (
        "eagle3_trt.pipeline.commands",
        "compile_cmd",
        "Load BUNDLE in TensorRT-LLM (EAGLE-3 one-model, CUDA graphs), run a smoke generation and a short acceptance "
        "measurement, and record results, GPU and versions in its manifest.json.",
    ),
    "alpha": ("eagle3_trt.measure.commands", "alpha_cmd", "Measure acceptance (alpha) of BUNDLE's quantized pair on your prompts, per category, vs BF16."),
    "gate": (
        "eagle3_trt.measure.commands",
        "gate_cmd",
        "Fail (exit 3) when BUNDLE's alpha on the prompts is below --threshold or speculation would slow it down.",
    ),
    "recommend": (
        "eagle3_trt.measure.commands",
        "recommend_cmd",
        "Predict speedup per K and batch size from measured acceptance; recommend K and max_concurrency.",
    ),
    "package": (
        "eagle3_trt.triton_serving.commands",
        "package_cmd",
        "Write a Triton model repository (Python-backend model, llmapi tensor interface, upstream model.yaml) for BUNDLE.",
    ),
    "serve": ("eagle3_trt.triton_serving.commands", "serve_cmd", "Start tritonserver on 127.0.0.1 with REPO, wait until it is ready, print the URLs."),
    "stop": ("eagle3_trt.triton_serving.commands", "stop_cmd", "Stop the server started by `eagle3-trt serve` (recorded in STATE_DIR/server.json)."),
    "deploy": (
        "eagle3_trt.triton_serving.deploy_commands",
        "deploy_cmd",
        "Add bundle NEW as the next version of the served Triton model: new requests go to it, requests in flight finish on the old one.",
    ),
    "serve-dynamo": (
        "eagle3_trt.dynamo_serving.commands",
        "serve_dynamo_cmd",
        "Start NVIDIA Dynamo's OpenAI frontend and N reference-runtime workers for BUNDLE on 127.0.0.1.",
    ),
    "status-dynamo": ("eagle3_trt.dynamo_serving.commands", "status_dynamo_cmd", "One line per process started by serve-dynamo; exit 1 when one is dead."),
    "stop-dynamo": ("eagle3_trt.dynamo_serving.commands", "stop_dynamo_cmd", "Stop what serve-dynamo started and remove its discovery store."),
    "deploy-dynamo": (
        "eagle3_trt.dynamo_serving.deploy_commands",
        "deploy_dynamo_cmd",
        "Serve bundle NEW on a serve-dynamo deployment: workers are replaced one at a time, each drained before it stops.",
    ),
    "generate": ("eagle3_trt.clients.commands", "generate_cmd", "Send PROMPT to the eagle3 model on a Triton server (chat template applied client-side)."),
    "bench": (
        "eagle3_trt.clients.commands",
        "bench_cmd",
        "Rollout benchmark: TTFT, ITL, throughput, alpha and AL with speculation on vs off; report + gate verdict.",
    ),
    "train-draft": ("eagle3_trt.train.commands", "train_draft_cmd", "Train (or fine-tune with --init) an EAGLE-3 draft head for TARGET on your prompts."),
    "hidden-states": (
        "eagle3_trt.train.hs_commands",
        "hidden_states_cmd",
        "Write target hidden states through an engine (reference, Hugging Face device_map, TensorRT-LLM), or convert them for other trainers.",
    ),
}


def load_command(name: str) -> click.Command:
    """Import the module of a command in LAZY_COMMANDS and return its click command."""
    module, attr, _ = LAZY_COMMANDS[name]
    cmd = getattr(importlib.import_module(module), attr)
    if not isinstance(cmd, click.Command) or cmd.name != name:
        raise TypeError(f"{module}.{attr} is not the click command {name!r} (eagle3_trt/cli.py LAZY_COMMANDS)")
    return cmd


class _UnknownCommand(click.UsageError):
    """A misspelled command, told apart by type. click >= 8.4's NoSuchCommand suggests only the
    commands registered eagerly (not LAZY_COMMANDS), and click 8.1-8.3 raise a plain UsageError."""

    def __init__(self, name: str, known: list[str], ctx: click.Context):
        super().__init__(f"no such command {name!r}", ctx)
        self.possibilities = difflib.get_close_matches(name, known, n=1)


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *LAZY_COMMANDS])

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        name = click.utils.make_str(args[0])
        # an option in command position (eagle3-trt --bogus) is left to click, which reports the option
        if not ctx.resilient_parsing and not name.startswith("-") and self.get_command(ctx, name) is None:
            raise _UnknownCommand(name, self.list_commands(ctx), ctx)
        return super().resolve_command(ctx, args)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in LAZY_COMMANDS:
            return load_command(name)
        return super().get_command(ctx, name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        limit = formatter.width - 6 - max(len(n) for n in self.list_commands(ctx))
        rows = []
        for name in self.list_commands(ctx):
            if name in LAZY_COMMANDS:
                text = click.Command(name, help=LAZY_COMMANDS[name][2]).get_short_help_str(limit)
            else:
                text = self.commands[name].get_short_help_str(limit)
            rows.append((name, text))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=_LazyGroup, help=PIPELINE, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="eagle3-trt")
def cli() -> None:
    pass


def _console():
    return Console(stderr=True, soft_wrap=True)


@cli.command("presets")
def presets_cmd() -> None:
    """List the model presets."""
    from eagle3_trt.pipeline.presets import available, load_preset

    for name in available():
        p = load_preset(name)
        click.echo(f"{name:14s} K={p.max_draft_len} max_seq_len={p.max_seq_len:<6d} {p.description}")


@cli.command("validate")
@click.option("--target", "target_dir", required=True, type=click.Path(file_okay=False), help="target HF checkpoint dir")
@click.option("--draft", "draft_dir", required=True, type=click.Path(file_okay=False), help="draft head: EAGLE-3 (SafeAILab/ModelOpt/speculators) or other")
@click.option("--model", "model", default=None, help="the preset a build of this pair would use (its max_seq_len is checked)  [default: tiny, as for engine]")
@click.option("--preset-file", default=None, type=click.Path(dir_okay=False), help="a preset YAML file of your own (instead of --model)")
@click.option("--max-seq-len", type=click.IntRange(min=1), default=None, help="tokens per sequence to check for (default: the preset's, what the build uses)")
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
@click.option(
    "--deep",
    is_flag=True,
    help="also run the pair on calibration prompts, as `engine` does: the target's loss vs log V (a swapped tokenizer) "
    "and the draft's agreement with the target vs chance (a head trained for another target)",
)
@click.option("--calib", "calib_file", default=None, type=click.Path(dir_okay=False), help="prompts for --deep (default: the shipped calibration set)")
def validate_cmd(
    target_dir: str, draft_dir: str, model: str | None, preset_file: str | None, max_seq_len: int | None, as_json: bool, deep: bool, calib_file: str | None
) -> None:
    """Check that a target and a draft head (EAGLE-3, or a registered method's own format) belong together (no quantization)."""
    from eagle3_trt.convert.draft_format import load_draft
    from eagle3_trt.convert.target import read_target
    from eagle3_trt.convert.validate import validate_pair
    from eagle3_trt.pipeline.presets import override_dir

    override_dir(target_dir, "target")
    override_dir(draft_dir, "draft")
    seq_len, seq_len_from = _validate_max_seq_len(model, preset_file, max_seq_len)
    target, draft = read_target(Path(target_dir)), load_draft(Path(draft_dir))
    rep = validate_pair(target, draft, seq_len)
    if deep:
        from eagle3_trt.convert import behaviour
        from eagle3_trt.convert.prompts import SHIPPED_PROMPTS

        prompts = Path(calib_file) if calib_file else SHIPPED_PROMPTS
        behaviour.check_behaviour(Path(target.path), draft, rep.aux_layer_ids, prompts, min(behaviour.MAX_TOKENS, target.max_position_embeddings), rep)
    if as_json:
        click.echo(json.dumps({**rep.to_dict(), "max_seq_len": seq_len, "max_seq_len_from": seq_len_from}, indent=2))
        return
    click.echo(f"for   max_seq_len {seq_len} ({seq_len_from})")
    for c in rep.checks:
        click.echo(f"ok    {c['check']:11s} {c['detail']}")
    for w in rep.warnings:
        click.echo(f"warn  {w}")


def _validate_max_seq_len(model: str | None, preset_file: str | None, max_seq_len: int | None) -> tuple[int, str]:
    """(the max_seq_len `validate` checks, where it comes from): the one `engine` builds with the
    same --model/--preset-file/--max-seq-len (the preset's unless given)."""
    from eagle3_trt.pipeline.presets import load_preset, load_preset_file

    if model and preset_file:
        raise UserError("--model/--preset-file", "both given", "pass a registry preset name (--model) or a preset file (--preset-file), not both")
    preset = load_preset_file(Path(preset_file)) if preset_file else load_preset(model or "tiny")
    if max_seq_len is not None:
        return max_seq_len, "--max-seq-len"
    flag = f"--preset-file {preset_file}" if preset_file else f"--model {preset.name}"
    return preset.max_seq_len, f"preset {preset.name}'s, what `eagle3-trt engine {flag} --target ... --draft ...` builds; --max-seq-len N checks another"


@cli.command("engine")
@click.option("--model", "model", default=None, help="preset name from the registry (eagle3-trt presets)  [default: tiny]")
@click.option(
    "--preset-file",
    default=None,
    type=click.Path(dir_okay=False),
    help="a preset YAML file of your own (instead of --model; same fields as build/presets/*.yaml)",
)
@click.option("--target", "target", default=None, help="local target checkpoint dir (overrides the preset)")
@click.option("--draft", "draft", default=None, help="local draft head dir, EAGLE-3 or other (overrides the preset; alone: with the embedded target)")
@click.option("--target-gpu", default=None, help="GPU the bundle is for: h100, h200, b200, ... (default: detected GPU, else the preset's)")
@click.option("--gpus", type=int, default=None, help="GPUs to plan for (default: the preset's)")
@click.option("--tp", type=int, default=None, help="tensor-parallel size (default: the planner's choice)")
@click.option(
    "--quant",
    type=click.Choice(["fp8", "nvfp4", "bf16", "native"]),
    default=None,
    help="target format (default: the preset's for the GPU generation; native keeps an already-quantized target as shipped)",
)
@click.option("--kv-cache", type=click.Choice(["fp8", "auto"]), default=None, help="KV cache format (default: the preset's)")
@click.option("--quantize-draft", is_flag=True, help="quantize the draft head too (default: BF16 draft)")
@click.option("--draft-quant", type=click.Choice(["fp8", "nvfp4"]), default=None, help="draft format with --quantize-draft (default: the target's)")
@click.option("--calib", "calib_file", default=None, help="calibration prompts (JSONL with 'turns' or 'text', or .txt); default: shipped set")
@click.option("--calib-samples", type=click.IntRange(min=1), default=None, help="number of calibration prompts")
@click.option(
    "--calib-max-length", type=click.IntRange(min=1), default=None, help="tokens per calibration prompt (at most the target's max_position_embeddings)"
)
@click.option("--max-draft-len", type=int, default=None, help="draft length K (default: the preset's)")
@click.option(
    "--max-seq-len",
    type=click.IntRange(min=1),
    default=None,
    help="tokens per sequence the bundle serves (default: the preset's; at most the target's max_position_embeddings)",
)
@click.option("-o", "--out", default=None, help="bundle dir (default: engines/<preset>-<quant>-<gpu>)")
@click.option("--force", is_flag=True, help="rebuild even when the inputs are unchanged")
@click.option("--dry-run", is_flag=True, help="configs only: plan, validate and write options + manifest, no weights")
@click.option(
    "--skip-behaviour-checks",
    is_flag=True,
    help="do not run the pair on calibration prompts (target loss vs log V, draft agreement vs chance); the skip is recorded "
    "(also: EAGLE3_TRT_SKIP_BEHAVIOUR_CHECKS=1)",
)
@click.option(
    "--heldout-prompts",
    default=None,
    type=click.Path(dir_okay=False),
    help="held-out prompts (a prompt file as for alpha) the build measures acceptance on and gates; an embedded pair ships its own",
)
@click.option("--json", "as_json", is_flag=True, help="print the manifest as JSON on stdout")
def engine_cmd(model: str | None, preset_file: str | None, as_json: bool, **kw) -> None:
    """Validate, quantize and export a target + EAGLE-3 draft into an engine bundle."""
    from eagle3_trt.pipeline.presets import load_preset, load_preset_file, override_dir

    if model and preset_file:
        raise UserError("--model/--preset-file", "both given", "pass a registry preset name (--model) or a preset file (--preset-file), not both")
    # the preset first: a name outside the registry is refused before a GPU is probed or a file read
    preset = load_preset_file(Path(preset_file)) if preset_file else load_preset(model or "tiny")
    if (max_seq_len := kw.pop("max_seq_len")) is not None:
        # the one fact the preset holds that a build may override; everything downstream (plan,
        # validation, options, fingerprint) reads it from the preset
        preset = preset.model_copy(update={"max_seq_len": max_seq_len})
    for role in ("target", "draft"):  # a mistyped path is refused before the GPU probe (imports torch)
        if kw[role]:
            override_dir(kw[role], role)
    if kw["heldout_prompts"]:  # missing, empty or malformed: one line before the GPU probe
        from eagle3_trt.convert.prompts import load_prompt_records

        load_prompt_records(kw["heldout_prompts"], option="--heldout-prompts")
    # imported after the checks above: the builder pulls in torch, transformers and ModelOpt (seconds),
    # and a mistyped MODEL or path should answer at once
    from eagle3_trt.pipeline.builder import EngineRequest, build_bundle

    if kw["target_gpu"] is None:
        kw["target_gpu"] = _detected_gpu()
    req = EngineRequest(preset=preset, **kw)
    con = _console()
    with _progress(con) as progress:
        res = build_bundle(req, progress=progress, log=progress.say)
    if as_json:
        click.echo(json.dumps(res.manifest.to_json(), indent=2))
    _print_summary(con, res)


def _detected_gpu() -> str | None:
    from eagle3_trt.pipeline.gpu_checks import detect_gpu

    found = detect_gpu()
    return found[0] if found else None


class _progress:
    """Build stages on the commands' one progress display (eagle3_trt/progress.py: live bars on a
    terminal, plain lines in a log); build_bundle asks for a ticker per stage. The display starts
    with the first stage, so a refusal before any stage prints its one error line and nothing else."""

    def __init__(self, console):
        self.bars = Bars()
        self.started = False
        self.last: list = []  # [advance, done, total] of the current stage

    def __enter__(self):
        return self

    def _finish_stage(self) -> None:
        if self.last:
            advance, done, total = self.last
            if done < total:
                advance(total - done)

    def __exit__(self, *exc):
        if not self.started:
            return False
        if exc[0] is None:
            self._finish_stage()
        return self.bars.__exit__(*exc)

    def say(self, message: str) -> None:
        self.bars.say(message, style="yellow")  # the build's warnings

    def __call__(self, stage: str, total: int | None = None):
        if not self.started:
            self.bars.__enter__()
            self.started = True
        else:
            self._finish_stage()
        state = [self.bars.task(stage, total or 1), 0, total or 1]
        self.last = state

        def tick() -> None:
            state[1] += 1
            state[0](1)

        return tick


def _print_summary(con, res) -> None:
    from eagle3_trt.pipeline.bundle import CALIBRATION_HINT

    b = res.opened
    m = b.manifest
    if res.cache_hit:
        con.print(
            f"[green]cache hit[/]: inputs and build options unchanged and every file matches the manifest "
            f"(fingerprint {m.fingerprint[:12]}); bundle not rebuilt"
        )
    con.print(f"[bold]bundle[/]: {res.bundle}")
    tg = b.target_gpu
    con.print(
        f"  for {tg.name} (SM{tg.sm}): target {b.quant.target}, draft {b.quant.draft}, KV cache {b.kv_cache}; K={b.k}, aux layers {list(b.aux_layer_ids)}"
    )
    if m.dry_run:
        con.print("  [yellow]dry run[/]: configs only, no weights were read or written")
    plan = m.plan
    if plan:
        con.print(
            f"  plan: {plan['num_gpus']}x {plan['gpu']}, TP{plan['tp']} x {plan['instances']} instance(s), max batch {plan['max_batch_size']}, KV cache {plan['kv_tokens']} tokens per instance"
        )
    con.print(f"  validated: {', '.join(m.validation.checks)}" + (f" ({len(res.warnings)} warning(s), printed above)" if res.warnings else ""))
    cal = m.calibration
    if cal.shortfall:
        con.print(f"  [yellow]warning[/]: {cal.shortfall} ({CALIBRATION_HINT})", highlight=False)
    elif cal.prompts_used:
        con.print(f"  calibration: {cal.prompts_used} prompts, {cal.tokens} tokens from {cal.file}")
    con.print(f"  took {m.timings.get('total_s', 0):.1f} s" + ("" if not res.cache_hit else " (original build)"))
    acc = m.acceptance
    if acc:
        con.print(
            # recommend --write may have replaced the build's figure: say where this one comes from
            f"  acceptance (K={acc.max_draft_len}, {acc.prompts} prompts; {acc.measured_on}): "
            f"alpha {acc.alpha:.2f}, acceptance length {acc.acceptance_length:.2f} tokens per target forward"
        )
        con.print(f"  {_build_gate_line(res.bundle, m)}", highlight=False)
    elif res.gate_note:
        con.print(f"  {res.gate_note}", highlight=False)


def _build_gate_line(bundle: Path, m) -> str:
    """The gate verdict on the build's own held-out measurement (measure/gate_verdict.py's bar), with the
    `alpha` command that reruns that measurement."""
    from eagle3_trt.formats.heldout import HELDOUT_FILE
    from eagle3_trt.measure.gate_verdict import build_acceptance_verdict
    from eagle3_trt.pipeline.build_checkpoints import HELDOUT_MAX_TOKENS

    acc = m.acceptance
    if acc.prompts_file:  # --heldout-prompts: every record's first turn
        rerun = f"eagle3-trt alpha {_shown(bundle)} --prompts {_shown(Path(acc.prompts_file))} --turns first --max-tokens {HELDOUT_MAX_TOKENS}"
    else:
        rerun = f"eagle3-trt alpha {_shown(bundle)} --prompts {_shown(Path(m.sources.target.path).parent / HELDOUT_FILE)} --limit {acc.prompts} --max-tokens {HELDOUT_MAX_TOKENS}"
    return build_acceptance_verdict(acc.alpha, _shown(bundle), rerun)


def _shown(p: Path) -> str:
    """``p`` relative to the working directory when it lies below it (a command to paste), else absolute."""
    p = Path(p).resolve()
    try:
        return str(p.relative_to(Path.cwd()))
    except ValueError:
        return str(p)


def _usage_line(e: click.UsageError) -> str:
    """A command-line mistake as one line: where, what, the closest valid spelling and where the help
    is (click's own report is the usage text, a hint and the message on four lines)."""
    cmd = e.ctx.command_path if e.ctx is not None else "eagle3-trt"
    close: list[str] = []
    if isinstance(e, click.NoSuchOption):
        what = f"no such option {e.option_name}"
        close = difflib.get_close_matches(e.option_name, e.possibilities or [], n=1)
        listed = "options"
    elif isinstance(e, _UnknownCommand):
        what, close, listed = e.message, e.possibilities, "commands"
    else:
        what, listed = e.format_message(), "options"
    guess = f"did you mean {close[0]}? " if close else ""
    return f"{cmd}: {what} (hint: {guess}`{cmd} --help` lists the {listed})"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        # the command line is kept for `--tp N`, which starts it again under torchrun (runtime/distributed.py)
        cli.main(args=args, standalone_mode=False, obj={"argv": args})
    except UserError as e:
        click.echo(f"error: {e.line()}", err=True)
        return e.exit_code
    except RankFailed as e:
        click.echo(f"error: {e}", err=True)
        return RankFailed.exit_code
    except GateFailed as e:
        if str(e):  # empty: the command printed its verdict already
            click.echo(str(e), err=True)
        return GateFailed.exit_code
    except click.exceptions.Abort as e:
        # SIGINT: 130; SIGTERM (eagle3_trt.atomic raises SignalInterrupt(15) for it): 143, the
        # 128 + signal number a shell reports, so `docker stop` and Ctrl-C can be told apart
        cause = e.__cause__ or e.__context__
        sig = cause.signum if isinstance(cause, SignalInterrupt) else int(signal.SIGINT)
        click.echo("interrupted (SIGTERM)" if sig == signal.SIGTERM else "aborted", err=True)
        return 128 + sig
    except click.UsageError as e:
        if isinstance(e, getattr(click.exceptions, "NoArgsIsHelpError", ())):  # bare `eagle3-trt` (click >= 8.2): the help
            e.show()
        else:
            click.echo(f"error: {_usage_line(e)}", err=True)
        return e.exit_code
    except click.ClickException as e:
        e.show()
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
