"""`train-draft --hidden-states DIR`: train the head from a hidden-state cache an engine wrote
(``hidden-states collect --backend hf|trtllm``, or converted from ModelOpt / speculators), without
loading the target: only its config, tokenizer, embedding, lm_head and final norm are read. This is
how a 70B target's head is trained under torchrun: the target runs in its engine, once.

Evaluation is teacher-forced top-1 agreement on ``--heldout-hidden-states`` (when given); the
acceptance the head gets when served is measured afterwards by ``alpha`` on the bundle.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path

import torch
from safetensors import safe_open

from eagle3_trt.convert.draft_format import load_draft
from eagle3_trt.convert.target import TargetInfo, read_target
from eagle3_trt.core.draft import Eagle3Draft
from eagle3_trt.errors import UserError
from eagle3_trt.formats.checkpoint_io import iter_tensors, read_json, weight_files
from eagle3_trt.formats.hidden_states import shard_name
from eagle3_trt.train import distributed
from eagle3_trt.train.draft_vocab import DraftVocab, build_draft_vocab, count_tokens, coverage
from eagle3_trt.train.evaluate import torch_threads
from eagle3_trt.train.export import draft_config_for, export_draft
from eagle3_trt.train.hidden_states import HiddenCache, check_aux_layers, target_tokenizer
from eagle3_trt.train.progress_bars import Bars
from eagle3_trt.train.train_draft import TrainDraftOptions, _Prepared, _train, _trained_head, check_init_fits, resolve_device
from eagle3_trt.train.trainer import TargetHead, new_draft, teacher_forced_accuracy

HEAD_TENSORS = ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight")


def target_head_from_files(target_dir: Path, info: TargetInfo, dtype: torch.dtype) -> TargetHead:
    """The target's embedding, lm_head and final norm, read alone from its weight files."""
    found: dict[str, torch.Tensor] = {}
    for f in weight_files(Path(target_dir)):
        if f.suffix == ".safetensors":
            with safe_open(str(f), framework="pt") as h:
                for k in HEAD_TENSORS:
                    if k in h.keys():
                        found[k] = h.get_tensor(k)
        else:
            found.update({k: t for k, t in iter_tensors(f) if k in HEAD_TENSORS})
    if "lm_head.weight" not in found and "model.embed_tokens.weight" in found:
        found["lm_head.weight"] = found["model.embed_tokens.weight"]  # tied embeddings
    missing = [k for k in HEAD_TENSORS if k not in found]
    if missing:
        raise UserError(target_dir, f"no {', '.join(missing)} in the weight files", "point --target at the model the hidden states came from")
    if any(t.dtype.itemsize == 1 for t in found.values()):
        raise UserError(target_dir, "embedding or lm_head is stored quantized (8-bit or less)", "point --target at the BF16 model the export was made from")
    return TargetHead(embed=found["model.embed_tokens.weight"].to(dtype), lm_head=found["lm_head.weight"].to(dtype), norm=found["model.norm.weight"].float())


def _token_rows(cache: HiddenCache) -> Iterator[list[int]]:
    """Each row's trained token ids, reading only ``input_ids`` and ``real`` of each shard (a 70B
    cache is terabytes of hidden states; the draft vocabulary needs the tokens alone)."""
    for i in range(len(cache.counts)):
        with safe_open(str(cache.dir / shard_name(i)), framework="pt") as h:
            ids, real = h.get_tensor("input_ids"), h.get_tensor("real")
        for r in range(ids.shape[0]):
            yield ids[r][real[r]].tolist()


def _open(cache_dir: Path, info: TargetInfo, option: str) -> HiddenCache:
    if not (Path(cache_dir) / "manifest.json").is_file():
        raise UserError(option, f"{cache_dir} has no manifest.json", "write one with `eagle3-trt hidden-states collect` or `hidden-states convert`")
    cache = HiddenCache(Path(cache_dir))
    if cache.meta.target_hidden_size != info.hidden_size:
        raise UserError(
            Path(cache_dir) / "manifest.json",
            f"target_hidden_size {cache.meta.target_hidden_size} != the target's hidden_size {info.hidden_size}",
            "pass the --target the states came from",
        )
    return cache


def train_draft_from_cache(o: TrainDraftOptions) -> dict:
    """``train_draft`` for ``o.hidden_states``; under torchrun every rank calls it, rank 0 reports."""
    with torch_threads(o.threads):
        try:
            d, device = distributed.start(resolve_device(o.device), o.parallel)
            return _from_cache(o, d, device)
        finally:
            distributed.stop()


def _from_cache(o: TrainDraftOptions, d: distributed.Dist, device: str) -> dict:
    t_start = time.time()
    info = read_target(Path(o.target))
    target_cfg = read_json(Path(o.target) / "config.json")
    assert o.hidden_states is not None
    cache = _open(o.hidden_states, info, "--hidden-states")
    aux = check_aux_layers(info, tuple(cache.meta.aux_layer_ids))
    if o.aux_layers is not None and tuple(sorted(o.aux_layers)) != aux:
        raise UserError("--aux-layers", f"{list(o.aux_layers)} but the cache holds layers {list(aux)}", "leave --aux-layers out with --hidden-states")
    held = _open(o.heldout_hidden_states, info, "--heldout-hidden-states") if o.heldout_hidden_states else None
    if held is not None and tuple(held.meta.aux_layer_ids) != aux:
        raise UserError(
            "--heldout-hidden-states", f"holds layers {held.meta.aux_layer_ids}, the training cache {list(aux)}", "collect both with the same layers"
        )
    init = load_draft(Path(o.init)) if o.init else None
    if init is not None:
        check_init_fits(init, info, aux)
    if Path(o.out).exists() and not o.overwrite:
        raise UserError(o.out, "output directory exists", "pass --overwrite or choose another -o")
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    head = target_head_from_files(Path(o.target), info, dtype)
    counts = count_tokens(_token_rows(cache))
    if init is not None:
        d2t = init.tensors.get("d2t")
        vocab = DraftVocab.from_d2t(d2t, info.vocab_size) if d2t is not None else DraftVocab(torch.arange(info.vocab_size), info.vocab_size)
        cfg = replace(init.config, aux_layer_ids=aux)
        draft = Eagle3Draft.from_checkpoint(init, dtype=torch.float32, device="cpu")
    else:
        specials = [i for i in target_tokenizer(Path(o.target)).all_special_ids if i is not None]
        vocab = build_draft_vocab(counts, info.vocab_size, o.draft_vocab, specials)
        cfg = draft_config_for(info, target_cfg, vocab.size, aux, o.intermediate_size)
        draft = new_draft(cfg, vocab, head, o.seed)
    d = distributed.decide(d, o.parallel, sum(p.numel() for p in draft.parameters()), device)
    prep = _Prepared(None, tuple(info.eos_token_ids), [], [], counts, vocab, cache.meta.seq_len, {"train": cache, "heldout": held})
    timings: dict[str, float] = {}
    with Bars(o.quiet or not d.main) as bars:
        settings, trainer, resumed_from = _train(o, draft, head, prep, init is not None, device, timings, bars, d)
    draft = _trained_head(trainer, cfg)
    if not d.main:
        return {"rank": d.rank}
    tf = None
    if held is not None:
        tf = [round(x, 4) for x in teacher_forced_accuracy(draft.to(device), head, vocab, held, o.max_draft_len, o.batch_size, device, dtype)]
        draft.to("cpu", torch.float32)
    report = {
        "schema": 1,
        "target": str(o.target),
        "hidden_states": str(o.hidden_states),
        "heldout_hidden_states": str(o.heldout_hidden_states) if o.heldout_hidden_states else None,
        "producer": cache.meta.producer,
        "init": str(o.init) if o.init else None,
        "aux_layer_ids": list(aux),
        "max_draft_len": o.max_draft_len,
        "draft_vocab_size": vocab.size,
        "draft_vocab_coverage": round(coverage(counts, vocab), 4),
        "seq_len": cache.meta.seq_len,
        "train_windows": len(cache),
        "heldout_windows": len(held) if held is not None else 0,
        "settings": asdict(settings),
        "device": device,
        "processes": d.world,
        "parallel": d.mode,
        "resumed_from_step": resumed_from,
        "rows_per_rank": trainer.rows_per_rank,  # what each rank trained on (its share of every global batch)
        "tokens_per_rank": trainer.tokens_per_rank,
        "final_loss": trainer.history[-1]["loss"] if trainer.history else None,
        "history": trainer.history,
        "heldout_teacher_forced_accuracy": tf,
        "timings": {**timings, "total_s": round(time.time() - t_start, 2)},
    }
    export_draft(draft, cfg, vocab, Path(o.out), target_cfg, {"train_report.json": json.dumps(report, indent=2) + "\n", **o.extra_files}, overwrite=o.overwrite)
    if not o.keep_work:
        shutil.rmtree(o.work, ignore_errors=True)
    return report
