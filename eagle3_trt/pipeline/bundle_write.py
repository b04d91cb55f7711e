"""Writing a bundle: the options file, launch/ rendered from it, and the manifest that seals the
digests of everything else. Each file is replaced atomically; manifest.json goes last."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from eagle3_trt.atomic import EXEC_MODE, FILE_MODE, staged_dir, write_json, write_text
from eagle3_trt.errors import UserError
from eagle3_trt.formats.bundle_manifest import (
    MANIFEST_FILE,
    OPTIONS_FILE,
    REBUILD_HINT,
    Acceptance,
    CompileRecord,
    FileDigest,
    Manifest,
    Quant,
    Recommendation,
    content_fingerprint,
    file_digests,
)
from eagle3_trt.formats.checkpoint_io import read_json, sha256_file
from eagle3_trt.pipeline.bundle import Bundle, open_bundle, read_options, verify
from eagle3_trt.pipeline.dynamo_launch import dynamo_launch_files
from eagle3_trt.pipeline.llm_options import LlmApiOptions
from eagle3_trt.pipeline.other_engines import LAUNCH_DIR, launcher_files, trtllm_refusal

_OPTIONS_HEADER = "# TensorRT-LLM LLM-API options (EAGLE-3 one-model). Paths are relative to this bundle.\n"


def options_text(opts: LlmApiOptions) -> str:
    return _OPTIONS_HEADER + yaml.safe_dump(opts.to_yaml_dict(), sort_keys=False)


def write_options(bundle_dir: Path, opts: LlmApiOptions) -> Path:
    return write_text(Path(bundle_dir) / OPTIONS_FILE, options_text(opts))


def write_manifest(bundle_dir: Path, man: Manifest) -> Path:
    return write_json(Path(bundle_dir) / MANIFEST_FILE, man.to_json())


def launch_files(bundle_dir: Path, opts: LlmApiOptions, quant: Quant) -> dict[str, str]:
    """launch/'s files (name -> text) rendered from the options and formats, in memory: rendering
    refuses options the bundle cannot serve, so callers render before they write anything."""
    draft_cfg = Path(bundle_dir) / opts.speculative_config.speculative_model / "config.json"
    draft_positions = read_json(draft_cfg).get("max_position_embeddings") if draft_cfg.is_file() else None
    files = launcher_files(opts, target_format=quant.target, draft_format=quant.draft, draft_max_positions=draft_positions)
    if trtllm_refusal(opts) is None:  # Dynamo's files launch the TensorRT-LLM backend: none for a method it cannot serve
        files.update(dynamo_launch_files(opts))
    return files


def write_launchers(bundle_dir: Path, opts: LlmApiOptions, quant: Quant, files: dict[str, str] | None = None) -> Path:
    """Write launch/ (``files``, or rendered from the options and formats), replacing any previous one atomically."""
    files = launch_files(bundle_dir, opts, quant) if files is None else files
    with staged_dir(Path(bundle_dir) / LAUNCH_DIR) as tmp:
        for name, text in files.items():
            write_text(tmp / name, text, EXEC_MODE if name.endswith(".sh") else FILE_MODE)
    return Path(bundle_dir) / LAUNCH_DIR


def seal(bundle_dir: Path, man: Manifest) -> Manifest:
    """Last step of a build (inside the builder's staging dir): write launch/ from the options on
    disk, record every file's digest and the fingerprint, write manifest.json."""
    bundle_dir = Path(bundle_dir)
    opts = read_options(bundle_dir)
    write_launchers(bundle_dir, opts, man.quant)
    outputs = file_digests(bundle_dir)
    man = man.model_copy(update={"outputs": outputs, "fingerprint": content_fingerprint(man.inputs_fingerprint, outputs)})
    write_manifest(bundle_dir, man)
    return man


def update(
    bundle_dir: Path,
    *,
    options: LlmApiOptions | None = None,
    record: Recommendation | CompileRecord | None = None,
    acceptance: Acceptance | None = None,
) -> Bundle:
    """Change a built bundle: new options (launch/ is re-rendered from them) and/or a record;
    ``acceptance`` replaces the manifest's acceptance record (recommend --write: the figure at the new K).

    The bundle must match its manifest first (a hand-edited bundle would otherwise be blessed).
    Every file is replaced atomically; manifest.json goes last, with the new files' digests and
    fingerprint, so a crash part-way leaves a bundle that :func:`verify` flags and the next
    ``eagle3-trt engine`` rebuilds. Unchanged files keep their recorded digests (no re-hashing
    of the weights).
    """
    b = open_bundle(bundle_dir)
    problems = verify(b, content=False, unrecorded=False)
    if problems:
        raise UserError(b.path, f"does not match its manifest ({problems[0]}); not updated", REBUILD_HINT)
    man = b.manifest
    outputs = dict(man.outputs)
    if options is not None:
        # rendered first: options the bundle cannot serve (e.g. two speculation methods selected at once) are
        # refused before any file changes
        files = launch_files(b.path, options, man.quant)
        write_options(b.path, options)
        write_launchers(b.path, options, man.quant, files)
        outputs = {k: v for k, v in outputs.items() if not k.startswith(LAUNCH_DIR + "/")}
        for rel in [OPTIONS_FILE, *(f"{LAUNCH_DIR}/{n}" for n in sorted(p.name for p in (b.path / LAUNCH_DIR).iterdir()))]:
            outputs[rel] = FileDigest(sha256=sha256_file(b.path / rel), bytes=(b.path / rel).stat().st_size)
        outputs = dict(sorted(outputs.items()))
    changes: dict[str, Any] = {"outputs": outputs, "fingerprint": content_fingerprint(man.inputs_fingerprint, outputs)}
    if acceptance is not None:
        changes["acceptance"] = acceptance
    if isinstance(record, Recommendation):
        changes["recommendation"] = record
    elif isinstance(record, CompileRecord):
        changes["compile"] = record
        trt = record.versions.get("tensorrt_llm")
        if trt:
            changes["versions"] = {**man.versions, "tensorrt_llm": trt}
    elif record is not None:
        raise TypeError(f"update(record=...) takes a Recommendation or a CompileRecord, not {type(record).__name__}")
    man = man.model_copy(update=changes)
    write_manifest(b.path, man)
    return open_bundle(b.path)
