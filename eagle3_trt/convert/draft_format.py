"""EAGLE-3 draft heads in the three layouts users have, normalized to one internal form.

Internal form = the SafeAILab/TensorRT-LLM layout: ``fc.weight``, ``midlayer.*``, ``norm.weight``,
``lm_head.weight``, ``d2t`` (int64, target_id = draft_id + d2t[draft_id]) and optional ``t2d``,
plus a typed ``DraftConfig``. Aux layer ids are kept in TensorRT-LLM's convention: the
*output* of decoder layer i (0-based), which is the *input* of layer i+1 in SafeAILab/vLLM terms.

Sources:
- SafeAILab/SpecForge: ``LlamaForCausalLMEagle3``, ``midlayer.*`` (TensorRT-LLM loads it natively).
- ModelOpt ``export_speculative_decoding``: ``layers.0.*`` names, ``eagle_config`` block.
- vllm-project/speculators: ``Eagle3Speculator``, ``transformer_layer_config``, vLLM aux-id convention.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from eagle3_trt.formats import rope_params
from eagle3_trt.formats.checkpoint_io import load_tensors, read_json
from eagle3_trt.formats.draft_config import DraftConfig, detect_format, draft_config

# The config half (DraftConfig, the layouts' config parsing, expected_shapes, trtllm_config) is
# eagle3_trt.formats.draft_config; this module loads the tensors and normalizes their names.


@dataclass
class DraftCheckpoint:
    path: Path
    config: DraftConfig
    tensors: dict[str, Any]
    raw_config: dict

    @property
    def has_d2t(self) -> bool:
        return "d2t" in self.tensors


def _rename(name: str, fmt: str) -> str:
    if name.startswith("layers.0."):
        return "midlayer." + name[len("layers.0.") :]
    if fmt == "modelopt" and name.startswith("eagle_module."):
        return _rename(name[len("eagle_module.") :], fmt)
    return name


def load_draft(path: Path) -> DraftCheckpoint:
    path = Path(path)
    raw = read_json(path / "config.json")
    tensors = load_tensors(path)
    fmt = detect_format(raw, set(tensors))
    norm = {_rename(k, fmt): v for k, v in tensors.items()}
    cfg = draft_config(raw, path / "config.json", fmt, norm)
    cfg, norm = _sort_aux_layers(cfg, norm)
    return DraftCheckpoint(path=path, config=cfg, tensors=norm, raw_config=raw)


def _sort_aux_layers(cfg: DraftConfig, tensors: dict) -> tuple[DraftConfig, dict]:
    """TensorRT-LLM sorts eagle3_layers_to_capture and writes capture i into fc's input block i
    (Eagle3OneModelSpecMetadata.__post_init__, tensorrt_llm/_torch/speculative/eagle3.py @
    f933a608045a46426792263617475b359d568043). A head that lists its aux layers in another order gets
    fc's input blocks (and the per-block input norms) permuted into the sorted order here, so the
    exported head computes the function it was trained as, and the runtime measures that function."""
    ids = cfg.aux_layer_ids
    if ids is None or list(ids) == sorted(ids) or len(set(ids)) != len(ids) or cfg.num_aux_layers != len(ids):
        return cfg, tensors  # sorted, or malformed: validate names the problem
    order = sorted(range(len(ids)), key=lambda i: ids[i])
    T = cfg.target_hidden_size
    out = dict(tensors)

    def permute_blocks(t, dim):
        return _cat([t.narrow(dim, i * T, T) for i in order], dim)

    if "fc.weight" in out and out["fc.weight"].shape[1] == len(ids) * T:
        out["fc.weight"] = permute_blocks(out["fc.weight"], 1)
    if "input_norm.weight" in out and out["input_norm.weight"].shape[0] == len(ids) * T:
        out["input_norm.weight"] = permute_blocks(out["input_norm.weight"], 0)
    norms = {i: out.get(f"fc_norm.{i}.weight") for i in range(len(ids))}
    if all(v is not None for v in norms.values()):
        for new, old in enumerate(order):
            out[f"fc_norm.{new}.weight"] = norms[old]
    return replace(cfg, aux_layer_ids=tuple(sorted(ids)), aux_layer_ids_as_trained=tuple(ids)), out


def _cat(parts, dim):
    import torch  # ~2 s; config-only callers (dry run, planner) never reach a permutation

    return torch.cat(parts, dim=dim).contiguous()


def config_for_max_seq_len(cfg: DraftConfig, max_seq_len: int) -> DraftConfig:
    """The config as a bundle of ``max_seq_len`` ships it: ``max_position_embeddings`` raised to
    at least ``max_seq_len`` and rope_scaling made explicit, where the rotary function stays the same
    (see ``trtllm_config``). A real build and a dry run both write the draft config through this."""
    rp = cfg.rope()
    if max_seq_len <= cfg.max_position_embeddings or rp.kind not in rope_params.MAX_POS_INDEPENDENT:
        return cfg
    return replace(cfg, max_position_embeddings=int(max_seq_len), rope_scaling=rope_params.export_scaling(rp, cfg.rope_scaling))


def for_max_seq_len(ckpt: DraftCheckpoint, max_seq_len: int) -> DraftCheckpoint:
    """The checkpoint with ``config_for_max_seq_len``'s config. Tensors are shared, not copied."""
    new = config_for_max_seq_len(ckpt.config, max_seq_len)
    if new is ckpt.config:
        return ckpt
    return DraftCheckpoint(path=ckpt.path, config=new, tensors=ckpt.tensors, raw_config=ckpt.raw_config)
