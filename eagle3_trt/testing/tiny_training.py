"""The stages that make one embedded tiny pair: tokenizer, target pre-training, the MXFP4 rewrite
gpt-oss ships in, the head's training data, and the held-out measurement of the committed files."""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from eagle3_trt.atomic import write_json
from eagle3_trt.convert import mxfp4
from eagle3_trt.convert.draft_format import load_draft
from eagle3_trt.convert.load import load_target
from eagle3_trt.convert.target import read_target
from eagle3_trt.core.draft import Eagle3Draft
from eagle3_trt.core.engine import SamplingParams, SpeculativeEngine
from eagle3_trt.formats.families import family_of
from eagle3_trt.formats.rope_block import normalised
from eagle3_trt.testing.induction_seed import seed_induction
from eagle3_trt.testing.tiny_copy_data import MARK_AGAIN, copy_corpus, copy_document, identifier_pool, lines_of, paste_prompts
from eagle3_trt.testing.tiny_pair import write_tokenizer
from eagle3_trt.testing.tiny_recipe import Recipe
from eagle3_trt.train.data import Encoder, Record, eval_prompts
from eagle3_trt.train.evaluate import greedy_generate, measure_acceptance, torch_threads
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


def target_texts(r: Recipe, train_texts: list[str]) -> tuple[list[str], list[str]]:
    """(the short windows' documents: the training files plus copy documents making up copy_fraction
    of the characters, in a seeded shuffled order; the long documents), testing/tiny_copy_data.py."""
    if not r.copy_fraction and not r.long_docs:
        return list(train_texts), []
    plain = sum(map(len, train_texts))
    copy_chars = int(plain * r.copy_fraction / max(1e-9, 1 - r.copy_fraction))
    # ~3.3 characters per token on this corpus; 10% over so that each long document fills its window
    short, long = copy_corpus(train_texts, r.seed, copy_chars, r.long_docs, int(r.target_long_seq * 3.6))
    docs = list(train_texts) + short
    random.Random(r.seed).shuffle(docs)
    return docs, long


def train_target(r: Recipe, tok_dir: Path, train_texts: list[str], held_texts: list[str], out: Path, log) -> dict:
    ids = _special_ids(tok_dir)
    docs, long_docs = target_texts(r, train_texts)
    stream = token_stream(tok_dir, docs)
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    bos = ids["<|begin_of_text|>"]
    long = [torch.tensor([bos, *tok.encode(d).ids][: r.target_long_seq], dtype=torch.int64) for d in long_docs]
    held = token_stream(tok_dir, held_texts)
    torch.manual_seed(r.seed)
    cfg = target_config(r, ids)
    model = getattr(transformers, family_of(r.model_type).hf_class)(cfg).float().train()
    if r.induction_seed:
        seed_induction(model, r.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=r.target_lr, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(r.seed)
    warm = max(1, r.target_steps // 20)
    losses = []
    for step in range(r.target_steps):
        lr = r.target_lr * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / r.target_steps))))
        for grp in opt.param_groups:
            grp["lr"] = lr
        starts = torch.randint(0, stream.numel() - r.target_seq - 1, (r.target_batch,), generator=g)
        if long and (step + 1) % r.long_every == 0:  # one long document, so attention works across the whole context
            x = long[(step // r.long_every) % len(long)].unsqueeze(0)
        else:
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
    spell_rope_every_way(out / "config.json", r.model_type)
    shutil.copy2(tok_dir / "tokenizer.json", out / "tokenizer.json")
    # the tokenizer's length limit follows the target's positions (transformers warns past it on long prompts)
    tok_cfg = json.loads((tok_dir / "tokenizer_config.json").read_text()) | {"model_max_length": r.max_position_embeddings}
    write_json(out / "tokenizer_config.json", tok_cfg)
    return {
        "train_tokens_in_corpus": int(stream.numel()),
        "long_windows": len(long),
        "long_window_tokens": sum(int(x.numel()) for x in long),
        "long_steps": r.target_steps // r.long_every if long else 0,
        "heldout_tokens": int(held.numel()),
        "tokens_seen": (r.target_steps - (r.target_steps // r.long_every if long else 0)) * r.target_batch * r.target_seq
        + sum(int(long[i % len(long)].numel()) for i in range(r.target_steps // r.long_every if long else 0)),
        "initial_train_loss": round(sum(losses[:10]) / len(losses[:10]), 4),
        # mean training loss over each tenth of the steps (the long-window steps included)
        "loss_by_tenth": [round(sum(c) / len(c), 4) for c in (losses[i * len(losses) // 10 : (i + 1) * len(losses) // 10] for i in range(10)) if c],
        "final_train_loss": round(sum(losses[-50:]) / len(losses[-50:]), 4),
        "heldout_loss": round(held_loss, 4),
        "params": sum(p.numel() for p in model.parameters()),
    }


def spell_rope_every_way(config_path: Path, model_type: str) -> None:
    """Rewrite a saved config.json with its rope in every spelling (formats/rope_block.normalised, as every
    bundle config is written): transformers 5's save_pretrained writes ``rope_parameters`` alone, which
    transformers 4.57 (TensorRT-LLM 1.2's containers, ``make test-compat``) does not read, so it built the
    shipped targets with the class default theta (10,000; gpt-oss's default yarn) instead of theirs."""
    cfg = json.loads(config_path.read_text())
    write_json(config_path, normalised(cfg, where=str(config_path), family=family_of(model_type)))


def ship_mxfp4(target_dir: Path) -> None:
    """Rewrite a saved gpt-oss target as openai ships gpt-oss: experts in MXFP4, quantization_config in config.json."""
    weights = target_dir / "model.safetensors"
    sd = load_file(str(weights))
    save_file({k: v.contiguous() for k, v in mxfp4.mxfp4_experts(sd).items()}, str(weights), metadata={"format": "pt"})
    cfg = json.loads((target_dir / "config.json").read_text())
    cfg["quantization_config"] = dict(mxfp4.QUANTIZATION_CONFIG)
    (target_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def draft_jsonl(train: dict[str, str], pieces: int, piece_chars: int, path: Path, copy_pieces: int = 0, seed: int = 0) -> int:
    """The head's training data: `pieces` text records of about piece_chars characters, cut at line
    ends and spread evenly over all training files (sorted order), then `copy_pieces` copy documents
    (testing/tiny_copy_data.py, seed + 1), as JSONL. With --generate each becomes its first tokens +
    the target's continuation, so the pieces serve as varied prompts (a copy piece's continuation is
    the target copying, which is what the head must then predict)."""
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
    if copy_pieces:
        rng = random.Random(seed + 1)
        files = lines_of(list(train.values()))
        pool = identifier_pool(files)
        chosen += [copy_document(rng, files, pool) for _ in range(copy_pieces)]
        random.Random(seed).shuffle(chosen)
    with path.open("w") as f:
        for c in chosen:
            f.write(json.dumps({"text": c}) + "\n")
    return len(chosen)


def heldout_sets(pair: Path, r: Recipe, held: dict[str, str]) -> dict[str, list[list[int]]]:
    """The held-out prompts (token ids) the acceptance is measured on, by set: "code", eval_prompts
    windows of the held-out files; "paste", paste_prompts paste-and-copy prompts made from them."""
    enc = Encoder(target_tokenizer(pair / "target"), r.draft_seq, r.eval_prompt_len)
    windows = [w for text in held.values() for w in enc.windows(Record(text=text))]
    sets = {"code": [list(map(int, p)) for p in eval_prompts(windows, r.eval_prompts, r.eval_prompt_len, r.seed)]}
    if r.paste_prompts:
        sets["paste"] = [enc.text_ids(text) for _, text, _ in paste_prompts(list(held.values()), r.paste_prompts, r.seed)]
    return sets


def interleaved(sets: dict[str, list[list[int]]]) -> list[list[int]]:
    """All held-out prompts, the sets taken in turn (code, paste, code, paste, ..., then the rest of the
    longer set): any leading part is a mix of both, and `make engine`'s build check measures the first 8
    (pipeline/build_checkpoints.HELDOUT_PROMPTS)."""
    lists = list(sets.values())
    return [ps[i] for i in range(max(map(len, lists), default=0)) for ps in lists if i < len(ps)]


def heldout_prompt_ids(pair: Path, r: Recipe, held: dict[str, str]) -> list[list[int]]:
    """All held-out prompts (heldout_sets, interleaved): what heldout_prompts.json ships and `make engine` gates on."""
    return interleaved(heldout_sets(pair, r, held))


def copy_check(target, tokenizer, r: Recipe, held: dict[str, str], stops: tuple[int, ...], pad: int) -> dict:
    """Does the target repeat a pasted block? The greedy continuation of each held-out 'pasted' and
    'again' prompt is decoded and compared with the block; plus long prompts: a held-out long
    document of about target_long_seq - 256 tokens, then '# again:' and the first line of a block
    from its first segment, which the target must finish from thousands of tokens back."""
    enc = Encoder(tokenizer, r.draft_seq, r.eval_prompt_len)
    cases = [(k, t, b) for k, t, b in paste_prompts(list(held.values()), r.paste_prompts, r.seed) if k != "changed"]
    rng = random.Random(r.seed + 7)
    files = lines_of(list(held.values()))
    long_cases = []
    for _ in range(4):
        f = rng.choice(files)
        i = rng.randrange(max(1, len(f) - 30))
        first = "".join(f[i : i + 30])
        lines = f[i + 10 : i + 16]
        doc = first
        while len(enc.text_ids(doc)) < r.target_long_seq - 256 - 40 * len(lines):
            g = rng.choice(files)
            k = rng.randrange(max(1, len(g) - 40))
            doc += "".join(g[k : k + 40])
        ids = enc.text_ids(doc)[: r.target_long_seq - 256 - 40 * len(lines)]
        doc = tokenizer.decode(ids[1:])
        long_cases.append(("long", doc + ("" if doc.endswith("\n") else "\n") + MARK_AGAIN + lines[0], "".join(lines[1:])))
    out: dict[str, Any] = {}
    for label, group in (("short", cases), ("long", long_cases)):
        prompts = [enc.text_ids(t) for _, t, _ in group]
        n_new = [len(tokenizer.encode(b, add_special_tokens=False)) + 2 for _, _, b in group]
        copied = same = total = 0
        for p, n, (_, _, block) in zip(prompts, n_new, group):
            (cont,) = greedy_generate(target, [p], n, stops, pad)
            copied += tokenizer.decode(cont, skip_special_tokens=True)[: len(block)] == block
            # how far the copy goes: the block's tokens reproduced before the first difference
            want = tokenizer.encode(block, add_special_tokens=False)
            k = 0
            while k < min(len(want), len(cont)) and cont[k] == want[k]:
                k += 1
            same, total = same + k, total + len(want)
        out[label] = {
            "prompts": len(group),
            "teacher_forced_copy_accuracy": teacher_forced_copy_accuracy(target, tokenizer, prompts, [b for _, _, b in group]),
            "copied": copied,
            "block_tokens": total,
            "block_tokens_before_first_difference": same,
            "prompt_tokens_max": max(map(len, prompts)),
        }
    return out


@torch.no_grad()
def teacher_forced_copy_accuracy(target, tokenizer, prompts: list[list[int]], blocks: list[str]) -> float:
    """Given the prompt and the copy's first two tokens, the share of the copy's later tokens the target's
    argmax predicts, each from the exact text before it: whether it copies, apart from where the copy starts
    (an 'again' prompt does not say which line began the block) and from how greedy text drifts after a miss."""
    hit = n = 0
    for p, block in zip(prompts, blocks):
        b = tokenizer.encode(block, add_special_tokens=False)
        x = torch.tensor([p + b])
        _, h = target.teacher_forced(x)
        pred = target.hf.lm_head(h)[0].argmax(-1)
        idx = torch.arange(len(p) + 1, len(p) + len(b) - 1)
        hit += int((pred[idx] == x[0, idx + 1]).sum())
        n += len(idx)
    return round(hit / max(1, n), 4)


def acceptance_interval(per_prompt: list[dict], seed: int, resamples: int = 2000) -> dict:
    """95% interval of the acceptance length (generated tokens / target forwards over all prompts),
    bootstrapped over prompts: the tolerance a rebuild's figure is held to (MODEL_CARD.md)."""
    tokens = torch.tensor([float(a["tokens"]) for a in per_prompt])
    forwards = tokens / torch.tensor([float(a["acceptance_length"]) for a in per_prompt])
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, len(per_prompt), (resamples, len(per_prompt)), generator=g)
    al = tokens[idx].sum(1) / forwards[idx].sum(1)
    lo, hi = torch.quantile(al, torch.tensor([0.025, 0.975])).tolist()
    return {"low": round(lo, 3), "high": round(hi, 3), "prompts": len(per_prompt), "resamples": resamples}


def measure_committed(pair: Path, r: Recipe, held: dict[str, str]) -> dict:
    """Acceptance of the files as committed (bf16) on the held-out prompts (all sets, and each set
    alone), by greedy speculative decoding through the runtime's loop (core.engine), computed in
    float32; and whether the target copies (copy_check)."""
    info = read_target(pair / "target")
    ck = load_draft(pair / "draft")
    target = load_target(pair / "target", dtype=torch.float32, aux_layer_ids=ck.config.aux_layer_ids)
    draft = Eagle3Draft.from_checkpoint(ck, dtype=torch.float32)
    sets = heldout_sets(pair, r, held)
    prompts = interleaved(sets)
    stops = tuple(info.eos_token_ids)
    out: dict[str, Any] = {}
    with torch_threads(r.threads):
        spec = SpeculativeEngine(target, draft, None, max_draft_len=r.max_draft_len, eos_token_ids=stops)
        params = SamplingParams(max_tokens=r.eval_tokens)
        same = all(spec.generate([p], params)[0].token_ids == spec.generate([p], params, speculate=False)[0].token_ids for p in prompts[:4])
        out["matches_greedy_first_4_prompts"] = same
        for k in sorted({1, 2, r.max_draft_len}):
            out[f"K={k}"] = measure_acceptance(target, draft, prompts, r.eval_tokens, k, stops).to_dict()
        if len(sets) > 1:
            out["by_set"] = {name: measure_acceptance(target, draft, ps, r.eval_tokens, r.max_draft_len, stops).to_dict() for name, ps in sets.items()}
        if len(sets) > 1:
            out["interval_95"] = acceptance_interval(
                [measure_acceptance(target, draft, [p], r.eval_tokens, r.max_draft_len, stops).to_dict() for p in prompts], r.seed
            )
        if r.paste_prompts:
            tok = target_tokenizer(pair / "target")
            out["copy_check"] = copy_check(target, tok, r, held, stops, int(tok.pad_token_id))
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
