"""The bundle's manifest.json: its schema (strict pydantic models, one per record) and the
provenance it carries (package versions, git sha, file digests, fingerprints).

The manifest's one reader is :func:`read_manifest` here; the bundle as a whole (the typed view with the
LLM-API options) is opened by pipeline/bundle.py and written by pipeline/bundle_write.py.
"""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from eagle3_trt import __version__
from eagle3_trt.errors import UserError
from eagle3_trt.formats.checkpoint_io import sha256_file
from eagle3_trt.formats.validation import field_error
from eagle3_trt.resources import checkout_root

SCHEMA: Final = 2
MANIFEST_FILE = "manifest.json"
OPTIONS_FILE = "llm_api_options.yaml"
VALIDATION_FILE = "validation.json"
KIND = "eagle3-trt engine bundle"
REBUILD_HINT = "rebuild with eagle3-trt engine --force"
VERSIONED_PACKAGES = ("torch", "transformers", "nvidia-modelopt", "safetensors", "tokenizers", "tensorrt_llm", "tensorrt-llm")

# "native": the target kept as shipped (already quantized, e.g. gpt-oss MXFP4 experts); Quant.target_native says which
WeightFormat = Literal["fp8", "nvfp4", "bf16", "native"]


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
    shortfall: str | None = Field(None, description="set when the file held fewer prompts than num_samples: asked vs got, in prompts and tokens")


def calibration_shortfall(calib: Calibration) -> str | None:
    """Asked vs got, when a build calibrated on fewer prompts than it asked for (the loader takes
    what the file has, so a short file would otherwise pass silently); None when it got them all."""
    if calib.prompts_used is None or calib.prompts_used >= calib.num_samples:
        return None
    return (
        f"calibration asked for {calib.num_samples} prompts x up to {calib.max_length} tokens ({calib.num_samples * calib.max_length:,} tokens) "
        f"but {Path(calib.file).name} has {calib.prompts_used} prompts: calibrated on {calib.tokens or 0:,} tokens"
    )


CALIBRATION_HINT = "pass --calib FILE with that many prompts like your traffic (JSONL or one prompt a line), or --calib-samples N to ask for fewer"


class Behaviour(_Strict):
    """convert/behaviour.py's figures: what files cannot show (a swapped tokenizer, a head trained
    for another target). ``skipped`` says why none were measured (a dry run reads no weights)."""

    skipped: str | None = None
    prompts_file: str | None = None
    target_loss_nats: float | None = None
    log_vocab: float | None = Field(None, description="log V: the loss of a uniform guess over the target's ids")
    loss_ratio: float | None = Field(None, description="target_loss_nats / log_vocab")
    loss_tokens: int | None = None
    loss_prompts: int | None = None
    draft_agreement: float | None = Field(None, description="draft step-1 top-1 == the target's next token (argmax), teacher-forced")
    chance: float | None = Field(None, description="1 / draft_vocab_size")
    agreement_over_chance: float | None = None
    agreement_positions: int | None = None
    agreement_prompts: int | None = None
    later_slot_agreement: list[float] | None = Field(None, description="a method head's draft slots 2..K (e.g. mask slots), teacher-forced")


class Validation(_Strict):
    checks: list[str]
    warnings: list[str]
    behaviour: Behaviour | None = None


class Acceptance(_Strict):
    """Greedy speculative decoding of the built bundle on held-out prompts: an embedded pair's own, or
    the file given with ``engine --heldout-prompts`` (``prompts_file``)."""

    alpha: float
    acceptance_length: float
    max_draft_len: int = Field(description="K the measurement ran at (the bundle's K at build time)")
    prompts: int
    generated_tokens: int
    target_forwards: int
    measured_on: str
    prompts_file: str | None = Field(default=None, description="the --heldout-prompts file measured (None: the embedded pair's own)")


class Recommendation(_Strict):
    """Evidence of ``eagle3-trt recommend --write``; the K it chose is in the options file."""

    max_draft_len: int
    max_concurrency: int | None
    cumulative_acceptance: list[float]
    measured_on: str | None
    evidence: dict[str, Any]
    table: list[dict[str, Any]]
    # what recommend --write put into speculative_config beside K (the options file holds the same)
    draft_len_schedule: dict[int, int] | None = None
    acceptance_rate_window_size: int | None = None
    acceptance_rate_threshold: float | None = None
    # the dynamic tree (speculative/dynamic_tree/builder.py), written only where it beat the chain (measure/dynamic_tree_choice.py)
    use_dynamic_tree: bool | None = None
    dynamic_tree_max_topK: int | None = None
    max_total_draft_tokens: int | None = None


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
    # the same prompts through the reference runtime and TensorRT-LLM, per request (pipeline/compile.agreement)
    agreement: dict[str, Any] | None = None
    error: str | None = None


class Lineage(_Strict):
    """Where a bundle retrained on captured traffic came from (``train-draft --traffic --from``, issue 23).

    Absent on a bundle built from checkpoints; older manifests without it stay readable."""

    parent_fingerprint: str = Field(description="the --from bundle's manifest fingerprint (its head was the starting point)")
    traffic_digest: str = Field(description="formats/traffic.traffic_digest of the records trained on (the training side of the split)")
    traffic_dir: str = Field(description="the capture directory read, as given")
    training: dict[str, Any] = Field(default_factory=dict, description="the training settings (steps, lr, regeneration, record counts)")
    heldout_seed: int = Field(description="formats/traffic_split.split_traffic seed: the gate rebuilds the held-back side with it")
    heldout_fraction: float = Field(ge=0.0, lt=1.0)


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
    lineage: Lineage | None = None
    # a head in a registered method's own format (speculative/registry.py method_for_head; its registry name): the
    # method, and per engine how it is served (vLLM's --speculative-config) or why not; None: an EAGLE-3 head
    method: str | None = None
    served_by: dict[str, Any] | None = None
    inputs_fingerprint: str = Field(description="sha256 of the inputs and the build request: the builder's cache key")
    outputs: dict[str, FileDigest] = Field(default_factory=dict, description="every file of the bundle but manifest.json")
    fingerprint: str = Field("", description="sha256 of inputs_fingerprint and outputs: changes whenever a file does")

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


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


def bundle_files(root: Path) -> list[str]:
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
    return {rel: FileDigest(sha256=sha256_file(root / rel), bytes=(root / rel).stat().st_size) for rel in bundle_files(root)}


def fingerprint(parts: Any) -> str:
    """Stable sha256 of a JSON-able value."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def content_fingerprint(inputs_fp: str, outputs: dict[str, FileDigest]) -> str:
    return fingerprint({"inputs": inputs_fp, "outputs": {k: v.sha256 for k, v in outputs.items()}})


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
        raise field_error(path, e, REBUILD_HINT, unknown_hint=f"not a field of schema {SCHEMA}; {REBUILD_HINT}") from None
