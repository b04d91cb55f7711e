"""Pre-flight checks that a target and an EAGLE-3 draft belong together.

Each check either passes (recorded with a short detail for the report) or raises a
UserError naming the file/field, what is wrong, and a hint. Warnings are recorded, never
silently dropped. The traps caught here all show up later only as a low acceptance rate.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from eagle3_trt.convert.draft_format import DraftCheckpoint
from eagle3_trt.convert.target import SUPPORTED_DTYPES, TargetInfo
from eagle3_trt.errors import UserError
from eagle3_trt.formats import rope_params
from eagle3_trt.formats.checkpoint_io import read_json, tensor_shapes
from eagle3_trt.formats.draft_config import expected_shapes
from eagle3_trt.formats.families import ATTENTION, MX_BLOCK, family_named, layer_shape_symbols, quant_refusal, resolve_shape
from eagle3_trt.formats.generation import eos_ids_of
from eagle3_trt.formats.hf_config import GenerationConfigIds, parse_config

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model")
FLOAT_DTYPES = ("bfloat16", "float16", "float32")


@dataclass
class ValidationReport:
    checks: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    aux_layer_ids: tuple[int, ...] = ()
    aux_layers_are_default: bool = True

    def ok(self, name: str, detail: str) -> None:
        self.checks.append({"check": name, "ok": True, "detail": detail})

    def warn(self, msg: str) -> None:
        self.warnings.append(msg)

    def to_dict(self) -> dict:
        return {
            "checks": self.checks,
            "warnings": self.warnings,
            "aux_layer_ids": list(self.aux_layer_ids),
            "aux_layers_are_default": self.aux_layers_are_default,
        }


def tokenizer_fingerprint(path: Path) -> dict | None:
    """Vocabulary hash and special tokens of a HF tokenizer.json, or None if the dir has none."""
    tj = Path(path) / "tokenizer.json"
    if not tj.is_file():
        return None
    try:
        data = json.loads(tj.read_text())
        vocab = data["model"]["vocab"]
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise UserError(tj, f"not a readable Hugging Face tokenizer ({type(e).__name__}: {e})", "re-download the tokenizer files") from None
    added = {t["content"]: t["id"] for t in data.get("added_tokens", [])}
    merges = data["model"].get("merges")
    h = hashlib.sha256(json.dumps(vocab, sort_keys=True).encode())
    if merges is not None:
        h.update(json.dumps(merges).encode())
    specials = {}
    tc = Path(path) / "tokenizer_config.json"
    if tc.is_file():
        cfg = json.loads(tc.read_text())
        for k in ("bos_token", "eos_token", "pad_token"):
            v = cfg.get(k)
            specials[k] = v.get("content") if isinstance(v, dict) else v
    return {
        "vocab_sha256": h.hexdigest(),
        "size": len(vocab) + len([a for a in added.values() if a >= len(vocab)]),
        "added_tokens": added,
        "specials": specials,
    }


SPECIAL_ROLES = ("bos", "eos", "pad")
_SWAPPED_HINT = "the tokenizer files and the config come from different models or revisions; copy all of them from the model repository"


def _token_ids(tj: Path) -> dict[str, int]:
    """token -> id of a tokenizer.json: the model's vocabulary (a dict for BPE/WordPiece, a list of
    [piece, score] for Unigram) with the added tokens over it, as ``tokenizers`` resolves them."""
    try:
        data = json.loads(tj.read_text())
        vocab = data["model"]["vocab"]
        ids = dict(vocab) if isinstance(vocab, dict) else {row[0]: i for i, row in enumerate(vocab)}
        ids.update({t["content"]: t["id"] for t in data.get("added_tokens") or []})
    except (json.JSONDecodeError, KeyError, TypeError, IndexError, UnicodeDecodeError) as e:
        raise UserError(tj, f"not a readable Hugging Face tokenizer ({type(e).__name__}: {e})", "re-download the tokenizer files") from None
    bad = next((t for t, i in ids.items() if not isinstance(i, int) or isinstance(i, bool) or i < 0), None)
    if bad is not None:
        raise UserError(tj, f"token {bad!r} has id {ids[bad]!r}, not a non-negative integer", "re-download the tokenizer files")
    return ids


def _special_tokens(tdir: Path) -> dict[str, tuple[str, Path]]:
    """role -> (token text, file naming it) from tokenizer_config.json and special_tokens_map.json.

    transformers reads both; which one wins differs between its releases, so two files that name
    different tokens for one role are refused rather than resolved one way here and another at
    serving time."""
    out: dict[str, tuple[str, Path]] = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        f = tdir / name
        if not f.is_file():
            continue
        try:
            cfg = json.loads(f.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UserError(f, f"not valid JSON ({e})".splitlines()[0], "re-download the tokenizer files") from None
        if not isinstance(cfg, dict):
            raise UserError(f, "expected a JSON object", "re-download the tokenizer files")
        for role in SPECIAL_ROLES:
            v = cfg.get(f"{role}_token")
            text = v.get("content") if isinstance(v, dict) else v
            if text is None:
                continue
            if not isinstance(text, str):
                raise UserError(f"{f}:{role}_token", f"must be a token string, got {text!r}", "re-download the tokenizer files")
            if role in out and out[role][0] != text:
                raise UserError(f"{f}:{role}_token", f"{text!r} but {out[role][1].name} says {out[role][0]!r}", _SWAPPED_HINT)
            out.setdefault(role, (text, f))
    return out


def check_target_tokenizer(target: TargetInfo, rep: ValidationReport) -> None:
    """The target's tokenizer against the target's own config.json and generation_config.json:
    every token id inside ``vocab_size``, and the bos/eos/pad tokens the tokenizer names are the
    ids the configs name. A swapped tokenizer (``<s>`` at id 595 while config.json says
    ``bos_token_id: 1``) loads and runs; it only produces wrong prompts and stop tokens."""
    tdir = Path(target.path)
    tj = tdir / "tokenizer.json"
    if not tj.is_file():
        raise UserError(tj, "target has no tokenizer.json", "the bundle ships the target's tokenizer; copy it from the model repository")
    ids = _token_ids(tj)
    n, top = len(set(ids.values())), max(ids.values(), default=-1)
    if n > target.vocab_size or top >= target.vocab_size:
        raise UserError(f"{tdir / 'config.json'}:vocab_size", f"{target.vocab_size}, but {tj.name} has {n} tokens with ids up to {top}", _SWAPPED_HINT)
    # what each config declares: (file, field) -> ids
    declared: dict[str, list[tuple[Path, set[int]]]] = {r: [] for r in SPECIAL_ROLES}
    cfg_file = tdir / "config.json"
    for role, v in (("bos", target.bos_token_id), ("eos", target.eos_token_ids), ("pad", target.pad_token_id)):
        vals = set(v) if isinstance(v, tuple) else ({v} if v is not None else set())
        if vals:
            declared[role].append((cfg_file, vals))
    gen_file = tdir / "generation_config.json"
    if gen_file.is_file():
        gen = parse_config(read_json(gen_file), gen_file, GenerationConfigIds)
        for role, vals in (("bos", {gen.bos_token_id} - {None}), ("eos", set(gen.eos_ids)), ("pad", {gen.pad_token_id} - {None})):
            if vals:
                declared[role].append((gen_file, vals))
    for role in SPECIAL_ROLES:
        for f, vals in declared[role]:
            out = sorted(i for i in vals if i >= target.vocab_size)
            if out:
                raise UserError(f"{f}:{role}_token_id", f"id {out[0]} is outside the vocabulary 0..{target.vocab_size - 1}", _SWAPPED_HINT)
    specials = _special_tokens(tdir)
    for role, (text, f) in specials.items():
        tid = ids.get(text)
        if tid is None:
            raise UserError(f"{f}:{role}_token", f"{text!r} is not a token of {tj.name}", _SWAPPED_HINT)
        for cf, vals in declared[role]:
            # eos: config.json and generation_config.json may list several stop ids (Llama 3: end of
            # text and end of turn); the tokenizer's eos must be one of them. bos/pad: one id each.
            if tid not in vals:
                want = sorted(vals) if len(vals) > 1 else next(iter(vals))
                raise UserError(f"{cf}:{role}_token_id", f"{want}, but the tokenizer's {role}_token {text!r} is id {tid} in {tj.name}", _SWAPPED_HINT)
    named = ", ".join(f"{r} {specials[r][0]!r}={ids[specials[r][0]]}" for r in SPECIAL_ROLES if r in specials)
    rep.ok("target_tokenizer", f"{n} tokens within vocab_size {target.vocab_size}; {named or 'no special tokens named'} agree with the configs")


def check_tokenizers(target: TargetInfo, draft: DraftCheckpoint, rep: ValidationReport) -> None:
    tdir = Path(target.path)
    tfp = tokenizer_fingerprint(tdir)
    if tfp is None:
        raise UserError(tdir / "tokenizer.json", "target has no tokenizer.json", "the bundle ships the target's tokenizer; copy it from the model repository")
    # its size against vocab_size: check_target_tokenizer, which runs first
    if draft.config.vocab_size != target.vocab_size:
        raise UserError(
            f"{draft.path / 'config.json'}:vocab_size",
            f"draft was trained for a vocabulary of {draft.config.vocab_size}, target has {target.vocab_size}",
            "this head belongs to another target model (tokenizer mismatch silently ruins acceptance)",
        )
    dfp = tokenizer_fingerprint(draft.path)
    if dfp is not None:
        if dfp["vocab_sha256"] != tfp["vocab_sha256"]:
            raise UserError(
                draft.path / "tokenizer.json",
                "draft tokenizer vocabulary differs from the target's",
                "train or download the head for this exact target tokenizer",
            )
        diff = {k: (tfp["added_tokens"].get(k), v) for k, v in dfp["added_tokens"].items() if tfp["added_tokens"].get(k) != v}
        if diff:
            name, (t_id, d_id) = next(iter(diff.items()))
            raise UserError(
                draft.path / "tokenizer.json",
                f"special token {name!r} is id {d_id} in the draft but {t_id} in the target",
                "the head was trained with another tokenizer revision",
            )
        if dfp["specials"] and tfp["specials"] and dfp["specials"] != tfp["specials"]:
            raise UserError(
                draft.path / "tokenizer_config.json",
                f"special tokens differ: draft {dfp['specials']} vs target {tfp['specials']}",
                "use the target's tokenizer files for both",
            )
        rep.ok("tokenizer", f"draft and target tokenizers identical ({tfp['size']} tokens)")
    else:
        rep.ok("tokenizer", f"draft ships no tokenizer; draft vocab_size matches the target's {target.vocab_size} tokens")
    if draft.config.source_format == "modelopt":
        # ModelOpt's exporter fills bos/eos from its own draft LlamaConfig (defaults 1 and 2) before the
        # base model's (modelopt/torch/export/plugins/hf_spec_export.py, _get_config_from_draft_or_base),
        # and TensorRT-LLM never reads a draft's bos/eos: not evidence of another tokenizer here.
        return
    d_eos = draft.raw_config.get("eos_token_id")
    d_eos_set = set(eos_ids_of(d_eos)) - {None}
    if d_eos_set and target.eos_token_ids and not d_eos_set & set(target.eos_token_ids):
        raise UserError(
            f"{draft.path / 'config.json'}:eos_token_id",
            f"{sorted(d_eos_set)} shares no id with the target's {list(target.eos_token_ids)}",
            "the head belongs to another tokenizer",
        )
    d_bos = draft.raw_config.get("bos_token_id")
    if d_bos is not None and target.bos_token_id is not None and d_bos != target.bos_token_id:
        raise UserError(
            f"{draft.path / 'config.json'}:bos_token_id", f"{d_bos} but the target's is {target.bos_token_id}", "the head belongs to another tokenizer"
        )


def check_shapes(target: TargetInfo, draft: DraftCheckpoint, rep: ValidationReport) -> None:
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
    want = expected_shapes(c)
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
    if n_aux == 1 and c.target_hidden_size != c.hidden_size:
        # Eagle3DraftModel creates fc only for num_capture_layers > 1 (modeling_speculative.py @ 00679c66)
        raise UserError(
            f"{draft.path}:fc.weight",
            "fuses one aux layer of a different width: TensorRT-LLM creates no fc for a single captured layer",
            "train the head with two or more aux layers",
        )
    if c.fuse_width == c.hidden_size:
        rep.warn("fc.weight is not applied: the concatenated aux width equals hidden_size, and TensorRT-LLM then feeds it to the layer unchanged")
    if "fc.bias" in draft.tensors and not c.fc_bias:
        rep.warn('fc.bias is ignored: TensorRT-LLM gives fc a bias only when config.json says "bias": true (measured without it)')
    if "embed_tokens.weight" in draft.tensors and not c.own_embedding:
        rep.warn(
            "the draft's embed_tokens.weight is ignored: with target_hidden_size == hidden_size TensorRT-LLM uses the target's embedding (measured with the target's)"
        )
    if c.extra.get("norm_before_residual"):
        rep.warn("norm_before_residual is not read by TensorRT-LLM: it serves (and eagle3-trt measures) the residual from the un-normed hidden state")
    if c.aux_layer_ids_as_trained is not None:
        rep.warn(
            f"aux layers listed as {list(c.aux_layer_ids_as_trained)}: TensorRT-LLM captures them in sorted order, so fc's input blocks are permuted to match (same function)"
        )
    for name, shape in want.items():
        t = draft.tensors.get(name)
        if t is None:
            raise UserError(draft.path, f"tensor {name} missing", f"a {c.source_format} EAGLE-3 head has it; the checkpoint is incomplete")
        if tuple(t.shape) != shape:
            raise UserError(f"{draft.path}:{name}", f"shape {tuple(t.shape)}, expected {shape} from config.json", "config.json and weights disagree")
    known = set(want) | set(_OPTIONAL_ALLOWED)
    extra = sorted(set(draft.tensors) - known)
    if extra:
        rep.warn(f"draft tensors ignored by TensorRT-LLM: {', '.join(extra[:5])}{' …' if len(extra) > 5 else ''}")
    variants = [k for k in ("return_hidden_post_norm", "norm_before_fc", "fc_norm", "eh_proj_before_attn", "fc_bias") if getattr(c, k)]
    rep.ok(
        "shapes",
        f"draft hidden {c.hidden_size}, target hidden {target.hidden_size}, {len(want)} tensors match the EAGLE-3 schema"
        + (f"; variants: {', '.join(variants)}" if variants else ""),
    )


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
    else:
        rep.aux_layers_are_default = tuple(sorted(ids)) == tuple(sorted(target.default_aux_layers()))
    bad = [i for i in ids if not 0 <= i < L]
    if bad:
        raise UserError(where, f"aux layer ids {bad} outside the target's layers 0..{L - 1}", "the head was trained for a deeper/shallower target")
    if len(set(ids)) != len(ids):
        raise UserError(where, f"aux layer ids {list(ids)} are not distinct", "each captured layer must be different")
    if len(ids) != n_aux:
        raise UserError(where, f"{len(ids)} aux layers but fc.weight fuses {n_aux} target hidden states", "config and weights disagree")
    rep.aux_layer_ids = tuple(ids)
    rep.ok(
        "aux_layers",
        f"captures outputs of target layers {list(ids)} of {L}"
        + (" (TensorRT-LLM default)" if rep.aux_layers_are_default else " (explicit: written to eagle3_layers_to_capture)"),
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
    tp = rope_params.from_config(target.rope_theta, target.rope_scaling, target.head_dim, target.max_position_embeddings, where=str(tfile))
    dp = rope_params.from_config(c.rope_theta, c.rope_scaling, c.head_dim, c.max_position_embeddings, where=str(dfile))
    rope_params.check_supported(tp, str(tfile), max_seq_len)
    # the draft's table is raised to max_seq_len at export where that keeps its function (draft_format.for_max_seq_len)
    rope_params.check_supported(dp, str(dfile), max_seq_len)
    if tp.kind == "llama3" and not (target.rope_scaling or {}).get("original_max_position_embeddings"):
        raise UserError(
            f"{tfile}:rope_scaling",
            "llama3 rope without original_max_position_embeddings",
            "TensorRT-LLM assumes 1024, transformers max_position_embeddings; write the model's value (8192 for Llama 3.1)",
        )
    if c.head_dim != target.head_dim:
        rep.warn(f"draft head_dim {c.head_dim} differs from the target's {target.head_dim} (allowed: the draft has its own attention)")
    if not rope_params.same_function(tp, dp):
        rep.warn(
            f"draft rope ({rope_params.describe(dp)}) differs from the target's ({rope_params.describe(tp)}); "
            "TensorRT-LLM runs the draft with its own rope, and so does the measurement"
        )
    if c.max_position_embeddings < max_seq_len:
        if dp.kind in rope_params.MAX_POS_INDEPENDENT:
            rep.warn(
                f"draft max_position_embeddings {c.max_position_embeddings} < max_seq_len {max_seq_len}: the bundle's draft config is raised to {max_seq_len} (same rotary function)"
            )
        else:
            rep.warn(f"draft max_position_embeddings {c.max_position_embeddings} < max_seq_len {max_seq_len}: acceptance drops on longer contexts")
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
    emb = shapes.get("model.embed_tokens.weight")
    if emb is None:
        raise UserError(where, "no model.embed_tokens.weight in the weight files", f"is this a Hugging Face {family.hf_class} checkpoint?")
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
    if not target.tie_word_embeddings and "lm_head.weight" not in shapes:
        raise UserError(
            where, "lm_head.weight missing and tie_word_embeddings is false", 'the checkpoint is incomplete (a tied model says "tie_word_embeddings": true)'
        )
    tied = " (lm_head tied to the embedding)" if target.tie_word_embeddings else ""
    own = [n for n in layer if n not in family_named("llama").layer_tensors]
    extra = f"; {family.name}: {', '.join(own)}" if own else ""
    moe = f"; {experts} experts" + (f" in {method}" if method else "") if experts else ""
    rep.ok("target_weights", f"{len(shapes)} tensors readable, {target.num_hidden_layers} layers present{tied}{extra}{moe}")


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
    quirks.append(f"TensorRT-LLM default aux layers {list(target.default_aux_layers())}")
    rep.ok("target_family", f"{fam.name} ({target.architectures[0]}; {fam.trtllm_source}): {', '.join(quirks)}")


def validate_pair(target: TargetInfo, draft: DraftCheckpoint, max_seq_len: int, quant: str | None = None) -> ValidationReport:
    rep = ValidationReport()
    check_target_family(target, rep)
    check_target_weights(target, rep)
    check_target_tokenizer(target, rep)
    check_dtypes(target, draft, rep, quant)
    check_tokenizers(target, draft, rep)
    check_shapes(target, draft, rep)
    check_aux_layers(target, draft, rep)
    check_vocab_map(target, draft, rep)
    check_rope(target, draft, max_seq_len, rep)
    return rep
