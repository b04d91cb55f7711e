"""`train-draft` end to end: data -> target hidden states -> TTT training -> export -> held-out acceptance.

Work files (hidden-state cache, checkpoints) live in ``<out>.work/`` beside the output, so an
interrupted run continues with ``--resume``; the output directory itself appears only when
everything succeeded.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from eagle3_trt.atomic import make_dirs
from eagle3_trt.convert.draft_format import DraftCheckpoint, head_hooks, load_draft
from eagle3_trt.convert.load import load_target
from eagle3_trt.convert.target import TargetInfo, read_target
from eagle3_trt.core.draft import Eagle3Draft
from eagle3_trt.errors import UserError
from eagle3_trt.formats.checkpoint_io import read_json
from eagle3_trt.formats.draft_config import expected_shapes, target_token_ids
from eagle3_trt.speculative.registry import DEFAULT_METHOD, METHODS, trainable_methods
from eagle3_trt.train import data as data_mod
from eagle3_trt.train import distributed
from eagle3_trt.train.distributed import Dist
from eagle3_trt.train.draft_vocab import DraftVocab, build_draft_vocab, count_tokens, coverage
from eagle3_trt.train.evaluate import greedy_generate, measure_acceptance, torch_threads
from eagle3_trt.train.export import draft_config_for, export_draft, export_files
from eagle3_trt.train.hidden_states import cache_key, check_aux_layers, collect, target_tokenizer
from eagle3_trt.train.progress_bars import Bars
from eagle3_trt.train.trainer import TargetHead, Trainer, TrainSettings, new_draft, teacher_forced_accuracy


@dataclass
class TrainDraftOptions:
    target: Path
    data: Path
    out: Path
    init: Path | None = None
    steps: int = 2000
    max_draft_len: int = 3
    draft_vocab: int = 32000
    device: str = "auto"
    resume: bool = False
    generate: bool = False
    gen_tokens: int = 256
    seq_len: int = 512
    batch_size: int = 8
    lr: float | None = None  # default: 3e-4 fresh, 1e-4 when fine-tuning --init
    seed: int = 0
    aux_layers: tuple[int, ...] | None = None
    eval_fraction: float = 0.1
    eval_samples: int = 16
    eval_tokens: int = 64
    eval_prompt_len: int = 64
    intermediate_size: int | None = None
    save_every: int = 200
    overwrite: bool = False
    keep_work: bool = False
    work_dir: Path | None = None
    quiet: bool = False
    threads: int | None = None  # torch intra-op threads on CPU (None: torch's default)
    parallel: str = "auto"  # under torchrun: auto | ddp | fsdp (see train/distributed.py)
    hidden_states: Path | None = None  # train from this cache (train/from_cache.py) instead of running the target
    heldout_hidden_states: Path | None = None
    extra_files: dict[str, str] = field(default_factory=dict)
    method: str = DEFAULT_METHOD  # speculative/registry.trainable_methods(): chain (EAGLE-3) or a method with training hooks
    mask_token_id: int | None = None  # a method whose head has mask slots: their token id (None: its training hook's default)

    @property
    def work(self) -> Path:
        return Path(self.work_dir) if self.work_dir else Path(str(self.out) + ".work")


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError("--device", f"{device} requested but torch sees no CUDA device", "use --device cpu")
    if device != "cpu" and not device.startswith("cuda"):
        raise UserError("--device", f"{device!r} is not cpu or cuda", "use --device cpu or --device cuda")
    return device


def check_init_fits(ckpt: DraftCheckpoint, info: TargetInfo, aux: tuple[int, ...], method: str = DEFAULT_METHOD) -> None:
    """One clear error when a --init head cannot serve this target, or is another method's head than the one
    trained (an EAGLE-3 head starts any method; a method's own head only its own)."""
    c = ckpt.config
    where = str(ckpt.path)
    hint = "pass a head trained for this target, or leave out --init to train a fresh one"
    if ckpt.method is not None and ckpt.method != method:
        raise UserError(where, f"is a {ckpt.method} head; this trains {method} heads", f"pass --method {ckpt.method}, or an EAGLE-3 head to start from")
    if any(k.endswith(("weight_scale", "input_scale")) for k in ckpt.tensors) or "quantization_config" in ckpt.raw_config:
        raise UserError(where, "is a quantized head (FP8/NVFP4 scales present)", "fine-tune the BF16 head it was made from, then quantize again")
    problems = []
    if c.vocab_size != info.vocab_size:
        problems.append(f"vocab_size {c.vocab_size} != target {info.vocab_size}")
    if c.target_hidden_size != info.hidden_size:
        problems.append(f"target_hidden_size {c.target_hidden_size} != target hidden_size {info.hidden_size}")
    if c.hidden_size != info.hidden_size:
        problems.append(f"hidden_size {c.hidden_size} != target hidden_size {info.hidden_size} (the head shares the target's embeddings)")
    if c.num_aux_layers != len(aux):
        problems.append(f"fc takes {c.num_aux_layers} aux layers, the target captures {len(aux)}")
    if problems:
        raise UserError(where, "does not fit the target: " + "; ".join(problems), hint)
    shapes = expected_shapes(c)
    for name, shape in shapes.items():
        t = ckpt.tensors.get(name)
        if t is None:
            raise UserError(where, f"tensor {name} is missing", hint)
        if tuple(t.shape) != shape:
            raise UserError(where, f"tensor {name} has shape {list(t.shape)}, expected {list(shape)} for its config", hint)
    d2t = ckpt.tensors.get("d2t")
    if d2t is not None:
        tid = torch.arange(d2t.numel()) + d2t.to(torch.int64)
        if int(tid.min()) < 0 or int(tid.max()) >= info.vocab_size:
            raise UserError(where, "d2t maps draft ids outside the target vocabulary", hint)


def _run_key(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def train_draft(o: TrainDraftOptions) -> dict:
    """The whole run; under torchrun every rank calls it, rank 0 evaluates, exports and reports
    (the other ranks return ``{"rank": r}``)."""
    with torch_threads(o.threads):
        try:
            return _train_draft(o)
        finally:
            distributed.stop()


def _train_draft(o: TrainDraftOptions) -> dict:
    t_start = time.time()
    device = resolve_device(o.device)
    d, device = distributed.start(device, o.parallel)
    # --hidden-states runs train/from_cache.train_draft_from_cache (the CLI dispatches)
    assert o.hidden_states is None, "train_draft_from_cache trains from a cache"
    info = read_target(Path(o.target))
    target_cfg = read_json(Path(o.target) / "config.json")
    init, aux = _check_request(o, info)
    records = data_mod.load_records(Path(o.data), chars_per_record=o.seq_len * 4)

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    timings: dict[str, float] = {}
    with Bars(o.quiet or not d.main) as bars:
        prep = _prepare(o, info, init, aux, records, device, dtype, timings, bars, d)
        head = _target_head(prep.target, device, dtype)
        hooks = head_hooks(init) if init is not None else None
        if init is not None:
            cfg = replace(init.config, aux_layer_ids=aux)  # record the layers it was trained on
            # a method's own head (check_init_fits: this method's) is fine-tuned whole, its own tensors included
            draft = hooks.build(init, torch.float32, "cpu")[0] if hooks is not None else Eagle3Draft.from_checkpoint(init, dtype=torch.float32, device="cpu")
        else:
            cfg = draft_config_for(info, target_cfg, prep.vocab.size, aux, o.intermediate_size)
            draft = new_draft(cfg, prep.vocab, head, o.seed)
        training = trainable_methods()[o.method]  # None: an EAGLE-3 head (TTT); else the method's hooks
        if training is not None and hooks is None:  # started from an EAGLE-3 head (fresh or --init)
            draft = training.make_head(draft, head.embed, o.seed, o.mask_token_id, target_tokenizer(Path(o.target)))
        d = distributed.decide(d, o.parallel, sum(p.numel() for p in draft.parameters()), device)
        prompts = data_mod.eval_prompts(prep.held_w, o.eval_samples, o.eval_prompt_len, o.seed)

        def evaluate(label: str, draft: Eagle3Draft) -> dict:
            return _acceptance(label, draft, prep, head, prompts, o, device, dtype, bars)

        before = None
        if init is not None and d.main:
            t = time.time()
            before = evaluate("before", draft)
            timings["eval_before_s"] = round(time.time() - t, 2)

        settings, trainer, resumed_from = _train(o, draft, head, prep, init is not None, device, timings, bars, d)
        draft = _trained_head(trainer, cfg)
        if not d.main:
            return {"rank": d.rank}

        t = time.time()
        after = evaluate("after", draft)
        timings["eval_s"] = round(time.time() - t, 2)

    report = _report(
        o, aux, prep, len(prompts), settings, device, resumed_from, trainer, before, after, {**timings, "total_s": round(time.time() - t_start, 2)}
    )
    report["processes"] = d.world
    report["parallel"] = d.mode
    report["method"] = o.method
    files = {"train_report.json": json.dumps(report, indent=2) + "\n", **o.extra_files}
    if training is None:
        export_draft(draft, cfg, prep.vocab, Path(o.out), target_cfg, files, overwrite=o.overwrite)
    else:  # the method's own layout (its training hook's ``files``: what its serving engine reads)
        maps = (None, None) if prep.vocab.full else (prep.vocab.d2t(), prep.vocab.t2d())
        config, tensors = training.files(draft, cfg, *maps, target_token_ids(target_cfg), o.max_draft_len, str(o.target))
        export_files(Path(o.out), config, tensors, files, overwrite=o.overwrite)
    if not o.keep_work:
        shutil.rmtree(o.work, ignore_errors=True)
    return report


def _check_request(o: TrainDraftOptions, info: TargetInfo) -> tuple[DraftCheckpoint | None, tuple[int, ...]]:
    """The --init head (or None) and the target layers the head reads, refused early when they cannot work."""
    init = load_draft(Path(o.init)) if o.init else None
    aux_req = o.aux_layers
    if aux_req is None and init is not None and init.config.aux_layer_ids:
        aux_req = tuple(init.config.aux_layer_ids)
    aux = check_aux_layers(info, aux_req)
    if init is not None:
        check_init_fits(init, info, aux, o.method)
    if o.steps < 1:
        raise UserError("--steps", f"{o.steps} is not a positive number of steps")
    if o.max_draft_len < 1:
        raise UserError("--max-draft-len", f"{o.max_draft_len} must be at least 1")
    if o.method not in trainable_methods():
        raise UserError("--method", f"{o.method!r} does not train a head", f"use one of {', '.join(sorted(trainable_methods()))}")
    training = trainable_methods()[o.method]
    if training is not None:
        training.check(o.mask_token_id, info.vocab_size)
    if o.method != DEFAULT_METHOD and o.parallel == "fsdp":
        raise UserError("--parallel", f"fsdp with --method {o.method}: the sharded head is gathered as an EAGLE-3 head", "use --parallel ddp")
    if Path(o.out).exists() and not o.overwrite:
        raise UserError(o.out, "output directory exists", "pass --overwrite or choose another -o")
    return init, aux


@dataclass
class _Prepared:
    """The target and what training reads from it: token windows, draft vocabulary, cached hidden states."""

    target: Any
    stop_ids: tuple[int, ...]
    train_w: list[data_mod.Window]
    held_w: list[data_mod.Window]
    counts: Any
    vocab: DraftVocab
    seq_len: int
    caches: dict[str, Any]


def _trained_head(trainer: Trainer, cfg) -> Eagle3Draft:
    """The trained head as one whole module on every rank (FSDP: the shards gathered, a collective)."""
    if trainer.dist.mode != "fsdp":
        return trainer.draft
    full = trainer.full_state()
    draft = Eagle3Draft(cfg).float()
    draft.load_state_dict(full)
    return draft


def _prepare(
    o: TrainDraftOptions,
    info: TargetInfo,
    init: DraftCheckpoint | None,
    aux: tuple[int, ...],
    records,
    device: str,
    dtype,
    timings: dict,
    bars: Bars,
    d: Dist | None = None,
) -> _Prepared:
    t = time.time()
    # the target as the runtime runs it: a quantized ModelOpt export is dequantized with its
    # activations fake-quantized, so training sees the pair that will serve
    target = load_target(Path(o.target), device=device, dtype=dtype, aux_layer_ids=aux)
    tokenizer = target_tokenizer(Path(o.target))
    stop_ids = tuple(info.eos_token_ids)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    train_w, held_w = _windows(o, target, tokenizer, records, stop_ids, pad, bars)
    timings["prepare_s"] = round(time.time() - t, 2)

    # -- draft vocabulary --
    counts = count_tokens(w.ids for w in train_w)
    if init is not None:
        d2t = init.tensors.get("d2t")
        vocab = DraftVocab.from_d2t(d2t, info.vocab_size) if d2t is not None else DraftVocab(torch.arange(info.vocab_size), info.vocab_size)
    else:
        specials = [i for i in tokenizer.all_special_ids if i is not None]
        vocab = build_draft_vocab(counts, info.vocab_size, o.draft_vocab, specials)

    # -- target hidden states, cached --
    t = time.time()
    seq_len = min(o.seq_len, max(len(w.ids) for w in train_w + held_w))
    make_dirs(o.work)
    caches = {}
    d = d or Dist()
    if not d.main:
        d.barrier()  # rank 0 writes the caches; the others read them (the same windows, the same key)
    for name, ws in (("train", train_w), ("heldout", held_w)):
        ids = [w.ids for w in ws]
        key = cache_key(Path(o.target), aux, seq_len, ids)
        adv = bars.task(f"hidden states ({name})", len(ids))
        caches[name] = collect(target, ids, o.work / f"cache_{name}", key, seq_len, pad, o.batch_size, on_batch=adv)
    if d.main:
        d.barrier()
    timings["hidden_states_s"] = round(time.time() - t, 2)
    return _Prepared(target, stop_ids, train_w, held_w, counts, vocab, seq_len, caches)


def _windows(o: TrainDraftOptions, target, tokenizer, records, stop_ids: tuple[int, ...], pad: int, bars: Bars) -> tuple[list, list]:
    """Training and held-out token windows (with the target's own responses when --generate)."""
    enc = data_mod.Encoder(tokenizer, o.seq_len, o.eval_prompt_len)
    train_recs, held_recs = data_mod.split_records(records, o.eval_fraction, o.seed)
    gen = None
    if o.generate:
        adv = bars.task("target responses (chats)", sum(len(r.messages or ()) for r in train_recs if r.prompts_only))

        def gen(prompt: list[int]) -> list[int]:
            (out,) = greedy_generate(target, [prompt], o.gen_tokens, stop_ids, pad)
            adv(1)
            return out

    train_w = [w for r in train_recs for w in enc.windows(r, gen)]
    held_w = [w for r in held_recs for w in enc.windows(r, None)]
    if not train_w and not held_w:
        raise UserError(o.data, "no usable text: every record tokenizes to fewer than 2 tokens", data_mod.FORMAT_HINT)
    if not held_w:  # one long document: hold out windows instead of records
        if len(train_w) < 2:
            raise UserError(o.data, "too little text to hold out an evaluation split (one window)", "add more text, or lower --seq-len")
        n_eval = max(1, round(o.eval_fraction * len(train_w)))
        held_w, train_w = train_w[-n_eval:], train_w[:-n_eval]
    if not train_w:
        train_w, held_w = held_w[:-1] or held_w, held_w[-1:]
    if o.generate:
        _continue_text(o, target, train_w, stop_ids, pad, bars)
    return train_w, held_w


def _continue_text(o: TrainDraftOptions, target, train_w: list, stop_ids: tuple[int, ...], pad: int, bars: Bars) -> None:
    # Raw text: the target continues each window's opening, so the head learns the
    # target's own greedy text, which is what it is asked to predict when serving.
    todo = [i for i, w in enumerate(train_w) if w.from_text and len(w.ids) > o.eval_prompt_len]
    adv = bars.task("target continuations (text)", len(todo))
    n_new = max(1, min(o.gen_tokens, o.seq_len - o.eval_prompt_len))
    conts = greedy_generate(target, [train_w[i].ids[: o.eval_prompt_len] for i in todo], n_new, stop_ids, pad, o.batch_size, on_batch=lambda n: adv(n))
    for i, c in zip(todo, conts):
        p = train_w[i].ids[: o.eval_prompt_len]
        train_w[i] = data_mod.Window(ids=p + c, prompt=p, from_text=False)


def _target_head(target, device: str, dtype) -> TargetHead:
    return TargetHead(
        embed=target.hf.model.embed_tokens.weight.detach().to(torch.float32 if device == "cpu" else dtype),
        lm_head=target.hf.lm_head.weight.detach().to(torch.float32 if device == "cpu" else dtype),
        norm=target.hf.model.norm.weight.detach().float(),
    )


def _acceptance(label: str, draft: Eagle3Draft, prep: _Prepared, head: TargetHead, prompts, o: TrainDraftOptions, device: str, dtype, bars: Bars) -> dict:
    adv = bars.task(f"acceptance ({label})", len(prompts))
    draft.eval()
    d = draft.to(device, dtype)
    training = trainable_methods()[o.method]
    kwargs = METHODS[o.method].engine_kwargs(d) if training is not None else None  # type: ignore[attr-defined]  # a method with training hooks has them
    rep = measure_acceptance(prep.target, d, prompts, o.eval_tokens, o.max_draft_len, prep.stop_ids, on_prompt=lambda i: adv(1), engine_kwargs=kwargs)
    unroll = training.unroll if training is not None else None
    tf = teacher_forced_accuracy(d, head, prep.vocab, prep.caches["heldout"], o.max_draft_len, o.batch_size, device, dtype, unroll)
    draft.to(torch.float32)
    return {**rep.to_dict(), "teacher_forced_accuracy": [round(x, 4) for x in tf]}


def _train(
    o: TrainDraftOptions, draft: Eagle3Draft, head: TargetHead, prep: _Prepared, fine_tune: bool, device: str, timings: dict, bars: Bars, d: Dist
) -> tuple[TrainSettings, Trainer, int]:
    """Train (or continue a --resume'd run); returns the settings, the trainer and the step resumed from."""
    settings = TrainSettings(
        steps=o.steps,
        batch_size=o.batch_size,
        lr=o.lr or (1e-4 if fine_tune else 3e-4),
        max_draft_len=o.max_draft_len,
        seed=o.seed,
        save_every=o.save_every,
    )
    vocab = prep.vocab
    run_key = _run_key(prep.caches["train"].meta.key, asdict(settings), str(o.init), vocab.target_ids.tolist()[:64], vocab.size, o.method, o.mask_token_id)
    training = trainable_methods()[o.method]
    unroll = training.unroll if training is not None else None
    trainer = Trainer(draft, head, vocab, prep.caches["train"], settings, o.work / "ckpt", device, run_key, d, unroll)
    resumed_from = 0
    if o.resume and trainer.resume():
        resumed_from = trainer.step
    t = time.time()
    adv = bars.task("training", o.steps)
    adv(resumed_from)
    trainer.train(on_step=lambda s, r: adv(1, f"loss {r['loss']:.3f} acc {'/'.join(f'{a:.2f}' for a in r['acc'])}"))
    timings["train_s"] = round(time.time() - t, 2)
    return settings, trainer, resumed_from


def _report(
    o: TrainDraftOptions, aux, prep: _Prepared, n_prompts: int, settings, device: str, resumed_from: int, trainer: Trainer, before, after, timings: dict
) -> dict:
    return {
        "schema": 1,
        "target": str(o.target),
        "data": str(o.data),
        "init": str(o.init) if o.init else None,
        "aux_layer_ids": list(aux),
        "max_draft_len": o.max_draft_len,
        "draft_vocab_size": prep.vocab.size,
        "draft_vocab_coverage": round(coverage(prep.counts, prep.vocab), 4),
        "seq_len": prep.seq_len,
        "train_windows": len(prep.train_w),
        "heldout_windows": len(prep.held_w),
        "eval_prompts": n_prompts,
        "eval_tokens": o.eval_tokens,
        "generated_responses": bool(o.generate),
        "settings": asdict(settings),
        "device": device,
        "resumed_from_step": resumed_from,
        "rows_per_rank": trainer.rows_per_rank,  # what each rank trained on (its share of every global batch)
        "tokens_per_rank": trainer.tokens_per_rank,
        "final_loss": trainer.history[-1]["loss"] if trainer.history else None,
        "history": trainer.history,  # loss and per-step accuracy every 10 steps (the global batch under torchrun)
        "before": before,
        "after": after,
        "timings": timings,
    }


def summary_lines(report: dict) -> list[str]:
    if report.get("hidden_states"):  # trained from a cache: no target here to measure acceptance with
        tf = report.get("heldout_teacher_forced_accuracy")
        return [
            f"trained {report['settings']['steps']} steps on {report['train_windows']} cached windows ({report['producer']}), "
            f"{report['processes']} process(es) ({report['parallel']}), final loss {report['final_loss']}",
            "held-out teacher-forced top-1 " + (" ".join(f"{i + 1}:{x:.2f}" for i, x in enumerate(tf)) if tf else "not measured (no --heldout-hidden-states)"),
            "measure served acceptance with `eagle3-trt alpha` on the bundle",
        ]
    a = report["after"]
    lines = [
        f"held-out acceptance length {a['acceptance_length']:.2f} tokens/pass (K={report['max_draft_len']}, {a['prompts']} prompts, {a['tokens']} tokens)",
        "per-step acceptance " + " ".join(f"{i + 1}:{x:.2f}" for i, x in enumerate(a["per_step"])),
        "teacher-forced top-1 " + " ".join(f"{i + 1}:{x:.2f}" for i, x in enumerate(a["teacher_forced_accuracy"])),
    ]
    if report.get("before"):
        b = report["before"]
        lines.insert(1, f"before training: {b['acceptance_length']:.2f} tokens/pass")
    return lines
