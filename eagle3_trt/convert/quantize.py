"""Post-training quantization of the target (and optionally the draft) with NVIDIA ModelOpt.

Configs come from ModelOpt itself (FP8_DEFAULT_CFG, NVFP4_DEFAULT_CFG, FP8_KV_CFG); we only
add exclusions and the KV-cache quantizers. Every ModelOpt call goes through
``modelopt_compat``, which absorbs the 0.37 vs 0.4x differences.
lm_head and embeddings stay unquantized (ModelOpt's defaults exclude them; we say so again
so a future default change cannot quietly quantize them).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from eagle3_trt.convert import modelopt_compat
from eagle3_trt.convert.prompts import SHIPPED_PROMPTS, load_prompts
from eagle3_trt.convert.target import TargetInfo
from eagle3_trt.core import hf_compat
from eagle3_trt.errors import UserError
from eagle3_trt.formats.families import family_of

DEFAULT_CALIB_FILE = SHIPPED_PROMPTS  # --calib's default
ALWAYS_EXCLUDED = ("*lm_head*", "*embed_tokens*")


def quant_cfg(fmt: str, kv_cache: str = "auto", exclude: Sequence[str] = ALWAYS_EXCLUDED) -> dict:
    """ModelOpt's default config for ``fmt``, plus FP8 KV-cache quantizers and our exclusions."""
    cfg = modelopt_compat.format_config(fmt)
    if kv_cache == "fp8":
        cfg = modelopt_compat.with_fp8_kv_cache(cfg)
    modelopt_compat.disable_quantizers(cfg, exclude)
    return cfg


def calibration_prompts(calib_file: Path, num_samples: int, max_length: int, target: TargetInfo, length_option: str = "--calib-max-length") -> list[str]:
    """The calibration prompts, checked before the target is loaded (a bad file or length costs
    nothing then, and minutes of loading after).

    ``max_length`` is capped at the target's ``max_position_embeddings``: past it the model was
    never trained (calibrating there records activation ranges serving never sees), and the cost
    of one prompt's attention grows with the square of its length. A 151k-token prompt on the
    tiny target spent minutes inside one CPU attention kernel; Python runs signal handlers only
    between such calls, so Ctrl-C and SIGTERM waited for it (measured: no reaction to SIGINT in
    over 2 minutes). With the cap each call returns in milliseconds and an interrupt raises
    KeyboardInterrupt at once, between two of them; eagle3_trt.atomic.staged_dir then removes the
    staging directory."""
    limit = target.max_position_embeddings
    if max_length > limit:
        raise UserError(
            length_option,
            f"{max_length} tokens per calibration prompt exceeds the target's max_position_embeddings ({limit}, {Path(target.path) / 'config.json'})",
            f"pass --calib-max-length {limit} or less",
        )
    return load_prompts(calib_file, num_samples, option="--calib")


def calibration_batches(tokenizer, prompts: list[str], max_length: int) -> list[torch.Tensor]:
    """Token id tensors [1, n] of the prompts, chat-formatted when the tokenizer has a template."""
    batches = []
    for p in prompts:
        if getattr(tokenizer, "chat_template", None):
            ids = hf_compat.chat_template_ids(tokenizer, [{"role": "user", "content": p}], add_generation_prompt=True)
        else:
            ids = tokenizer(p)["input_ids"]
        batches.append(torch.tensor([list(ids)[:max_length]], dtype=torch.long))
    return batches


def calibration_hash(batches: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for b in batches:
        h.update(b.numpy().tobytes())
    return h.hexdigest()


def quantize_target(model, batches: list[torch.Tensor], fmt: str, kv_cache: str, on_step: Callable[[], None] | None = None):
    """In-place PTQ of a HF causal LM; returns the model."""
    device = next(model.parameters()).device

    def forward_loop(m):
        with torch.no_grad():
            for ids in batches:
                m(input_ids=ids.to(device), use_cache=False)
                if on_step:
                    on_step()

    exclude = ALWAYS_EXCLUDED + family_of(model.config.model_type, "target config.json:model_type").quant_exclude
    return modelopt_compat.quantize(model, quant_cfg(fmt, kv_cache, exclude), forward_loop)


def aux_hidden_states(model, ids: torch.Tensor, layer_ids: Sequence[int]) -> torch.Tensor:
    """Concatenated outputs of the target's decoder layers layer_ids (TensorRT-LLM convention)."""
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
    # hidden_states[0] is the embedding output, hidden_states[i + 1] the output of layer i.
    return torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)


def quantize_draft(draft, target_model, batches: list[torch.Tensor], layer_ids: Sequence[int], fmt: str, on_step: Callable[[], None] | None = None):
    """PTQ of the EAGLE-3 head, calibrated on the target's own aux states (teacher-forced step 1)."""
    # the draft's own table exactly when it has one (target_hidden_size != hidden_size), as TensorRT-LLM
    embed = getattr(draft, "embed_tokens", None) or target_model.get_input_embeddings()
    device = next(target_model.parameters()).device
    inputs = []
    for ids in batches:
        ids = ids.to(device)
        if ids.shape[1] < 2:
            continue
        aux = aux_hidden_states(target_model, ids, layer_ids)
        with torch.no_grad():
            emb = embed(ids[:, 1:])
        pos = torch.arange(ids.shape[1] - 1, device=device)[None]
        inputs.append((emb, aux[:, :-1], pos))

    def forward_loop(m):
        with torch.no_grad():
            for emb, aux, pos in inputs:
                m(emb.to(m.fc.weight.dtype), None, pos, aux=aux.to(m.fc.weight.dtype))
                if on_step:
                    on_step()

    # eh_proj is a plain torch nn.Linear in TensorRT-LLM's Eagle3DraftModel (modeling_speculative.py
    # @ 00679c66): it cannot load quantized weights, so it stays BF16 like lm_head and the embedding.
    return modelopt_compat.quantize(draft, quant_cfg(fmt, "auto", exclude=("*lm_head*", "*eh_proj*", "*embed_tokens*")), forward_loop)
