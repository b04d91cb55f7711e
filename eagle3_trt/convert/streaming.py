"""Shard-by-shard checkpoint conversion with bounded memory.

``stream_convert`` rewrites a safetensors checkpoint (one file or an index + shards) under new
tensor names, optionally casting dtypes, into shards of at most ``max_shard_bytes``. It never
holds a whole shard: each output shard's header is planned from the source headers (names,
shapes, dtypes; no data read), written first, and the tensor bytes follow one tensor at a time.

Memory, per path a tensor takes:
- rename only: bytes are copied in ``CHUNK_BYTES`` pieces (64 MiB), whatever the tensor size;
- ``cast`` (elementwise dtype change): converted chunk by chunk, same bound;
- ``transform`` (any per-tensor function, e.g. a transpose or a fused split): the tensor is read
  whole and transformed, so the peak is about input + output of the largest tensor.
Reading uses plain file reads, not mmap, so source pages never count toward the process's RSS.
Pickled ``.bin`` sources are loaded file by file through torch's weights-only loader (memory:
one file); export them to safetensors for truly streaming conversion.
"""

from __future__ import annotations

import io
import json
import math
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import torch

from eagle3_trt.atomic import make_dirs, staged_dir, write_json
from eagle3_trt.errors import UserError
from eagle3_trt.formats.checkpoint_io import weight_files

CHUNK_BYTES = 64 << 20
DEFAULT_SHARD_BYTES = 5 * 10**9  # the Hugging Face default (5GB)
INDEX_FILE = "model.safetensors.index.json"

# safetensors dtype codes <-> torch dtype names, with element sizes in bytes.
ST_DTYPES: dict[str, tuple[str, int]] = {
    "BF16": ("bfloat16", 2),
    "F16": ("float16", 2),
    "F32": ("float32", 4),
    "F64": ("float64", 8),
    "I64": ("int64", 8),
    "I32": ("int32", 4),
    "I16": ("int16", 2),
    "I8": ("int8", 1),
    "U8": ("uint8", 1),
    "BOOL": ("bool", 1),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E5M2": ("float8_e5m2", 1),
}
_TORCH_TO_ST = {v[0]: k for k, v in ST_DTYPES.items()}


@dataclass(frozen=True)
class TensorRef:
    """Where one source tensor's bytes are: file, absolute byte offset, shape, dtype code."""

    name: str
    path: Path
    offset: int
    nbytes: int
    shape: tuple[int, ...]
    dtype: str  # safetensors code, e.g. "BF16"


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """(header dict, absolute offset of the data section) of a safetensors file."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise ValueError("file shorter than 8 bytes")
            (n,) = struct.unpack("<Q", raw)
            if n > 100 << 20:
                raise ValueError(f"header length {n} is implausible")
            header = json.loads(f.read(n))
        size = path.stat().st_size
    except (OSError, ValueError) as e:
        raise UserError(path, f"corrupt or truncated safetensors file ({e})", "re-download or re-export this file") from None
    data_start = 8 + n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        if data_start + end > size:
            raise UserError(path, f"tensor {name!r} extends past the end of the file", "the file is truncated; re-download it")
    return header, data_start


def source_tensors(src_dir: Path) -> Iterator[TensorRef]:
    """Every tensor of a safetensors checkpoint, in file order, from headers only."""
    for f in weight_files(Path(src_dir)):
        if f.suffix != ".safetensors":
            raise UserError(f, "not a safetensors file", "stream_convert reads safetensors; use load_tensors for pickles")
        header, start = read_header(f)
        entries = sorted(((k, v) for k, v in header.items() if k != "__metadata__"), key=lambda kv: kv[1]["data_offsets"][0])
        for name, info in entries:
            if info["dtype"] not in ST_DTYPES:
                raise UserError(f, f"tensor {name!r} has unsupported dtype {info['dtype']}", "convert it with safetensors' own tools")
            b, e = info["data_offsets"]
            yield TensorRef(name, f, start + b, e - b, tuple(info["shape"]), info["dtype"])


# ---------------------------------------------------------------------------------------------
# Writing


@dataclass
class _OutTensor:
    name: str
    src: TensorRef
    shape: tuple[int, ...]
    dtype: str  # output safetensors code
    nbytes: int
    mode: str  # "copy" | "cast" | "transform"


@dataclass
class ConvertReport:
    tensors: int = 0
    skipped: list[str] = field(default_factory=list)
    bytes_read: int = 0
    bytes_written: int = 0
    shards: list[str] = field(default_factory=list)
    largest_tensor_bytes: int = 0


def _header_bytes(entries: list[_OutTensor], metadata: dict[str, str]) -> bytes:
    header: dict[str, Any] = {"__metadata__": metadata}
    off = 0
    for t in entries:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [off, off + t.nbytes]}
        off += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors pads the header to 8-byte alignment
    return struct.pack("<Q", len(raw)) + raw


def _torch_dtype(code: str):
    return getattr(torch, ST_DTYPES[code][0])


def _copy_bytes(src: io.BufferedReader, dst: BinaryIO, offset: int, nbytes: int, buf: bytearray) -> None:
    src.seek(offset)
    view = memoryview(buf)
    left = nbytes
    while left:
        n = src.readinto(view[: min(left, len(buf))])
        if not n:
            raise OSError(f"unexpected end of file at {src.tell()}")
        dst.write(view[:n])
        left -= n


class _CastBuffers:
    """Reusable torch-owned input/output chunks for elementwise casts (allocated once: fresh
    pages per chunk and bytearray-backed tensors both cost several times the conversion)."""

    def __init__(self, nbytes: int):
        self.raw = torch.empty(nbytes, dtype=torch.uint8)
        self.view = self.raw.numpy().data  # a flat byte memoryview of the torch-owned buffer
        self.out: dict[str, Any] = {}

    def output(self, dtype, count: int):
        key = str(dtype)
        need = count * torch.empty((), dtype=dtype).element_size()
        cur = self.out.get(key)
        if cur is None or cur.numel() < need:
            cur = self.out[key] = torch.empty(max(need, 1), dtype=torch.uint8)
        return cur[:need].view(dtype)


def _cast_bytes(src: io.BufferedReader, dst: BinaryIO, t: _OutTensor, bufs: _CastBuffers) -> None:
    in_dtype, out_dtype = _torch_dtype(t.src.dtype), _torch_dtype(t.dtype)
    in_size = ST_DTYPES[t.src.dtype][1]
    step = (len(bufs.view) // in_size) * in_size
    src.seek(t.src.offset)
    left = t.src.nbytes
    while left:
        n = src.readinto(bufs.view[: min(left, step)])
        if not n or n % in_size:
            raise OSError(f"unexpected end of file at {src.tell()}")
        out = bufs.output(out_dtype, n // in_size)
        out.copy_(bufs.raw[:n].view(in_dtype))
        dst.write(memoryview(out.view(torch.uint8).numpy()))
        left -= n


def _read_tensor(src: io.BufferedReader, ref: TensorRef):
    src.seek(ref.offset)
    data = bytearray(ref.nbytes)
    if src.readinto(data) != ref.nbytes:
        raise OSError(f"unexpected end of file reading {ref.name}")
    if ref.nbytes == 0:
        return torch.empty(ref.shape, dtype=_torch_dtype(ref.dtype))
    return torch.frombuffer(data, dtype=_torch_dtype(ref.dtype)).reshape(ref.shape)


def _write_tensor_bytes(dst: BinaryIO, tensor) -> int:
    flat = tensor.contiguous().reshape(-1)
    if flat.numel() == 0:
        return 0
    raw = flat.view(torch.uint8).numpy()
    dst.write(memoryview(raw))
    return raw.nbytes


def _plan(
    refs: list[TensorRef],
    rename: Callable[[str], str | None],
    cast: Callable[[str, str], str | None] | None,
    transform: Callable[[str, Any], Any] | None,
    report: ConvertReport,
) -> list[_OutTensor]:
    out: list[_OutTensor] = []
    seen: dict[str, str] = {}
    for ref in refs:
        new = rename(ref.name)
        if new is None:
            report.skipped.append(ref.name)
            continue
        if new in seen:
            raise UserError(ref.path, f"tensors {seen[new]!r} and {ref.name!r} both map to {new!r}", "fix the rename function")
        seen[new] = ref.name
        mode, shape, code = "copy", ref.shape, ref.dtype
        if transform is not None:
            # A meta tensor carries shape and dtype without data: the output header is known
            # before a byte is read.
            meta = transform(new, torch.empty(ref.shape, dtype=_torch_dtype(ref.dtype), device="meta"))
            if meta is not None:
                shape, code, mode = tuple(meta.shape), _TORCH_TO_ST[str(meta.dtype).replace("torch.", "")], "transform"
        if mode == "copy" and cast is not None:
            target = cast(new, ST_DTYPES[ref.dtype][0])
            if target is not None and target != ST_DTYPES[ref.dtype][0]:
                if target not in _TORCH_TO_ST:
                    raise UserError(ref.path, f"cannot cast {ref.name!r} to {target!r}", f"choose one of {', '.join(sorted(_TORCH_TO_ST))}")
                code, mode = _TORCH_TO_ST[target], "cast"
        nbytes = math.prod(shape) * ST_DTYPES[code][1]
        out.append(_OutTensor(new, ref, shape, code, nbytes, mode))
    return out


def _shards(tensors: list[_OutTensor], max_shard_bytes: int) -> list[list[_OutTensor]]:
    shards: list[list[_OutTensor]] = [[]]
    size = 0
    for t in tensors:
        if shards[-1] and size + t.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)  # a tensor larger than the limit gets a shard of its own
        size += t.nbytes
    return [s for s in shards if s]


def stream_convert(
    src_dir: Path,
    dst_dir: Path,
    rename: Callable[[str], str | None],
    *,
    cast: Callable[[str, str], str | None] | None = None,
    transform: Callable[[str, Any], Any] | None = None,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    metadata: dict[str, str] | None = None,
) -> ConvertReport:
    """Rewrite the tensors of ``src_dir`` into ``dst_dir`` (which must not exist yet).

    ``rename(name)`` gives the new name, or None to drop the tensor. ``cast(new_name, dtype)``
    returns a torch dtype name (e.g. "bfloat16") to convert to, or None to keep it.
    ``transform(new_name, tensor)`` returns a new tensor (it is also called once with a meta
    tensor to learn the output shape and dtype), or None to leave the tensor to ``cast``/copy.
    Output: ``model.safetensors``, or ``model-0000i-of-0000n.safetensors`` + index when there
    is more than one shard. Written through ``eagle3_trt.atomic.staged_dir``: complete or absent.
    """
    src_dir, dst_dir = Path(src_dir), Path(dst_dir)
    if dst_dir.exists():
        raise UserError(dst_dir, "destination already exists", "remove it or choose a new directory")
    if max_shard_bytes < 1:
        raise UserError("max_shard_bytes", f"must be positive, got {max_shard_bytes}")
    report = ConvertReport()
    plan = _plan(list(source_tensors(src_dir)), rename, cast, transform, report)
    shards = _shards(plan, max_shard_bytes)
    meta = {"format": "pt", **(metadata or {})}
    make_dirs(dst_dir.parent)
    buf = bytearray(CHUNK_BYTES)
    cast_bufs = _CastBuffers(CHUNK_BYTES) if any(t.mode == "cast" for t in plan) else None
    handles: dict[Path, io.BufferedReader] = {}
    threads = _single_thread() if any(t.mode != "copy" for t in plan) else None
    try:
        with staged_dir(dst_dir) as tmp:
            names = ["model.safetensors"] if len(shards) == 1 else [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
            weight_map: dict[str, str] = {}
            for fname, shard in zip(names, shards):
                with open(tmp / fname, "wb") as out:
                    out.write(_header_bytes(shard, meta))
                    for t in shard:
                        _write_tensor(_source_handle(handles, t.src.path), out, t, buf, cast_bufs, transform)
                        weight_map[t.name] = fname
                        report.tensors += 1
                        report.bytes_read += t.src.nbytes
                        report.bytes_written += t.nbytes
                        report.largest_tensor_bytes = max(report.largest_tensor_bytes, t.src.nbytes, t.nbytes)
                report.shards.append(fname)  # staged_dir fsyncs every file before the rename
            if len(shards) > 1:
                write_json(tmp / INDEX_FILE, {"metadata": {"total_size": report.bytes_written}, "weight_map": weight_map})
    finally:
        for h in handles.values():
            h.close()
        if threads is not None:
            _restore_threads(threads)
    return report


def _source_handle(handles: dict[Path, io.BufferedReader], path: Path) -> io.BufferedReader:
    """The open source file ``path``; sources are read in order, so at most one stays open at a time
    (the caller closes what is left in ``handles``)."""
    src = handles.get(path)
    if src is None:
        for h in handles.values():
            h.close()
        handles.clear()
        src = handles[path] = open(path, "rb")  # noqa: SIM115 - closed by the caller
    return src


def _write_tensor(
    src: io.BufferedReader, out: BinaryIO, t: _OutTensor, buf: bytearray, cast_bufs: _CastBuffers | None, transform: Callable[[str, Any], Any] | None
) -> None:
    """One planned tensor from ``src`` to ``out``: copied as is, cast, or through ``transform``."""
    if t.mode == "copy":
        _copy_bytes(src, out, t.src.offset, t.nbytes, buf)
    elif t.mode == "cast":
        _cast_bytes(src, out, t, cast_bufs)  # type: ignore[arg-type]
    else:
        result = transform(t.name, _read_tensor(src, t.src))  # type: ignore[misc]
        if tuple(result.shape) != t.shape or _TORCH_TO_ST[str(result.dtype).replace("torch.", "")] != t.dtype:
            raise UserError(
                t.src.path,
                f"transform of {t.name!r} gave {tuple(result.shape)} {result.dtype}, not the {t.shape} {t.dtype} it promised for a meta tensor",
                "make the transform shape-stable",
            )
        _write_tensor_bytes(out, result)
        del result


def _single_thread() -> int:
    # Casts are memory-bound: one thread converts ~2 GB/s, faster than the disk, while torch's
    # OpenMP pool stalls for milliseconds per call on a shared, busy CPU (measured 10-50x slower).
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    return prev


def _restore_threads(n: int) -> None:
    torch.set_num_threads(n)


def write_tensors(path: Path, tensors: list[tuple[str, tuple[int, ...], str]], fill: Callable[[str, Any], Any], metadata: dict[str, str] | None = None) -> int:
    """Write one safetensors file whose tensors are produced one at a time by ``fill(name, empty)``.

    ``tensors``: (name, shape, torch dtype name). Used for synthetic checkpoints larger than
    memory (benchmarks, tests). Returns the bytes written.
    """
    entries = []
    for name, shape, dt in tensors:
        code = _TORCH_TO_ST[dt]
        ref = TensorRef(name, Path(path), 0, 0, tuple(shape), code)
        entries.append(_OutTensor(name, ref, tuple(shape), code, math.prod(shape) * ST_DTYPES[code][1], "copy"))
    total = 0
    with open(path, "wb") as out:
        out.write(_header_bytes(entries, {"format": "pt", **(metadata or {})}))
        for t in entries:
            tensor = fill(t.name, torch.empty(t.shape, dtype=_torch_dtype(t.dtype)))
            total += _write_tensor_bytes(out, tensor)
            del tensor
    return total
