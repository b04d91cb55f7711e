"""`hidden-states collect`: the data's token windows (as train-draft cuts them) through one backend into a cache."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch

from eagle3_trt.atomic import staged_dir
from eagle3_trt.convert.target import read_target
from eagle3_trt.errors import UserError
from eagle3_trt.formats.hidden_states import CacheManifest
from eagle3_trt.pipeline.trtllm_adapter import LlmKwargs, build_llm
from eagle3_trt.train import data as data_mod
from eagle3_trt.train import hs_backends
from eagle3_trt.train.hidden_states import ShardWriter, cache_key, check_aux_layers, collect, target_tokenizer
from eagle3_trt.train.hs_convert import read_trtllm_dump


def collect_with_backend(
    backend: str,
    target: Path | None,
    bundle: Path | None,
    data: Path,
    out: Path,
    aux: list[int] | None,
    *,
    device_map: str = "auto",
    device: str = "cpu",
    seq_len: int = 512,
    batch_size: int = 8,
) -> CacheManifest:
    if Path(out).exists():
        raise UserError(out, "exists", "choose a new output directory (a cache is written once)")
    if backend == "trtllm":
        if bundle is None:
            raise UserError("--bundle", "is required with --backend trtllm", "pass the engine bundle TensorRT-LLM serves")
        hs_backends.check_trtllm_usable()
        target = Path(bundle) / "target"
    elif target is None:
        raise UserError("--target", f"is required with --backend {backend}", "pass the target's Hugging Face checkpoint directory")
    info = read_target(Path(target))
    layers = check_aux_layers(info, tuple(aux) if aux else None)
    tokenizer = target_tokenizer(Path(target))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    records = data_mod.load_records(Path(data), chars_per_record=seq_len * 4)
    enc = data_mod.Encoder(tokenizer, seq_len, min(64, seq_len // 2))
    windows = [w.ids for r in records for w in enc.windows(r, None)]
    if not windows:
        raise UserError(data, "no usable text: every record tokenizes to fewer than 2 tokens", data_mod.FORMAT_HINT)
    S = min(seq_len, max(len(w) for w in windows))
    key = cache_key(Path(target), layers, S, windows)
    if backend == "trtllm":  # pragma: no cover - TensorRT-LLM and a GPU
        return _collect_trtllm(Path(bundle), windows, Path(out), layers, key, S, pad)  # type: ignore[arg-type]
    if backend == "hf":
        engine: object = hs_backends.HFBackend(Path(target), layers, device_map=device_map, dtype=torch.float32 if device_map == "cpu" else torch.bfloat16)
    else:
        engine = hs_backends.reference_backend(Path(target), layers, device=device, dtype=torch.float32 if device == "cpu" else torch.bfloat16)
    return collect(engine, windows, Path(out), key, S, pad, batch_size).meta


def _collect_trtllm(
    bundle: Path, windows: list[list[int]], out: Path, layers: tuple[int, ...], key: str, seq_len: int, pad: int
) -> CacheManifest:  # pragma: no cover - GPU only
    """TensorRT-LLM serves the bundle's target with the SaveState writer; one request per window,
    in order, so file n (the writer counts from 1) holds window n. Each row goes into the cache as
    its file is read, and the file is deleted: memory and scratch disk hold one row."""
    from tensorrt_llm import SamplingParams  # local: optional, GPU machines only

    dump = Path(tempfile.mkdtemp(prefix=".savestate-", dir=str(Path(out).parent)))
    try:
        kwargs = hs_backends.trtllm_llm_kwargs(bundle, dump, layers)
        llm = build_llm(LlmKwargs(kwargs, None, "installed"))
        with staged_dir(Path(out)) as tmp:
            writer: ShardWriter | None = None
            for n, w in enumerate(windows, start=1):
                llm.generate([w], SamplingParams(max_tokens=1))
                f = dump / f"{hs_backends.SAVE_STATE_PREFIX}_{n}.pt"
                (row,) = read_trtllm_dump(f, len(layers))
                f.unlink()
                if row.input_ids[: len(w)].tolist() != w:
                    raise UserError(dump, f"file {n} does not hold window {n}'s tokens", "run one hidden-states collect per engine at a time")
                k = len(w)
                writer = writer or ShardWriter(tmp, seq_len, int(row.last.shape[-1]), len(layers), len(windows))
                writer.add_unpadded(row.input_ids[:k], torch.ones(k, dtype=torch.bool), row.aux[:k], row.last[:k], pad)
            assert writer is not None
            return writer.finish(key, list(layers), "trtllm")
    finally:
        shutil.rmtree(dump, ignore_errors=True)
