"""The target model as config files describe it (no weights are read here)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from eagle3_trt.errors import UserError
from eagle3_trt.formats import rope_params
from eagle3_trt.formats.checkpoint_io import read_json
from eagle3_trt.formats.families import Family, family_of
from eagle3_trt.formats.hf_config import parse_config

SUPPORTED_DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class TargetInfo:
    path: str
    model_type: str
    architectures: tuple[str, ...]
    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float
    rope_scaling: dict | None
    torch_dtype: str | None
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None
    tie_word_embeddings: bool
    quantized: bool
    family: str = "llama"  # formats/families.py's entry for model_type
    quant_method: str | None = None  # config.json quantization_config.quant_method of a shipped-quantized target

    @property
    def native_format(self) -> str | None:
        """The format the target ships in when its family is served in it as shipped (gpt-oss: mxfp4), else None."""
        return self.quant_method if self.quant_method in self.family_spec.native_quant_methods else None

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def family_spec(self) -> Family:
        return family_of(self.model_type)

    def default_aux_layers(self) -> tuple[int, ...]:
        """TensorRT-LLM's default capture for this target (its family's rule, formats/families.py)."""
        return self.family_spec.default_aux_layers(self.num_hidden_layers)


def read_target(path: Path) -> TargetInfo:
    """The target's config.json through the toolkit's one config schema (formats/hf_config.py):
    ``validate`` and ``engine`` both start here, so a field is accepted or refused the same way by both."""
    path = Path(path)
    cfg_path = path / "config.json"
    raw = read_json(cfg_path)
    cfg = parse_config(raw, cfg_path, required=("model_type", "num_hidden_layers", "max_position_embeddings"))
    family = family_of(cfg.model_type, f"{cfg_path}:model_type")
    if not cfg.architectures:
        raise UserError(f"{cfg_path}:architectures", "missing", f'set "architectures": ["{family.architectures[0]}"] (ModelOpt export needs it)')
    if cfg.architectures[0] not in family.architectures:
        # TensorRT-LLM picks its model class by architectures[0] (register_auto_model), transformers by model_type
        raise UserError(
            f"{cfg_path}:architectures",
            f"{cfg.architectures[0]!r} is not a {family.name} class (model_type {cfg.model_type!r})",
            f"a {family.name} checkpoint names one of {', '.join(family.architectures)}; the config mixes two models",
        )
    # the scaling TensorRT-LLM uses (a top-level original_max_position_embeddings written into it), so the
    # trainer's exported draft config and every reader of TargetInfo carry the value TensorRT-LLM takes
    theta, scaling = rope_params.effective_scaling(raw, str(cfg_path), family)
    quantized = (path / "hf_quant_config.json").is_file() or cfg.quantization_config is not None
    return TargetInfo(
        path=str(path),
        model_type=cfg.model_type,
        architectures=tuple(cfg.architectures),
        num_hidden_layers=cfg.num_hidden_layers,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.kv_heads,
        head_dim=family.head_dim(raw),
        vocab_size=cfg.vocab_size,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=theta,
        rope_scaling=scaling,
        torch_dtype=cfg.checkpoint_dtype,
        bos_token_id=cfg.bos_token_id,
        eos_token_ids=cfg.eos_ids,
        pad_token_id=cfg.pad_token_id,
        tie_word_embeddings=cfg.tie_word_embeddings,
        quantized=quantized,
        family=family.name,
        quant_method=(cfg.quantization_config or {}).get("quant_method"),
    )
