"""EAGLE-3 draft heads in the three layouts users have, normalized to one internal form.

Internal form = the SafeAILab/TensorRT-LLM layout: ``fc.weight``, ``midlayer.*``, ``norm.weight``,
``lm_head.weight``, ``d2t`` (int64, target_id = draft_id + d2t[draft_id]) and optional ``t2d``,
plus a typed ``DraftConfig``. Aux layer ids are kept in TensorRT-LLM's convention: the
*output* of decoder layer i (0-based), which is the *input* of layer i+1 in SafeAILab/vLLM terms.

Sources:
- SafeAILab/SpecForge: ``LlamaForCausalLMEagle3``, ``midlayer.*`` (TensorRT-LLM loads it natively).
- ModelOpt ``export_speculative_decoding``: ``layers.0.*`` names, ``eagle_config`` block.
- vllm-project/speculators: ``Eagle3Speculator``, ``transformer_layer_config``, vLLM aux-id convention.

Multi-layer heads take TensorRT-LLM's names ``midlayer.{i}.*``; what each producer trained and what is
refused is ``formats.draft_producers``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from eagle3_trt.errors import UserError
from eagle3_trt.formats import draft_producers, rope_params
from eagle3_trt.formats.checkpoint_io import load_tensors, read_json
from eagle3_trt.formats.draft_config import DraftConfig, detect_format, draft_config, expected_shapes
from eagle3_trt.formats.draft_layer_names import trtllm_layer_names
from eagle3_trt.speculative.registry import method_class, method_for_head

# The config half (DraftConfig, the layouts' config parsing, expected_shapes, trtllm_config) is
# eagle3_trt.formats.draft_config; this module loads the tensors and normalizes their names.


@dataclass
class DraftCheckpoint:
    path: Path
    config: DraftConfig
    tensors: dict[str, Any]
    raw_config: dict
    # a registered method's own head format (speculative.registry.method_for_head: its registry name), read by
    # that method's ``head`` hooks; None: an EAGLE-3 head in one of the three layouts above
    method: str | None = None

    @property
    def has_d2t(self) -> bool:
        return "d2t" in self.tensors


def _rename(name: str, fmt: str) -> str:
    if fmt == "modelopt" and name.startswith("eagle_module."):
        return _rename(name[len("eagle_module.") :], fmt)
    return name


def load_draft(path: Path) -> DraftCheckpoint:
    path = Path(path)
    raw = read_json(path / "config.json")
    method = method_for_head(raw)
    if method is not None:  # its home reads and checks it: tensors under the draft core's names plus its own
        head = method.head.load(path)  # type: ignore[attr-defined]  # method_for_head returns classes with head hooks
        return DraftCheckpoint(path=path, config=head.config, tensors=head.tensors, raw_config=raw, method=method.name)
    draft_producers.refuse_other_method(raw, path / "config.json")  # before reading weights another method may lay out differently
    tensors = load_tensors(path)
    fmt = detect_format(raw, set(tensors), path / "config.json")
    norm = {_rename(k, fmt): v for k, v in tensors.items()}
    cfg = draft_config(raw, path / "config.json", fmt, norm)
    norm = trtllm_layer_names(norm, cfg.num_hidden_layers)  # layers.{i}.* -> midlayer.* (formats/draft_layer_names.py)
    field = "transformer_layer_config.num_hidden_layers" if isinstance(raw.get("transformer_layer_config"), dict) else "num_hidden_layers"
    _check_layer_count(norm, cfg.num_hidden_layers, f"{path / 'config.json'}:{field}")
    return DraftCheckpoint(path=path, config=cfg, tensors=norm, raw_config=raw)


_INDEXED = re.compile(r"^(?:midlayer|layers)\.(\d+)\.")


def _check_layer_count(tensors: dict[str, Any], num_layers: int, where: str) -> None:
    """The config's layer count against the layers the weights hold. TensorRT-LLM builds
    ``num_hidden_layers`` layers (``Eagle3DraftModel``): with fewer in the config it loads the first
    ones and drops the rest (a head's later layers left out is another function); with more it would
    load a one-layer head's ``midlayer.*`` into none of them. Names are TensorRT-LLM's after
    ``trtllm_layer_names``, which keeps a one-layer config's ``layers.{i>=1}.*`` as they are."""
    indexed = {int(m.group(1)) for k in tensors if (m := _INDEXED.match(k))}
    if any(k.startswith("midlayer.") and not _INDEXED.match(k) for k in tensors):
        indexed.add(0)  # a one-layer head's midlayer.*
    held = len(indexed)
    if held and held != num_layers:
        extra = f": TensorRT-LLM would build {num_layers} and drop the tensors of the others" if held > num_layers else ""
        raise UserError(
            where,
            f"{num_layers} draft decoder layers, but the checkpoint holds {held} (layers {sorted(indexed)}){extra}",
            "set num_hidden_layers to the number of layers the head was trained with",
        )


def head_hooks(ckpt: DraftCheckpoint) -> Any:
    """The ``head`` hooks of the method whose own format the checkpoint is (None: an EAGLE-3 head)."""
    return None if ckpt.method is None else getattr(method_class(ckpt.method), "head", None)


def served_tensors(ckpt: DraftCheckpoint) -> dict[str, Any]:
    """The tensors a bundle ships for this head: exactly those TensorRT-LLM loads for its config
    (``expected_shapes``), plus ``d2t`` for a reduced vocabulary (created only then). q_norm/k_norm, an
    embed_tokens shared with the target, an fc.bias without ``bias: true``, t2d: TensorRT-LLM ignores them."""
    c = ckpt.config
    keep = set(expected_shapes(c))
    if c.draft_vocab_size != c.vocab_size:
        keep.add("d2t")
    return {k: v for k, v in ckpt.tensors.items() if k in keep}


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
    return DraftCheckpoint(path=ckpt.path, config=new, tensors=ckpt.tensors, raw_config=ckpt.raw_config, method=ckpt.method)
