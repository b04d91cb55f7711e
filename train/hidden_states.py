"""The target's side of draft training: aux hidden states, cached to disk as safetensors shards.

EAGLE-3 feeds the draft the outputs of three target decoder layers (TensorRT-LLM convention:
``aux_layer_ids`` = outputs of layers i, 0-based), and trains it against the target's own
next-token distribution. Both come from one teacher-forced target pass per window; they are
written once to shards (aux states and the target's post-norm last hidden state, bf16) so that
training runs many epochs without the target and a killed run restarts from the cache.
The target's logits are recomputed from the last hidden state with its lm_head at train time:
that is far smaller on disk than logits over a 128k vocabulary.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from eagle3_trt.convert.target import TargetInfo, read_target
from eagle3_trt.errors import UserError

SHARD_BYTES = 256 << 20
IN_MEMORY_BYTES = 1 << 30
CACHE_SCHEMA = 1


def check_aux_layers(info: TargetInfo, aux: tuple[int, ...] | None) -> tuple[int, ...]:
    """The three capture layers (TensorRT-LLM convention), validated against the target depth."""
    L = info.num_hidden_layers
    ids = tuple(aux) if aux is not None else info.default_aux_layers()
    where = f"{info.path}/config.json:num_hidden_layers"
    if len(ids) != 3 or len(set(ids)) != 3 or min(ids) < 0 or max(ids) >= L:
        if aux is None:
            raise UserError(
                where,
                f"{L} decoder layers give capture layers {list(ids)} (TensorRT-LLM default 1, L//2-1, L-4), not three distinct layers",
                "EAGLE-3 needs a target with at least 7 decoder layers; use a deeper target",
            )
        raise UserError("--aux-layers", f"{list(ids)} are not three distinct layers in 0..{L - 1}", f"the target has {L} decoder layers")
    return tuple(sorted(ids))


def load_target(target_dir: Path, device: str, dtype: torch.dtype):
    """(model, tokenizer, TargetInfo) for a HF target directory; quantized ModelOpt exports are
    dequantized first so training sees the weights that will serve."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    target_dir = Path(target_dir)
    info = read_target(target_dir)
    tok_dir = target_dir
    if not (target_dir / "tokenizer.json").is_file() and not (target_dir / "tokenizer.model").is_file():
        if (target_dir.parent / "tokenizer" / "tokenizer.json").is_file():  # an engine bundle's target/
            tok_dir = target_dir.parent / "tokenizer"
        else:
            raise UserError(target_dir, "no tokenizer (tokenizer.json) next to the target", "copy the tokenizer files of the model into the target directory")
    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir), trust_remote_code=False)
    if info.quantized:
        from eagle3_trt.convert.dequantize import load_checkpoint_dequantized

        cfg, sd, _ = load_checkpoint_dequantized(target_dir, dtype=dtype)
        model_type = cfg.pop("model_type")
        config = AutoConfig.for_model(model_type, **cfg)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        missing, unexpected = model.load_state_dict(sd, strict=False)
        missing = [k for k in missing if "rotary" not in k]
        if missing or unexpected:
            raise UserError(target_dir, f"dequantized weights do not fit the config (missing {missing[:3]}, unexpected {unexpected[:3]})", "pass the BF16 source checkpoint with --target")
    else:
        model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=dtype, trust_remote_code=False)
    model.to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, tokenizer, info


@dataclass
class TargetPass:
    logits: torch.Tensor  # [B, S, V] float
    aux: torch.Tensor  # [B, S, A*T] (concat of the capture layers' outputs)
    last: torch.Tensor  # [B, S, T] post final norm


class TargetRunner:
    """Runs the target and captures the aux layers' outputs and the final-norm output by hooks."""

    def __init__(self, model, aux_layer_ids: tuple[int, ...]):
        self.model = model
        self.aux_layer_ids = tuple(aux_layer_ids)
        base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        self._captured: dict[str, torch.Tensor] = {}
        self._hooks = []
        for i in self.aux_layer_ids:
            self._hooks.append(base.layers[i].register_forward_hook(self._grab(f"aux{i}")))
        self._hooks.append(base.norm.register_forward_hook(self._grab("last")))

    def _grab(self, name: str):
        def hook(_mod, _args, out):
            self._captured[name] = out[0] if isinstance(out, tuple) else out
        return hook

    @property
    def embed(self) -> torch.nn.Embedding:
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> torch.nn.Linear:
        return self.model.get_output_embeddings()

    @torch.no_grad()
    def run(self, ids: torch.Tensor, past=None, use_cache: bool = False) -> tuple[TargetPass, object]:
        self._captured.clear()
        out = self.model(input_ids=ids, past_key_values=past, use_cache=use_cache)
        aux = torch.cat([self._captured[f"aux{i}"] for i in self.aux_layer_ids], dim=-1)
        return TargetPass(logits=out.logits.float(), aux=aux, last=self._captured["last"]), out.past_key_values

    @torch.no_grad()
    def greedy(self, prompt: list[int], max_new_tokens: int, stop_ids: tuple[int, ...]) -> list[int]:
        """Plain greedy continuation (the reference speculative decoding must reproduce)."""
        from transformers import DynamicCache

        dev = self.embed.weight.device
        cache = DynamicCache()
        p, cache = self.run(torch.tensor([prompt], device=dev), cache, use_cache=True)
        out: list[int] = []
        nxt = int(p.logits[0, -1].argmax())
        while True:
            out.append(nxt)
            if nxt in stop_ids or len(out) >= max_new_tokens:
                return out
            p, cache = self.run(torch.tensor([[nxt]], device=dev), cache, use_cache=True)
            nxt = int(p.logits[0, -1].argmax())

    @torch.no_grad()
    def greedy_batch(self, prompts: list[list[int]], max_new_tokens: int, stop_ids: tuple[int, ...], pad_id: int,
                     batch_size: int = 16, on_batch: Callable[[int], None] | None = None) -> list[list[int]]:
        """Greedy continuations of many prompts, left-padded batches through HF generate; each
        ends at (and includes) its first stop token."""
        dev = self.embed.weight.device
        out: list[list[int]] = []
        for i in range(0, len(prompts), batch_size):
            chunk = prompts[i : i + batch_size]
            width = max(len(p) for p in chunk)
            ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for r, p in enumerate(chunk):
                ids[r, width - len(p):] = torch.tensor(p)
                mask[r, width - len(p):] = 1
            gen = self.model.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev), max_new_tokens=max_new_tokens,
                                      do_sample=False, num_beams=1, pad_token_id=pad_id,
                                      eos_token_id=list(stop_ids) or None)
            for row in gen[:, width:].tolist():
                cut = next((j + 1 for j, t in enumerate(row) if t in stop_ids), len(row))
                out.append(row[:cut])
            if on_batch:
                on_batch(len(chunk))
        return out

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()


def cache_key(target_dir: Path, aux: tuple[int, ...], seq_len: int, windows: list[list[int]]) -> str:
    """Identity of a hidden-state cache: target config + weight file sizes, capture layers, data."""
    h = hashlib.sha256()
    target_dir = Path(target_dir)
    h.update((target_dir / "config.json").read_bytes())
    for f in sorted(target_dir.glob("*.safetensors")):
        h.update(f"{f.name}:{f.stat().st_size}:{int(f.stat().st_mtime)}".encode())
    h.update(json.dumps([CACHE_SCHEMA, list(aux), seq_len]).encode())
    for w in windows:
        h.update(json.dumps(w).encode())
    return h.hexdigest()[:24]


def collect(runner: TargetRunner, windows: list[list[int]], cache_dir: Path, key: str, seq_len: int,
            pad_id: int, batch_size: int = 8, on_batch: Callable[[int], None] | None = None) -> "HiddenCache":
    """Teacher-force every window through the target and write shards; reuses a matching cache."""
    cache_dir = Path(cache_dir)
    manifest = cache_dir / "manifest.json"
    if manifest.is_file():
        try:
            if json.loads(manifest.read_text()).get("key") == key:
                if on_batch:
                    on_batch(len(windows))
                return HiddenCache(cache_dir)
        except json.JSONDecodeError:
            pass
    if cache_dir.exists():
        shutil.rmtree(cache_dir)
    tmp = cache_dir.with_name(cache_dir.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    from safetensors.torch import save_file

    dev = runner.embed.weight.device
    T = runner.embed.weight.shape[1]
    A = len(runner.aux_layer_ids)
    per_sample = seq_len * (A + 1) * T * 2 + seq_len * 9
    per_shard = max(1, min(len(windows), SHARD_BYTES // per_sample))
    shards: list[int] = []
    buf: dict[str, list[torch.Tensor]] = {"input_ids": [], "real": [], "aux": [], "last": []}

    def flush() -> None:
        if not buf["input_ids"]:
            return
        tensors = {k: torch.cat(v).contiguous() for k, v in buf.items()}
        save_file(tensors, str(tmp / f"shard_{len(shards):05d}.safetensors"))
        shards.append(int(tensors["input_ids"].shape[0]))
        for v in buf.values():
            v.clear()

    for start in range(0, len(windows), batch_size):
        chunk = windows[start : start + batch_size]
        ids = torch.full((len(chunk), seq_len), pad_id, dtype=torch.int64)
        real = torch.zeros((len(chunk), seq_len), dtype=torch.bool)
        for r, w in enumerate(chunk):
            ids[r, : len(w)] = torch.tensor(w[:seq_len])
            real[r, : len(w)] = True
        # Right padding never changes earlier positions under a causal mask, so no attention mask.
        p, _ = runner.run(ids.to(dev))
        buf["input_ids"].append(ids)
        buf["real"].append(real)
        buf["aux"].append(p.aux.to("cpu", torch.bfloat16))
        buf["last"].append(p.last.to("cpu", torch.bfloat16))
        if sum(t.shape[0] for t in buf["input_ids"]) >= per_shard:
            flush()
        if on_batch:
            on_batch(len(chunk))
    flush()
    meta = {"schema": CACHE_SCHEMA, "key": key, "seq_len": seq_len, "aux_layer_ids": list(runner.aux_layer_ids),
            "target_hidden_size": T, "shards": shards}
    (tmp / "manifest.json").write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(tmp, cache_dir)
    return HiddenCache(cache_dir)


class HiddenCache:
    """Read side of the shards: a deterministic, resumable batch order (step -> batch)."""

    def __init__(self, cache_dir: Path):
        self.dir = Path(cache_dir)
        self.meta = json.loads((self.dir / "manifest.json").read_text())
        self.counts: list[int] = list(self.meta["shards"])
        total_bytes = sum(f.stat().st_size for f in self.dir.glob("shard_*.safetensors"))
        self._keep_all = total_bytes <= IN_MEMORY_BYTES
        self._loaded: dict[int, dict[str, torch.Tensor]] = {}
        self._plan: tuple[tuple[int, int, int], list[tuple[int, list[int]]]] | None = None

    def __len__(self) -> int:
        return sum(self.counts)

    def _shard(self, i: int) -> dict[str, torch.Tensor]:
        if i not in self._loaded:
            from safetensors.torch import load_file

            if not self._keep_all:
                self._loaded.clear()
            self._loaded[i] = load_file(str(self.dir / f"shard_{i:05d}.safetensors"))
        return self._loaded[i]

    def batches_per_epoch(self, batch_size: int) -> int:
        return sum(math.ceil(n / batch_size) for n in self.counts)

    def _epoch_plan(self, epoch: int, batch_size: int, seed: int) -> list[tuple[int, list[int]]]:
        rng = random.Random(f"{seed}:{epoch}")
        order = list(range(len(self.counts)))
        rng.shuffle(order)
        plan = []
        for s in order:
            idx = list(range(self.counts[s]))
            rng.shuffle(idx)
            plan += [(s, idx[j : j + batch_size]) for j in range(0, len(idx), batch_size)]
        return plan

    def batch(self, step: int, batch_size: int, seed: int) -> dict[str, torch.Tensor]:
        """Batch number `step` of the endless, seeded order; the same step always gives the same batch."""
        bpe = self.batches_per_epoch(batch_size)
        epoch, j = divmod(step, bpe)
        key = (epoch, batch_size, seed)
        if self._plan is None or self._plan[0] != key:
            self._plan = (key, self._epoch_plan(epoch, batch_size, seed))
        shard, idx = self._plan[1][j]
        data = self._shard(shard)
        sel = torch.tensor(idx)
        return {k: v[sel] for k, v in data.items()}

    def iter_all(self, batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
        for s, n in enumerate(self.counts):
            data = self._shard(s)
            for j in range(0, n, batch_size):
                yield {k: v[j : j + batch_size] for k, v in data.items()}
