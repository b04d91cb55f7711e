"""Checks of the draft head against the target: tensor shapes, aux layers, vocabulary map, rope and dtypes."""

from __future__ import annotations

from pathlib import Path

from eagle3_trt.convert.draft_format import DraftCheckpoint, head_hooks
from eagle3_trt.convert.target import SUPPORTED_DTYPES, TargetInfo
from eagle3_trt.convert.validate_report import ValidationReport
from eagle3_trt.errors import UserError
from eagle3_trt.formats import rope_params
from eagle3_trt.formats.checkpoint_io import read_json, read_tensor
from eagle3_trt.formats.draft_config import DraftConfig, expected_shapes
from eagle3_trt.formats.draft_producers import window_refusal
from eagle3_trt.formats.families import quant_refusal

FLOAT_DTYPES = ("bfloat16", "float16", "float32")


def check_shapes(target: TargetInfo, draft: DraftCheckpoint, rep: ValidationReport) -> None:
    c = draft.config
    _check_widths(target, draft)
    want = expected_shapes(c)
    _check_head_tensors(target, draft)
    _check_shared_embedding(target, draft)
    _warn_unread(draft, rep)
    for name, shape in want.items():
        t = draft.tensors.get(name)
        if t is None:
            raise UserError(draft.path, f"tensor {name} missing", f"a {c.source_format} EAGLE-3 head has it; the checkpoint is incomplete")
        if tuple(t.shape) != shape:
            raise UserError(f"{draft.path}:{name}", f"shape {tuple(t.shape)}, expected {shape} from config.json", "config.json and weights disagree")
    known = set(want) | set(_OPTIONAL_ALLOWED)
    extra = sorted(set(draft.tensors) - known)
    if extra:
        rep.warn(f"draft tensors TensorRT-LLM does not load (not shipped): {', '.join(extra[:5])}{' …' if len(extra) > 5 else ''}")
    variants = [k for k in ("return_hidden_post_norm", "norm_before_fc", "fc_norm", "eh_proj_before_attn", "fc_bias") if getattr(c, k)]
    rep.ok(
        "shapes",
        f"draft hidden {c.hidden_size}, target hidden {target.hidden_size}, {len(want)} tensors match the EAGLE-3 schema"
        + (f"; variants: {', '.join(variants)}" if variants else ""),
    )


def _check_widths(target: TargetInfo, draft: DraftCheckpoint) -> None:
    """The draft's widths against the target's hidden size: what fc fuses and what the draft embeds."""
    c = draft.config
    cfg_file = draft.path / "config.json"
    if c.target_hidden_size != target.hidden_size:
        raise UserError(
            f"{cfg_file}:target_hidden_size",
            f"{c.target_hidden_size} but the target's hidden_size is {target.hidden_size}",
            "this head was trained for a different target model",
        )
    if c.hidden_size != target.hidden_size and "embed_tokens.weight" not in draft.tensors:
        raise UserError(
            f"{cfg_file}:hidden_size",
            f"draft hidden {c.hidden_size} differs from target hidden {target.hidden_size} and the draft has no embed_tokens",
            "such a head must ship its own embed_tokens.weight",
        )
    if "fc.weight" not in draft.tensors:
        raise UserError(draft.path, "tensor fc.weight missing", "an EAGLE-3 head fuses the target's aux hidden states through fc")
    if draft.tensors["fc.weight"].shape[1] % target.hidden_size:
        raise UserError(
            f"{draft.path}:fc.weight",
            f"in_features {draft.tensors['fc.weight'].shape[1]} is not a multiple of the target hidden size {target.hidden_size}",
            "this head was trained for a different target model",
        )


def _check_head_tensors(target: TargetInfo, draft: DraftCheckpoint) -> None:
    """lm_head and fc as TensorRT-LLM creates them, refused here rather than met later as a traceback."""
    c = draft.config
    qk = sorted(n for n in draft.tensors if n.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight")))
    if qk:
        # the head was trained with per-head q/k RMSNorm (Qwen3-style layers); serving it without them is another function
        raise UserError(
            f"{draft.path}:{qk[0]}",
            "a Qwen3-style draft layer (q_norm/k_norm): TensorRT-LLM's Eagle3Attention applies no q/k norm",
            "retrain the head with Llama-style draft layers (speculators: --draft-arch llama)",
        )
    if "lm_head.weight" not in draft.tensors:
        if c.draft_vocab_size != target.vocab_size:
            raise UserError(
                f"{draft.path}:lm_head.weight",
                "missing while draft_vocab_size differs from the target vocab",
                "the head must ship its own lm_head for a reduced draft vocabulary",
            )
        # TensorRT-LLM would borrow the target's lm_head; the reference runtime, the draft quantizer and
        # the exporter work on the head alone, so refuse here rather than fail later with a traceback
        raise UserError(
            f"{draft.path}:lm_head.weight",
            "missing (TensorRT-LLM would borrow the target's; eagle3-trt measures and exports the head alone)",
            "copy the target's lm_head.weight into the draft checkpoint",
        )
    n_aux = c.num_aux_layers
    if c.fuse_width == c.hidden_size:
        # tensorrt_llm/_torch/models/modeling_speculative.py@00679c66 Eagle3ForCausalLM.apply_eagle3_fc runs fc only
        # when hidden_states.shape[-1] != hidden_size; every producer trains fc over the aux states, one layer included (speculators allows one target layer)
        hooks = head_hooks(draft)
        raise UserError(
            f"{draft.path}:fc.weight",
            f"fuses one aux layer of width {c.target_hidden_size} = hidden_size, and the head was trained with fc applied; "
            + (
                hooks.single_aux_fc
                if hooks is not None
                else "TensorRT-LLM would skip fc (Eagle3ForCausalLM.apply_eagle3_fc applies it only when the aux width differs from hidden_size) "
                "and serve another function"
            ),
            "train the head on two or more aux layers (the default three)",
        )
    if n_aux == 1 and c.target_hidden_size != c.hidden_size:
        # Eagle3DraftModel creates fc only for num_capture_layers > 1 (modeling_speculative.py @ 00679c66)
        raise UserError(
            f"{draft.path}:fc.weight",
            "fuses one aux layer of a different width: TensorRT-LLM creates no fc for a single captured layer",
            "train the head with two or more aux layers",
        )


def _warn_unread(draft: DraftCheckpoint, rep: ValidationReport) -> None:
    """Tensors and config fields of the draft that TensorRT-LLM does not read: served (and measured) without them."""
    c = draft.config
    if "fc.bias" in draft.tensors and not c.fc_bias:
        rep.warn('fc.bias is ignored: TensorRT-LLM gives fc a bias only when config.json says "bias": true (measured without it)')
    w_in = draft.tensors.get("midlayer.input_layernorm.weight", draft.tensors.get("midlayer.0.input_layernorm.weight"))
    if c.source_format == "modelopt" and w_in is not None and bool((w_in.float() != 1).any()):
        # formats/draft_producers.py: ModelOpt's HF plugin normalises the hidden branch twice; its Megatron
        # trainer's exports look the same, so this is said, not refused
        rep.warn(
            "ModelOpt layout with a trained input_layernorm: ModelOpt's HF EAGLE-3 trainer computes hidden_norm(input_layernorm(h)) "
            "on the hidden branch, TensorRT-LLM (and this measurement) hidden_norm(h); a head trained there is served as another function"
        )
    if "embed_tokens.weight" in draft.tensors and not c.own_embedding:
        rep.warn("the draft's embed_tokens.weight (equal to the target's) is not shipped: TensorRT-LLM shares the target's embedding")


def _check_shared_embedding(target: TargetInfo, draft: DraftCheckpoint) -> None:
    """A shipped embed_tokens where TensorRT-LLM shares the target's (target_hidden_size == hidden_size:
    modeling_speculative.py@00679c66 Eagle3DraftModel sets embed_tokens None, load_weights_from_target_model
    takes the target's): served with the target's table, so one that differs was trained as another function."""
    import torch  # ~2 s to import; the config-only checks (dry run, planner) run without it

    mine = draft.tensors.get("embed_tokens.weight")
    if mine is None or draft.config.own_embedding:
        return
    theirs = read_tensor(Path(target.path), "model.embed_tokens.weight")
    if theirs is None:
        return  # check_target_weights names a target without one
    where = f"{draft.path}:embed_tokens.weight"
    served = "TensorRT-LLM would serve the head with the target's model.embed_tokens.weight (it shares the target's when target_hidden_size == hidden_size)"
    hint = "retrain the head with the target's embedding frozen (the producers' default), or drop the tensor if it was trained that way"
    if tuple(mine.shape) != tuple(theirs.shape):
        raise UserError(where, f"shape {tuple(mine.shape)}, the target's embedding is {tuple(theirs.shape)}: {served}", hint)
    # compared at the coarser of the two dtypes: a head saved in BF16 from an FP32 target holds the same table
    coarse = min((mine.dtype, theirs.dtype), key=lambda d: torch.finfo(d).bits if d.is_floating_point else 64)
    diff = mine.to(coarse).float() != theirs.to(coarse).float()
    if bool(diff.any()):
        rows = int(diff.any(dim=-1).sum())
        err = float((mine.float() - theirs.float()).abs().max())
        raise UserError(where, f"differs from the target's in {rows} of {mine.shape[0]} rows (max abs difference {err:.3g}): {served}", hint)


_OPTIONAL_ALLOWED = ("d2t", "t2d", "embed_tokens.weight", "fc.bias")  # warned about above when not loaded


def check_aux_layers(target: TargetInfo, draft: DraftCheckpoint, rep: ValidationReport) -> None:
    L = target.num_hidden_layers
    n_aux = draft.config.num_aux_layers
    ids = draft.config.aux_layer_ids
    where = f"{draft.path / 'config.json'}:eagle_aux_hidden_state_layer_ids"
    if ids is None:
        ids = target.default_aux_layers()
        where = f"target {target.path} num_hidden_layers={L}"
        rep.aux_layers_are_default = True
        if len(set(ids)) != len(ids):
            raise UserError(
                where,
                f"default aux layers {list(ids)} are not distinct",
                "TensorRT-LLM's default {1, L/2-1, L-4} is distinct only for L >= 7; for a shallower target list the layers "
                "the head was trained on in the draft config.json's eagle_config.eagle_aux_hidden_state_layer_ids",
            )
        warning = aux_default_warning(draft.config, ids)
        if warning:
            rep.warn(warning)
    else:
        rep.aux_layers_are_default = tuple(sorted(ids)) == tuple(sorted(target.default_aux_layers()))
    c = draft.config

    # the file's own values in messages (speculators numbers inputs of layers: 1..L), TensorRT-LLM's beside them
    def shown(xs: list[int] | tuple[int, ...]) -> str:
        return c.aux_ids_in_file(xs) if c.aux_layer_ids is not None else str(list(xs))  # the defaults are TensorRT-LLM's own

    bad = [i for i in ids if not 0 <= i < L]
    if bad:
        off = c.aux_id_offset if c.aux_layer_ids is not None else 0
        lo, hi = off, L - 1 + off
        raise UserError(
            where,
            f"aux layer ids {shown(bad)} outside the target's {L} layers (ids {lo}..{hi} in this file's numbering)",
            "the head was trained for a deeper/shallower target",
        )
    if len(set(ids)) != len(ids):
        raise UserError(where, f"aux layer ids {shown(list(ids))} are not distinct", "each captured layer must be different")
    if len(ids) != n_aux:
        raise UserError(where, f"{len(ids)} aux layers {shown(list(ids))} but fc.weight fuses {n_aux} target hidden states", "config and weights disagree")
    rep.aux_layer_ids = tuple(ids)
    listed = draft.config.aux_layer_ids_as_listed
    rep.ok(
        "aux_layers",
        f"captures outputs of target layers {list(ids)} of {L}"
        + (" (TensorRT-LLM default)" if rep.aux_layers_are_default else " (explicit: written to eagle3_layers_to_capture)")
        + (
            f"; listed as {list(listed)}, but every producer and TensorRT-LLM concatenate them in ascending layer order, so fc's blocks are read in that order"
            if listed
            else ""
        ),
    )


def check_vocab_map(target: TargetInfo, draft: DraftCheckpoint, rep: ValidationReport) -> None:
    import torch  # ~2 s to import; the config-only checks (dry run, planner) run without it

    c = draft.config
    where = f"{draft.path}:d2t"
    if c.draft_vocab_size > target.vocab_size:
        raise UserError(
            f"{draft.path / 'config.json'}:draft_vocab_size",
            f"{c.draft_vocab_size} exceeds the target vocab {target.vocab_size}",
            "the head belongs to another target",
        )
    d2t = draft.tensors.get("d2t")
    if c.draft_vocab_size == target.vocab_size:
        if d2t is not None and bool(torch.any(d2t != 0)):
            rep.warn("d2t present with a full draft vocabulary: TensorRT-LLM ignores it (creates d2t only for reduced vocabularies)")
        rep.ok("vocab_map", f"full draft vocabulary ({c.draft_vocab_size}); no d2t needed")
        return
    if d2t is None:
        raise UserError(
            where,
            f"missing, but draft_vocab_size {c.draft_vocab_size} < vocab_size {target.vocab_size}",
            "ship the draft-to-target map d2t (int, shape [draft_vocab_size]) with the head",
        )
    if d2t.dtype.is_floating_point or d2t.dtype == torch.bool:
        raise UserError(where, f"dtype {d2t.dtype}, expected an integer tensor", "d2t holds offsets: target_id = draft_id + d2t[draft_id]")
    if tuple(d2t.shape) != (c.draft_vocab_size,):
        raise UserError(where, f"shape {tuple(d2t.shape)}, expected ({c.draft_vocab_size},)", "d2t has one offset per draft token")
    tids = torch.arange(c.draft_vocab_size, dtype=torch.int64) + d2t.to(torch.int64)
    lo, hi = int(tids.min()), int(tids.max())
    if lo < 0 or hi >= target.vocab_size:
        raise UserError(
            where,
            f"maps draft ids to target ids in [{lo}, {hi}], outside 0..{target.vocab_size - 1}",
            "d2t stores offsets (target_id - draft_id), not absolute ids",
        )
    if torch.unique(tids).numel() != tids.numel():
        dup = tids.numel() - torch.unique(tids).numel()
        raise UserError(where, f"not injective: {dup} draft tokens map to an already-used target id", "rebuild d2t from the draft vocabulary")
    t2d = draft.tensors.get("t2d")
    if t2d is not None and (
        tuple(t2d.shape) != (target.vocab_size,) or int(t2d.to(torch.int64).sum()) != c.draft_vocab_size or not bool(t2d.to(torch.bool)[tids].all())
    ):
        raise UserError(
            f"{draft.path}:t2d", "disagrees with d2t (t2d must mark exactly the target ids d2t maps to)", "rebuild both maps from one draft vocabulary"
        )
    rep.ok("vocab_map", f"d2t maps {c.draft_vocab_size} draft ids injectively into target ids [{lo}, {hi}]")


def check_rope(target: TargetInfo, draft: DraftCheckpoint, max_seq_len: int, rep: ValidationReport) -> None:
    """Rope types as TensorRT-LLM reads them (formats/rope_params.py); what the reference runtime cannot
    compute the way TensorRT-LLM serves it is refused here, in one line, not met later as a traceback."""
    c = draft.config
    tfile, dfile = Path(target.path) / "config.json", draft.path / "config.json"
    # the raw config, so the top-level keys TensorRT-LLM reads (original_max_position_embeddings first,
    # max_seq_len, the rotary dim's) count, with the family's rotary-dim rule
    traw = read_json(tfile)
    tp = rope_params.from_raw_config(traw, str(tfile), target.family_spec)
    dp = c.rope(str(dfile))
    rope_params.check_supported(tp, str(tfile), max_seq_len)
    # the draft's table is raised to max_seq_len at export where that keeps its function (draft_format.for_max_seq_len)
    rope_params.check_supported(dp, str(dfile), max_seq_len)
    # TargetInfo.rope_scaling carries the value TensorRT-LLM takes (a top-level one written in: read_target)
    if tp.kind == "llama3" and not (target.rope_scaling or {}).get("original_max_position_embeddings"):
        raise UserError(
            f"{tfile}:rope_scaling",
            "llama3 rope without original_max_position_embeddings (top level or in rope_scaling)",
            "TensorRT-LLM assumes 1024, transformers max_position_embeddings; write the model's value (8192 for Llama 3.1)",
        )
    if tp.partial:
        # transformers' Llama/Qwen3 classes rotate the whole head whatever these keys say (5.x), so a head
        # trained against transformers' target saw another function than the one TensorRT-LLM serves
        rep.warn(
            f"target rotates the first {tp.dim} of {tp.head_dim} channels of each head, as TensorRT-LLM's {target.family_spec.name} "
            f"reads its config (and as measured); transformers' {target.family_spec.hf_class} does not implement partial rotary"
        )
    if c.head_dim != target.head_dim:
        rep.warn(f"draft head_dim {c.head_dim} differs from the target's {target.head_dim} (allowed: the draft has its own attention)")
    if not rope_params.same_function(tp, dp):
        rep.warn(
            f"draft rope ({rope_params.describe(dp)}) differs from the target's ({rope_params.describe(tp)}); "
            "TensorRT-LLM runs the draft with its own rope, and so does the measurement"
        )
    check_window(c, max_seq_len, dfile, rep)
    warning = max_position_warning(c, max_seq_len)
    if warning:
        rep.warn(warning)
    rep.ok("rope", f"draft {rope_params.describe(dp)}; target {rope_params.describe(tp)}")


def check_dtypes(target: TargetInfo, draft: DraftCheckpoint, rep: ValidationReport, quant: str | None = None) -> None:
    """A shipped-quantized target against ``quant`` (None: plain ``validate``) by the planner's policy
    (formats/families.py ``quant_refusal``); a ModelOpt export (hf_quant_config.json) counts as quantized."""
    if target.quantized:
        cfg_file = Path(target.path) / "config.json"
        method = target.quant_method
        where = f"{cfg_file}:quantization_config.quant_method" if method else Path(target.path) / "hf_quant_config.json"
        refused = quant_refusal(target.family_spec, method or "hf_quant_config", quant)
        if refused:
            raise UserError(where, *refused)
        rep.ok("target_format", f"{method} as shipped: built with --quant native (TensorRT-LLM loads it as is)")
    if target.torch_dtype is not None and target.torch_dtype not in SUPPORTED_DTYPES:
        raise UserError(f"{Path(target.path) / 'config.json'}:torch_dtype", f"{target.torch_dtype} not supported", f"use one of {', '.join(SUPPORTED_DTYPES)}")
    for name, t in draft.tensors.items():
        if name in ("d2t", "t2d"):
            continue
        dt = str(t.dtype).replace("torch.", "")
        if dt not in FLOAT_DTYPES:
            raise UserError(
                f"{draft.path}:{name}",
                f"dtype {dt} not supported for a draft weight",
                f"ship the head in {', '.join(FLOAT_DTYPES)}; eagle3-trt quantizes it with --quantize-draft",
            )
    rep.ok(
        "dtypes",
        f"target {target.torch_dtype}, draft {sorted({str(t.dtype).replace('torch.', '') for n, t in draft.tensors.items() if n not in ('d2t', 't2d')})}",
    )


def aux_default_warning(c: DraftConfig, ids: tuple[int, ...] | list[int]) -> str | None:
    """What validate and a dry run say about a head that leaves its aux layers to the serving engine:
    vLLM and TensorRT-LLM both fall back to the target's default layers (formats/draft_producers.py)."""
    if not c.aux_layer_ids_missing:
        return None
    return (
        f"{c.aux_layer_ids_missing}: served on the default layers {list(ids)}, as vLLM and TensorRT-LLM do; if the head was trained on others, list them there"
    )


def check_window(c: DraftConfig, max_seq_len: int, cfg_file: Path, rep: ValidationReport) -> None:
    """A speculators sliding window (validate and a dry run alike): served with full attention where every
    context fits in it (the same function), refused where it does not (formats/draft_producers.py)."""
    refused = window_refusal(c.sliding_window, max_seq_len, cfg_file)
    if refused is not None:
        raise refused
    if c.sliding_window is not None:
        rep.warn(
            f"draft trained with a {c.sliding_window}-token sliding window: served with full attention, the same function for max_seq_len {max_seq_len} <= {c.sliding_window}"
        )


def max_position_warning(c: DraftConfig, max_seq_len: int) -> str | None:
    """What a build (or a dry run: the same words) says about a draft table shorter than max_seq_len."""
    if c.max_position_embeddings >= max_seq_len:
        return None
    if c.rope().kind in rope_params.MAX_POS_INDEPENDENT:
        return f"draft max_position_embeddings {c.max_position_embeddings} < max_seq_len {max_seq_len}: the bundle's draft config is raised to {max_seq_len} (same rotary function)"
    return f"draft max_position_embeddings {c.max_position_embeddings} < max_seq_len {max_seq_len}: acceptance drops on longer contexts"
