"""Tokenizer checks: the target's tokenizer against its own configs, and the draft's against the target's."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from eagle3_trt.convert.draft_format import DraftCheckpoint
from eagle3_trt.convert.target import TargetInfo
from eagle3_trt.convert.validate_report import ValidationReport
from eagle3_trt.errors import UserError
from eagle3_trt.formats.checkpoint_io import read_json
from eagle3_trt.formats.generation import eos_ids_of
from eagle3_trt.formats.hf_config import GenerationConfigIds, parse_config

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model")


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
