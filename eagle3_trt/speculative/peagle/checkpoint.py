"""A speculators 0.9 P-EAGLE head directory, read and checked: the typed config, the tensors under the
draft core's names, and the checks an EAGLE-3 head gets (every tensor present with its shape, none
unknown), plus P-EAGLE's own two (``mask_hidden`` [1, 1, A*T], ``embed_tokens`` [V, H])."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_trt.errors import UserError
from eagle3_trt.formats.checkpoint_io import load_tensors, read_json
from eagle3_trt.formats.draft_config import DraftConfig, draft_config, expected_shapes
from eagle3_trt.formats.draft_layer_names import trtllm_layer_names
from eagle3_trt.speculative.peagle.head_config import PEagleHeadConfig, eagle3_view, read_head_config

# tensors speculators saves that the draft does not compute with (verifier_* are excluded from its saves)
_NOT_SERVED = ("t2d", "verifier_lm_head.weight", "verifier_norm.weight")


@dataclass
class PEagleCheckpoint:
    path: Path
    config: DraftConfig  # the EAGLE-3 part, as formats.draft_config parses it
    head: PEagleHeadConfig  # the P-EAGLE part
    tensors: dict[str, Any]  # the draft core's names (midlayer.*), plus mask_hidden and embed_tokens.weight
    raw_config: dict[str, Any]


def is_peagle(raw: dict[str, Any]) -> bool:
    """A config.json that says it is a speculators P-EAGLE head."""
    return raw.get("speculators_model_type") == "peagle"


def load_peagle(path: Path) -> PEagleCheckpoint:
    """Read and check a P-EAGLE head; one-line UserError naming the file/field/tensor otherwise."""
    path = Path(path)
    cfg_path = path / "config.json"
    raw = read_json(cfg_path)
    if not is_peagle(raw):
        raise UserError(
            f"{cfg_path}:speculators_model_type",
            f"{raw.get('speculators_model_type')!r}: not a P-EAGLE head",
            "pass a speculators P-EAGLE head (speculators_model_type: peagle)",
        )
    head = read_head_config(raw, cfg_path)
    tensors = load_tensors(path)
    cfg = draft_config(eagle3_view(raw), cfg_path, "speculators", tensors)
    tensors = trtllm_layer_names(tensors, cfg.num_hidden_layers)  # the draft core's names, as for EAGLE-3 heads
    _check_shapes(tensors, cfg, path)
    return PEagleCheckpoint(path=path, config=cfg, head=head, tensors=tensors, raw_config=raw)


def _check_shapes(tensors: dict[str, Any], cfg: DraftConfig, path: Path) -> None:
    want = dict(expected_shapes(cfg))
    want["embed_tokens.weight"] = (cfg.vocab_size, cfg.hidden_size)
    want["mask_hidden"] = (1, 1, cfg.fuse_width)
    optional = {"d2t"} | set(_NOT_SERVED)
    for name, shape in want.items():
        t = tensors.get(name)
        if t is None:
            raise UserError(f"{path}:{name}", "missing from the head's weights", "a P-EAGLE head as speculators 0.9 saves it")
        if tuple(t.shape) != shape:
            raise UserError(f"{path}:{name}", f"shape {tuple(t.shape)}, config.json implies {shape}", "the weights and config.json disagree")
    extra = sorted(set(tensors) - set(want) - optional)
    if extra:
        raise UserError(
            f"{path}:{extra[0]}", "a tensor the P-EAGLE draft does not have (q_norm/k_norm layers, another method's weights)", "a Llama-style P-EAGLE head"
        )
    if cfg.draft_vocab_size != cfg.vocab_size and "d2t" not in tensors:
        raise UserError(f"{path}:d2t", "missing for a reduced draft vocabulary", "save the head with its vocabulary maps (d2t)")
