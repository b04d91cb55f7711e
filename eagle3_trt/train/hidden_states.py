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
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoTokenizer

from eagle3_trt.atomic import staged_dir, write_text
from eagle3_trt.convert.target import TargetInfo
from eagle3_trt.core.target import TargetModel
from eagle3_trt.errors import UserError
from eagle3_trt.formats.hidden_states import CACHE_SCHEMA, MANIFEST, SHARD_KEYS, CacheManifest, Producer, shard_name
from eagle3_trt.formats.hidden_states import read_manifest as read_cache_manifest

SHARD_BYTES = 256 << 20
IN_MEMORY_BYTES = 1 << 30

__all__ = ["CACHE_SCHEMA", "CacheManifest", "HiddenCache", "ShardWriter", "collect", "read_cache_manifest"]


# safetensors' dtype names (the format's header, github.com/huggingface/safetensors docs "Format")
_ST_DTYPES = {torch.int64: "I64", torch.bool: "BOOL", torch.bfloat16: "BF16"}


class _ShardFile:
    """One shard of ``n`` rows written row by row: the safetensors header first (the shapes are
    known), then each row's bytes at its place in every tensor, so memory holds one row at a time
    (``safetensors.torch.save_file`` needs the whole shard, and a copy of it, in memory)."""

    def __init__(self, path: Path, n: int, row_shapes: dict[str, tuple[tuple[int, ...], torch.dtype]]):
        header: dict[str, dict] = {}
        self.row_bytes: dict[str, int] = {}
        self.start: dict[str, int] = {}
        off = 0
        # safetensors' own order (wider dtypes first, then by name): the file is byte for byte save_file's
        for k, (shape, dtype) in sorted(row_shapes.items(), key=lambda kv: (-kv[1][1].itemsize, kv[0])):
            size = math.prod(shape) * dtype.itemsize
            header[k] = {"dtype": _ST_DTYPES[dtype], "shape": [n, *shape], "data_offsets": [off, off + n * size]}
            self.row_bytes[k], self.start[k] = size, off
            off += n * size
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
        self.base = 8 + len(text)
        self.n, self.rows = n, 0
        self.f = open(path, "wb")  # noqa: SIM115  # closed by close(), after the last row
        self.f.write(len(text).to_bytes(8, "little") + text)
        self.f.truncate(self.base + off)

    def add(self, row: dict[str, torch.Tensor]) -> None:
        for k, t in row.items():
            raw = t.contiguous().reshape(-1).view(torch.uint8).numpy()
            assert raw.nbytes == self.row_bytes[k], k
            self.f.seek(self.base + self.start[k] + self.rows * self.row_bytes[k])
            self.f.write(raw.data)
        self.rows += 1

    def close(self) -> None:
        self.f.close()


class ShardWriter:
    """Rows appended in order, written as shards of about SHARD_BYTES (the one writer of the format
    in formats/hidden_states.py: backends and converters all go through it). ``rows`` is how many
    rows will come (the shards' sizes are fixed up front, so each is written row by row);
    ``rows_per_shard`` overrides SHARD_BYTES' choice."""

    def __init__(self, out_dir: Path, seq_len: int, hidden_size: int, n_aux: int, rows: int, rows_per_shard: int | None = None):
        self.dir = Path(out_dir)
        self.seq_len, self.hidden_size, self.n_aux = seq_len, hidden_size, n_aux
        per_row = seq_len * (n_aux + 1) * hidden_size * 2 + seq_len * 9
        self.per_shard = max(1, rows_per_shard or min(max(rows, 1), SHARD_BYTES // per_row))
        self.rows, self.written = rows, 0
        self.shards: list[int] = []
        self._file: _ShardFile | None = None
        self._shapes = {
            "input_ids": ((seq_len,), torch.int64),
            "real": ((seq_len,), torch.bool),
            "aux": ((seq_len, n_aux * hidden_size), torch.bfloat16),
            "last": ((seq_len, hidden_size), torch.bfloat16),
        }

    def add(self, input_ids: torch.Tensor, real: torch.Tensor, aux: torch.Tensor, last: torch.Tensor) -> None:
        """Rows [b, seq_len] (+ hidden dims), right-padded."""
        b, s = input_ids.shape
        if s != self.seq_len or aux.shape != (b, s, self.n_aux * self.hidden_size) or last.shape != (b, s, self.hidden_size):
            raise ValueError(f"rows of shape {tuple(input_ids.shape)}/{tuple(aux.shape)}/{tuple(last.shape)} do not fit this cache")
        if self.written + b > self.rows:
            raise ValueError(f"more than the {self.rows} rows this cache was sized for")
        for r in range(b):
            if self._file is None:
                n = min(self.per_shard, self.rows - self.written)
                self._file = _ShardFile(self.dir / shard_name(len(self.shards)), n, self._shapes)
                self.shards.append(n)
            row = {"input_ids": input_ids[r], "real": real[r], "aux": aux[r], "last": last[r]}
            self._file.add({k: v.to("cpu", self._shapes[k][1]) for k, v in row.items()})
            self.written += 1
            if self._file.rows == self._file.n:
                self._file.close()
                self._file = None

    def add_unpadded(self, input_ids: torch.Tensor, real: torch.Tensor, aux: torch.Tensor, last: torch.Tensor, pad_id: int = 0) -> None:
        """One row at its own length n (ids [n], real [n], aux [n, A*T], last [n, T]), right-padded here."""
        n, S, T = int(input_ids.shape[0]), self.seq_len, self.hidden_size
        ids = torch.full((1, S), pad_id, dtype=torch.int64)
        ids[0, :n] = input_ids
        mask = torch.zeros((1, S), dtype=torch.bool)
        mask[0, :n] = real.bool()
        a = torch.zeros((1, S, self.n_aux * T), dtype=torch.bfloat16)
        a[0, :n] = aux.to(torch.bfloat16)
        lst = torch.zeros((1, S, T), dtype=torch.bfloat16)
        lst[0, :n] = last.to(torch.bfloat16)
        self.add(ids, mask, a, lst)

    def finish(self, key: str, aux_layer_ids: list[int], producer: Producer) -> CacheManifest:
        if self.written != self.rows:
            raise ValueError(f"{self.written} rows written, {self.rows} expected")
        meta = CacheManifest(
            schema_=CACHE_SCHEMA,
            key=key,
            seq_len=self.seq_len,
            aux_layer_ids=list(aux_layer_ids),
            target_hidden_size=self.hidden_size,
            shards=self.shards,
            producer=producer,
        )
        write_text(self.dir / MANIFEST, meta.model_dump_json(by_alias=True, indent=2) + "\n")
        return meta


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


def target_tokenizer(target_dir: Path):
    """The target's tokenizer: in the target directory, or in an engine bundle's tokenizer/ beside it."""
    target_dir = Path(target_dir)
    tok_dir = target_dir
    if not (target_dir / "tokenizer.json").is_file() and not (target_dir / "tokenizer.model").is_file():
        if (target_dir.parent / "tokenizer" / "tokenizer.json").is_file():  # an engine bundle's target/
            tok_dir = target_dir.parent / "tokenizer"
        else:
            raise UserError(target_dir, "no tokenizer (tokenizer.json) next to the target", "copy the tokenizer files of the model into the target directory")
    return AutoTokenizer.from_pretrained(str(tok_dir), trust_remote_code=False)


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


def collect(
    target: TargetModel | Any,
    windows: list[list[int]],
    cache_dir: Path,
    key: str,
    seq_len: int,
    pad_id: int,
    batch_size: int = 8,
    on_batch: Callable[[int], None] | None = None,
) -> HiddenCache:
    """Teacher-force every window through the target and write shards; reuses a matching cache.

    ``target`` is any hidden-state backend (train/hs_backends.py): the reference model, or
    Hugging Face with ``device_map``; each gives ``teacher_forced(ids) -> (aux, last)``."""
    cache_dir = Path(cache_dir)
    existing = read_cache_manifest(cache_dir)
    if existing is not None and existing.key == key:
        if on_batch:
            on_batch(len(windows))
        return HiddenCache(cache_dir)
    T = target.hidden_size
    A = len(target.aux_layer_ids)
    with staged_dir(cache_dir) as tmp:
        writer = ShardWriter(tmp, seq_len, T, A, len(windows))
        for start in range(0, len(windows), batch_size):
            chunk = windows[start : start + batch_size]
            ids = torch.full((len(chunk), seq_len), pad_id, dtype=torch.int64)
            real = torch.zeros((len(chunk), seq_len), dtype=torch.bool)
            for r, w in enumerate(chunk):
                ids[r, : len(w)] = torch.tensor(w[:seq_len])
                real[r, : len(w)] = True
            aux, last = target.teacher_forced(ids)
            writer.add(ids, real, aux, last)
            if on_batch:
                on_batch(len(chunk))
        writer.finish(key, list(target.aux_layer_ids), getattr(target, "producer", "reference"))
    return HiddenCache(cache_dir)


class HiddenCache:
    """Read side of the shards: a deterministic, resumable batch order (step -> batch).

    An epoch visits the shards in a seeded order and each shard's rows in a seeded order; epochs
    follow one another as one endless row stream, and batch ``step`` is rows ``step*B .. step*B+B-1``
    of it, so every batch holds ``B`` rows whatever the shard sizes (a 70B row at 2,048 tokens is
    a shard of its own). A cache up to IN_MEMORY_BYTES is kept in memory; a larger one is read row
    by row from its shards (memory bounded by the rows asked for, not by a shard)."""

    def __init__(self, cache_dir: Path, in_memory: bool | None = None):
        self.dir = Path(cache_dir)
        meta = read_cache_manifest(self.dir)
        if meta is None:
            raise UserError(self.dir / "manifest.json", "not a hidden-state cache of this version", "delete the cache directory; it is rebuilt")
        self.meta = meta
        self.counts: list[int] = list(meta.shards)
        total_bytes = sum(f.stat().st_size for f in self.dir.glob("shard_*.safetensors"))
        self._keep_all = total_bytes <= IN_MEMORY_BYTES if in_memory is None else in_memory
        self._loaded: dict[int, dict[str, torch.Tensor]] = {}
        self._orders: dict[tuple[int, int], torch.Tensor] = {}

    def __len__(self) -> int:
        return sum(self.counts)

    def batches_per_epoch(self, batch_size: int) -> int:
        return math.ceil(len(self) / batch_size)

    def _epoch_order(self, epoch: int, seed: int) -> torch.Tensor:
        """int64 [rows, 2]: (shard, row) of every row, in epoch ``epoch``'s order."""
        key = (epoch, seed)
        if key not in self._orders:
            rng = random.Random(f"{seed}:{epoch}")
            order = list(range(len(self.counts)))
            rng.shuffle(order)
            pairs: list[tuple[int, int]] = []
            for s in order:
                idx = list(range(self.counts[s]))
                rng.shuffle(idx)
                pairs += [(s, r) for r in idx]
            while len(self._orders) >= 2:  # a batch spans at most two epochs
                self._orders.pop(next(iter(self._orders)))
            self._orders[key] = torch.tensor(pairs, dtype=torch.int64).reshape(-1, 2)
        return self._orders[key]

    def batch(self, step: int, batch_size: int, seed: int, part: slice | None = None) -> dict[str, torch.Tensor]:
        """Batch number `step` of the endless, seeded order (``batch_size`` rows; ``part``: only
        these rows of it, a rank's share); the same step always gives the same rows."""
        n = len(self)
        picks = []
        for g in range(step * batch_size, (step + 1) * batch_size)[part or slice(None)]:
            s, r = self._epoch_order(g // n, seed)[g % n].tolist()
            picks.append((s, r))
        return self._gather(picks)

    def iter_all(self, batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
        """Every row in shard order, ``batch_size`` rows at a time (within one shard)."""
        for s, n in enumerate(self.counts):
            for j in range(0, n, batch_size):
                yield self._gather([(s, r) for r in range(j, min(n, j + batch_size))])

    def _gather(self, picks: list[tuple[int, int]]) -> dict[str, torch.Tensor]:
        """The rows ``picks`` ((shard, row) pairs) in that order, as one batch."""
        parts: dict[str, list[torch.Tensor]] = {k: [] for k in SHARD_KEYS}
        i = 0
        while i < len(picks):
            s = picks[i][0]
            j = i
            while j < len(picks) and picks[j][0] == s:
                j += 1
            rows = [r for _, r in picks[i:j]]
            if self._keep_all:
                data = self._shard(s)
                sel = torch.tensor(rows)
                for k in SHARD_KEYS:
                    parts[k].append(data[k][sel])
            else:  # a fresh handle per run of rows: its mapped pages go when it closes
                with safe_open(str(self.dir / shard_name(s)), framework="pt") as h:
                    for k in SHARD_KEYS:
                        sl = h.get_slice(k)
                        parts[k] += [sl[r : r + 1] for r in rows]
            i = j
        if not picks:
            return self._empty()
        return {k: torch.cat(v) for k, v in parts.items()}

    def _empty(self) -> dict[str, torch.Tensor]:
        S, T, A = self.meta.seq_len, self.meta.target_hidden_size, len(self.meta.aux_layer_ids)
        return {
            "input_ids": torch.zeros((0, S), dtype=torch.int64),
            "real": torch.zeros((0, S), dtype=torch.bool),
            "aux": torch.zeros((0, S, A * T), dtype=torch.bfloat16),
            "last": torch.zeros((0, S, T), dtype=torch.bfloat16),
        }

    def _shard(self, i: int) -> dict[str, torch.Tensor]:
        if i not in self._loaded:
            self._loaded[i] = load_file(str(self.dir / shard_name(i)))
        return self._loaded[i]
