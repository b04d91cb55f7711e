"""The checkpoints a build writes into its staging directory: target/, draft/ and tokenizer/.

A real build loads the target (only when something is calibrated), calibrates and quantizes
with ModelOpt, and exports unified Hugging Face checkpoints; a dry run writes the configs only.
Also the acceptance figure of an embedded pair, measured on the checkpoints just written.
pipeline/builder.py decides what to build and calls these; the on-disk format is bundle.py's.
"""

from __future__ import annotations

import contextlib
import json
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from eagle3_trt.convert import export, quantize
from eagle3_trt.convert.draft_format import config_for_max_seq_len, head_hooks
from eagle3_trt.convert.embedded import heldout_prompts
from eagle3_trt.convert.load import load_engine
from eagle3_trt.convert.prompts import first_turn_ids, load_prompt_records, load_prompts
from eagle3_trt.core.draft import Eagle3Draft
from eagle3_trt.core.engine import SamplingParams
from eagle3_trt.errors import UserError
from eagle3_trt.formats.checkpoint_io import read_json
from eagle3_trt.formats.draft_config import read_draft_config, target_token_ids
from eagle3_trt.pipeline import bundle as fmt

Progress = Callable[[str, int | None], Callable[[], None]]


# How many held-out prompts and tokens the build's check measures; the build's summary prints
# `eagle3-trt alpha ... --limit HELDOUT_PROMPTS --max-tokens HELDOUT_MAX_TOKENS` to rerun it.
HELDOUT_PROMPTS = 8
HELDOUT_MAX_TOKENS = 32


def measure_embedded_acceptance(
    bundle: Path, pair_dir: Path, k: int, aux: tuple[int, ...], n_prompts: int = HELDOUT_PROMPTS, max_tokens: int = HELDOUT_MAX_TOKENS
) -> fmt.Acceptance | None:
    """Greedy speculative decoding of the built (quantized) checkpoints on the pair's shipped held-out prompts.

    Only embedded pairs ship such prompts; a few seconds on a CPU. The figure is the bundle's own
    (FP8/NVFP4 weights dequantized, activations fake-quantized by the reference runtime)."""
    prompts = heldout_prompts(pair_dir)
    if prompts is None:
        return None
    eng = _built_engine(Path(bundle), k, aux, "cpu")
    measured_on = "heldout_prompts.json (held-out text), greedy, reference runtime on the quantized bundle"
    return _acceptance(eng, prompts[:n_prompts], k, max_tokens, measured_on)


def measure_file_acceptance(
    bundle: Path, prompts_file: Path, k: int, aux: tuple[int, ...], device: str = "cpu", max_tokens: int = HELDOUT_MAX_TOKENS
) -> fmt.Acceptance:
    """The same measurement on held-out prompts the user supplies (``engine --heldout-prompts``): every
    record's first turn, encoded as ``alpha`` encodes it (chat records through the bundle's template)."""
    records = load_prompt_records(prompts_file, option="--heldout-prompts")
    eng = _built_engine(Path(bundle), k, aux, device)
    prompts = first_turn_ids(records, eng.tokenizer, eng.target.vocab_size, source=prompts_file)
    for rec, ids in zip(records, prompts):
        if len(ids) + max_tokens > eng.max_seq_len:
            raise UserError(
                f"{prompts_file}: prompt {rec.id}", f"{len(ids)} tokens + {max_tokens} generated exceed max_seq_len {eng.max_seq_len}", "shorten or drop it"
            )
    measured_on = f"{prompts_file} (held-out prompts given with --heldout-prompts), first turns, greedy, reference runtime on the quantized bundle"
    return _acceptance(eng, prompts, k, max_tokens, measured_on).model_copy(update={"prompts_file": str(Path(prompts_file).resolve())})


def _built_engine(bundle: Path, k: int, aux: tuple[int, ...], device: str):
    return load_engine(
        bundle / "target", bundle / "draft", tokenizer_dir=bundle / "tokenizer", max_draft_len=k, aux_layer_ids=aux, quantized=True, device=device
    )


def _acceptance(eng, prompts: list[list[int]], k: int, max_tokens: int, measured_on: str) -> fmt.Acceptance:
    res = eng.generate(prompts, SamplingParams(max_tokens=max_tokens))
    gen = sum(r.stats.generated_tokens for r in res)
    fwd = sum(r.stats.target_forwards for r in res)
    drafted = sum(r.stats.draft_tokens for r in res)
    accepted = sum(r.stats.accepted_tokens for r in res)
    return fmt.Acceptance(
        alpha=round(accepted / drafted, 4) if drafted else 0.0,
        acceptance_length=round(gen / fwd, 4) if fwd else 1.0,
        max_draft_len=k,
        prompts=len(prompts),
        generated_tokens=gen,
        target_forwards=fwd,
        measured_on=measured_on,
    )


def write_config_only(target_dir: Path, draft_dir: Path, tmp: Path, max_seq_len: int) -> None:
    """A dry run's configs: the target's as shipped but for the one rope block (``export.target_config``, as a
    real build writes it), the draft's through the function a real build writes it with (its layout flattened,
    max_position_embeddings raised to max_seq_len)."""
    (tmp / "target").mkdir()
    # a plain write into the staging directory (the directory is what is atomic): a full disk then surfaces as
    # the staging directory's one error naming the output, as the copy this replaced did
    cfg = export.target_config(read_json(target_dir / "config.json"), target_dir)
    (tmp / "target" / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    draft_cfg = config_for_max_seq_len(read_draft_config(draft_dir), max_seq_len)
    export.write_draft_config(draft_cfg, target_token_ids(read_json(target_dir / "config.json")), tmp / "draft")
    export.copy_tokenizer(target_dir, tmp / "target")
    export.copy_tokenizer(target_dir, tmp / "tokenizer")


def quantize_and_export(
    target_dir,
    draft,
    report,
    tmp: Path,
    quant: str,
    kv: str,
    draft_quant: str,
    calib_file: Path,
    n_calib: int,
    calib_len: int,
    timings: dict,
    progress: Progress,
) -> dict:
    """Library chatter (ModelOpt prints its whole config, transformers draws bars) goes to build.log."""
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    with open(tmp / "build.log", "w") as logf, contextlib.redirect_stdout(logf), warnings.catch_warnings():

        def to_log(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: TextIO | None = None, line: str | None = None) -> None:
            logf.write(warnings.formatwarning(message, category, filename, lineno, line))

        warnings.showwarning = to_log
        return _quantize_and_export_inner(target_dir, draft, report, tmp, quant, kv, draft_quant, calib_file, n_calib, calib_len, timings, progress)


def _quantize_and_export_inner(
    target_dir,
    draft,
    report,
    tmp: Path,
    quant: str,
    kv: str,
    draft_quant: str,
    calib_file: Path,
    n_calib: int,
    calib_len: int,
    timings: dict,
    progress: Progress,
) -> dict:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer, model = _load_target(target_dir, quant, draft_quant, device, timings, progress)

    if quant in ("bf16", "native") and draft_quant == "bf16":
        batches, info = [], {}  # nothing is calibrated: the manifest records no calibration prompts
    else:
        prompts = load_prompts(calib_file, n_calib, option="--calib")
        batches = quantize.calibration_batches(tokenizer, prompts, calib_len)
        info = {"prompts_used": len(batches), "tokens": int(sum(b.numel() for b in batches)), "tokens_sha256": quantize.calibration_hash(batches)}

    s = time.perf_counter()
    if quant not in ("bf16", "native"):
        tick = progress(f"calibrate + quantize target ({quant}, KV {kv})", len(batches))
        quantize.quantize_target(model, batches, quant, kv, on_step=tick)
    timings["quantize_target_s"] = time.perf_counter() - s

    token_ids = target_token_ids(read_json(Path(target_dir) / "config.json"))  # the draft config's bos/eos are the target's
    _quantize_and_export_draft(draft, model, batches, report, tmp, draft_quant, device, timings, progress, token_ids)
    _export_target(Path(target_dir), model, tmp, quant, timings, progress)
    return info


def _load_target(target_dir, quant: str, draft_quant: str, device: str, timings: dict, progress: Progress) -> tuple[Any, Any]:
    """The tokenizer, and the target model when something is calibrated (else None)."""
    s = time.perf_counter()
    tick = progress("load target", None)
    tokenizer = AutoTokenizer.from_pretrained(str(target_dir), trust_remote_code=False)
    model = None  # only ModelOpt calibration needs the target loaded; a BF16 target is streamed (export_target_bf16)
    if quant not in ("bf16", "native") or draft_quant != "bf16":
        # the config with the bundle's rope block (export.target_config): transformers 4.57 raises KeyError on a
        # llama3 config whose original_max_position_embeddings sits at the top level only, and both generations
        # then calibrate the rope that is served and measured
        config = AutoConfig.for_model(**export.target_config(read_json(Path(target_dir) / "config.json"), Path(target_dir)))
        model = AutoModelForCausalLM.from_pretrained(
            str(target_dir),
            config=config,
            dtype=torch.bfloat16,
            trust_remote_code=False,
            low_cpu_mem_usage=True,
            **({"device_map": "auto"} if device == "cuda" else {}),
        ).eval()
    tick()
    timings["load_target_s"] = time.perf_counter() - s
    return tokenizer, model


def _quantize_and_export_draft(
    draft, model, batches: list, report, tmp: Path, draft_quant: str, device: str, timings: dict, progress: Progress, token_ids: dict
) -> None:
    s = time.perf_counter()
    hooks = head_hooks(draft)
    if hooks is not None:  # a method's own head (its ``head`` hooks): shipped as its serving engine reads it, unquantized (builder refuses --quantize-draft)
        hooks.export(draft, tmp / "draft")
    elif draft_quant != "bf16":
        dm = Eagle3Draft.from_checkpoint(draft, dtype=torch.bfloat16, device=device)
        tick = progress(f"calibrate + quantize draft ({draft_quant})", len(batches))
        quantize.quantize_draft(dm, model, batches, report.aux_layer_ids, draft_quant, on_step=tick)
        timings["quantize_draft_s"] = time.perf_counter() - s
        s = time.perf_counter()
        export.export_draft_quantized(dm, draft, tmp / "draft", token_ids)
    else:
        export.export_draft_bf16(draft, tmp / "draft", token_ids)
    timings["export_draft_s"] = time.perf_counter() - s


def _export_target(target_dir: Path, model, tmp: Path, quant: str, timings: dict, progress: Progress) -> None:
    s = time.perf_counter()
    tick = progress("copy target as shipped" if quant == "native" else "export target (unified HF checkpoint)", None)
    if quant == "native":
        export.export_target_native(target_dir, tmp / "target")
    elif quant == "bf16":
        export.export_target_bf16(target_dir, tmp / "target")
    else:
        export.export_target(model, tmp / "target", target_dir)
    export.copy_tokenizer(target_dir, tmp / "tokenizer")
    tick()
    timings["export_target_s"] = time.perf_counter() - s
