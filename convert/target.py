"""The target model as config files describe it (no weights are read here)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from eagle3_trt.convert.checkpoint_io import read_json
from eagle3_trt.convert.hf_compat import dtype_of, rope_of
from eagle3_trt.errors import UserError

# EAGLE-3's llama3 draft architecture runs on Llama-family decoders in TensorRT-LLM.
SUPPORTED_MODEL_TYPES = ("llama", "mistral")
SUPPORTED_DTYPES = ("bfloat16", "float16", "float32")


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """TensorRT-LLM's default ``eagle3_layers_to_capture`` for a target of ``num_layers`` decoder
    layers: the outputs of layers {1, L//2 - 1, L - 4} (0-based), as
    ``Eagle3OneModelSpecMetadata`` in TensorRT-LLM's ``tensorrt_llm/_torch/speculative/eagle3.py``
    sets ``layers_to_capture`` when the draft config names none (targets deeper than 5 layers).
    The one copy of this rule: every stage that needs the default calls this."""
    L = int(num_layers)
    return (1, L // 2 - 1, L - 4)


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
    tie_word_embeddings: bool
    quantized: bool

    def to_dict(self) -> dict:
        return asdict(self)

    def default_aux_layers(self) -> tuple[int, ...]:
        return default_aux_layers(self.num_hidden_layers)


def read_target(path: Path) -> TargetInfo:
    path = Path(path)
    cfg_path = path / "config.json"
    cfg = read_json(cfg_path)

    def need(key: str):
        if cfg.get(key) is None:
            raise UserError(f"{cfg_path}:{key}", "missing required field", "the target config.json is incomplete; re-download it")
        return cfg[key]

    model_type = need("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UserError(f"{cfg_path}:model_type", f"{model_type!r} is not a Llama-family decoder", f"EAGLE-3 llama3 heads run on {', '.join(SUPPORTED_MODEL_TYPES)} targets")
    if not cfg.get("architectures"):
        raise UserError(f"{cfg_path}:architectures", "missing", 'set "architectures": ["LlamaForCausalLM"] (ModelOpt export needs it)')
    heads = int(need("num_attention_heads"))
    hidden = int(need("hidden_size"))
    eos = cfg.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
    theta, scaling = rope_of(cfg)
    quantized = (path / "hf_quant_config.json").is_file() or "quantization_config" in cfg
    return TargetInfo(
        path=str(path),
        model_type=model_type,
        architectures=tuple(cfg["architectures"]),
        num_hidden_layers=int(need("num_hidden_layers")),
        hidden_size=hidden,
        intermediate_size=int(need("intermediate_size")),
        num_attention_heads=heads,
        num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        vocab_size=int(need("vocab_size")),
        max_position_embeddings=int(need("max_position_embeddings")),
        rope_theta=theta,
        rope_scaling=scaling,
        torch_dtype=dtype_of(cfg),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=eos_ids,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        quantized=quantized,
    )
