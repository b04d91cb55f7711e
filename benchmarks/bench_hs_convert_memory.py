"""Peak RSS of every hidden-state converter direction against the size of its input: each direction
streams (memory holds one row), so its peak stays flat from ~100 MB to ~2 GB of input.

Directions (``eagle3-trt hidden-states convert``; the functions in train/hs_convert.py):

- ``to-modelopt``: the cache -> ModelOpt's offline ``.pt`` dump (one file per row);
- ``to-speculators``: the cache -> speculators 0.9's offline data (``hs_{i}.safetensors`` + an Arrow dataset);
- ``from-modelopt``, ``from-speculators``: those outputs back into a cache;
- ``from-trtllm``: TensorRT-LLM ``SaveHiddenStatesDecodingConfig`` files (one row per file, as
  ``hidden-states collect --backend trtllm`` has the writer write them) into a cache. The collector
  itself needs a GPU and TensorRT-LLM; it reads each file with the same reader and writes each row
  with the same writer (``ShardWriter``) as this direction.

Input: a synthetic cache of rows of ``--seq-len`` tokens at hidden size ``--hidden`` (3 aux layers +
the last state, bf16; rows of slightly varying length, so padding is exercised), sized to each
``--sizes-mb``; the other formats are made from it by the ``to-*`` runs. Each measurement runs in
its own Python process; its peak is ``ru_maxrss``, printed beside the RSS after its imports (torch,
datasets), so what the conversion itself holds is the difference.

    .venv/bin/python benchmarks/bench_hs_convert_memory.py [--sizes-mb 100,500,2000] [--json]
    .venv/bin/python benchmarks/bench_hs_convert_memory.py --smoke   # 8 MB: the suite's run
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DIRECTIONS = ("to-modelopt", "to-speculators", "from-modelopt", "from-speculators", "from-trtllm")
AUX = [1, 3, 4]


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _size_mb(p: Path) -> float:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) / 1e6


def make_inputs(root: Path, mb: float, seq_len: int, hidden: int) -> int:
    """A cache of about ``mb`` MB, the TensorRT-LLM dump of the same rows, and a target holding a final norm."""
    import torch
    from safetensors.torch import save_file

    from eagle3_trt.train.hidden_states import ShardWriter

    A = len(AUX)
    row_bytes = seq_len * (A + 1) * hidden * 2 + seq_len * 9
    n = max(2, round(mb * 1e6 / row_bytes))
    g = torch.Generator().manual_seed(0)
    (root / "cache").mkdir()
    (root / "trtllm").mkdir()
    w = ShardWriter(root / "cache", seq_len, hidden, A, n)
    for i in range(n):
        k = seq_len - (i % 7) * (seq_len // 64)
        ids = torch.randint(0, 32000, (k,), generator=g)
        aux = torch.randn(k, A * hidden, generator=g).to(torch.bfloat16)
        last = torch.randn(k, hidden, generator=g).to(torch.bfloat16)
        w.add_unpadded(ids, torch.ones(k, dtype=torch.bool), aux, last)
        rec = {"id": i, "input_ids": ids, "hidden_state": last, "aux_hidden_states": torch.cat([aux, last], dim=-1)}
        torch.save([rec], str(root / "trtllm" / f"eagle3trt_{i + 1}.pt"))
    w.finish("bench", AUX, "reference")
    (root / "target").mkdir()
    (root / "target" / "config.json").write_text(json.dumps({"hidden_size": hidden, "rms_norm_eps": 1e-5}))
    save_file({"model.norm.weight": (0.5 + torch.rand(hidden, generator=g)).to(torch.bfloat16)}, str(root / "target" / "model.safetensors"))
    return n


def child(direction: str, root: Path) -> dict:
    """One conversion in this (fresh) process: its figures."""
    import datasets  # noqa: F401  # imported before the baseline: speculators' side needs it
    import torch  # noqa: F401

    from eagle3_trt.train import hs_convert

    src, out = {
        "to-modelopt": ("cache", "modelopt"),
        "to-speculators": ("cache", "speculators"),
        "from-modelopt": ("modelopt", "back-modelopt"),
        "from-speculators": ("speculators", "back-speculators"),
        "from-trtllm": ("trtllm", "back-trtllm"),
    }[direction]
    base = _rss_mb()
    t0 = time.perf_counter()
    if direction == "to-modelopt":
        rows = hs_convert.to_modelopt(root / src, root / out)
    elif direction == "to-speculators":
        rows = hs_convert.to_speculators(root / src, root / out, root / "target")
    elif direction == "from-modelopt":
        rows = hs_convert.from_modelopt(root / src, root / out, AUX).rows
    elif direction == "from-speculators":
        rows = hs_convert.from_speculators(root / src, root / out, root / "target", AUX).rows
    else:
        rows = hs_convert.from_trtllm(root / src, root / out, AUX).rows
    s = time.perf_counter() - t0
    return {
        "direction": direction,
        "rows": rows,
        "input_mb": round(_size_mb(root / src), 1),
        "seconds": round(s, 2),
        "rss_after_imports_mb": round(base, 1),
        "peak_rss_mb": round(_rss_mb(), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mb", default="100,500,2000", help="comma-separated input sizes in MB")
    ap.add_argument("--seq-len", type=int, default=2048, help="tokens per row")
    ap.add_argument("--hidden", type=int, default=1024, help="the target's hidden size (a row is seq_len x 4 x hidden x 2 bytes)")
    ap.add_argument("--smoke", action="store_true", help="one small size (8 MB, 256-token rows at hidden 256): the suite's run")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", choices=DIRECTIONS, help=argparse.SUPPRESS)
    ap.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.root)))
        return
    sizes = [8.0] if a.smoke else [float(x) for x in a.sizes_mb.split(",")]
    seq_len, hidden = (256, 256) if a.smoke else (a.seq_len, a.hidden)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-hs-convert-") as tmp:
        for mb in sizes:
            root = Path(tmp) / f"{mb:g}mb"
            root.mkdir()
            make_inputs(root, mb, seq_len, hidden)
            for direction in DIRECTIONS:
                p = subprocess.run([sys.executable, __file__, "--child", direction, "--root", str(root)], capture_output=True, text=True, check=False)
                if p.returncode != 0:
                    raise SystemExit(f"{direction} at {mb:g} MB failed:\n{p.stderr[-2000:]}")
                r = json.loads(p.stdout.strip().splitlines()[-1])
                results.append(r)
                if not a.json:
                    print(
                        f"{r['input_mb']:>8.1f} MB in ({r['rows']:>4} rows)  {direction:<17} peak RSS {r['peak_rss_mb']:>7.1f} MB "
                        f"(after imports {r['rss_after_imports_mb']:.1f} MB)  {r['seconds']:.1f} s",
                        flush=True,
                    )
            shutil.rmtree(root)
    flat = {}
    for d in DIRECTIONS:
        peaks = [r["peak_rss_mb"] for r in results if r["direction"] == d]
        flat[d] = round(max(peaks) / min(peaks), 3)
    if a.json:
        print(
            json.dumps(
                {"schema": 1, "kind": "hidden-state convert memory", "seq_len": seq_len, "hidden": hidden, "rows": results, "peak_ratio": flat}, indent=1
            )
        )
    else:
        print("peak RSS, largest input / smallest input: " + ", ".join(f"{d} {x:.2f}x" for d, x in flat.items()))


if __name__ == "__main__":
    main()
