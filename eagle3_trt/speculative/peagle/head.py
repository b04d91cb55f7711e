"""The hooks through which the method-agnostic layers (convert's loader and validation, the bundle
build, the launchers) handle a P-EAGLE head: read it, check it against the target, build its draft,
and say who serves it. ``PEagleMethod.head`` points here; ``speculative.registry.method_for_head``
finds it from a head's config.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from eagle3_trt.errors import UserError
from eagle3_trt.speculative.peagle import serving
from eagle3_trt.speculative.peagle.checkpoint import PEagleCheckpoint, is_peagle, load_peagle
from eagle3_trt.speculative.peagle.draft import PEagleDraft
from eagle3_trt.speculative.peagle.export import speculators_names
from eagle3_trt.speculative.peagle.training import parallel_unroll


class PEagleHead:
    """A speculators P-EAGLE head (``speculators_model_type: peagle``)."""

    label = "P-EAGLE"
    # tensors the EAGLE-3 checks do not know; ``load`` has checked their shapes
    method_tensors = ("mask_hidden", "embed_tokens.weight")
    # the one-line reason TensorRT-LLM (compile, Triton, trtllm-serve) cannot serve it
    trtllm_refusal = serving.NOT_SERVED["tensorrt_llm"]

    # what a bundle's speculative_config sets for it: vLLM's key (PEagleMethod.from_options reads it back)
    speculative_options: dict[str, Any] = {"parallel_drafting": True}  # noqa: RUF012  # read-only class data

    # why a head fusing one aux layer (fc [H, H]) cannot be served as trained: vLLM's Eagle3 draft
    # (vllm/model_executor/models/llama_eagle3.py@00bd1493 LlamaModel) builds fc over target_hidden_size * 3
    single_aux_fc = "vLLM's Eagle3 draft builds fc over 3 aux layers (llama_eagle3.py LlamaModel), so it cannot load this fc"

    @staticmethod
    def claims(raw: dict[str, Any]) -> bool:
        return is_peagle(raw)

    @staticmethod
    def load(path: Path) -> PEagleCheckpoint:
        return load_peagle(path)

    @staticmethod
    def check_target(ckpt: Any, vocab_size: int) -> str:
        """The head against the target beyond the EAGLE-3 checks: the mask token is a target token and
        the head's own embedding covers the target's vocabulary. Returns the report line."""
        mask_id = int(ckpt.raw_config["mask_token_id"])
        cfg_file = Path(ckpt.path) / "config.json"
        if not 0 <= mask_id < vocab_size:
            raise UserError(
                f"{cfg_file}:mask_token_id", f"{mask_id} is outside the target's vocabulary ({vocab_size} ids)", "the mask token is a target token id"
            )
        rows = int(ckpt.tensors["embed_tokens.weight"].shape[0])
        if rows != vocab_size:
            raise UserError(
                f"{ckpt.path}:embed_tokens.weight", f"{rows} rows but the target has {vocab_size} tokens", "this head was trained for another target"
            )
        k = int(ckpt.raw_config["speculators_config"]["proposal_methods"][0]["speculative_tokens"])
        return f"P-EAGLE head: mask_token_id {mask_id}, own embed_tokens [{rows}, {ckpt.config.hidden_size}], mask_hidden [1, 1, {ckpt.tensors['mask_hidden'].shape[-1]}], trained for K={k}"

    @staticmethod
    def trained_k(ckpt: Any) -> int:
        """K the head was trained for (vLLM's num_speculative_tokens when its config is read as is)."""
        return int(ckpt.raw_config["speculators_config"]["proposal_methods"][0]["speculative_tokens"])

    @staticmethod
    def build(ckpt: Any, dtype: torch.dtype, device: Any) -> tuple[PEagleDraft, torch.nn.Embedding]:
        """The draft and the embedding table it reads (its own, trained)."""
        draft = PEagleDraft.from_peagle_checkpoint(ckpt, int(ckpt.raw_config["mask_token_id"]), dtype=dtype, device=device)
        return draft, draft.embed_tokens

    @staticmethod
    def slot_logits(draft: Any, next_ids: torch.Tensor, aux: torch.Tensor, k: int) -> list[torch.Tensor]:
        """Slots 1..k over a window in one forward (convert/behaviour.py's later-slot agreement): the training
        pass, which tests/test_peagle_training.py holds equal to vLLM's one forward per group."""
        return parallel_unroll(draft, next_ids, aux, k)

    @staticmethod
    def export(ckpt: Any, out_dir: Path) -> None:
        """The bundle's draft/: the head as speculators saved it (config.json as read; the tensors under
        speculators' names, floats in BF16), which is what vLLM loads (``--speculative-config model``)."""
        tensors = {k: (t.to(torch.bfloat16) if t.is_floating_point() else t).contiguous() for k, t in speculators_names(ckpt.tensors).items()}
        out_dir.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
        (out_dir / "config.json").write_text(json.dumps(ckpt.raw_config, indent=2) + "\n")

    @staticmethod
    def serving(draft_path: str, k: int) -> dict[str, Any]:
        return serving.serving_table(draft_path, k)


__all__ = ["PEagleHead"]
