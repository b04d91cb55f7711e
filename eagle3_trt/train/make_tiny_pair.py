"""Make the embedded tiny pairs (models/tiny/, models/tiny-qwen3/): a small target trained on the
Python standard library's source and an EAGLE-3 head trained for it with `train-draft`'s own code path.

    python -m eagle3_trt.train.make_tiny_pair -o models/tiny [--overwrite]
    python -m eagle3_trt.train.make_tiny_pair --family qwen3 -o models/tiny-qwen3 [--overwrite]
    python -m eagle3_trt.train.make_tiny_pair --family gpt-oss -o models/tiny-gpt-oss [--overwrite]

The target's architecture is its family's transformers class (convert/families.py): a Llama for
``tiny``; a Qwen3 (per-head q/k norms, head_dim not hidden/heads, tied embeddings) for ``tiny-qwen3``,
whose recipe is short enough (< 2 min on 2 cores) to be re-made at will.

Reproducible: fixed seeds, a fixed sorted file list, fixed step counts (the time budget is set
by steps, not by a clock). The standard library differs slightly between Python versions, so
the committed weights are the reference and this script is how they were made; MODEL_CARD.md
records the Python version, the files used and the measured run time.

Stages: byte-level BPE tokenizer (Llama-3 special tokens and chat template) -> target
pre-training on random windows -> draft training (train.train_draft, as the CLI runs it) ->
held-out acceptance of the committed bf16 files by greedy speculative decoding -> model card.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import click
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from eagle3_trt.atomic import staged_dir
from eagle3_trt.convert import mxfp4
from eagle3_trt.convert.draft_format import load_draft
from eagle3_trt.convert.families import family_of
from eagle3_trt.convert.target import read_target
from eagle3_trt.convert.tiny_pair import write_tokenizer
from eagle3_trt.core.draft import Eagle3Draft
from eagle3_trt.core.engine import SamplingParams, SpeculativeEngine
from eagle3_trt.core.target import TargetModel
from eagle3_trt.train.data import Encoder, Record, eval_prompts
from eagle3_trt.train.evaluate import measure_acceptance, torch_threads
from eagle3_trt.train.hidden_states import target_tokenizer
from eagle3_trt.train.train_draft import TrainDraftOptions, train_draft

# Top-level stdlib modules present in CPython 3.10-3.13 (modules removed in 3.12/3.13 and
# generated/joke files left out). Held-out files are seen by neither model.
CORPUS_FILES = (
    "__future__",
    "_collections_abc",
    "_compat_pickle",
    "_compression",
    "_markupbase",
    "_py_abc",
    "_pydecimal",
    "_pyio",
    "_sitebuiltins",
    "_strptime",
    "_threading_local",
    "_weakrefset",
    "abc",
    "argparse",
    "ast",
    "base64",
    "bdb",
    "bisect",
    "bz2",
    "cProfile",
    "calendar",
    "cmd",
    "code",
    "codecs",
    "codeop",
    "colorsys",
    "compileall",
    "configparser",
    "contextlib",
    "contextvars",
    "copy",
    "copyreg",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "dis",
    "doctest",
    "enum",
    "filecmp",
    "fileinput",
    "fnmatch",
    "fractions",
    "ftplib",
    "functools",
    "genericpath",
    "getopt",
    "getpass",
    "gettext",
    "glob",
    "graphlib",
    "gzip",
    "hashlib",
    "heapq",
    "hmac",
    "imaplib",
    "inspect",
    "io",
    "ipaddress",
    "keyword",
    "linecache",
    "locale",
    "lzma",
    "mailbox",
    "mimetypes",
    "modulefinder",
    "netrc",
    "ntpath",
    "nturl2path",
    "numbers",
    "opcode",
    "operator",
    "optparse",
    "os",
    "pathlib",
    "pdb",
    "pickle",
    "pickletools",
    "pkgutil",
    "platform",
    "plistlib",
    "poplib",
    "posixpath",
    "pprint",
    "profile",
    "pstats",
    "pty",
    "py_compile",
    "pyclbr",
    "pydoc",
    "queue",
    "quopri",
    "random",
    "reprlib",
    "rlcompleter",
    "runpy",
    "sched",
    "secrets",
    "selectors",
    "shelve",
    "shlex",
    "shutil",
    "signal",
    "site",
    "smtplib",
    "socket",
    "socketserver",
    "ssl",
    "stat",
    "statistics",
    "string",
    "stringprep",
    "struct",
    "subprocess",
    "symtable",
    "sysconfig",
    "tabnanny",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "timeit",
    "token",
    "tokenize",
    "trace",
    "traceback",
    "tracemalloc",
    "tty",
    "turtle",
    "types",
    "typing",
    "uuid",
    "warnings",
    "wave",
    "weakref",
    "webbrowser",
    "zipapp",
    "zipfile",
    "zipimport",
)
HELDOUT_FILES = ("csv", "fractions", "gettext", "heapq", "pprint", "queue", "shlex", "textwrap")


@dataclass(frozen=True)
class Recipe:
    seed: int = 0
    model_type: str = "llama"  # the target's family (convert/families.py)
    tie_word_embeddings: bool = False
    vocab_size: int = 2048
    hidden_size: int = 192
    num_hidden_layers: int = 8
    num_attention_heads: int = 3
    num_key_value_heads: int = 1
    head_dim: int = 64
    intermediate_size: int = 576
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0
    # mixture of experts and sliding-window layers (gpt-oss; 0 = dense, full attention everywhere)
    num_local_experts: int = 0
    num_experts_per_tok: int = 0
    sliding_window: int = 0
    # yarn rope over max_position_embeddings / yarn_factor original positions (gpt-oss's rope; 0 = plain rope)
    yarn_factor: float = 0.0
    # how the target is shipped: "bf16", or "mxfp4" (experts in gpt-oss's MXFP4 layout, convert/mxfp4.py)
    target_format: str = "bf16"
    # target pre-training
    target_steps: int = 550
    target_batch: int = 8
    target_seq: int = 256
    target_lr: float = 3e-3
    # draft (train-draft) training
    draft_steps: int = 300
    draft_batch: int = 8
    draft_seq: int = 256
    draft_vocab: int = 1024
    draft_lr: float = 1e-3
    draft_pieces: int = 600  # text records for the head, spread over the training files
    draft_piece_chars: int = 800
    draft_gen_tokens: int = 192  # train-draft --generate: the target continues each piece's first 64 tokens
    max_draft_len: int = 3
    # held-out measurement
    eval_prompts: int = 32
    eval_prompt_len: int = 64
    eval_tokens: int = 64
    threads: int = 1


# tiny-qwen3: a Qwen3 with the family's quirks (q/k norms; 4 heads x head_dim 48 = 192 over a hidden
# size of 128; tied embeddings, as Qwen3-0.6B/1.7B/4B have), trained in < 2 min on one core (one torch thread: two threads on a shared 2-core box ran 10-50x slower).
QWEN3_RECIPE = Recipe(
    model_type="qwen3",
    tie_word_embeddings=True,
    vocab_size=1024,
    hidden_size=128,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=48,
    intermediate_size=384,
    rope_theta=1000000.0,
    max_position_embeddings=1024,
    target_steps=160,
    target_batch=8,
    target_seq=128,
    target_lr=4e-3,
    draft_steps=120,
    draft_batch=8,
    draft_seq=128,
    draft_vocab=512,
    draft_lr=2e-3,
    draft_pieces=160,
    draft_piece_chars=600,
    draft_gen_tokens=96,
    eval_prompts=16,
    eval_prompt_len=48,
    eval_tokens=48,
    threads=1,
)
# tiny-gpt-oss: a GptOssForCausalLM with 4 experts (2 per token), attention sinks, sliding-window (32) attention
# on the even layers, yarn rope (gpt-oss's betas, factor 4 over 256 original positions), shipped as openai ships gpt-oss:
# experts in MXFP4 (attention, router, embedding and lm_head in BF16). The head is trained against the
# MXFP4 target as the runtime loads it (experts dequantized exactly), i.e. the checkpoint TensorRT-LLM serves.
GPT_OSS_RECIPE = Recipe(
    model_type="gpt_oss",
    vocab_size=1024,
    hidden_size=128,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    intermediate_size=128,
    num_local_experts=4,
    num_experts_per_tok=2,
    sliding_window=32,
    yarn_factor=4.0,
    target_format="mxfp4",
    rope_theta=150000.0,
    max_position_embeddings=1024,
    target_steps=160,
    target_batch=8,
    target_seq=128,
    target_lr=4e-3,
    draft_steps=120,
    draft_batch=8,
    draft_seq=128,
    draft_vocab=512,
    draft_lr=2e-3,
    draft_pieces=160,
    draft_piece_chars=600,
    draft_gen_tokens=96,
    eval_prompts=16,
    eval_prompt_len=48,
    eval_tokens=48,
    threads=1,
)
RECIPES = {"llama": Recipe(), "qwen3": QWEN3_RECIPE, "gpt-oss": GPT_OSS_RECIPE}


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def read_corpus() -> tuple[dict[str, str], dict[str, str], list[str]]:
    """(train name->text, held-out name->text, missing names), in sorted file order."""
    root = stdlib_dir()
    train, held, missing = {}, {}, []
    for name in sorted(set(CORPUS_FILES)):
        f = root / f"{name}.py"
        if not f.is_file():
            missing.append(name)
            continue
        text = f.read_text(encoding="utf-8")
        (held if name in HELDOUT_FILES else train)[name] = text
    return train, held, missing


def train_tokenizer(texts: list[str], vocab_size: int, out: Path) -> None:
    """Byte-level BPE with the Llama-3 special tokens and chat template of convert.tiny_pair."""
    write_tokenizer(out, texts, vocab_size)


def _special_ids(tok_dir: Path) -> dict[str, int]:
    added = json.loads((tok_dir / "tokenizer.json").read_text())["added_tokens"]
    return {t["content"]: t["id"] for t in added}


def target_config(r: Recipe, ids: dict[str, int]):
    family = family_of(r.model_type, "recipe model_type")
    moe = {}
    if r.num_local_experts:
        moe.update({family.moe_experts_field: r.num_local_experts, family.moe_active_field: r.num_experts_per_tok})
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
    target = TargetModel.from_dir(pair / "target", dtype=torch.float32, aux_layer_ids=ck.config.aux_layer_ids)
    draft = Eagle3Draft.from_checkpoint(ck, dtype=torch.float32)
    enc = Encoder(target_tokenizer(pair / "target"), r.draft_seq, r.eval_prompt_len)
    windows = [w for text in held.values() for w in enc.windows(Record(text=text))]
    prompts = eval_prompts(windows, r.eval_prompts, r.eval_prompt_len, r.seed)
    stops = tuple(info.eos_token_ids)
    out = {}
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
            f.get_slice(k).get_shape()[0] * (f.get_slice(k).get_shape()[1] if len(f.get_slice(k).get_shape()) > 1 else 1) for k in f if k not in ("d2t", "t2d")
        )


def dir_size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def make(out: Path, r: Recipe = Recipe(), overwrite: bool = False, log=print) -> dict:
    out = Path(out)
    if out.exists() and not overwrite:
        raise click.UsageError(f"{out} exists; pass --overwrite")
    t0 = time.time()
    torch.set_num_threads(r.threads)
    os.environ.setdefault("RAYON_NUM_THREADS", str(r.threads))
    timings = {}
    with staged_dir(out) as pair:
        # Scratch files (tokenizer, draft data and work dir) live inside the staging directory, so an
        # interrupted or killed run leaves nothing beside `out` that the next run does not remove.
        work = pair / ".work"
        work.mkdir()
        train, held, missing = read_corpus()
        t = time.time()
        train_tokenizer(list(train.values()), r.vocab_size, work / "tokenizer")
        timings["tokenizer_s"] = round(time.time() - t, 1)
        log(f"tokenizer: {timings['tokenizer_s']} s")
        t = time.time()
        target_stats = train_target(r, work / "tokenizer", list(train.values()), list(held.values()), pair / "target", log)
        timings["target_s"] = round(time.time() - t, 1)
        log(f"target: {timings['target_s']} s, held-out loss {target_stats['heldout_loss']}")
        t = time.time()
        data = work / "draft_train.jsonl"
        n_pieces = draft_jsonl(train, r.draft_pieces, r.draft_piece_chars, data)
        report = train_draft(
            TrainDraftOptions(
                target=pair / "target",
                data=data,
                out=pair / "draft",
                steps=r.draft_steps,
                max_draft_len=r.max_draft_len,
                draft_vocab=r.draft_vocab,
                device="cpu",
                seq_len=r.draft_seq,
                batch_size=r.draft_batch,
                lr=r.draft_lr,
                generate=True,
                gen_tokens=r.draft_gen_tokens,
                seed=r.seed,
                eval_samples=16,
                eval_tokens=r.eval_tokens,
                eval_prompt_len=r.eval_prompt_len,
                quiet=not sys.stderr.isatty(),
                threads=r.threads,
                save_every=0,
                work_dir=work / "draft.work",
            )
        )
        timings["draft_s"] = round(time.time() - t, 1)
        log(f"draft: {timings['draft_s']} s, train-split acceptance {report['after']['acceptance_length']}")
        # the report names paths of this machine's temp dir; record what they were instead
        report["target"] = f"models/{out.name}/target"
        report["data"] = f"draft_train.jsonl: {n_pieces} pieces of the training files (see MODEL_CARD.md)"
        (pair / "draft" / "train_report.json").write_text(json.dumps(report, indent=2) + "\n")
        t = time.time()
        acceptance = measure_committed(pair, r, held)
        timings["measure_s"] = round(time.time() - t, 1)
        timings["total_s"] = round(time.time() - t0, 1)
        facts = {
            "name": out.name,
            "recipe": asdict(r),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "corpus": {
                "train_files": list(train),
                "heldout_files": list(held),
                "missing_files": missing,
                "draft_pieces": n_pieces,
                "train_chars": sum(map(len, train.values())),
            },
            "target": target_stats,
            "draft": {
                "train_report": "draft/train_report.json",
                "final_loss": report["final_loss"],
                "params": draft_params(pair / "draft"),
                "draft_vocab_coverage": report["draft_vocab_coverage"],
                "train_windows": report["train_windows"],
            },
            "acceptance_heldout": acceptance,
            "timings": timings,
            "sizes": {"target_bytes": dir_size(pair / "target"), "draft_bytes": dir_size(pair / "draft")},
        }
        (pair / "MODEL_CARD.md").write_text(model_card(facts))
        (pair / "tiny_pair.json").write_text(json.dumps(facts, indent=2) + "\n")
        # what `make engine` measures a bundle of this pair on (convert/embedded.py heldout_prompts)
        about = (
            f"Held-out prompts for the embedded {out.name} pair: token ids of {r.eval_prompt_len}-token windows from Python "
            f"standard-library modules neither model was trained on ({', '.join(held)}; PSF License). "
            "`make engine` measures the built bundle's acceptance on them."
        )
        (pair / "heldout_prompts.json").write_text(json.dumps({"about": about, "prompts": heldout_prompt_ids(pair, r, held)}) + "\n")
        shutil.rmtree(work)
    return facts


def model_card(f: dict) -> str:
    r = f["recipe"]
    acc = f["acceptance_heldout"]
    k = f"K={r['max_draft_len']}"
    main = acc[k]
    rows = "\n".join(
        f"| {key} | {a['acceptance_length']:.2f} | {' / '.join(f'{x:.2f}' for x in a['per_step'])} | {a['iterations']} | {a['tokens']} |"
        for key, a in acc.items()
        if key.startswith("K=")
    )
    greedy_line = "Output equals the target's plain greedy decoding (checked on the first 4 prompts)." if acc.get("matches_greedy_first_4_prompts") else ""
    t = f["timings"]
    mb = 1 << 20
    files = "weights (target experts MXFP4 as shipped, dequantized exactly; the rest bf16)" if r.get("target_format") == "mxfp4" else "bf16 weights"
    family = family_of(r.get("model_type", "llama"))
    aux = ", ".join(map(str, family.default_aux_layers(r["num_hidden_layers"])))
    quirks = (
        f"; per-head q/k RMSNorm, {r['num_attention_heads']} heads x head_dim {r['head_dim']} over hidden {r['hidden_size']}" if family.qk_norm else ""
    ) + ("; lm_head tied to the embedding" if r.get("tie_word_embeddings") else "")
    if r.get("num_local_experts"):
        quirks += (
            f"; MoE: {r['num_local_experts']} experts, {r['num_experts_per_tok']} per token"
            + ("; attention sinks" if family.attention_sinks else "")
            + (f"; {r['sliding_window']}-token sliding window on the even layers" if r.get("sliding_window") else "")
            + (f"; yarn rope x{r['yarn_factor']:g}" if r.get("yarn_factor") else "")
            + ("; experts shipped in MXFP4" if r.get("target_format") == "mxfp4" else "")
        )
    raw_note = (
        " (training on the raw text instead gave 2.03 at K=3 in an earlier run)"
        if family.name == "llama"
        else f". This target is trained only briefly (held-out loss {f['target']['heldout_loss']} nats/token): its greedy "
        "output repeats a few frequent tokens, which is why a head trained for a minute predicts most of it"
    )
    return f"""# Embedded tiny EAGLE-3 pair

A small {family.name} target (`{family.hf_class}`) trained on Python standard-library source, and an EAGLE-3 draft
head trained for it with `eagle3-trt train-draft`'s code path. It exists so that every stage
(quantization, acceptance measurement, serving, benchmarks) runs on a CPU with a real, measured
acceptance rate. It is not a useful code model: its greedy continuations are often repetitive
(runs of comment lines, repeated statements), which is part of why a one-layer head can predict
them. The figure shows that the head tracks this target, not that the target is good.

**Measured greedy acceptance length on held-out text: {main["acceptance_length"]:.2f} tokens per target pass**
(max_draft_len {r["max_draft_len"]}; {main["prompts"]} prompts of {r["eval_prompt_len"]} tokens from held-out files, {r["eval_tokens"]} generated
tokens each; greedy speculative decoding of the committed {files}, computed in float32, on a CPU;
`eagle3_trt.train.evaluate.measure_acceptance`; acceptance length = generated tokens per target
forward, the prefill included). {greedy_line}
The decoding is the runtime's own loop (`eagle3_trt.core.engine.SpeculativeEngine`); its accept lengths are
checked against an independent re-derivation in `tests/test_engine_cross_check.py`.

| drafts per pass | acceptance length | per-step acceptance | verification passes | tokens |
|---|---|---|---|---|
{rows}

## Architecture

| | target (`target/`) | draft (`draft/`) |
|---|---|---|
| class | `{family.hf_class}`{quirks} | `LlamaForCausalLMEagle3` (SafeAILab layout: fc, midlayer.*, norm, lm_head, d2t, t2d) |
| layers | {r["num_hidden_layers"]} | 1 (+ fc over 3 aux layers) |
| hidden / intermediate | {r["hidden_size"]} / {r["intermediate_size"]} | {r["hidden_size"]} / {r["intermediate_size"]} |
| heads / KV heads / head_dim | {r["num_attention_heads"]} / {r["num_key_value_heads"]} / {r["head_dim"]} | same |
| vocabulary | {r["vocab_size"]} (byte-level BPE, Llama-3 special tokens + chat template) | {r["draft_vocab"]} most frequent target ids (d2t/t2d) |
| aux capture layers | outputs of layers {aux} (TensorRT-LLM default for {r["num_hidden_layers"]} layers) | |
| RoPE | theta {r["rope_theta"]:.0f}, max positions {r["max_position_embeddings"]} | same |
| parameters | {f["target"]["params"]:,} | {f["draft"]["params"]:,} |
| size on disk (bf16 safetensors + tokenizer/config) | {f["sizes"]["target_bytes"] / mb:.1f} MiB | {f["sizes"]["draft_bytes"] / mb:.1f} MiB |

## Corpus

The Python standard library's own source (`sysconfig.get_paths()["stdlib"]`, top-level `*.py` modules;
PSF License), CPython {f["python"]} when these weights were made. Fixed sorted file list in
`train/make_tiny_pair.py` (`CORPUS_FILES`); {len(f["corpus"]["train_files"])} training files
({f["corpus"]["train_chars"]:,} characters, {f["target"]["train_tokens_in_corpus"]:,} tokens).
Held out from both models: {", ".join(f["corpus"]["heldout_files"])}
({f["target"]["heldout_tokens"]:,} tokens). Missing on this Python: {", ".join(f["corpus"]["missing_files"]) or "none"}.
The draft's data: {f["corpus"]["draft_pieces"]} pieces of ~{r["draft_piece_chars"]} characters spread evenly over the training files;
with `--generate` the target continued the first {r["eval_prompt_len"]} tokens of each by {r["draft_gen_tokens"]} greedy tokens, so the
head learned the target's own output{raw_note}.

## Training budget

- Target: {r["target_steps"]} AdamW steps x {r["target_batch"]} random windows of {r["target_seq"]} tokens
  ({f["target"]["tokens_seen"]:,} tokens seen), peak lr {r["target_lr"]}, warmup + cosine, seed {r["seed"]}.
  Final train loss {f["target"]["final_train_loss"]}, held-out loss {f["target"]["heldout_loss"]} nats/token.
- Draft: `train-draft --generate` with {r["draft_steps"]} steps x {r["draft_batch"]} windows of {r["draft_seq"]} tokens,
  training-time test over {r["max_draft_len"]} draft steps, peak lr {r["draft_lr"]}, draft vocabulary {r["draft_vocab"]}
  (coverage {f["draft"]["draft_vocab_coverage"]:.1%} of training tokens), final loss {f["draft"]["final_loss"]}.
  Its own report (acceptance and teacher-forced accuracy on the held-out tenth of its data): `draft/train_report.json`.

## Run time

{t["total_s"] / 60:.1f} min in all on a shared 2-core CPU, {r["threads"]} torch thread: tokenizer {t["tokenizer_s"]} s,
target {t["target_s"]} s, draft {t["draft_s"]} s (target continuations, hidden states, training, evaluation),
held-out measurement {t["measure_s"]} s.
torch {f["torch"]}.

## Reproduce

    python -m eagle3_trt.train.make_tiny_pair{"" if family.name == "llama" else " --family " + family.name} -o models/{f.get("name", "tiny")} --overwrite

Seeds, file list and step counts are fixed; another Python version's standard library differs
slightly, so the committed weights are the reference. All figures above are in `tiny_pair.json`.
"""


def remeasure_pair(out: Path) -> dict:
    """Measure the committed pair again and rewrite its card; training facts are kept as recorded."""
    facts = json.loads((out / "tiny_pair.json").read_text())
    r = Recipe(**facts["recipe"])
    torch.set_num_threads(r.threads)
    _, held, _ = read_corpus()
    facts["acceptance_heldout"] = measure_committed(out, r, held)
    facts["sizes"] = {"target_bytes": dir_size(out / "target"), "draft_bytes": dir_size(out / "draft")}
    facts["draft"]["params"] = draft_params(out / "draft")
    (out / "tiny_pair.json").write_text(json.dumps(facts, indent=2) + "\n")
    (out / "MODEL_CARD.md").write_text(model_card(facts))
    return facts


@click.command("make-tiny-pair")
@click.option("-o", "--output", "out", default="models/tiny", show_default=True, type=click.Path(path_type=Path))
@click.option("--overwrite", is_flag=True)
@click.option("--target-steps", type=int, default=None, help="Override the recipe (for quick experiments).")
@click.option("--draft-steps", type=int, default=None, help="Override the recipe (for quick experiments).")
@click.option("--remeasure", is_flag=True, help="Only measure the existing pair in OUTPUT again and rewrite its card.")
@click.option(
    "--family",
    type=click.Choice(sorted(RECIPES)),
    default="llama",
    show_default=True,
    help="The target's family and its recipe (qwen3: models/tiny-qwen3, gpt-oss: models/tiny-gpt-oss).",
)
def main(out: Path, overwrite: bool, target_steps: int | None, draft_steps: int | None, remeasure: bool, family: str) -> None:
    if remeasure:
        facts = remeasure_pair(out)
        acc = facts["acceptance_heldout"]
        click.echo(json.dumps({k: v["acceptance_length"] if isinstance(v, dict) else v for k, v in acc.items()}, indent=1))
        return
    r = RECIPES[family]
    over = {k: v for k, v in (("target_steps", target_steps), ("draft_steps", draft_steps)) if v is not None}
    if over:
        r = Recipe(**{**asdict(r), **over})
    facts = make(out, r, overwrite, log=lambda m: click.echo(m, err=True))
    acc = facts["acceptance_heldout"][f"K={r.max_draft_len}"]
    click.echo(f"wrote {out}: acceptance length {acc['acceptance_length']:.2f} (K={r.max_draft_len}), {facts['timings']['total_s'] / 60:.1f} min")


if __name__ == "__main__":
    main()
