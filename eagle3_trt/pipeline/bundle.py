"""The engine bundle's on-disk format and its reader (with bundle_manifest.py and bundle_write.py, the only code that reads or writes a bundle).

A bundle is a directory::

    target/ draft/ tokenizer/     checkpoints (quantized by the builder) and the tokenizer
    llm_api_options.yaml          TensorRT-LLM LLM-API options (build/llm_options.LlmApiOptions)
    launch/                       vLLM / SGLang / trtllm-serve scripts rendered from the options
    validation.json, build.log    what the builder checked and the libraries' chatter
    manifest.json                 provenance, formats, records, and the digest of every other file

Each fact is stored once. What TensorRT-LLM reads lives in the options file (draft length K,
aux layers to capture, KV-cache dtype, max_seq_len, parallel sizes); what only this toolkit knows
lives in the manifest (weight formats, target GPU, sources, calibration, records). Everything
else derives them from :class:`Bundle`, the typed view :func:`open_bundle` returns.

This module is the reader (:func:`open_bundle`, :func:`verify`); the manifest's schema and its reader
(:func:`read_manifest`) are in formats/bundle_manifest.py (their names are importable from here too).
The typed view stays here, above formats: its options schema (pipeline/llm_options.py) is made of the
speculation methods' option schemas (speculative/*/options.py), and opening a dynamic-tree bundle
checks the target with speculative/dynamic_tree/rules.py. Writers
(pipeline/bundle_write.py): the builder stages a new bundle with ``write_options`` and ``seal``; later
stages change one through ``update``, which keeps ``outputs`` (the file digests) and the
``fingerprint`` true. :func:`verify` compares the files with the recorded digests; the builder
reports a cache hit only for a bundle that verifies clean.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from eagle3_trt.errors import UserError
from eagle3_trt.formats.bundle_manifest import (
    CALIBRATION_HINT,
    KIND,
    MANIFEST_FILE,
    OPTIONS_FILE,
    REBUILD_HINT,
    SCHEMA,
    VALIDATION_FILE,
    Acceptance,
    Calibration,
    CompileRecord,
    FileDigest,
    Manifest,
    Quant,
    Recommendation,
    Source,
    Sources,
    TargetGpu,
    Validation,
    WeightFormat,
    bundle_files,
    calibration_shortfall,
    content_fingerprint,
    file_digests,
    fingerprint,
    git_sha,
    package_versions,
    read_manifest,
)
from eagle3_trt.formats.checkpoint_io import read_json, sha256_file
from eagle3_trt.formats.families import default_aux_layers_of
from eagle3_trt.formats.hf_config import max_positions_of
from eagle3_trt.pipeline.llm_options import LlmApiOptions, validate_options
from eagle3_trt.speculative.dynamic_tree.rules import check_target

# The schema's names, for readers that take the whole format from this module (``bundle as fmt``).
__all__ = [
    "CALIBRATION_HINT",
    "KIND",
    "MANIFEST_FILE",
    "OPTIONS_FILE",
    "REBUILD_HINT",
    "SCHEMA",
    "VALIDATION_FILE",
    "Acceptance",
    "Bundle",
    "Calibration",
    "CompileRecord",
    "FileDigest",
    "Manifest",
    "Quant",
    "Recommendation",
    "Source",
    "Sources",
    "TargetGpu",
    "Validation",
    "WeightFormat",
    "calibration_shortfall",
    "content_fingerprint",
    "file_digests",
    "fingerprint",
    "git_sha",
    "open_bundle",
    "package_versions",
    "read_manifest",
    "read_options",
    "verify",
]


def read_options(bundle_dir: Path) -> LlmApiOptions:
    """The bundle's llm_api_options.yaml, validated against the toolkit's schema."""
    path = Path(bundle_dir) / OPTIONS_FILE
    if not path.is_file():
        raise UserError(path, "file not found", "is this an engine bundle? build one with `eagle3-trt engine`")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise UserError(path, f"not valid YAML: {str(e).splitlines()[0]}", "rebuild the bundle or fix the file") from None
    if not isinstance(raw, dict):
        raise UserError(path, "expected a mapping of LLM() options", "rebuild the bundle")
    return validate_options(raw, path)


@dataclass(frozen=True)
class Bundle:
    """Typed view of a bundle: what is stored, and the facts derived from it."""

    path: Path
    manifest: Manifest
    options: LlmApiOptions

    # -- directories (paths in the options are relative to the bundle)
    def _dir(self, value: str) -> Path:
        p = Path(value).expanduser()
        return p if p.is_absolute() else self.path / p

    @property
    def target_dir(self) -> Path:
        return self._dir(self.options.model)

    @property
    def draft_dir(self) -> Path:
        return self._dir(self.options.speculative_config.speculative_model)

    @property
    def tokenizer_dir(self) -> Path:
        tok = self.path / "tokenizer"
        return tok if tok.is_dir() else self._dir(self.options.tokenizer or self.options.model)

    # -- facts stored in the options file (what TensorRT-LLM reads)
    @property
    def k(self) -> int:
        """Draft length K."""
        return self.options.speculative_config.max_draft_len

    @functools.cached_property
    def target_config(self) -> dict:
        return read_json(self.target_dir / "config.json")

    @property
    def aux_layers_are_default(self) -> bool:
        return self.options.speculative_config.eagle3_layers_to_capture is None

    @property
    def aux_layer_ids(self) -> tuple[int, ...]:
        """Target layers whose outputs the draft fuses: the options' list, else TensorRT-LLM's default."""
        ids = self.options.speculative_config.eagle3_layers_to_capture
        if ids is not None:
            return tuple(ids)
        return default_aux_layers_of(self.target_config)

    @property
    def kv_cache(self) -> str:
        return self.options.kv_cache_config.dtype

    @property
    def max_seq_len(self) -> int:
        return int(self.options.max_seq_len or max_positions_of(self.target_config))

    @property
    def tensor_parallel_size(self) -> int:
        return self.options.tensor_parallel_size

    # -- facts stored in the manifest
    @property
    def quant(self) -> Quant:
        return self.manifest.quant

    @property
    def formats(self) -> dict[str, str]:
        """Weight and KV formats together, for the GPU format rules."""
        return {"target": self.quant.target, "draft": self.quant.draft, "kv_cache": self.kv_cache}

    @property
    def quantized(self) -> bool:
        return self.quant.target != "bf16" or self.quant.draft != "bf16"

    @property
    def target_gpu(self) -> TargetGpu:
        return self.manifest.target_gpu

    @property
    def dry_run(self) -> bool:
        return self.manifest.dry_run

    @property
    def label(self) -> str:
        return f"{self.quant.target} target + {self.quant.draft} draft"

    @property
    def weights_id(self) -> str:
        """sha256 of the recorded digests of the files the engine loads (target, draft and tokenizer
        directories): the same for a copy of the bundle or for one whose options or records changed
        (recommend --write, compile), different for other weights. An alpha report carries it, and
        recommend refuses a report measured on other weights."""
        dirs = {"tokenizer"} | {Path(d).parts[0] for d in (self.options.model, self.options.speculative_config.speculative_model) if not Path(d).is_absolute()}
        served = sorted((rel, d.sha256) for rel, d in self.manifest.outputs.items() if rel.split("/", 1)[0] in dirs)
        return hashlib.sha256(json.dumps(served).encode()).hexdigest()

    def source_dirs(self) -> tuple[Path, Path]:
        """The BF16 target and draft the bundle was built from; a UserError when they are gone."""
        where = self.path / MANIFEST_FILE
        tdir, ddir = Path(self.manifest.sources.target.path), Path(self.manifest.sources.draft.path)
        for p in (tdir, ddir):
            if not p.is_dir():
                raise UserError(where, f"BF16 source {p} does not exist on this machine", "pass --reference-bundle DIR, or rebuild the bundle here")
        return tdir, ddir


def open_bundle(path: Path) -> Bundle:
    """Open a bundle directory: manifest and options validated, one-line errors naming the file."""
    path = Path(path)
    if not path.is_dir():
        raise UserError(path, "bundle directory not found", "build one with `eagle3-trt engine`")
    b = Bundle(path, read_manifest(path), read_options(path))
    if b.options.speculative_config.use_dynamic_tree:
        # TensorRT-LLM runs no dynamic tree on sliding-window or MLA targets (speculative/dynamic_tree/builder.py)
        check_target(b.target_config, where=f"{path / OPTIONS_FILE}:speculative_config.use_dynamic_tree")
    return b


def verify(bundle: Bundle | Path, *, content: bool = True, unrecorded: bool = True) -> list[str]:
    """What differs between the files and the manifest's record: missing, changed or (with
    ``unrecorded``) unrecorded files, and a fingerprint that does not match the recorded digests.
    ``content=False`` compares sizes only (no hashing). An unreadable manifest or options file
    raises its UserError."""
    b = bundle if isinstance(bundle, Bundle) else open_bundle(bundle)
    man = b.manifest
    problems: list[str] = []
    if man.fingerprint != content_fingerprint(man.inputs_fingerprint, man.outputs):
        problems.append(f"{MANIFEST_FILE}: fingerprint does not match the recorded outputs")
    present = set(bundle_files(b.path))
    for rel, d in man.outputs.items():
        p = b.path / rel
        if rel not in present:
            problems.append(f"{rel}: missing")
        elif p.stat().st_size != d.bytes or (content and sha256_file(p) != d.sha256):
            problems.append(f"{rel}: changed since the build")
    if unrecorded:
        problems += [f"{rel}: not recorded in {MANIFEST_FILE}" for rel in sorted(present - set(man.outputs))]
    return problems
