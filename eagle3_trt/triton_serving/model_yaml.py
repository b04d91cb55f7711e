"""``1/model.yaml`` (upstream's format) and ``1/eagle3.yaml`` (this toolkit's serving settings).

``model.yaml`` is exactly what upstream's Triton llmapi model reads
(NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/1/model.py @ 044a90d2):
``get_model_config(os.environ.get('LLM_CONFIG_PATH', 'model.yaml'), include_keys=["triton_config"])
["triton_config"]`` for ``decoupled`` / ``max_batch_size`` (``auto_complete_config``, both
required: they are indexed, not ``.get``) and ``cancellation_check_period_ms`` (``initialize``,
default 100), and ``get_model_config(..., exclude_keys=["triton_config"])`` -> every other
top-level key goes to ``update_llm_args_with_extra_dict`` and ``LLM(**args)``. So the file holds
``triton_config`` plus the bundle's ``LLM()`` options with absolute paths, nothing else: either
model.py (upstream's or ours) serves the repository.

Our own settings (which runtime, the bundle, the reference runtime's device, ...) live in
``eagle3.yaml`` beside it, which upstream never opens. Unknown keys there are rejected so a typo
fails the model load with the key named.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from eagle3_trt.errors import UserError
from eagle3_trt.pipeline.bundle import Bundle, open_bundle
from eagle3_trt.pipeline.trtllm_adapter import check_names, documented_names, installed_names
from eagle3_trt.runtime.llm_api import DeviceName, RuntimeName

MODEL_YAML = "model.yaml"
SERVING_YAML = "eagle3.yaml"


class TritonConfig(BaseModel):
    """``model.yaml: triton_config`` (the keys upstream reads; anything else is refused)."""

    model_config = ConfigDict(extra="forbid")

    max_batch_size: int = Field(default=0, ge=0, description="0: one prompt per request (upstream: batching is JIRA-4496)")
    decoupled: bool = Field(default=True, description="true: streaming (generate_stream, gRPC stream); false: unary /infer, ModelInfer")
    cancellation_check_period_ms: int = Field(default=50, gt=0, description="how often in-flight requests are checked for client cancellation")


class ServingConfig(BaseModel):
    """``eagle3.yaml``: what this toolkit's model.py needs beyond upstream's model.yaml."""

    model_config = ConfigDict(extra="forbid")

    runtime: RuntimeName = Field(description="reference: the toolkit's PyTorch runtime; trtllm: TensorRT-LLM LLM(**model.yaml without triton_config)")
    bundle: str = Field(description="engine bundle directory (absolute, or relative to this file)")
    device: DeviceName = Field(default="auto", description="reference runtime only")
    torch_threads: int | None = Field(default=None, ge=1, description="reference runtime: torch.set_num_threads (CPU); null keeps torch's default")
    speculation: bool = Field(default=True, description="false: serve without the draft (a baseline model for A/B)")
    default_max_tokens: int | None = Field(
        default=None,
        gt=0,
        description="caps a request without sampling_param_max_tokens; null: the rest of the context, as on Dynamo (runtime/request_contract.py)",
    )
    python_path: list[str] = Field(default_factory=list, description="prepended to sys.path so the model can import eagle3_trt")


@dataclass(frozen=True)
class ModelYaml:
    triton_config: TritonConfig
    llm_kwargs: dict[str, Any]


def _read_mapping(path: Path) -> dict:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise UserError(path, f"cannot read: {e}", "regenerate with `eagle3-trt package`") from None
    if not isinstance(raw, dict):
        raise UserError(path, "must be a mapping", "regenerate with `eagle3-trt package`")
    return raw


def _errors(e: ValidationError, prefix: str = "") -> str:
    return "; ".join(f"{prefix}{'.'.join(map(str, x['loc'])) or '<root>'}: {x['msg']}" for x in e.errors())


def load_model_yaml(path: Path, check_llm_names: bool = True) -> ModelYaml:
    """model.yaml split the way upstream splits it; triton_config checked, and the ``LLM()`` keys
    checked against TensorRT-LLM's option names (installed field list, else the documented table)."""
    raw = _read_mapping(path)
    if "triton_config" not in raw or not isinstance(raw["triton_config"], dict):
        raise UserError(path, "no triton_config mapping (upstream's model.py indexes model.yaml['triton_config'])", "regenerate with `eagle3-trt package`")
    try:
        tc = TritonConfig.model_validate(raw["triton_config"])
    except ValidationError as e:
        raise UserError(path, _errors(e, "triton_config."), "triton_config holds max_batch_size, decoupled, cancellation_check_period_ms") from None
    llm = {k: v for k, v in raw.items() if k != "triton_config"}
    if "model" not in llm:
        raise UserError(path, "no 'model' key (LLM() needs the target checkpoint)", "regenerate with `eagle3-trt package`")
    if check_llm_names:
        check_names(llm, installed_names() or documented_names(), where=str(path))
    return ModelYaml(tc, llm)


def dump_model_yaml(my: ModelYaml) -> str:
    header = (
        "# Written by `eagle3-trt package`, in the format of TensorRT-LLM's Triton llmapi model.yaml:\n"
        "# triton_config for Triton, every other key is passed to tensorrt_llm.LLM(). Our own settings: eagle3.yaml.\n"
    )
    body = {"triton_config": my.triton_config.model_dump(), **copy.deepcopy(my.llm_kwargs)}
    return header + yaml.safe_dump(body, sort_keys=False)


def load_serving_yaml(path: Path) -> ServingConfig:
    raw = _read_mapping(path)
    try:
        return ServingConfig.model_validate(raw)
    except ValidationError as e:
        raise UserError(path, _errors(e), "see `eagle3-trt package --help` for the fields") from None


def dump_serving_yaml(cfg: ServingConfig) -> str:
    header = "# Written by `eagle3-trt package`: this toolkit's serving settings (upstream's model.py never reads this file).\n"
    return header + yaml.safe_dump(cfg.model_dump(), sort_keys=False)


def resolve_bundle(cfg: ServingConfig, serving_yaml_path: Path) -> Path:
    p = Path(cfg.bundle)
    if not p.is_absolute():
        p = (Path(serving_yaml_path).parent / p).resolve()
    return p


@dataclass(frozen=True)
class BundleInfo:
    path: Path
    max_seq_len: int
    max_draft_len: int
    tensor_parallel_size: int
    preset: str
    bundle: Bundle


def read_bundle(path: Path) -> BundleInfo:
    """The bundle (opened through build/bundle.open_bundle: manifest and llm_api_options.yaml
    validated, which both runtimes need) and the directories serving reads."""
    b = open_bundle(Path(path))
    # imported here (as dynamo_serving/launcher.py does): the registry behind refuse_on_trtllm imports torch and
    # transformers (~4 CPU-seconds), and every Triton command, stop included, imports this module
    from eagle3_trt.pipeline.other_engines import refuse_on_trtllm

    refuse_on_trtllm(b.path, b.options, "Triton serving")  # its engines are TensorRT-LLM's (or the runtime predicting it)
    for d in (b.target_dir, b.draft_dir, b.tokenizer_dir):
        if not d.is_dir():
            raise UserError(d, "missing from the bundle", "rebuild the bundle with `eagle3-trt engine`")
    return BundleInfo(b.path, b.max_seq_len, b.k, int(b.options.tensor_parallel_size), b.manifest.preset, b)
