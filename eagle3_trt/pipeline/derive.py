"""A bundle derived from another one with a new draft head (``train-draft --traffic --from``, issue 23).

The child serves the same target as its parent: target/, tokenizer/ and the options file (K, aux
layers, KV cache, plan) are the parent's, byte for byte (hard-linked where the filesystem allows,
so a large target costs no disk). Only draft/ is new, exported the way the parent's was: BF16 as
a build exports it (``export_draft_bf16`` after ``for_max_seq_len``), or calibrated and quantized
with ModelOpt to the parent's draft format on the parent's calibration set (the build's own
functions). The pair is validated again (convert/validate.validate_pair), the embedded pair's
acceptance figure is measured again when the parent had one, launch/ is re-rendered and the
manifest is sealed with ``lineage`` naming the parent. Records that described the parent's head
(``recommendation``, ``compile``) are not carried over; the K recommend chose stays in the options.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import warnings
from pathlib import Path
from typing import Any, TextIO

from eagle3_trt.atomic import staged_dir, write_json, write_text
from eagle3_trt.convert import export, quantize
from eagle3_trt.convert.draft_format import DraftCheckpoint, for_max_seq_len, load_draft
from eagle3_trt.convert.target import read_target
from eagle3_trt.convert.validate import validate_pair
from eagle3_trt.core.draft import Eagle3Draft
from eagle3_trt.errors import UserError
from eagle3_trt.formats.bundle_manifest import Behaviour, Lineage
from eagle3_trt.formats.checkpoint_io import read_json
from eagle3_trt.formats.draft_config import target_token_ids
from eagle3_trt.pipeline import bundle as fmt
from eagle3_trt.pipeline import bundle_write
from eagle3_trt.pipeline.build_checkpoints import measure_embedded_acceptance

# what the child takes from its parent unchanged (launch/ is rendered again by seal)
SHARED_DIRS = ("target", "tokenizer")


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)  # the atomic writer replaces files by rename, never in place: a shared inode is safe
    except OSError:
        shutil.copy2(src, dst)


def open_parent(path: Path, option: str = "--from") -> fmt.Bundle:
    """The parent bundle, refused in one line when it is not a (real, intact) bundle."""
    p = Path(path)
    if not (p / fmt.MANIFEST_FILE).is_file():
        raise UserError(
            option,
            f"{p} is not an engine bundle (no {fmt.MANIFEST_FILE})",
            "pass a directory written by `eagle3-trt engine` or a previous train-draft --traffic",
        )
    b = fmt.open_bundle(p)
    if b.dry_run:
        raise UserError(option, f"{p} is a dry-run bundle (configs only, no weights)", "build the bundle for real first")
    problems = fmt.verify(b, content=False, unrecorded=False)
    if problems:
        raise UserError(option, f"{p} does not match its manifest ({problems[0]})", fmt.REBUILD_HINT)
    return b


def _export_draft(parent: fmt.Bundle, ckpt: DraftCheckpoint, aux: tuple[int, ...], out: Path) -> dict[str, Any]:
    """draft/ as the parent's was made; returns what the manifest records about it."""
    token_ids = target_token_ids(read_json(parent.path / "target" / "config.json"))  # the draft config's bos/eos are the target's
    if parent.quant.draft == "bf16":
        export.export_draft_bf16(ckpt, out, token_ids)
        return {}
    # A quantized draft: ModelOpt calibration on the parent's calibration set through its BF16 target,
    # exactly as pipeline/build_checkpoints quantizes a draft in a build.
    # torch and transformers only for a quantized draft: a BF16 head is copied without them
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy: only for a quantized draft

    tdir, _ = parent.source_dirs()
    cal = parent.manifest.calibration
    tok = AutoTokenizer.from_pretrained(str(tdir), trust_remote_code=False)
    prompts = quantize.calibration_prompts(Path(cal.file), cal.num_samples, cal.max_length, read_target(tdir), "calibration.max_length")
    batches = quantize.calibration_batches(tok, prompts, cal.max_length)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(
        str(tdir), dtype=torch.bfloat16, trust_remote_code=False, low_cpu_mem_usage=True, **({"device_map": "auto"} if device == "cuda" else {})
    ).eval()
    dm = Eagle3Draft.from_checkpoint(ckpt, dtype=torch.bfloat16, device=device)
    # ModelOpt's chatter (its config, export warnings) goes to build.log, as in a build
    with open(out.parent / "build.log", "a") as logf, contextlib.redirect_stdout(logf), warnings.catch_warnings():

        def to_log(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: TextIO | None = None, line: str | None = None) -> None:
            logf.write(warnings.formatwarning(message, category, filename, lineno, line))

        warnings.showwarning = to_log
        quantize.quantize_draft(dm, model, batches, aux, parent.quant.draft)
        export.export_draft_quantized(dm, ckpt, out, token_ids)
    return {"draft_calibration_prompts": len(batches)}


def derive_bundle(
    parent: fmt.Bundle,
    head_dir: Path,
    dest: Path,
    lineage: Lineage,
    *,
    timings: dict[str, float] | None = None,
    files: dict[str, str] | None = None,
) -> fmt.Bundle:
    """Write ``dest``: ``parent`` with the BF16 head at ``head_dir`` as its draft (see the module doc);
    ``files``: more text files at the bundle's top level, sealed with it (the traffic split's sides)."""
    t0 = time.perf_counter()
    dest = Path(dest)
    if dest.resolve() == parent.path.resolve():
        raise UserError("-o", f"{dest} is the --from bundle", "write the retrained bundle to a new directory")
    ckpt = load_draft(Path(head_dir))
    tdir = Path(parent.manifest.sources.target.path)
    target = read_target(tdir if tdir.is_dir() else parent.target_dir)
    report = validate_pair(target, ckpt, parent.max_seq_len, quant=parent.quant.target)
    if tuple(report.aux_layer_ids) != tuple(parent.aux_layer_ids):
        raise UserError(
            head_dir,
            f"reads target layers {list(report.aux_layer_ids)}, the bundle captures {list(parent.aux_layer_ids)}",
            "train the head with the bundle's aux layers",
        )
    report.behaviour = {"skipped": "retrained from traffic: measured on the held-back traffic instead (manifest lineage.training)"}
    ckpt = for_max_seq_len(ckpt, parent.max_seq_len)
    with staged_dir(dest) as tmp:
        for d in SHARED_DIRS:
            if (parent.path / d).is_dir():
                shutil.copytree(parent.path / d, tmp / d, copy_function=_link_or_copy)
        shutil.copy2(parent.path / fmt.OPTIONS_FILE, tmp / fmt.OPTIONS_FILE)
        extra = _export_draft(parent, ckpt, tuple(parent.aux_layer_ids), tmp / "draft")
        write_json(tmp / fmt.VALIDATION_FILE, report.to_dict())
        for name, text in (files or {}).items():
            write_text(tmp / name, text)
        acceptance = None
        if parent.manifest.acceptance is not None and tdir.is_dir():
            acceptance = measure_embedded_acceptance(tmp, tdir.parent, parent.k, tuple(parent.aux_layer_ids))
        man = parent.manifest
        src = man.sources.draft
        times = {**(timings or {}), "derive_s": round(time.perf_counter() - t0, 3)}
        inputs_fp = fmt.fingerprint(
            {
                "derived_from": man.fingerprint,
                "draft": {rel: d.sha256 for rel, d in fmt.file_digests(Path(head_dir)).items()},
                "lineage": lineage.model_dump(mode="json"),
            }
        )
        child = man.model_copy(
            update={
                "created_unix": int(time.time()),
                "sources": fmt.Sources(
                    target=man.sources.target,
                    draft=fmt.Source(path=str(Path(head_dir).resolve()), source=f"retrained from {src.path}", files=fmt.file_digests(Path(head_dir))),
                ),
                "validation": fmt.Validation(checks=[c["check"] for c in report.checks], warnings=report.warnings, behaviour=Behaviour(**report.behaviour)),
                "versions": fmt.package_versions(),
                "git_sha": fmt.git_sha(),
                "timings": {k: round(v, 3) for k, v in times.items()},
                "acceptance": acceptance,
                "recommendation": None,
                "compile": None,
                "lineage": lineage.model_copy(update={"training": {**lineage.training, **extra}}),
                "inputs_fingerprint": inputs_fp,
                "outputs": {},
                "fingerprint": "",
            }
        )
        bundle_write.seal(tmp, child)
    return fmt.open_bundle(dest)
