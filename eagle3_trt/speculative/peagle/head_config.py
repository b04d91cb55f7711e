"""The config.json of a speculators 0.9 P-EAGLE head, typed: what P-EAGLE adds to an EAGLE-3 head.

speculators 0.9.0 ``models/peagle/config.py`` (``PEagleSpeculatorConfig(Eagle3SpeculatorConfig)``,
registered as ``speculators_model_type: peagle``) adds ``mask_token_id`` (the token id of the K-1
mask slots) and ``embed_requires_grad`` (default true: P-EAGLE trains its ``embed_tokens``), and
``models/peagle/core.py`` adds the ``mask_hidden`` parameter [1, 1, A*T] (the aux states of a mask
slot). Every other field is an EAGLE-3 head's and is parsed by the EAGLE-3 reader
(``formats.draft_config.draft_config``) on ``eagle3_view`` of the config, so the two methods share
one parser of the layer config, aux ids and norm flags.

vLLM (``vllm/transformers_utils/configs/speculators/base.py`` @ 052316aeab2a1b2a9076518f20fe776052b947c9,
``build_vllm_speculative_config``) serves ``peagle`` as ``method: eagle3`` with ``parallel_drafting:
true``, K = ``speculators_config.proposal_methods[0].speculative_tokens``; its proposer
(``vllm/v1/spec_decode/llm_base_proposer.py`` @ 00c4f22dae4795e34658bead82fa071e6bb7ae39,
``_init_parallel_drafting_params``) refuses a config without ``mask_token_id``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from eagle3_trt.errors import UserError

# the top-level keys speculators 0.9.0 writes for PEagleSpeculatorConfig (its pydantic fields plus what
# transformers' PretrainedConfig serialises); anything else is refused rather than ignored
_WRITTEN_BY_SPECULATORS = (
    "architectures",
    "auto_map",
    "chunk_size_feed_forward",
    "draft_vocab_size",
    "dtype",
    "torch_dtype",
    "eagle_aux_hidden_state_layer_ids",
    "embed_requires_grad",
    "fc_norm",
    "id2label",
    "is_encoder_decoder",
    "label2id",
    "mask_token_id",
    "norm_before_fc",
    "norm_before_residual",
    "norm_output",
    "output_hidden_states",
    "problem_type",
    "return_dict",
    "speculators_config",
    "speculators_model_type",
    "speculators_version",
    "target_hidden_size",
    "tie_word_embeddings",
    "transformer_layer_config",
    "transformers_version",
)
# the fields only P-EAGLE has; eagle3_view drops them
PEAGLE_ONLY = ("mask_token_id", "embed_requires_grad")


class _Proposal(BaseModel):
    model_config = ConfigDict(extra="allow")
    speculative_tokens: StrictInt = Field(ge=1)


class _SpeculatorsBlock(BaseModel):
    model_config = ConfigDict(extra="allow")
    algorithm: Literal["peagle"]
    proposal_methods: list[_Proposal] = Field(min_length=1)


class PEagleHeadConfig(BaseModel):
    """The P-EAGLE fields of a head's config.json (the EAGLE-3 ones: ``formats.draft_config``)."""

    model_config = ConfigDict(extra="forbid")

    speculators_model_type: Literal["peagle"]
    mask_token_id: StrictInt = Field(ge=0)
    embed_requires_grad: StrictBool = True
    speculators_config: _SpeculatorsBlock
    norm_before_residual: StrictBool = False

    @property
    def num_speculative_tokens(self) -> int:
        """K as vLLM reads it: the first proposal method's ``speculative_tokens``."""
        return self.speculators_config.proposal_methods[0].speculative_tokens


def read_head_config(raw: dict[str, Any], cfg_path: Path) -> PEagleHeadConfig:
    """The typed P-EAGLE fields, or a one-line UserError naming the field."""
    unknown = sorted(set(raw) - set(_WRITTEN_BY_SPECULATORS))
    if unknown:
        raise UserError(f"{cfg_path}:{unknown[0]}", "not a field speculators 0.9 writes for a P-EAGLE head", "remove it")
    if raw.get("mask_token_id") is None:
        raise UserError(
            f"{cfg_path}:mask_token_id",
            "missing: vLLM's parallel drafting feeds this token id to the K-1 mask slots and refuses a head without it",
            "retrain or set the mask token id the head was trained with (speculators' --mask-token-id)",
        )
    fields = {k: raw[k] for k in ("speculators_model_type", "mask_token_id", "embed_requires_grad", "speculators_config", "norm_before_residual") if k in raw}
    try:
        cfg = PEagleHeadConfig.model_validate(fields)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise UserError(f"{cfg_path}:{where}", f"{err['msg']} (got {err.get('input')!r})", "a P-EAGLE head as speculators 0.9 saves it") from None
    if cfg.norm_before_residual:
        raise UserError(
            f"{cfg_path}:norm_before_residual",
            "true: the head was trained with residual = hidden_norm(hidden); the toolkit's draft core (core/draft.py) adds the un-normed hidden state",
            "retrain with speculators' --no-norm-before-residual",
        )
    layer = raw.get("transformer_layer_config")
    if isinstance(layer, dict):
        vocab = layer.get("vocab_size")
        if isinstance(vocab, int) and not cfg.mask_token_id < vocab:
            raise UserError(f"{cfg_path}:mask_token_id", f"{cfg.mask_token_id} is outside the vocabulary ({vocab} ids)", "the mask token is a target token id")
        if "sliding_attention" in (layer.get("layer_types") or []):
            raise UserError(
                f"{cfg_path}:transformer_layer_config.layer_types",
                "sliding-window draft layers: the toolkit's P-EAGLE draft attends the whole context",
                "retrain with full attention (speculators' --full-attention-indices 0)",
            )
    return cfg


def eagle3_view(raw: dict[str, Any]) -> dict[str, Any]:
    """The config as the EAGLE-3 reader parses it: the P-EAGLE-only fields dropped, the type eagle3."""
    out = {k: v for k, v in raw.items() if k not in PEAGLE_ONLY}
    out["speculators_model_type"] = "eagle3"
    out["architectures"] = ["Eagle3DraftModel"]
    return out
