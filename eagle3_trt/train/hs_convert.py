"""Converters between the project's hidden-state cache (formats/hidden_states.py) and the offline
formats other trainers read and write, so a user can bring their own trainer or take our cache to theirs.

ModelOpt (NVIDIA/Model-Optimizer a2fbac7bad8ab446d3f8783dadb0c3366eb0ad73,
``examples/speculative_decoding/collect_hidden_states/compute_hidden_states_hf.py``; read back by
``modelopt/torch/speculative/eagle/utils.py`` ``OfflineSupervisedDataset`` with
``torch.load(..., weights_only=True)``): one ``{conversation_id}.pt`` per conversation, a dict

    input_ids          long [n]
    hidden_states      [n, T]     the final hidden state, post-norm (``hidden_states[-1]`` of HF;
                                  ``hidden_states_prenorm: True`` marks a pre-norm dump)
    aux_hidden_states  [n, A*T]   ``hidden_states[lid + 1]`` for the aux layer ids, concatenated
    loss_mask          long [n]   (optional; all ones unless --answer-only-loss)
    conversation_id    int | str

speculators 0.9 (the installed package: ``speculators/train/data.py`` ``ArrowDataset``, files
through ``hs_connectors/transfer.py`` ``FileTransfer``): a ``datasets`` directory
(``save_to_disk``: ``input_ids``, ``loss_mask``, ``seq_len``) and ``hidden_states/hs_{i}.safetensors``
with ``token_ids`` [n] and ``hidden_states`` [n, A+1, T]: the A aux layers then the last layer's
output BEFORE the final norm (speculators applies ``verifier_norm`` itself, models/eagle3/core.py).
Its layer ids are vLLM's (input of layer i = output of layer i-1: scripts/launch_vllm.py's default
[2, L//2, L-3] + [L] is TensorRT-LLM's [1, L//2-1, L-4] + the last layer), so ``--aux-layers`` is
given in TensorRT-LLM's convention on import. The cache keeps ``last`` post-norm; exporting
writes ``last / w`` (w the target's final-norm weight): RMSNorm of it is ``w * (last/w) /
rms(last/w)`` = ``last`` up to eps, because rms(last/w) is 1 when ``last`` is itself a norm output;
importing applies the target's RMSNorm.

TensorRT-LLM's ``SaveHiddenStatesDecodingConfig`` writer (``save_hidden_state.py``, commit
17c59c369a8f180e95386d7d434136b68b95bfbb): ``{file_prefix}_{n}.pt``, ``torch.save`` of a list of
dicts ``{"id", "input_ids" [n], "hidden_state" [n, T] (the last capture slot: -1, post-norm),
"aux_hidden_states" or, in earlier commits, "hidden_state_features" [n, k*T]}`` (with -1
captured, the features include the post-norm slot last, which is dropped here).

Every ``.pt`` is read with torch's weights-only loader (tensors, lists, dicts, numbers, strings):
nothing else is unpickled. Rows keep their own length n; the cache pads them to the longest, with
``real`` = the loss mask (all ones when the source has none).

Every direction streams: memory holds one row (one source file; a TensorRT-LLM dump file holds
``write_interval`` rows), never the whole set. Importing reads the sources twice: first the token
ids alone (memory-mapped: the longest row and the cache's key), then row by row into the cache's
writer, which writes each row into its place in its shard (``ShardWriter``).
"""

from __future__ import annotations

import hashlib
import pickle
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from eagle3_trt.atomic import staged_dir
from eagle3_trt.errors import UserError
from eagle3_trt.formats.checkpoint_io import iter_tensors, read_json, weight_files
from eagle3_trt.formats.hidden_states import CacheManifest, Producer
from eagle3_trt.train.hidden_states import HiddenCache, ShardWriter

FORMATS = ("modelopt", "speculators")


@dataclass
class Row:
    """One sequence: token ids [n], aux states [n, A*T], post-norm last state [n, T], loss mask [n]."""

    input_ids: torch.Tensor
    aux: torch.Tensor
    last: torch.Tensor
    mask: torch.Tensor


# -- the project's cache ------------------------------------------------------------------------


def iter_rows(cache_dir: Path) -> Iterator[Row]:
    """The cache's rows without padding (a row ends at its last trained position), read one at a time."""
    cache = HiddenCache(Path(cache_dir), in_memory=False)
    for batch in cache.iter_all(1):
        real = batch["real"][0]
        idx = torch.nonzero(real).flatten()
        n = int(idx.max()) + 1 if idx.numel() else 0
        yield Row(batch["input_ids"][0, :n], batch["aux"][0, :n], batch["last"][0, :n], real[:n])


def write_rows(
    token_ids: Callable[[], Iterable[torch.Tensor]],
    rows: Callable[[], Iterable[Row]],
    out_dir: Path,
    aux_layer_ids: list[int],
    producer: Producer,
    pad_id: int = 0,
) -> CacheManifest:
    """A cache (formats/hidden_states.py) holding the source's rows, right-padded to the longest.

    ``token_ids()`` yields each row's token ids (a first, cheap pass: the longest row, the row
    count and the key); ``rows()`` then yields the rows themselves, in the same order, one at a time."""
    h_ids = hashlib.sha256()
    n_rows = S = 0
    for ids in token_ids():
        n_rows += 1
        S = max(S, int(ids.shape[0]))
        h_ids.update(ids.long().numpy().tobytes())
    if not n_rows:
        raise UserError(out_dir, "nothing to write: the source holds no sequences", "check the source directory")
    key = hashlib.sha256(repr((producer, aux_layer_ids, S, n_rows)).encode() + h_ids.digest()).hexdigest()[:24]
    A = len(aux_layer_ids)
    with staged_dir(Path(out_dir)) as tmp:
        w: ShardWriter | None = None
        for r in rows():
            T = int(r.last.shape[-1])
            if r.aux.shape[-1] != A * T:
                raise UserError(
                    "--aux-layers",
                    f"{A} layers x hidden {T} = {A * T} columns, the source's aux states have {r.aux.shape[-1]}",
                    "name the layers the source captured",
                )
            w = w or ShardWriter(tmp, S, T, A, n_rows)
            w.add_unpadded(r.input_ids, r.mask, r.aux, r.last, pad_id)
        assert w is not None
        meta = w.finish(key, sorted(aux_layer_ids), producer)
    return meta


# -- the target's final norm (speculators' last state is pre-norm) -------------------------------


def target_norm(target_dir: Path) -> tuple[torch.Tensor, float]:
    """(final RMSNorm weight [T] float32, eps) of a Hugging Face target."""
    target_dir = Path(target_dir)
    cfg = read_json(target_dir / "config.json")
    text = cfg.get("text_config") or cfg
    eps = float(text.get("rms_norm_eps", 1e-6))
    for f in weight_files(target_dir):
        if f.suffix == ".safetensors":
            with safe_open(str(f), framework="pt") as h:
                if "model.norm.weight" in h.keys():
                    return h.get_tensor("model.norm.weight").float(), eps
        else:
            for k, t in iter_tensors(f):
                if k == "model.norm.weight":
                    return t.float(), eps
    raise UserError(target_dir, "no model.norm.weight (the final norm) in the target's weights", "point --target at the model the states came from")


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.float()
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


# -- torch .pt files, weights-only ---------------------------------------------------------------


def load_pt(path: Path, mmap: bool = False) -> Any:
    """``mmap``: tensors stay in the file until read (a pass that reads the token ids alone)."""
    try:
        try:
            return torch.load(str(path), map_location="cpu", weights_only=True, mmap=mmap)
        except RuntimeError:
            if not mmap:
                raise
            return torch.load(str(path), map_location="cpu", weights_only=True)  # a legacy (non-zip) .pt cannot be mapped
    except (pickle.UnpicklingError, RuntimeError, EOFError, AttributeError, TypeError, ValueError, OSError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(path, f"refused: not a tensors-only .pt file ({first[:160]})", "eagle3-trt reads .pt files with torch's weights-only loader") from None


def _tensor(d: dict, key: str, path: Path) -> torch.Tensor:
    v = d.get(key)
    if not isinstance(v, torch.Tensor):
        raise UserError(path, f"no tensor {key!r} (keys: {', '.join(map(str, d))})", "is this a ModelOpt / TensorRT-LLM hidden-state dump?")
    return v.squeeze(0) if v.dim() > 1 and v.shape[0] == 1 and key == "input_ids" else v


# -- ModelOpt -----------------------------------------------------------------------------------


def to_modelopt(cache_dir: Path, out_dir: Path) -> int:
    """ModelOpt's offline dump of the cache: ``{i}.pt`` per row; returns the number of files."""
    n = 0
    with staged_dir(Path(out_dir)) as tmp:
        for i, r in enumerate(iter_rows(cache_dir)):
            rec = {
                "input_ids": r.input_ids.clone(),
                "hidden_states": r.last.clone(),
                "aux_hidden_states": r.aux.clone(),
                "loss_mask": r.mask.to(torch.long),
                "conversation_id": i,
            }
            torch.save(rec, str(tmp / f"{i}.pt"))
            n += 1
    return n


def from_modelopt(src: Path, out_dir: Path, aux_layer_ids: list[int], target: Path | None = None) -> CacheManifest:
    """The cache of a ModelOpt offline dump directory (``*.pt``, sorted by conversation id)."""
    files = sorted(Path(src).glob("*.pt"), key=lambda p: (len(p.stem), p.stem))
    if not files:
        raise UserError(src, "no *.pt files (ModelOpt's compute_hidden_states_* output)", "point at the --output-dir of compute_hidden_states_hf.py")

    def record(f: Path, mmap: bool) -> dict:
        d = load_pt(f, mmap)
        if not isinstance(d, dict):
            raise UserError(f, "not a dict of tensors (ModelOpt writes one dict per conversation)", "point at ModelOpt's dump directory")
        return d

    def token_ids() -> Iterator[torch.Tensor]:
        for f in files:
            yield _tensor(record(f, True), "input_ids", f).flatten()

    def rows() -> Iterator[Row]:
        norm = None
        for f in files:
            d = record(f, False)
            ids, last, aux = _tensor(d, "input_ids", f), _tensor(d, "hidden_states", f), _tensor(d, "aux_hidden_states", f)
            if d.get("hidden_states_prenorm"):
                if target is None:
                    raise UserError(f, "holds pre-norm hidden states (hidden_states_prenorm)", "pass --target MODEL: its final norm is applied")
                norm = norm or target_norm(target)
                last = rms_norm(last, *norm)
            mask = d.get("loss_mask")
            mask = mask.flatten() if isinstance(mask, torch.Tensor) else torch.ones(ids.shape[-1], dtype=torch.long)
            yield Row(ids.flatten().long(), aux, last, mask)

    return write_rows(token_ids, rows, out_dir, aux_layer_ids, "modelopt")


# -- speculators 0.9 ----------------------------------------------------------------------------


def _token_columns(cache_dir: str) -> Iterator[dict]:
    """speculators' dataset columns of each cache row (a generator for ``Dataset.from_generator``)."""
    for r in iter_rows(Path(cache_dir)):
        yield {"input_ids": r.input_ids.tolist(), "loss_mask": r.mask.long().tolist(), "seq_len": int(r.input_ids.shape[0])}


def to_speculators(cache_dir: Path, out_dir: Path, target: Path) -> int:
    """speculators' offline layout of the cache (dataset + hidden_states/hs_{i}.safetensors)."""
    from datasets import Dataset, Features, Sequence, Value  # local: only the converter needs it

    w, _eps = target_norm(target)
    if bool((w == 0).any()):
        raise UserError(target, "the final norm has zero weights; its pre-norm state cannot be recovered", "use the ModelOpt format instead")
    with staged_dir(Path(out_dir)) as tmp:
        (tmp / "hidden_states").mkdir()
        n = 0
        for i, r in enumerate(iter_rows(cache_dir)):
            T = r.last.shape[-1]
            layers = [r.aux[:, j * T : (j + 1) * T] for j in range(r.aux.shape[-1] // T)]
            pre = (r.last.float() / w).to(r.last.dtype)  # RMSNorm(pre) == last, see the module docstring
            hs = torch.stack([*layers, pre], dim=1).contiguous()
            save_file({"token_ids": r.input_ids.clone().contiguous(), "hidden_states": hs}, str(tmp / "hidden_states" / f"hs_{i}.safetensors"))
            n += 1
        # the token columns go to Arrow in batches (a 70B cache has tens of thousands of 2,048-token rows)
        features = Features({"input_ids": Sequence(Value("int64")), "loss_mask": Sequence(Value("int64")), "seq_len": Value("int64")})
        ds = Dataset.from_generator(
            _token_columns, gen_kwargs={"cache_dir": str(Path(cache_dir).resolve())}, features=features, cache_dir=str(tmp / ".arrow"), keep_in_memory=False
        )
        ds.set_format(type="torch")  # as speculators' preprocessing saves it (its reader compares tensors)
        ds.save_to_disk(str(tmp / "dataset"))
        del ds
        shutil.rmtree(tmp / ".arrow")
        # speculators reads the dataset at the data path itself: move its files up beside hidden_states/
        for p in (tmp / "dataset").iterdir():
            p.rename(tmp / p.name)
        (tmp / "dataset").rmdir()
    return n


def from_speculators(src: Path, out_dir: Path, target: Path, aux_layer_ids: list[int]) -> CacheManifest:
    """The cache of a speculators offline data directory (its ``hidden_states/hs_{i}.safetensors``)."""
    src = Path(src)
    hs_dir = src / "hidden_states"
    files = sorted(hs_dir.glob("hs_*.safetensors"), key=lambda p: int(p.stem[3:]) if p.stem[3:].isdigit() else -1)
    if not files:
        raise UserError(hs_dir, "no hs_{i}.safetensors files (speculators' offline hidden states)", "point at the data path speculators trains from")
    ds = None
    if (src / "dataset_info.json").is_file():
        from datasets import load_from_disk  # local: only the converter needs it

        ds = load_from_disk(str(src)).with_format(None)  # plain lists, whatever format it was saved in; memory-mapped Arrow
        if "loss_mask" not in ds.column_names:
            ds = None
    w, eps = target_norm(target)

    def keys(f: Path, h: Any) -> None:
        if not {"token_ids", "hidden_states"} <= set(h.keys()):
            raise UserError(f, f"needs token_ids and hidden_states, has {sorted(h.keys())}", "is this speculators' offline format?")

    def token_ids() -> Iterator[torch.Tensor]:
        for f in files:
            with safe_open(str(f), framework="pt") as h:
                keys(f, h)
                yield h.get_tensor("token_ids")

    def rows() -> Iterator[Row]:
        for f in files:
            with safe_open(str(f), framework="pt") as h:
                keys(f, h)
                ids, hs = h.get_tensor("token_ids"), h.get_tensor("hidden_states")
            if hs.dim() != 3 or hs.shape[1] != len(aux_layer_ids) + 1:
                raise UserError(
                    f, f"hidden_states {list(hs.shape)}: expected [n, {len(aux_layer_ids) + 1}, T] (the aux layers, then the last layer)", "check --aux-layers"
                )
            i = int(f.stem[3:])
            mask = torch.tensor(ds[i]["loss_mask"]) if ds is not None and i < len(ds) else torch.ones(ids.shape[0], dtype=torch.long)
            last = rms_norm(hs[:, -1], w, eps)
            yield Row(ids.long(), hs[:, :-1].flatten(1), last, mask)

    return write_rows(token_ids, rows, out_dir, aux_layer_ids, "speculators")


# -- TensorRT-LLM's SaveHiddenStates writer -----------------------------------------------------


def read_trtllm_dump(path: Path, n_aux: int, mmap: bool = False) -> Iterator[Row]:
    """The records of one ``{file_prefix}_{n}.pt`` written by ``SaveHiddenStatesDecodingConfig``."""
    data = load_pt(Path(path), mmap)
    if not isinstance(data, list) or not all(isinstance(x, dict) for x in data):
        raise UserError(path, "not a list of dicts (TensorRT-LLM's SaveHiddenStates writes one list per file)", "point at the writer's output_directory")
    for d in data:
        ids, last = _tensor(d, "input_ids", Path(path)), _tensor(d, "hidden_state", Path(path))
        key = "aux_hidden_states" if "aux_hidden_states" in d else "hidden_state_features"
        feats = _tensor(d, key, Path(path))
        T = last.shape[-1]
        if feats.shape[-1] == (n_aux + 1) * T:  # -1 captured: its post-norm slot comes last
            feats = feats[:, : n_aux * T]
        n = min(int(ids.shape[0]), int(last.shape[0]))
        yield Row(ids[:n].long(), feats[:n], last[:n], torch.ones(n, dtype=torch.long))


def from_trtllm(src: Path, out_dir: Path, aux_layer_ids: list[int]) -> CacheManifest:
    """The cache of a ``SaveHiddenStatesDecodingConfig`` output directory (``*.pt``, in file order)."""
    files = sorted(Path(src).glob("*.pt"), key=lambda p: (len(p.stem), p.stem))
    if not files:
        raise UserError(src, "no *.pt files (TensorRT-LLM's SaveHiddenStates output)", "point at the writer's output_directory")
    A = len(aux_layer_ids)

    def token_ids() -> Iterator[torch.Tensor]:
        for f in files:
            for r in read_trtllm_dump(f, A, mmap=True):
                yield r.input_ids

    def rows() -> Iterator[Row]:
        for f in files:
            yield from read_trtllm_dump(f, A, mmap=True)

    return write_rows(token_ids, rows, out_dir, aux_layer_ids, "trtllm")
