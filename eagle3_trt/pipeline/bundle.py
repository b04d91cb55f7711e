"""The engine bundle's on-disk format: the one module that reads and writes it.

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

Writers: the builder stages a new bundle with :func:`write_options` and :func:`seal`; later
stages change one through :func:`update`, which keeps ``outputs`` (the file digests) and the
``fingerprint`` true. :func:`verify` compares the files with the recorded digests; the builder
reports a cache hit only for a bundle that verifies clean.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import subprocess
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from eagle3_trt import __version__
from eagle3_trt.atomic import EXEC_MODE, FILE_MODE, staged_dir, write_json, write_text
from eagle3_trt.convert.checkpoint_io import read_json, sha256_file
from eagle3_trt.convert.families import default_aux_layers_of
from eagle3_trt.errors import UserError
from eagle3_trt.pipeline.dynamo_launch import dynamo_launch_files
from eagle3_trt.pipeline.llm_options import LlmApiOptions, validate_options
from eagle3_trt.pipeline.other_engines import LAUNCH_DIR, launcher_files
from eagle3_trt.resources import checkout_root

SCHEMA = 2
MANIFEST_FILE = "manifest.json"
OPTIONS_FILE = "llm_api_options.yaml"
VALIDATION_FILE = "validation.json"
KIND = "eagle3-trt engine bundle"
REBUILD_HINT = "rebuild with eagle3-trt engine --force"
VERSIONED_PACKAGES = ("torch", "transformers", "nvidia-modelopt", "safetensors", "tokenizers", "tensorrt_llm", "tensorrt-llm")
_OPTIONS_HEADER = "# TensorRT-LLM LLM-API options (EAGLE-3 one-model). Paths are relative to this bundle.\n"

# "native": the target kept as shipped (already quantized, e.g. gpt-oss MXFP4 experts); Quant.target_native says which
WeightFormat = Literal["fp8", "nvfp4", "bf16", "native"]


# ---------------------------------------------------------------------------------------------
# The manifest schema


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FileDigest(_Strict):
    sha256: str
    bytes: int = Field(ge=0)


class Source(_Strict):
    path: str = Field(description="absolute path of the BF16 checkpoint the bundle was built from, on the build machine")
    source: str | None = Field(None, description="the preset's source (Hugging Face repo id or local path)")
    revision: str | None = None
    files: dict[str, FileDigest]


class Sources(_Strict):
    target: Source
    draft: Source


class TargetGpu(_Strict):
    name: str
    generation: str
    sm: int


class Quant(_Strict):
    """Weight formats. The KV-cache dtype is a TensorRT-LLM option (kv_cache_config.dtype)."""

    target: WeightFormat
    draft: WeightFormat
    target_native: str | None = Field(None, description="with target native: the shipped format (quantization_config.quant_method)")


class Calibration(_Strict):
    file: str
    sha256: str | None
    num_samples: int
    max_length: int
    prompts_used: int | None = None
    tokens: int | None = None
    tokens_sha256: str | None = None


class Validation(_Strict):
    checks: list[str]
    warnings: list[str]


class Acceptance(_Strict):
    """Greedy speculative decoding of the built bundle on an embedded pair's held-out prompts."""

    alpha: float
    acceptance_length: float
    max_draft_len: int = Field(description="K the measurement ran at (the bundle's K at build time)")
    prompts: int
    generated_tokens: int
    target_forwards: int
    measured_on: str


class Recommendation(_Strict):
    """Evidence of ``eagle3-trt recommend --write``; the K it chose is in the options file."""

    max_draft_len: int
    max_concurrency: int | None
    cumulative_acceptance: list[float]
    measured_on: str | None
    evidence: dict[str, Any]
    table: list[dict[str, Any]]


class CompileRecord(_Strict):
    """What ``eagle3-trt compile`` saw on the GPU (a failed compile is recorded too)."""

    ok: bool
    when_unix: int | None = None
    gpu: dict[str, Any] | None = None
    versions: dict[str, str | None] = Field(default_factory=dict)
    checks: list[str] = Field(default_factory=list)
    options: dict[str, Any] = Field(default_factory=dict)
    timings: dict[str, float] = Field(default_factory=dict)
    smoke: dict[str, Any] | None = None
    acceptance: dict[str, Any] | None = None
    error: str | None = None


class Manifest(_Strict):
    schema_: Literal[2] = Field(SCHEMA, alias="schema")
    kind: str = KIND
    created_unix: int
    preset: str
    dry_run: bool = False
    target_gpu: TargetGpu
    quant: Quant
    plan: dict[str, Any] = Field(description="the planner's memory plan at build time (a record; facts are read from the options)")
    sources: Sources
    calibration: Calibration
    validation: Validation
    versions: dict[str, str | None]
    git_sha: str | None = None  # None outside a git checkout (a wheel install); to_json then leaves it out
    timings: dict[str, float]
    acceptance: Acceptance | None = None
    recommendation: Recommendation | None = None
    compile: CompileRecord | None = None
    inputs_fingerprint: str = Field(description="sha256 of the inputs and the build request: the builder's cache key")
    outputs: dict[str, FileDigest] = Field(default_factory=dict, description="every file of the bundle but manifest.json")
    fingerprint: str = Field("", description="sha256 of inputs_fingerprint and outputs: changes whenever a file does")

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# ---------------------------------------------------------------------------------------------
# Provenance helpers (pure)


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"eagle3-trt": __version__, "python": platform.python_version()}
    for name in VERSIONED_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            if name.replace("_", "-") not in out:
                out[name] = None
    out.pop("tensorrt_llm", None)
    return out


def git_sha() -> str | None:
    root = checkout_root()
    if root is None:
        return None
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if sha.returncode:
        return None
    return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def _files(root: Path) -> list[str]:
    """Relative paths of the files a digest covers: hidden entries (atomic-writer staging and
    lock files) and the manifest itself are not part of the content."""
    root = Path(root)
    out = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and not any(part.startswith(".") for part in rel.parts) and str(rel) != MANIFEST_FILE:
            out.append(str(rel))
    return out


def file_digests(root: Path) -> dict[str, FileDigest]:
    """relative path -> {sha256, bytes} for every file under root, sorted."""
    root = Path(root)
    return {rel: FileDigest(sha256=sha256_file(root / rel), bytes=(root / rel).stat().st_size) for rel in _files(root)}


def fingerprint(parts: Any) -> str:
    """Stable sha256 of a JSON-able value."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def content_fingerprint(inputs_fp: str, outputs: dict[str, FileDigest]) -> str:
    return fingerprint({"inputs": inputs_fp, "outputs": {k: v.sha256 for k, v in outputs.items()}})


# ---------------------------------------------------------------------------------------------
# Reading


def _validation_error(where: Path, e: ValidationError, hint: str) -> UserError:
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "<root>"
    if err["type"] == "extra_forbidden":
        hint = f"not a field of schema {SCHEMA}; {REBUILD_HINT}"
    return UserError(f"{where}:{loc}", err["msg"], hint)


def read_manifest(bundle_dir: Path) -> Manifest:
    """The bundle's manifest.json, validated; every problem is a one-line UserError naming the file."""
    path = Path(bundle_dir) / MANIFEST_FILE
    if not path.is_file():
        raise UserError(path, "file not found", "is this an engine bundle? build one with `eagle3-trt engine`")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(path, f"not valid JSON ({e})", REBUILD_HINT) from None
    if not isinstance(raw, dict) or "schema" not in raw:
        raise UserError(path, "not an engine bundle manifest (no 'schema')", "build one with `eagle3-trt engine`")
    if raw["schema"] != SCHEMA:
        raise UserError(f"{path}:schema", f"schema {raw['schema']!r}; this eagle3-trt reads schema {SCHEMA} bundles", REBUILD_HINT)
    try:
        return Manifest.model_validate(raw)
    except ValidationError as e:
        raise _validation_error(path, e, REBUILD_HINT) from None


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
        return int(self.options.max_seq_len or self.target_config.get("max_position_embeddings") or 2048)

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
    return Bundle(path, read_manifest(path), read_options(path))


# ---------------------------------------------------------------------------------------------
# Writing


def options_text(opts: LlmApiOptions) -> str:
    return _OPTIONS_HEADER + yaml.safe_dump(opts.to_yaml_dict(), sort_keys=False)


def write_options(bundle_dir: Path, opts: LlmApiOptions) -> Path:
    return write_text(Path(bundle_dir) / OPTIONS_FILE, options_text(opts))


def write_manifest(bundle_dir: Path, man: Manifest) -> Path:
    return write_json(Path(bundle_dir) / MANIFEST_FILE, man.to_json())


def write_launchers(bundle_dir: Path, opts: LlmApiOptions, quant: Quant) -> Path:
    """Render launch/ from the options and formats (replacing any previous one atomically)."""
    draft_cfg = Path(bundle_dir) / opts.speculative_config.speculative_model / "config.json"
    draft_positions = read_json(draft_cfg).get("max_position_embeddings") if draft_cfg.is_file() else None
    files = {**launcher_files(opts, target_format=quant.target, draft_format=quant.draft, draft_max_positions=draft_positions), **dynamo_launch_files(opts)}
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


def update(bundle_dir: Path, *, options: LlmApiOptions | None = None, record: Recommendation | CompileRecord | None = None) -> Bundle:
    """Change a built bundle: new options (launch/ is re-rendered from them) and/or a record.

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
        write_options(b.path, options)
        write_launchers(b.path, options, man.quant)
        outputs = {k: v for k, v in outputs.items() if not k.startswith(LAUNCH_DIR + "/")}
        for rel in [OPTIONS_FILE, *(f"{LAUNCH_DIR}/{n}" for n in sorted(p.name for p in (b.path / LAUNCH_DIR).iterdir()))]:
            outputs[rel] = FileDigest(sha256=sha256_file(b.path / rel), bytes=(b.path / rel).stat().st_size)
        outputs = dict(sorted(outputs.items()))
    changes: dict[str, Any] = {"outputs": outputs, "fingerprint": content_fingerprint(man.inputs_fingerprint, outputs)}
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
    present = set(_files(b.path))
    for rel, d in man.outputs.items():
        p = b.path / rel
        if rel not in present:
            problems.append(f"{rel}: missing")
        elif p.stat().st_size != d.bytes or (content and sha256_file(p) != d.sha256):
            problems.append(f"{rel}: changed since the build")
    if unrecorded:
        problems += [f"{rel}: not recorded in {MANIFEST_FILE}" for rel in sorted(present - set(man.outputs))]
    return problems
