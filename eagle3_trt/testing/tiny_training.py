"""The stages that make one embedded tiny pair: tokenizer, target pre-training, the MXFP4 rewrite
gpt-oss ships in, the head's training data, and the held-out measurement of the committed files."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from eagle3_trt.convert import mxfp4
from eagle3_trt.convert.draft_format import load_draft
from eagle3_trt.convert.load import load_target
from eagle3_trt.convert.target import read_target
from eagle3_trt.core.draft import Eagle3Draft
from eagle3_trt.core.engine import SamplingParams, SpeculativeEngine
from eagle3_trt.formats.families import family_of
from eagle3_trt.testing.tiny_pair import write_tokenizer
from eagle3_trt.testing.tiny_recipe import Recipe
from eagle3_trt.train.data import Encoder, Record, eval_prompts
from eagle3_trt.train.evaluate import measure_acceptance, torch_threads
from eagle3_trt.train.hidden_states import target_tokenizer


def train_tokenizer(texts: list[str], vocab_size: int, out: Path) -> None:
    """Byte-level BPE with the Llama-3 special tokens and chat template of testing.tiny_pair."""
    write_tokenizer(out, texts, vocab_size)


def _special_ids(tok_dir: Path) -> dict[str, int]:
    added = json.loads((tok_dir / "tokenizer.json").read_text())["added_tokens"]
    return {t["content"]: t["id"] for t in added}


def target_config(r: Recipe, ids: dict[str, int]):
    family = family_of(r.model_type, "recipe model_type")
    moe: dict[str, Any] = {}
    if r.num_local_experts:
        if not (family.moe_experts_field and family.moe_active_field):
            raise ValueError(f"recipe model_type {r.model_type!r}: its family has no mixture-of-experts fields")
        moe[family.moe_experts_field] = r.num_local_experts
        moe[family.moe_active_field] = r.num_experts_per_tok
    if r.yarn_factor:  # gpt-oss's yarn (beta 32/1, truncate off), scaled to this context
        moe["rope_scaling"] = {
            "rope_type": "yarn",
            "factor": r.yarn_factor,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": int(r.max_position_embeddings / r.yarn_factor),
        }
    if r.sliding_window:  # gpt-oss's pattern: the even layers slide
        moe.update(sliding_window=r.sliding_window, layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(r.num_hidden_layers)])
    return getattr(transformers, family.hf_config_class)(
        **moe,
        vocab_size=r.vocab_size,
        hidden_size=r.hidden_size,
        intermediate_size=r.intermediate_size,
        num_hidden_layers=r.num_hidden_layers,
        num_attention_heads=r.num_attention_heads,
        num_key_value_heads=r.num_key_value_heads,
        head_dim=r.head_dim,
        max_position_embeddings=r.max_position_embeddings,
        rope_theta=r.rope_theta,
        rms_norm_eps=1e-5,
        tie_word_embeddings=r.tie_word_embeddings,
        bos_token_id=ids["<|begin_of_text|>"],
        eos_token_id=[ids["<|end_of_text|>"], ids["<|eot_id|>"]],
        pad_token_id=ids["<|finetune_right_pad_id|>"],
        architectures=[family.hf_class],
        torch_dtype="bfloat16",
    )


def token_stream(tok_dir: Path, texts: list[str]):
    """One long int64 tensor: <bos> file <bos> file ..."""
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    bos = _special_ids(tok_dir)["<|begin_of_text|>"]
    ids: list[int] = []
    for t in texts:
        ids.append(bos)
        ids.extend(tok.encode(t).ids)
    return torch.tensor(ids, dtype=torch.int64)


def train_target(r: Recipe, tok_dir: Path, train_texts: list[str], held_texts: list[str], out: Path, log) -> dict:
    ids = _special_ids(tok_dir)
    stream = token_stream(tok_dir, train_texts)
    held = token_stream(tok_dir, held_texts)
    torch.manual_seed(r.seed)
    cfg = target_config(r, ids)
    model = getattr(transformers, family_of(r.model_type).hf_class)(cfg).float().train()
    opt = torch.optim.AdamW(model.parameters(), lr=r.target_lr, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(r.seed)
    warm = max(1, r.target_steps // 20)
    losses = []
    for step in range(r.target_steps):
        lr = r.target_lr * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / r.target_steps))))
        for grp in opt.param_groups:
            grp["lr"] = lr
        starts = torch.randint(0, stream.numel() - r.target_seq - 1, (r.target_batch,), generator=g)
        x = torch.stack([stream[s : s + r.target_seq] for s in starts.tolist()])
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if (step + 1) % 50 == 0 or step + 1 == r.target_steps:
            log(f"target step {step + 1}/{r.target_steps} loss {sum(losses[-50:]) / len(losses[-50:]):.3f}")
    model.eval()
    with torch.no_grad():
        n = (held.numel() - 1) // r.target_seq
        chunks = held[: n * r.target_seq].view(n, r.target_seq)
        held_loss = sum(float(model(input_ids=chunks[i : i + 8], labels=chunks[i : i + 8]).loss) * len(chunks[i : i + 8]) for i in range(0, n, 8)) / n
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16)
    model.generation_config.do_sample = False
    model.generation_config.bos_token_id = ids["<|begin_of_text|>"]
    model.generation_config.eos_token_id = [ids["<|end_of_text|>"], ids["<|eot_id|>"]]
    model.generation_config.pad_token_id = ids["<|finetune_right_pad_id|>"]
    model.save_pretrained(out, safe_serialization=True)
    if r.target_format == "mxfp4":
        ship_mxfp4(out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(tok_dir / f, out / f)
    return {
        "train_tokens_in_corpus": int(stream.numel()),
        "heldout_tokens": int(held.numel()),
        "tokens_seen": r.target_steps * r.target_batch * r.target_seq,
        "final_train_loss": round(sum(losses[-50:]) / len(losses[-50:]), 4),
        "heldout_loss": round(held_loss, 4),
        "params": sum(p.numel() for p in model.parameters()),
    }


def ship_mxfp4(target_dir: Path) -> None:
    """Rewrite a saved gpt-oss target as openai ships gpt-oss: experts in MXFP4, quantization_config in config.json."""
    weights = target_dir / "model.safetensors"
    sd = load_file(str(weights))
    save_file({k: v.contiguous() for k, v in mxfp4.mxfp4_experts(sd).items()}, str(weights), metadata={"format": "pt"})
    cfg = json.loads((target_dir / "config.json").read_text())
    cfg["quantization_config"] = dict(mxfp4.QUANTIZATION_CONFIG)
    (target_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def draft_jsonl(train: dict[str, str], pieces: int, piece_chars: int, path: Path) -> int:
    """The head's training data: `pieces` text records of about piece_chars characters, cut at line
    ends and spread evenly over all training files (sorted order), as JSONL. With --generate each
    becomes its first tokens + the target's continuation, so the pieces serve as varied prompts."""
    chunks: list[str] = []
    for text in train.values():
        cur: list[str] = []
        size = 0
        for line in text.splitlines(keepends=True):
            cur.append(line)
            size += len(line)
            if size >= piece_chars:
                chunks.append("".join(cur))
                cur, size = [], 0
    step = max(1, len(chunks) // pieces)
    chosen = chunks[::step][:pieces]
    with path.open("w") as f:
        for c in chosen:
            f.write(json.dumps({"text": c}) + "\n")
    return len(chosen)


def heldout_prompt_ids(pair: Path, r: Recipe, held: dict[str, str]) -> list[list[int]]:
    """The held-out prompts (token ids) the acceptance is measured on: eval_prompts windows of the held-out files."""
    enc = Encoder(target_tokenizer(pair / "target"), r.draft_seq, r.eval_prompt_len)
    windows = [w for text in held.values() for w in enc.windows(Record(text=text))]
    return [list(map(int, p)) for p in eval_prompts(windows, r.eval_prompts, r.eval_prompt_len, r.seed)]


def measure_committed(pair: Path, r: Recipe, held: dict[str, str]) -> dict:
    """Acceptance of the files as committed (bf16) on the held-out files, by greedy speculative
    decoding through the runtime's loop (core.engine), computed in float32."""
    info = read_target(pair / "target")
    ck = load_draft(pair / "draft")
    target = load_target(pair / "target", dtype=torch.float32, aux_layer_ids=ck.config.aux_layer_ids)
    draft = Eagle3Draft.from_checkpoint(ck, dtype=torch.float32)
    enc = Encoder(target_tokenizer(pair / "target"), r.draft_seq, r.eval_prompt_len)
    windows = [w for text in held.values() for w in enc.windows(Record(text=text))]
    prompts = eval_prompts(windows, r.eval_prompts, r.eval_prompt_len, r.seed)
    stops = tuple(info.eos_token_ids)
    out: dict[str, Any] = {}
    with torch_threads(r.threads):
        spec = SpeculativeEngine(target, draft, None, max_draft_len=r.max_draft_len, eos_token_ids=stops)
        params = SamplingParams(max_tokens=r.eval_tokens)
        same = all(spec.generate([p], params)[0].token_ids == spec.generate([p], params, speculate=False)[0].token_ids for p in prompts[:4])
        out["matches_greedy_first_4_prompts"] = same
        for k in sorted({1, 2, r.max_draft_len}):
            out[f"K={k}"] = measure_acceptance(target, draft, prompts, r.eval_tokens, k, stops).to_dict()
    return out


def draft_params(draft_dir: Path) -> int:
    with safe_open(str(draft_dir / "model.safetensors"), framework="pt") as f:
        return sum(
            f.get_slice(k).get_shape()[0] * (f.get_slice(k).get_shape()[1] if len(f.get_slice(k).get_shape()) > 1 else 1)
            for k in f.keys()
            if k not in ("d2t", "t2d")
        )


def dir_size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
