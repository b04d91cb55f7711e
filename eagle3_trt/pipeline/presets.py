"""Presets: one small YAML file per model pair under build/presets/, loaded into typed configs.

Unknown or conflicting fields are rejected when the file is loaded, not when a value is used.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from eagle3_trt.errors import UserError
from eagle3_trt.resources import data_dir

PRESET_DIR = data_dir("build") / "presets"

# "native": keep an already-quantized target (gpt-oss's MXFP4 experts) as shipped
QuantFormat = Literal["fp8", "nvfp4", "bf16", "native"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Source(_Strict):
    source: str = Field(description="embedded:<name>, hf:<org>/<repo>, or a local directory")
    revision: str | None = Field(None, description="pinned Hugging Face revision, recorded in the manifest")

    @field_validator("source")
    @classmethod
    def _known_scheme(cls, v: str) -> str:
        if ":" in v.split("/")[0] and not v.startswith(("embedded:", "hf:")):
            raise ValueError("source must start with embedded: or hf:, or be a local path")
        return v

    @property
    def hf_id(self) -> str | None:
        return self.source[3:] if self.source.startswith("hf:") else None

    @property
    def embedded(self) -> str | None:
        return self.source[9:] if self.source.startswith("embedded:") else None


class QuantByGeneration(_Strict):
    hopper: QuantFormat = "fp8"
    blackwell: QuantFormat = "nvfp4"
    ada: QuantFormat = "fp8"
    ampere: QuantFormat = "bf16"


class Calibration(_Strict):
    num_samples: int = Field(512, gt=0, description="calibration prompts used for PTQ")
    max_length: int = Field(512, gt=0, description="tokens per calibration prompt")


class Preset(_Strict):
    name: str
    description: str = ""
    target: Source
    draft: Source
    quant: QuantByGeneration = QuantByGeneration()
    default_gpu: str = "h100"
    default_gpus: int = Field(1, ge=1, le=64, description="GPUs planned for when --gpus is not given")
    max_draft_len: int = Field(3, ge=1, le=16, description="draft length K (TensorRT-LLM max_draft_len)")
    max_seq_len: int = Field(8192, gt=0)
    kv_cache_dtype: Literal["fp8", "auto"] = "fp8"
    calibration: Calibration = Calibration()

    @model_validator(mode="after")
    def _embedded_pairs(self) -> Preset:
        if bool(self.target.embedded) != bool(self.draft.embedded):
            raise ValueError("target and draft must both be embedded or both external")
        return self


def available() -> list[str]:
    """The registry: the presets shipped in build/presets/ (a file's stem is its name)."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_preset(name: str) -> Preset:
    """A registry preset by name. Only names in ``available()`` are looked up: the name is never
    joined to a path, so ``../../x/evil`` or ``/tmp/p`` cannot load a YAML file from elsewhere
    (a preset outside the registry is read with ``load_preset_file``, behind its own option)."""
    names = available()
    if name not in names:
        # a newcomer's guess (llama-70b) is usually one edit away from a shipped name: suggest it first
        close = difflib.get_close_matches(name, names, n=1)
        guess = f"did you mean {close[0]!r}? " if close else ""
        raise UserError(
            "MODEL",
            f"unknown preset {name!r} (a preset name from the registry, never a path)",
            f"{guess}available presets: {', '.join(names)}; for a preset file of your own pass --preset-file PATH",
        )
    return load_preset_file(PRESET_DIR / f"{name}.yaml")


def load_preset_file(path: Path) -> Preset:
    """A preset YAML file anywhere on disk (``engine --preset-file``); checked like a shipped one."""
    path = Path(path)
    if not path.is_file():
        raise UserError(path, "preset file not found", "pass the path of a YAML preset (see build/presets/tiny.yaml)")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise UserError(path, f"not UTF-8 text ({e.reason} at byte {e.start})", "a preset is a YAML text file") from None
    except yaml.YAMLError as e:
        raise UserError(path, f"not valid YAML: {e}".splitlines()[0], "fix the file's syntax") from None
    if not isinstance(data, dict):
        raise UserError(path, "expected a mapping of preset fields", "see build/presets/tiny.yaml")
    try:
        return Preset.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "<root>"
        raise UserError(f"{path}:{field}", err["msg"], "see build/presets/tiny.yaml for the fields") from None


def hf_cache_dir(hf_id: str, revision: str | None = None) -> Path | None:
    """Snapshot directory of hf_id in the local Hugging Face cache, without any network access."""
    home = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", Path.home() / ".cache/huggingface")) / "hub")
    repo = home / ("models--" + hf_id.replace("/", "--"))
    if not repo.is_dir():
        return None
    ref = revision or "main"
    ref_file = repo / "refs" / ref
    commit = ref_file.read_text().strip() if ref_file.is_file() else ref
    snap = repo / "snapshots" / commit
    if snap.is_dir():
        return snap
    snaps = sorted((repo / "snapshots").glob("*")) if revision is None else []
    return snaps[-1] if snaps else None


def override_dir(override: str, role: str) -> Path:
    """The directory given with --target/--draft (make: TARGET=/DRAFT=), which must exist. `engine`
    calls it before any other work (GPU probe, preset checks); resolve_source again for library callers."""
    p = Path(override).expanduser()
    if not p.is_dir():
        raise UserError(
            f"--{role} {override}",
            "directory does not exist" if not p.exists() else "is not a directory",
            f"pass an existing local checkpoint directory; make takes it as {role.upper()}=DIR",
        )
    return p


def resolve_source(src: Source, override: str | None, role: str) -> Path | None:
    """Local directory for a target/draft source; None for embedded models (built on demand)."""
    if override:
        return override_dir(override, role)
    if src.embedded:
        return None
    if src.hf_id:
        snap = hf_cache_dir(src.hf_id, src.revision)
        if snap is None:
            raise UserError(
                f"{role} {src.hf_id}",
                "not found locally (no local path given and not in the Hugging Face cache)",
                f"download it first (huggingface-cli download {src.hf_id}) or pass {role.upper()}=/path/to/checkpoint",
            )
        return snap
    p = Path(src.source).expanduser()
    if not p.is_dir():
        raise UserError(f"{role} source {src.source}", "directory does not exist", f"pass {role.upper()}=/path/to/checkpoint")
    return p
