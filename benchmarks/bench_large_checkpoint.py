"""Bounded memory on large checkpoints: peak RSS and throughput of hashing, header validation and
shard-by-shard conversion on a synthetic sharded safetensors checkpoint.

    python benchmarks/bench_large_checkpoint.py               # >= 8 GB, Llama-3.3-70B tensor shapes
    python benchmarks/bench_large_checkpoint.py --size-gb 0.05 --json

The checkpoint is written to a temp directory (free disk is checked first: source + converted
copy + 2 GB margin) and deleted at the end. Each phase resets the kernel's peak-RSS counter
(/proc/self/clear_refs "5") and a sampling thread reads VmRSS every 5 ms, so every phase gets its
own peak. Goal: peak RSS <= 2 GB + the largest tensor (the whole process, torch included).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # source checkout without install

from eagle3_trt.convert.streaming import INDEX_FILE, stream_convert
from eagle3_trt.formats.checkpoint_io import sha256_file, tensor_shapes

GB = 1e9
GOAL_BASE = 2 * GB


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


class PeakRss:
    """Peak resident set size of this process during a block (bytes)."""

    def __init__(self, interval_s: float = 0.005):
        self.interval = interval_s
        self.peak = 0
        self._stop = threading.Event()

    def __enter__(self):
        try:  # reset VmHWM so that it covers this block only (Linux >= 4.0)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.hwm_reset = True
        except OSError:
            self.hwm_reset = False
        self.start_rss = _status_kb("VmRSS")
        self.peak = self.start_rss
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, _status_kb("VmRSS"))
            time.sleep(self.interval)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, _status_kb("VmRSS"))
        if self.hwm_reset:
            self.peak = max(self.peak, _status_kb("VmHWM"))
        return False


def llama_layout(size_bytes: float) -> tuple[list[tuple[str, tuple[int, ...], str]], dict]:
    """Tensor list of a Llama-like checkpoint of at least size_bytes (BF16).

    At >= 4 GB the shapes are Llama-3.3-70B's (hidden 8192, MLP 28672, vocab 128256: embedding and
    lm_head 2.1 GB each, 1.71 GB per layer); below that a small model with the same structure.
    """
    if size_bytes >= 4 * GB:
        h, inter, vocab, kv = 8192, 28672, 128256, 1024
    else:
        h, inter, vocab, kv = 256, 896, 4096, 64
    per_layer = 2 * (2 * h * h + 2 * h * kv + 3 * h * inter + 2 * h)
    vocab_bytes = 2 * 2 * vocab * h
    layers = max(1, math.ceil((size_bytes - vocab_bytes) / per_layer))
    t: list[tuple[str, tuple[int, ...], str]] = [("model.embed_tokens.weight", (vocab, h), "bfloat16")]
    for i in range(layers):
        p = f"model.layers.{i}."
        t += [
            (p + "input_layernorm.weight", (h,), "bfloat16"),
            (p + "self_attn.q_proj.weight", (h, h), "bfloat16"),
            (p + "self_attn.k_proj.weight", (kv, h), "bfloat16"),
            (p + "self_attn.v_proj.weight", (kv, h), "bfloat16"),
            (p + "self_attn.o_proj.weight", (h, h), "bfloat16"),
            (p + "post_attention_layernorm.weight", (h,), "bfloat16"),
            (p + "mlp.gate_proj.weight", (inter, h), "bfloat16"),
            (p + "mlp.up_proj.weight", (inter, h), "bfloat16"),
            (p + "mlp.down_proj.weight", (h, inter), "bfloat16"),
        ]
    t += [("model.norm.weight", (h,), "bfloat16"), ("lm_head.weight", (vocab, h), "bfloat16")]
    return t, {"hidden": h, "intermediate": inter, "vocab": vocab, "layers": layers}


def _nbytes(shape: tuple[int, ...]) -> int:
    return math.prod(shape) * 2


def _write_safetensors(path: Path, tensors: list, pattern: bytes) -> int:
    """A safetensors file written directly (header, then data from a repeated pattern): no
    tensor is ever materialized, so writing runs at disk speed. Independent of
    convert/streaming.py's writer, so the reader is checked against a second implementation."""
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, _ in tensors:
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + _nbytes(shape)]}
        off += _nbytes(shape)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        for i, (_name, shape, _) in enumerate(tensors):
            left = _nbytes(shape)
            # Tensor i starts with its index: a copy that mixes tensors up is detectable.
            first = (i.to_bytes(8, "little") + pattern[8 : min(left, len(pattern))])[:left]
            f.write(first)
            left -= len(first)
            while left:
                n = min(left, len(pattern))
                f.write(pattern[:n])
                left -= n
    return off


def write_checkpoint(root: Path, tensors: list, shard_bytes: int) -> tuple[int, int]:
    """Sharded safetensors + index. Returns (bytes, largest tensor)."""
    shards, cur, size = [], [], 0
    for t in tensors:
        if cur and size + _nbytes(t[1]) > shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(t)
        size += _nbytes(t[1])
    shards.append(cur)
    import torch

    # 16 MiB of weight-like BF16 values (normal floats: raw byte patterns would be full of
    # denormals and NaNs, which slow down dtype conversion and no real checkpoint has).
    gen = torch.Generator().manual_seed(0)
    pattern = (torch.randn(8 << 20, generator=gen) * 0.02).to(torch.bfloat16).view(torch.uint8).numpy().tobytes()
    weight_map, total = {}, 0
    for i, shard in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        total += _write_safetensors(root / name, shard, pattern)
        weight_map.update({t[0]: name for t in shard})
    (root / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return total, max(_nbytes(t[1]) for t in tensors)


def _phase(name: str, nbytes: int, fn) -> dict:
    with PeakRss() as rss:
        t0 = time.perf_counter()
        result = fn()
        dt = time.perf_counter() - t0
    return {
        "phase": name,
        "seconds": round(dt, 2),
        "mb_per_s": round(nbytes / 1e6 / dt, 1) if nbytes and dt > 0 else None,
        "peak_rss_bytes": rss.peak,
        "rss_before_bytes": rss.start_rss,
        "result": result,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gb", type=float, default=8.0, help="checkpoint size (default 8)")
    ap.add_argument("--shard-gb", type=float, default=2.0, help="source shard size (default 2)")
    ap.add_argument("--out-shard-gb", type=float, default=5.0, help="converted shard size (default 5, the HF default)")
    ap.add_argument("--dir", default=None, help="parent for the temp dir (default: system temp)")
    ap.add_argument("--skip-cast", action="store_true", help="skip the BF16->FP16 cast pass")
    ap.add_argument("--json", action="store_true", help="print results as JSON")
    args = ap.parse_args(argv)

    size = args.size_gb * GB
    tensors, dims = llama_layout(size)
    total = sum(_nbytes(t[1]) for t in tensors)
    parent = Path(args.dir or tempfile.gettempdir())
    need = total * 2 + 2 * GB  # each converted copy is deleted before the next phase
    free = shutil.disk_usage(parent).free
    if free < need:
        print(f"not enough disk under {parent}: need {need / GB:.1f} GB (source + converted copies + 2 GB), have {free / GB:.1f} GB", file=sys.stderr)
        return 2

    import torch  # noqa: F401 - in the baseline RSS, as in the real pipeline

    root = Path(tempfile.mkdtemp(prefix="eagle3-bench-ckpt-", dir=parent))
    results = []
    try:
        src = root / "src"
        src.mkdir()
        w = _phase("write synthetic checkpoint", total, lambda: write_checkpoint(src, tensors, int(args.shard_gb * GB)))
        total, largest = w["result"]
        w["result"] = {"bytes": total, "largest_tensor_bytes": largest, "files": len(list(src.glob("*.safetensors"))), **dims}
        results.append(w)
        files = sorted(src.glob("*.safetensors"))
        results.append(
            _phase(
                "sha256 (streaming, checkpoint_io.sha256_file)", total, lambda: hashlib.sha256("".join(sha256_file(f) for f in files).encode()).hexdigest()[:16]
            )
        )
        results.append(_phase("header-only shapes (checkpoint_io.tensor_shapes)", 0, lambda: len(tensor_shapes(src))))
        rename = lambda n: n.removeprefix("model.")  # noqa: E731
        results.append(
            _phase(
                "stream_convert rename (byte copy)",
                total,
                lambda: _summary(stream_convert(src, root / "renamed", rename, max_shard_bytes=int(args.out_shard_gb * GB))),
            )
        )
        results[-1]["result"]["verified"] = _verify_copy(src, root / "renamed")
        shutil.rmtree(root / "renamed")
        if not args.skip_cast:
            results.append(
                _phase(
                    "stream_convert rename + BF16->FP16 cast",
                    total,
                    lambda: _summary(stream_convert(src, root / "cast", rename, cast=lambda n, d: "float16", max_shard_bytes=int(args.out_shard_gb * GB))),
                )
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)

    goal = GOAL_BASE + largest
    for r in results:
        r["within_goal"] = r["peak_rss_bytes"] <= goal
    out = {"checkpoint_bytes": total, "largest_tensor_bytes": largest, "goal_peak_rss_bytes": goal, "phases": results}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(
            f"synthetic checkpoint: {total / GB:.2f} GB in {results[0]['result']['files']} shards, largest tensor {largest / GB:.2f} GB; "
            f"goal: peak RSS <= 2 GB + largest = {goal / GB:.2f} GB"
        )
        for r in results:
            rate = f"{r['mb_per_s']:8.1f} MB/s" if r["mb_per_s"] else "         -   "
            print(
                f"  {r['phase']:50s} {r['seconds']:7.2f} s {rate}  peak RSS {r['peak_rss_bytes'] / GB:5.2f} GB "
                f"({r['peak_rss_bytes'] / goal:4.0%} of goal) {'ok' if r['within_goal'] else 'OVER GOAL'}"
            )
    return 0 if all(r["within_goal"] for r in results) else 1


def _verify_copy(src: Path, dst: Path) -> bool:
    """Same names (minus the prefix), shapes and bytes: compares the sha256 of each tensor's
    bytes, read through safetensors' own loader one tensor at a time."""
    from safetensors import safe_open

    def digests(root: Path, strip: str) -> dict[str, str]:
        out = {}
        for f in sorted(root.glob("*.safetensors")):
            with safe_open(str(f), framework="pt") as h:
                for k in h.keys():  # safe_open handles are not iterable
                    t = h.get_tensor(k)
                    out[k.removeprefix(strip)] = hashlib.sha256(t.reshape(-1).view(torch.uint8).numpy()).hexdigest()
                    del t
        return out

    import torch

    return digests(src, "model.") == digests(dst, "")


def _summary(rep) -> dict:
    return {"tensors": rep.tensors, "shards": len(rep.shards), "bytes_written": rep.bytes_written}


if __name__ == "__main__":
    raise SystemExit(main())
