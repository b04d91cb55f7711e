"""Checks of the target alone: its family's flags, and every shard's tensor headers against config.json."""

from __future__ import annotations

from pathlib import Path

from eagle3_trt.convert.target import TargetInfo
from eagle3_trt.convert.validate_report import ValidationReport
from eagle3_trt.errors import UserError
from eagle3_trt.formats import rope_params
from eagle3_trt.formats.checkpoint_io import read_json, tensor_shapes
from eagle3_trt.formats.families import ATTENTION, MX_BLOCK, family_named, layer_shape_symbols, resolve_shape


def check_target_weights(target: TargetInfo, rep: ValidationReport) -> None:
    """Header-only pass over every target shard against the family's layer table (formats/families.py):
    corrupt or truncated files, missing layers and shapes config.json does not imply fail here, before a
    multi-GB load, with the file and tensor named. A natively quantized checkpoint (gpt-oss MXFP4) is
    checked against the tensors its format ships (blocks and scales) with their dtypes."""
    shapes = tensor_shapes(Path(target.path))
    where = Path(target.path)
    family = target.family_spec
    raw = read_json(where / "config.json")
    method = target.quant_method
    prefix = _check_embedding_and_depth(target, shapes, where, family.hf_class)
    _check_shipped_layout(target, family, shapes, method, where)
    experts = int(raw.get(family.moe_experts_field) or 0) if family.moe_experts_field else 0
    sym = layer_shape_symbols(target.hidden_size, target.intermediate_size, target.num_attention_heads, target.num_key_value_heads, target.head_dim, experts)
    layer = family.expected_layer_tensors(method)
    shipped = {n for swap in family.native_layer_tensors.get(method or "", {}).values() for n in swap}
    # the family's own tensors first (on the last layer), so a checkpoint of another layout is named as such
    for name in layer:
        if prefix + name not in shapes and name not in ATTENTION:
            raise UserError(
                where,
                f"{prefix + name} missing: a {family.name} decoder layer has it" + (f" ({method} checkpoints ship it)" if name in shipped else ""),
                "the checkpoint is incomplete or not a " + family.name + " model",
            )
    # every decoder layer against config.json, from the headers: a header that lies about a shape (or a
    # layer of another size) otherwise passes here and fails inside transformers' from_pretrained
    _check_layer_shapes(target, shapes, layer, sym, shipped, method, where)
    if not target.tie_word_embeddings and "lm_head.weight" not in shapes:
        raise UserError(
            where, "lm_head.weight missing and tie_word_embeddings is false", 'the checkpoint is incomplete (a tied model says "tie_word_embeddings": true)'
        )
    tied = " (lm_head tied to the embedding)" if target.tie_word_embeddings else ""
    own = [n for n in layer if n not in family_named("llama").layer_tensors]
    extra = f"; {family.name}: {', '.join(own)}" if own else ""
    moe = f"; {experts} experts" + (f" in {method}" if method else "") if experts else ""
    rep.ok("target_weights", f"{len(shapes)} tensors readable, {target.num_hidden_layers} layers present{tied}{extra}{moe}")


def _check_embedding_and_depth(target: TargetInfo, shapes: dict, where: Path, hf_class: str) -> str:
    """The embedding's shape and the last layer's q_proj against config.json; returns the last layer's prefix."""
    emb = shapes.get("model.embed_tokens.weight")
    if emb is None:
        raise UserError(where, "no model.embed_tokens.weight in the weight files", f"is this a Hugging Face {hf_class} checkpoint?")
    if tuple(emb[0]) != (target.vocab_size, target.hidden_size):
        raise UserError(
            f"{where}:model.embed_tokens.weight",
            f"shape {tuple(emb[0])}, config says ({target.vocab_size}, {target.hidden_size})",
            "config.json and weights come from different models",
        )
    prefix = f"model.layers.{target.num_hidden_layers - 1}."
    last = f"{prefix}self_attn.q_proj.weight"
    if last not in shapes:
        raise UserError(where, f"{last} missing: fewer layers than num_hidden_layers={target.num_hidden_layers}", "the checkpoint is incomplete")
    # q_proj writes heads x head_dim, which need not be hidden_size (Qwen3-32B: 64 x 128 = 8192 over a
    # hidden size of 5120); a config whose head_dim is wrong loads only to fail in the first forward
    q_rows = target.num_attention_heads * target.head_dim
    if shapes[last][0][0] != q_rows:
        raise UserError(
            f"{where}:{last}",
            f"{shapes[last][0][0]} output rows, config says num_attention_heads x head_dim = {target.num_attention_heads} x {target.head_dim} = {q_rows}",
            "config.json (its head_dim) and the weights disagree",
        )
    return prefix


def _check_layer_shapes(target: TargetInfo, shapes: dict, layer: dict, sym: dict, shipped: set, method: str | None, where: Path) -> None:
    want = {f"model.layers.{i}.{n}": resolve_shape(shp, sym) for i in range(target.num_hidden_layers) for n, shp in layer.items()}
    want["model.norm.weight"] = (target.hidden_size,)
    if "lm_head.weight" in shapes:
        want["lm_head.weight"] = (target.vocab_size, target.hidden_size)
    for name, shape in want.items():
        got = shapes.get(name)
        if got is None:
            raise UserError(where, f"{name} missing", "the checkpoint is incomplete")
        if tuple(got[0]) != shape:
            raise UserError(
                f"{where}:{name}",
                f"shape {tuple(got[0])}, config.json implies {shape}",
                "config.json and the weights disagree (or the safetensors header is corrupt)",
            )
        if got[1] != "uint8" and any(name.endswith("." + n) for n in shipped):
            raise UserError(
                f"{where}:{name}", f"dtype {got[1]}, {method} ships uint8 codes and exponents", "the checkpoint is not the format its quantization_config names"
            )


def _check_shipped_layout(target: TargetInfo, family, shapes: dict, method: str | None, where: Path) -> None:
    """The tensors and quantization_config must tell the same story: experts shipped in a native format
    (gpt-oss MXFP4 blocks/scales) with a config naming another, or none, and a config naming that format
    over dense experts, are each refused by the config field at fault, not as a missing tensor of layer N."""
    cfg_field = f"{where / 'config.json'}:quantization_config"
    found = {m for m, swaps in family.native_layer_tensors.items() for swap in swaps.values() for n in swap if any(k.endswith("." + n) for k in shapes)}
    for m in found - {method}:
        said = f"quant_method {method!r}" if method else "no quantization_config"
        raise UserError(
            f"{cfg_field}.quant_method" if method else cfg_field,
            f"the weights ship the experts in {m} "
            f"({'/'.join(sorted({n.rsplit('_', 1)[1] for swap in family.native_layer_tensors[m].values() for n in swap}))}) "
            f"but config.json has {said}",
            f'the checkpoint as shipped says "quantization_config": {{"quant_method": "{m}", ...}}',
        )
    if method in family.native_layer_tensors and method not in found:
        dense = next(iter(family.native_layer_tensors[method]))
        raise UserError(
            f"{cfg_field}.quant_method",
            f"{method!r}, but the weights hold dense experts ({dense}), no {method} blocks",
            "a BF16 checkpoint has no quantization_config: remove it, or use the checkpoint as shipped",
        )
    if method in family.native_layer_tensors:
        for field, width in (("hidden_size", target.hidden_size), ("intermediate_size", target.intermediate_size)):
            if width % MX_BLOCK:
                raise UserError(
                    f"{where / 'config.json'}:{field}",
                    f"{width} is not a multiple of the {method} block ({MX_BLOCK})",
                    f"{method} stores {MX_BLOCK} weights per exponent: such a checkpoint cannot hold this config's experts",
                )


def check_target_family(target: TargetInfo, rep: ValidationReport) -> None:
    """The target's family (formats/families.py) and what it implies, reported; flags the family's
    TensorRT-LLM model does not implement are refused (config only: the dry run runs this too)."""
    fam = target.family_spec
    cfg_file = Path(target.path) / "config.json"
    raw = read_json(cfg_file)
    for flag, why in fam.unsupported_flags.items():
        if raw.get(flag):
            raise UserError(f"{cfg_file}:{flag}", f"{raw[flag]!r}: {why}", f"a {fam.name} target is served with {flag} off; set it to false")
    quirks = [
        f"head_dim {target.head_dim}"
        + (
            ""
            if target.head_dim * target.num_attention_heads == target.hidden_size
            else f" (heads x head_dim = {target.head_dim * target.num_attention_heads} != hidden {target.hidden_size})"
        )
    ]
    if fam.qk_norm:
        quirks.append("per-head q/k RMSNorm")
    quirks.append("lm_head tied to the embedding" if target.tie_word_embeddings else "own lm_head")
    quirks.append(f"rope theta {target.rope_theta:g}")
    # the rotary dim and scaling as the family's TensorRT-LLM model reads them: what it cannot serve as the
    # checkpoint was trained (gpt-oss partial rotary, Qwen3 keys its fused kernel ignores) is refused here,
    # which validate and the dry run both run
    rp = rope_params.from_raw_config(raw, str(cfg_file), fam)
    if rp.partial:
        quirks.append(f"rotary dim {rp.dim} of head_dim {rp.head_dim}")
    quirks.append(f"TensorRT-LLM default aux layers {list(target.default_aux_layers())}")
    rep.ok("target_family", f"{fam.name} ({target.architectures[0]}; {fam.trtllm_source}): {', '.join(quirks)}")


def check_target_context(target: TargetInfo, max_seq_len: int, rep: ValidationReport) -> None:
    """A target trained on fewer positions than the bundle would serve: a build refuses that length
    (pipeline/plan_checks.py), so `validate` says so before anyone starts one."""
    if target.max_position_embeddings < max_seq_len:
        rep.warn(
            f"target max_position_embeddings {target.max_position_embeddings} < max_seq_len {max_seq_len} "
            f"({Path(target.path) / 'config.json'}): `eagle3-trt engine` refuses this length; build with --max-seq-len {target.max_position_embeddings} or less"
        )
