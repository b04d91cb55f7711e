"""Reading checkpoint files safely: safetensors first, pickles only through torch's weights-only loader.

Every failure names the file and says what to do; nothing here executes code from a checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open

from eagle3_trt.errors import UserError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
_HASH_CHUNK = 8 << 20


def sha256_file(path: Path) -> str:
    """Streaming sha256: memory stays at one chunk whatever the file size."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def read_json(path: Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise UserError(path, "file not found", "is this a Hugging Face checkpoint directory?")
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        if isinstance(e, json.JSONDecodeError) and text.startswith("\ufeff"):
            # transformers reads config.json with a plain json.loads too, so TensorRT-LLM would fail on it later
            raise UserError(path, "starts with a UTF-8 byte-order mark", "save it as UTF-8 without a BOM (transformers cannot read it either)") from None
        raise UserError(path, f"not valid JSON ({e})", "the file is corrupt or truncated; re-download it") from None
    if not isinstance(data, dict):
        raise UserError(path, "expected a JSON object", "re-download the checkpoint")
    return data


def weight_files(ckpt_dir: Path) -> list[Path]:
    """The checkpoint's weight files in load order: safetensors (sharded or single), else pickles."""
    ckpt_dir = Path(ckpt_dir)
    index = ckpt_dir / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(read_json(index).get("weight_map", {}).values()))
        if not names:
            raise UserError(index, "weight_map is empty", "re-download the checkpoint")
        files = [ckpt_dir / n for n in names]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise UserError(index, f"shards listed but missing: {', '.join(missing[:3])}", "the download is incomplete")
        return files
    st = sorted(ckpt_dir.glob("*.safetensors"))
    if st:
        return st
    pk = sorted(p for p in ckpt_dir.iterdir() if p.suffix in PICKLE_SUFFIXES and p.is_file())
    if pk:
        return pk
    raise UserError(ckpt_dir, "no weight files (*.safetensors, pytorch_model.bin)", "point at a Hugging Face checkpoint directory")


def iter_tensors(path: Path) -> Iterator[tuple[str, Any]]:
    """(name, tensor) pairs of one weight file, one tensor in memory at a time for safetensors."""
    path = Path(path)
    if path.suffix == ".safetensors":
        try:
            with safe_open(str(path), framework="pt") as f:
                keys = list(f.keys())
                for k in keys:
                    yield k, f.get_tensor(k)
        except (SafetensorError, OSError, ValueError) as e:
            raise UserError(path, f"corrupt or truncated safetensors file ({e})", "re-download or re-export this file") from None
        return
    yield from _load_pickle_weights_only(path).items()


def _load_pickle_weights_only(path: Path) -> dict[str, Any]:
    import torch  # ~2 s to import; header and config readers in this module run without it

    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, AttributeError, TypeError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(
            path,
            f"refused: not a plain tensor checkpoint under torch's weights-only loader ({first[:160]})",
            "convert it to safetensors with trusted tooling; eagle3-trt never unpickles arbitrary objects",
        ) from None
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
        raise UserError(path, "refused: holds something other than a name -> tensor mapping", "export the weights as safetensors")
    return obj


def load_tensors(ckpt_dir: Path) -> dict[str, Any]:
    """All tensors of a checkpoint directory (used for draft heads, which are small)."""
    out: dict[str, Any] = {}
    for f in weight_files(ckpt_dir):
        for k, t in iter_tensors(f):
            if k in out:
                raise UserError(f, f"tensor {k!r} appears in more than one shard", "the checkpoint is inconsistent")
            out[k] = t
    return out


def read_tensor(ckpt_dir: Path, name: str) -> Any:
    """One tensor of a checkpoint directory (None when no weight file holds it): safetensors read that
    tensor alone; a pickle is read whole through the weights-only loader."""
    for f in weight_files(ckpt_dir):
        if f.suffix != ".safetensors":
            t = _load_pickle_weights_only(f).get(name)
            if t is not None:
                return t
            continue
        try:
            with safe_open(str(f), framework="pt") as h:
                if name in h.keys():  # safe_open handles are not containers
                    return h.get_tensor(name)
        except (SafetensorError, OSError, ValueError) as e:
            raise UserError(f, f"corrupt or truncated safetensors file ({e})", "re-download or re-export this file") from None
    return None


def tensor_shapes(ckpt_dir: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, dtype) from safetensors headers only, without reading data."""
    out = {}
    for f in weight_files(ckpt_dir):
        if f.suffix != ".safetensors":
            for k, t in iter_tensors(f):
                out[k] = (tuple(t.shape), str(t.dtype).replace("torch.", ""))
            continue
        try:
            with safe_open(str(f), framework="pt") as h:
                for k in h.keys():  # safe_open handles are not iterable
                    s = h.get_slice(k)
                    out[k] = (tuple(s.get_shape()), _st_dtype(s.get_dtype()))
        except (SafetensorError, OSError, ValueError) as e:
            raise UserError(f, f"corrupt or truncated safetensors file ({e})", "re-download or re-export this file") from None
    return out


def safetensors_names(ckpt_dir: Path) -> set[str]:
    """Tensor names from the directory's safetensors headers (no data read); empty where it ships none
    (config-only presets, pickled checkpoints)."""
    ckpt_dir = Path(ckpt_dir)
    if not any(ckpt_dir.glob("*.safetensors")):
        return set()
    return set(tensor_shapes(ckpt_dir))


def _st_dtype(code: str) -> str:
    return {
        "BF16": "bfloat16",
        "F16": "float16",
        "F32": "float32",
        "F8_E4M3": "float8_e4m3fn",
        "U8": "uint8",
        "I64": "int64",
        "I32": "int32",
        "BOOL": "bool",
        "I8": "int8",
        "I16": "int16",
        "F64": "float64",
    }.get(code, code.lower())
