"""The one schema of the Hugging Face ``config.json`` fields this toolkit reads.

``validate``, ``engine`` (and its dry run), the planner's callers and the draft loader all read a
config through ``parse_config``, so one file gets one answer everywhere: either typed values or a
one-line ``UserError`` naming ``file:field``.

Types are strict, as transformers' own are: ``"hidden_size": "256"`` is refused, not coerced.
transformers 5.x refuses it when the config is built (``StrictDataclassFieldValidationError:
Field 'hidden_size' expected int, got str``) and 4.57.3 (TensorRT-LLM 1.2's) fails on first use
(``TypeError: unsupported operand type(s) for //: 'str' and 'int'``), both checked here with
``AutoConfig.from_pretrained`` on such a file. Accepting what every runtime downstream refuses
would only move the error later. JSON integers are accepted for float fields (``"rope_theta":
10000``), as Python's json gives them.

Only fields the toolkit reads are declared; the rest of a config.json (``initializer_range``,
``transformers_version``, fields of newer transformers releases) is none of our business and is
ignored, not forbidden, so a valid checkpoint is never refused for carrying them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from eagle3_trt.errors import UserError
from eagle3_trt.formats.generation import eos_ids_of
from eagle3_trt.formats.hf_compat import dtype_of, rope_of

# What a config without ``max_position_embeddings`` means: transformers' ``LlamaConfig`` default
# (models/llama/configuration_llama.py, the same in 4.57 and 5.x), which is what TensorRT-LLM and
# transformers build such a model with; the draft config, the bundle's max_seq_len and the
# reference engine all fall back to it through here.
DEFAULT_MAX_POSITIONS = 2048


def max_positions_of(cfg: dict[str, Any]) -> int:
    """A raw config's ``max_position_embeddings``, or ``DEFAULT_MAX_POSITIONS`` where it has none."""
    return int(cfg.get("max_position_embeddings") or DEFAULT_MAX_POSITIONS)


class LlamaConfigFields(BaseModel):
    """The Llama-family fields read from a target's (or an EAGLE-3 draft's) config.json."""

    # strict: no "256" -> 256, no 256.0 -> 256, no true -> 1 (see the module docstring);
    # extra="ignore": a config.json has many fields the toolkit never reads.
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    model_type: str | None = None
    architectures: list[str] | None = None
    hidden_size: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    num_hidden_layers: int = Field(1, gt=0)
    num_attention_heads: int = Field(gt=0)
    num_key_value_heads: int | None = Field(None, gt=0)
    head_dim: int | None = Field(None, gt=0)
    vocab_size: int = Field(gt=0)
    max_position_embeddings: int | None = Field(None, gt=0)
    rms_norm_eps: float | None = Field(None, gt=0)
    rope_theta: float | None = Field(None, gt=0)
    rope_scaling: dict[str, Any] | None = None
    rope_parameters: dict[str, Any] | None = None
    torch_dtype: str | None = None
    dtype: str | None = None
    bos_token_id: int | None = Field(None, ge=0)
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = Field(None, ge=0)
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    quantization_config: dict[str, Any] | None = None
    # mixture of experts and per-layer attention kinds (gpt-oss; formats/families.py names the fields)
    num_local_experts: int | None = Field(None, gt=0)
    num_experts_per_tok: int | None = Field(None, gt=0)
    sliding_window: int | None = Field(None, gt=0)
    layer_types: list[str] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> LlamaConfigFields:
        if self.num_key_value_heads is not None and self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of num_key_value_heads {self.num_key_value_heads}", "num_key_value_heads"
            )
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads {self.num_attention_heads} and head_dim is not given", "hidden_size"
            )
        if self.layer_types is not None and len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"{len(self.layer_types)} entries for {self.num_hidden_layers} layers", "layer_types")
        if self.num_experts_per_tok and self.num_local_experts and self.num_experts_per_tok > self.num_local_experts:
            raise ValueError(f"{self.num_experts_per_tok} experts per token of {self.num_local_experts}", "num_experts_per_tok")
        ids = self.eos_token_id if isinstance(self.eos_token_id, list) else [self.eos_token_id]
        if any(i is not None and i < 0 for i in ids):
            raise ValueError(f"{self.eos_token_id} holds a negative id", "eos_token_id")
        return self

    # ---- derived values, each with transformers' default where the field is optional
    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return eos_ids_of(self.eos_token_id)

    @property
    def rope(self) -> tuple[float, dict[str, Any] | None]:
        """(rope_theta, rope_scaling or None) from either transformers spelling (hf_compat.rope_of)."""
        return rope_of(self.model_dump(exclude_none=True))

    @property
    def checkpoint_dtype(self) -> str | None:
        return dtype_of(self.model_dump(exclude_none=True))


class Eagle3DraftConfigFields(LlamaConfigFields):
    """An EAGLE-3 head's flat config: the Llama fields plus the two sizes that tie it to a target."""

    draft_vocab_size: int | None = Field(None, gt=0)
    target_hidden_size: int | None = Field(None, gt=0)


class GenerationConfigIds(BaseModel):
    """The special-token ids of a ``generation_config.json`` (the rest of it is sampling defaults)."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    bos_token_id: int | None = Field(None, ge=0)
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = Field(None, ge=0)

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return eos_ids_of(self.eos_token_id)


_HINTS: dict[str, str] = {
    "int_type": "write a JSON integer (no quotes, no decimal point), as transformers requires",
    "float_type": "write a JSON number (no quotes)",
    "bool_type": "write true or false (no quotes)",
    "string_type": "write a JSON string",
    "greater_than": "a size must be a positive integer",
    "greater_than_equal": "token ids are >= 0",
    "missing": "the config.json is incomplete; re-download it from the model repository",
}


def parse_config(cfg: dict[str, Any], path: Path | str, schema: type[BaseModel] = LlamaConfigFields, *, required: tuple[str, ...] = ()) -> Any:
    """``cfg`` (the JSON of ``path``) through ``schema``; a UserError ``path:field: what (hint)`` otherwise.

    ``required``: optional fields of the schema that this caller needs all the same."""
    for key in required:
        if cfg.get(key) is None:
            raise UserError(f"{path}:{key}", "missing required field", _HINTS["missing"])
    try:
        return schema.model_validate(cfg)
    except ValidationError as e:
        errs = e.errors()
        # a union field (eos_token_id: int | list[int]) reports one error per member: the deepest
        # location names the offending element ("eos_token_id.1"), the most useful of them
        err = max((x for x in errs if x["loc"][:1] == errs[0]["loc"][:1]), key=lambda x: len(x["loc"]))
        field = str(err["loc"][0]) if err["loc"] else "<root>"
        if err["type"] == "value_error":  # a _consistent() failure: ValueError(message, field)
            msg, field = err["ctx"]["error"].args
            raise UserError(f"{path}:{field}", msg, "config.json and the checkpoint must describe the same model") from None
        kind = err["type"]
        if kind == "missing":
            raise UserError(f"{path}:{field}", "missing required field", _HINTS["missing"]) from None
        got = err.get("input")
        want = err["msg"].removeprefix("Input should be ").removeprefix("Input ")
        what = f"must be {want}, got {json.dumps(got, default=str)}"
        if kind.endswith("_type"):
            what += f" (a JSON {_json_type(got)})"
        raise UserError(f"{path}:{field}", what, _HINTS.get(kind, "see the model's original config.json")) from None


def _json_type(v: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object", type(None): "null"}.get(type(v), type(v).__name__)
