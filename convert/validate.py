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

from eagle3_trt.convert.checkpoint_io import tensor_shapes
from eagle3_trt.convert.draft_format import DraftCheckpoint, expected_shapes
from eagle3_trt.convert.target import SUPPORTED_DTYPES, TargetInfo
from eagle3_trt.errors import UserError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model")
KNOWN_ROPE_TYPES = ("llama3", "linear", "dynamic", "yarn", "longrope", "default")
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
        return {"checks": self.checks, "warnings": self.warnings, "aux_layer_ids": list(self.aux_layer_ids),
                "aux_layers_are_default": self.aux_layers_are_default}


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
    return {"vocab_sha256": h.hexdigest(), "size": len(vocab) + len([a for a in added.values() if a >= len(vocab)]),
            "added_tokens": added, "specials": specials}


def check_tokenizers(target: TargetInfo, draft: DraftCheckpoint, rep: ValidationReport) -> None:
    tdir = Path(target.path)
    tfp = tokenizer_fingerprint(tdir)
    if tfp is None:
        raise UserError(tdir / "tokenizer.json", "target has no tokenizer.json", "the bundle ships the target's tokenizer; copy it from the model repository")
    if tfp["size"] > target.vocab_size:
        raise UserError(tdir / "tokenizer.json", f"tokenizer has {tfp['size']} tokens but config vocab_size is {target.vocab_size}", "tokenizer and weights come from different models")
    if draft.config.vocab_size != target.vocab_size:
        raise UserError(
            f"{draft.path / 'config.json'}:vocab_size",
            f"draft was trained for a vocabulary of {draft.config.vocab_size}, target has {target.vocab_size}",
            "this head belongs to another target model (tokenizer mismatch silently ruins acceptance)",
        )
    dfp = tokenizer_fingerprint(draft.path)
    if dfp is not None:
        if dfp["vocab_sha256"] != tfp["vocab_sha256"]:
            raise UserError(draft.path / "tokenizer.json", "draft tokenizer vocabulary differs from the target's", "train or download the head for this exact target tokenizer")
        diff = {k: (tfp["added_tokens"].get(k), v) for k, v in dfp["added_tokens"].items() if tfp["added_tokens"].get(k) != v}
        if diff:
            name, (t_id, d_id) = next(iter(diff.items()))
            raise UserError(draft.path / "tokenizer.json", f"special token {name!r} is id {d_id} in the draft but {t_id} in the target", "the head was trained with another tokenizer revision")
        if dfp["specials"] and tfp["specials"] and dfp["specials"] != tfp["specials"]:
            raise UserError(draft.path / "tokenizer_config.json", f"special tokens differ: draft {dfp['specials']} vs target {tfp['specials']}", "use the target's tokenizer files for both")
        rep.ok("tokenizer", f"draft and target tokenizers identical ({tfp['size']} tokens)")
    else:
        rep.ok("tokenizer", f"draft ships no tokenizer; draft vocab_size matches the target's {target.vocab_size} tokens")
    d_eos = draft.raw_config.get("eos_token_id")
    d_eos_set = set(d_eos if isinstance(d_eos, list) else [d_eos]) - {None}
    if d_eos_set and target.eos_token_ids and not d_eos_set & set(target.eos_token_ids):
        raise UserError(f"{draft.path / 'config.json'}:eos_token_id", f"{sorted(d_eos_set)} shares no id with the target's {list(target.eos_token_ids)}", "the head belongs to another tokenizer")
    d_bos = draft.raw_config.get("bos_token_id")
    if d_bos is not None and target.bos_token_id is not None and d_bos != target.bos_token_id:
        raise UserError(f"{draft.path / 'config.json'}:bos_token_id", f"{d_bos} but the target's is {target.bos_token_id}", "the head belongs to another tokenizer")


def check_shapes(target: TargetInfo, draft: DraftCheckpoint, rep: ValidationReport) -> None:
    c = draft.config
    cfg_file = draft.path / "config.json"
    if c.target_hidden_size != target.hidden_size:
        raise UserError(f"{cfg_file}:target_hidden_size", f"{c.target_hidden_size} but the target's hidden_size is {target.hidden_size}", "this head was trained for a different target model")
    if c.hidden_size != target.hidden_size and "embed_tokens.weight" not in draft.tensors:
        raise UserError(f"{cfg_file}:hidden_size", f"draft hidden {c.hidden_size} differs from target hidden {target.hidden_size} and the draft has no embed_tokens", "such a head must ship its own embed_tokens.weight")
    if "fc.weight" not in draft.tensors:
        raise UserError(draft.path, "tensor fc.weight missing", "an EAGLE-3 head fuses the target's aux hidden states through fc")
    if draft.tensors["fc.weight"].shape[1] % target.hidden_size:
        raise UserError(f"{draft.path}:fc.weight", f"in_features {draft.tensors['fc.weight'].shape[1]} is not a multiple of the target hidden size {target.hidden_size}", "this head was trained for a different target model")
    want = expected_shapes(c)
    if "lm_head.weight" not in draft.tensors:
        if c.draft_vocab_size != target.vocab_size:
            raise UserError(f"{draft.path}:lm_head.weight", "missing while draft_vocab_size differs from the target vocab", "the head must ship its own lm_head for a reduced draft vocabulary")
        want.pop("lm_head.weight")
        rep.warn("draft has no lm_head; TensorRT-LLM will use the target's")
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
    rep.ok("shapes", f"draft hidden {c.hidden_size}, target hidden {target.hidden_size}, {len(want)} tensors match the EAGLE-3 schema")


_OPTIONAL_ALLOWED = ("d2t", "t2d", "embed_tokens.weight", "fc.bias")


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
            raise UserError(where, f"default aux layers {list(ids)} are not distinct", "EAGLE-3 needs a target with at least 6 decoder layers (TensorRT-LLM's default needs L > 5)")
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
    rep.ok("aux_layers", f"captures outputs of target layers {list(ids)} of {L}" + (" (TensorRT-LLM default)" if rep.aux_layers_are_default else " (explicit: written to eagle3_layers_to_capture)"))


def check_vocab_map(target: TargetInfo, draft: DraftCheckpoint, rep: ValidationReport) -> None:
    import torch  # ~2 s to import; the config-only checks (dry run, planner) run without it

    c = draft.config
    where = f"{draft.path}:d2t"
    if c.draft_vocab_size > target.vocab_size:
        raise UserError(f"{draft.path / 'config.json'}:draft_vocab_size", f"{c.draft_vocab_size} exceeds the target vocab {target.vocab_size}", "the head belongs to another target")
    d2t = draft.tensors.get("d2t")
    if c.draft_vocab_size == target.vocab_size:
        if d2t is not None and bool(torch.any(d2t != 0)):
            rep.warn("d2t present with a full draft vocabulary: TensorRT-LLM ignores it (creates d2t only for reduced vocabularies)")
        rep.ok("vocab_map", f"full draft vocabulary ({c.draft_vocab_size}); no d2t needed")
        return
    if d2t is None:
        raise UserError(where, f"missing, but draft_vocab_size {c.draft_vocab_size} < vocab_size {target.vocab_size}", "ship the draft-to-target map d2t (int, shape [draft_vocab_size]) with the head")
    if d2t.dtype.is_floating_point or d2t.dtype == torch.bool:
        raise UserError(where, f"dtype {d2t.dtype}, expected an integer tensor", "d2t holds offsets: target_id = draft_id + d2t[draft_id]")
    if tuple(d2t.shape) != (c.draft_vocab_size,):
        raise UserError(where, f"shape {tuple(d2t.shape)}, expected ({c.draft_vocab_size},)", "d2t has one offset per draft token")
    tids = torch.arange(c.draft_vocab_size, dtype=torch.int64) + d2t.to(torch.int64)
    lo, hi = int(tids.min()), int(tids.max())
    if lo < 0 or hi >= target.vocab_size:
        raise UserError(where, f"maps draft ids to target ids in [{lo}, {hi}], outside 0..{target.vocab_size - 1}", "d2t stores offsets (target_id - draft_id), not absolute ids")
    if torch.unique(tids).numel() != tids.numel():
        dup = tids.numel() - torch.unique(tids).numel()
        raise UserError(where, f"not injective: {dup} draft tokens map to an already-used target id", "rebuild d2t from the draft vocabulary")
    t2d = draft.tensors.get("t2d")
    if t2d is not None:
        if tuple(t2d.shape) != (target.vocab_size,) or int(t2d.to(torch.int64).sum()) != c.draft_vocab_size or not bool(t2d.to(torch.bool)[tids].all()):
            raise UserError(f"{draft.path}:t2d", "disagrees with d2t (t2d must mark exactly the target ids d2t maps to)", "rebuild both maps from one draft vocabulary")
    rep.ok("vocab_map", f"d2t maps {c.draft_vocab_size} draft ids injectively into target ids [{lo}, {hi}]")


def check_rope(target: TargetInfo, draft: DraftCheckpoint, max_seq_len: int, rep: ValidationReport) -> None:
    c = draft.config
    for who, scaling, file in (("target", target.rope_scaling, Path(target.path) / "config.json"), ("draft", c.rope_scaling, draft.path / "config.json")):
        if scaling is not None:
            kind = scaling.get("rope_type", scaling.get("type"))
            if kind not in KNOWN_ROPE_TYPES:
                raise UserError(f"{file}:rope_scaling", f"unknown rope type {kind!r}", f"supported: {', '.join(KNOWN_ROPE_TYPES)}")
    if c.head_dim % 2:
        raise UserError(f"{draft.path / 'config.json'}:head_dim", f"{c.head_dim} is odd", "rotary embeddings need an even head_dim")
    if c.rope_theta <= 0 or target.rope_theta <= 0:
        raise UserError(f"{draft.path / 'config.json'}:rope_theta", "must be positive", "fix the config")
    if c.head_dim != target.head_dim:
        rep.warn(f"draft head_dim {c.head_dim} differs from the target's {target.head_dim} (allowed: the draft has its own attention)")
    if c.rope_theta != target.rope_theta:
        rep.warn(f"draft rope_theta {c.rope_theta:g} differs from the target's {target.rope_theta:g}; TensorRT-LLM uses the draft's own (as it was trained)")
    if c.max_position_embeddings < max_seq_len:
        rep.warn(f"draft max_position_embeddings {c.max_position_embeddings} < max_seq_len {max_seq_len}: acceptance drops on longer contexts")
    rep.ok("rope", f"draft theta {c.rope_theta:g} scaling {((c.rope_scaling or {}).get('rope_type') or 'none')}; target theta {target.rope_theta:g} scaling {((target.rope_scaling or {}).get('rope_type') or 'none')}")


def check_dtypes(target: TargetInfo, draft: DraftCheckpoint, rep: ValidationReport) -> None:
    if target.quantized:
        raise UserError(Path(target.path) / "hf_quant_config.json", "target is already quantized", "pass the BF16/FP16 checkpoint; eagle3-trt quantizes it with ModelOpt")
    if target.torch_dtype is not None and target.torch_dtype not in SUPPORTED_DTYPES:
        raise UserError(f"{Path(target.path) / 'config.json'}:torch_dtype", f"{target.torch_dtype} not supported", f"use one of {', '.join(SUPPORTED_DTYPES)}")
    for name, t in draft.tensors.items():
        if name in ("d2t", "t2d"):
            continue
        dt = str(t.dtype).replace("torch.", "")
        if dt not in FLOAT_DTYPES:
            raise UserError(f"{draft.path}:{name}", f"dtype {dt} not supported for a draft weight", f"ship the head in {', '.join(FLOAT_DTYPES)}; eagle3-trt quantizes it with --quantize-draft")
    rep.ok("dtypes", f"target {target.torch_dtype}, draft {sorted({str(t.dtype).replace('torch.', '') for n, t in draft.tensors.items() if n not in ('d2t', 't2d')})}")


def check_target_weights(target: TargetInfo, rep: ValidationReport) -> None:
    """Header-only pass over every target shard: corrupt or truncated files and missing layers fail here,
    before a multi-GB load, with the file named."""
    shapes = tensor_shapes(Path(target.path))
    where = Path(target.path)
    emb = shapes.get("model.embed_tokens.weight")
    if emb is None:
        raise UserError(where, "no model.embed_tokens.weight in the weight files", "is this a Hugging Face Llama checkpoint?")
    if tuple(emb[0]) != (target.vocab_size, target.hidden_size):
        raise UserError(f"{where}:model.embed_tokens.weight", f"shape {tuple(emb[0])}, config says ({target.vocab_size}, {target.hidden_size})", "config.json and weights come from different models")
    last = f"model.layers.{target.num_hidden_layers - 1}.self_attn.q_proj.weight"
    if last not in shapes:
        raise UserError(where, f"{last} missing: fewer layers than num_hidden_layers={target.num_hidden_layers}", "the checkpoint is incomplete")
    rep.ok("target_weights", f"{len(shapes)} tensors readable, {target.num_hidden_layers} layers present")


def validate_pair(target: TargetInfo, draft: DraftCheckpoint, max_seq_len: int) -> ValidationReport:
    rep = ValidationReport()
    check_target_weights(target, rep)
    check_dtypes(target, draft, rep)
    check_tokenizers(target, draft, rep)
    check_shapes(target, draft, rep)
    check_aux_layers(target, draft, rep)
    check_vocab_map(target, draft, rep)
    check_rope(target, draft, max_seq_len, rep)
    return rep
