"""``1/model.yaml``: which runtime serves the bundle, and where the bundle is.

Read by the model inside Triton and written by ``eagle3-trt package``. Unknown keys are
rejected so that a typo fails the model load with the key named instead of being ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from eagle3_trt.build.bundle import Bundle, open_bundle
from eagle3_trt.errors import UserError

MODEL_YAML = "model.yaml"


class ModelYaml(BaseModel):
    model_config = ConfigDict(extra="forbid")

    runtime: Literal["reference", "trtllm"] = Field(
        description="reference: the toolkit's PyTorch runtime; trtllm: TensorRT-LLM LLM() built from the bundle's llm_api_options.yaml"
    )
    bundle: str = Field(description="engine bundle directory (absolute, or relative to this file)")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="reference runtime only")
    torch_threads: int | None = Field(None, ge=1, description="reference runtime: torch.set_num_threads (CPU); null keeps torch's default")
    speculation: bool = Field(True, description="false: serve without the draft (a baseline model for A/B)")
    default_max_tokens: int = Field(64, gt=0, description="when a request has no sampling_param_max_tokens")
    cancellation_check_period_ms: int = Field(50, gt=0, description="how often in-flight requests are checked for client cancellation")
    python_path: list[str] = Field(default_factory=list, description="prepended to sys.path so the model can import eagle3_trt")
    llm_api_overrides: dict[str, Any] = Field(
        default_factory=dict, description="trtllm only: merged over the bundle's llm_api_options.yaml"
    )


def load_model_yaml(path: Path) -> ModelYaml:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise UserError(path, f"cannot read: {e}") from None
    if not isinstance(raw, dict):
        raise UserError(path, "must be a mapping")
    try:
        return ModelYaml.model_validate(raw)
    except ValidationError as e:
        errs = "; ".join(f"{'.'.join(map(str, x['loc'])) or '<root>'}: {x['msg']}" for x in e.errors())
        raise UserError(path, errs, "see `eagle3-trt package --help` for the fields") from None


def dump_model_yaml(cfg: ModelYaml) -> str:
    header = "# Written by `eagle3-trt package`. runtime: reference | trtllm (see the README).\n"
    return header + yaml.safe_dump(cfg.model_dump(), sort_keys=False)


def resolve_bundle(cfg: ModelYaml, model_yaml_path: Path) -> Path:
    p = Path(cfg.bundle)
    if not p.is_absolute():
        p = (Path(model_yaml_path).parent / p).resolve()
    return p


@dataclass(frozen=True)
class BundleInfo:
    path: Path
    max_seq_len: int
    max_draft_len: int
    preset: str
    bundle: Bundle


def read_bundle(path: Path) -> BundleInfo:
    """The bundle (opened through build/bundle.open_bundle: manifest and llm_api_options.yaml
    validated, which both runtimes need) and the directories serving reads."""
    b = open_bundle(Path(path))
    for d in (b.target_dir, b.draft_dir, b.tokenizer_dir):
        if not d.is_dir():
            raise UserError(d, "missing from the bundle", "rebuild the bundle with `eagle3-trt engine`")
    return BundleInfo(b.path, b.max_seq_len, b.k, b.manifest.preset, b)
