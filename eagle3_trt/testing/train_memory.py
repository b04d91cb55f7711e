"""Peak memory of one rank training the head from a hidden-state cache, as ``train-draft
--hidden-states`` trains it (train/from_cache.py's setup, ``Trainer``, DDP or FSDP under torchrun),
for comparing with what ``plan --train`` prices (tests/test_train_plan.py).

The peak is counted from torch's allocator (``torch.profiler`` with ``profile_memory``: every tensor
allocation and free on this rank, in order), not from the process's RSS, so a tiny head's few
megabytes are measured exactly: what was live before the window (the head's fp32 weights, the
target's frozen embedding and lm_head) plus the highest running sum of what the window allocated
and freed (the wrapper, gradients, DDP's buckets or FSDP's gathered weights, AdamW moments, the
batches and the TTT unroll's activations). Run under ``torchrun``:

    torchrun --nproc-per-node 2 -m eagle3_trt.testing.train_memory --target T --hidden-states C --parallel ddp --out DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from eagle3_trt.convert.target import read_target
from eagle3_trt.formats.checkpoint_io import read_json
from eagle3_trt.formats.draft_config import target_token_ids, trtllm_config
from eagle3_trt.train import distributed
from eagle3_trt.train.draft_vocab import build_draft_vocab, count_tokens
from eagle3_trt.train.export import draft_config_for
from eagle3_trt.train.from_cache import _token_rows, target_head_from_files
from eagle3_trt.train.hidden_states import HiddenCache
from eagle3_trt.train.trainer import Trainer, TrainSettings, new_draft


def allocator_peak(timeline) -> int:
    """The highest running sum of allocations minus frees in a ``MemoryProfile`` timeline."""
    from torch.profiler._memory_profiler import Action  # private torch module: imported only where a profile is read

    live = peak = 0
    for _t, action, _key, size in timeline:
        if action == Action.CREATE:
            live += size
        elif action == Action.DESTROY:
            live -= size
        peak = max(peak, live)
    return peak


def measure(target: Path, cache_dir: Path, parallel: str, batch_size: int, steps: int, draft_vocab: int, work: Path) -> dict:
    d, device = distributed.start("cpu", parallel)
    try:
        info = read_target(target)
        cache = HiddenCache(cache_dir, in_memory=False)  # a batch at a time, as a 70B cache is read
        aux = tuple(cache.meta.aux_layer_ids)
        head = target_head_from_files(target, info, torch.float32)
        vocab = build_draft_vocab(count_tokens(_token_rows(cache)), info.vocab_size, draft_vocab, [])
        cfg = draft_config_for(info, read_json(target / "config.json"), vocab.size, aux, None)
        draft = new_draft(cfg, vocab, head, 0)
        params = sum(p.numel() for p in draft.parameters())
        d = distributed.decide(d, parallel, params, device)
        before = params * 4 + head.embed.numel() * head.embed.element_size() + head.lm_head.numel() * head.lm_head.element_size()
        settings = TrainSettings(steps=steps, batch_size=batch_size, save_every=0)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
            trainer = Trainer(draft, head, vocab, cache, settings, work / f"ckpt{d.rank}", device, "probe", d)
            trainer.train()
        peak = allocator_peak(prof._memory_profile().timeline)
        wrapped: dict = {}
        m = trainer.step_module
        if d.mode == "ddp":  # what torch's reducer built: its buckets' sizes and settings
            log = m._get_ddp_logging_data()
            wrapped = {
                "ddp_bucket_bytes": sum(int(x) for x in str(log["bucket_sizes"]).split(",")),
                "ddp_bucket_cap_bytes": int(log["bucket_cap_bytes"]),
                "ddp_gradient_as_bucket_view": bool(log["gradient_as_bucket_view"]),
            }
        elif d.mode == "fsdp":
            from torch.distributed.fsdp import FSDPModule  # local: only FSDP runs need it

            wrapped = {"fsdp_units": sum(isinstance(x, FSDPModule) for x in m.modules())}
        return {
            **wrapped,
            "rank": d.rank,
            "world": d.world,
            "mode": d.mode,
            "draft_params": params,
            "draft_config": trtllm_config(cfg, target_token_ids(read_json(target / "config.json"))),
            "draft_vocab": vocab.size,
            "seq_len": cache.meta.seq_len,
            "local_batch": trainer.rows_done // steps,
            "before_bytes": before,
            "window_peak_bytes": peak,
            "peak_bytes": before + peak,
        }
    finally:
        distributed.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--hidden-states", type=Path, required=True)
    ap.add_argument("--parallel", default="ddp")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--draft-vocab", type=int, default=128)
    ap.add_argument("--out", type=Path, required=True, help="directory: rank_<r>.json per rank")
    a = ap.parse_args()
    torch.set_num_threads(1)
    rep = measure(a.target, a.hidden_states, a.parallel, a.batch_size, a.steps, a.draft_vocab, a.out)
    (a.out / f"rank_{rep['rank']}.json").write_text(json.dumps(rep) + "\n")


if __name__ == "__main__":
    main()
