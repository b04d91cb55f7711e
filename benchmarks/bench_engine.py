"""`eagle3-trt engine` against a bare ModelOpt quantize + export of the same model, same prompts.

Each side runs in its own subprocess (imports included, as a user runs them); wall time and
peak RSS (ru_maxrss of that child) are taken per run, median over --repeats. Goal from the
issue: engine <= 1.10x the time and <= 1.2x the memory of the raw ModelOpt path.

The pair (--pair): ``random``, a synthetic target of --hidden/--layers with a random draft head
(eagle3_trt.testing.tiny_pair), built with --skip-behaviour-checks: the build rightly refuses a
random pair (its target's loss is that of a uniform guess, its draft agrees with it by chance), and
the raw ModelOpt side runs no such check, so the skip keeps the comparison like for like; or
``embedded``, the shipped trained tiny pair (models/tiny), built as `make engine` builds it, behaviour
checks included (the raw side still only quantizes and exports). The report says which.

    .venv/bin/python benchmarks/bench_engine.py [--pair random] [--hidden 256] [--repeats 3] [--quant fp8]
    .venv/bin/python benchmarks/bench_engine.py --smoke     # the suite's size: one run of each side, seconds of work
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAW = r"""
import sys, torch, copy
from transformers import AutoModelForCausalLM, AutoTokenizer
import modelopt.torch.quantization as mtq
from modelopt.torch.export import export_hf_checkpoint
target, out, quant, n, max_len, calib = sys.argv[1:7]
tok = AutoTokenizer.from_pretrained(target)
model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.bfloat16).eval()
import json
prompts = [json.loads(l)["turns"][0] for l in open(calib) if l.strip()][: int(n)]
batches = [torch.tensor([tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"][: int(max_len)]]) for p in prompts]
cfg = copy.deepcopy(mtq.FP8_DEFAULT_CFG if quant == "fp8" else mtq.NVFP4_DEFAULT_CFG)
# the FP8 KV cache as each ModelOpt generation's own example does it: 0.47's helper, or 0.37's
# examples/llm_ptq/hf_ptq.py merging the KV quantizers into quant_cfg (0.37 has no helper)
if hasattr(mtq, "update_quant_cfg_with_kv_cache_quant"):
    cfg = mtq.update_quant_cfg_with_kv_cache_quant(cfg, mtq.FP8_KV_CFG["quant_cfg"])
else:
    cfg["quant_cfg"].update(mtq.FP8_KV_CFG["quant_cfg"])
def loop(m):
    with torch.no_grad():
        for b in batches:
            m(input_ids=b, use_cache=False)
mtq.quantize(model, cfg, forward_loop=loop)
export_hf_checkpoint(model, export_dir=out)
"""


def run(cmd: list[str]) -> tuple[float, float]:
    # stderr to a file, not a pipe: ModelOpt and the build's progress fill a pipe's buffer, and a
    # child blocked on a full pipe would never be reaped by wait4
    with tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        if status != 0:
            err.seek(0)
            raise SystemExit(f"command failed (exit {os.waitstatus_to_exitcode(status)}): {' '.join(cmd)}\n{err.read().decode(errors='replace')[-2000:]}")
    return wall, ru.ru_maxrss / 1024  # MiB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=256, help="hidden size of the synthetic target (tiny preset shape otherwise)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quant", choices=["fp8", "nvfp4"], default="fp8")
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--pair", choices=["random", "embedded"], default="random", help="random: synthetic pair of --hidden/--layers; embedded: models/tiny")
    ap.add_argument("--smoke", action="store_true", help="smallest run (tests/test_benchmarks_smoke.py): hidden 64, 1 repeat, 2 samples of 16 tokens")
    args = ap.parse_args()
    if args.smoke:
        args.hidden, args.repeats, args.samples, args.max_length = 64, 1, 2, 16

    from eagle3_trt.convert.prompts import load_prompts
    from eagle3_trt.convert.quantize import DEFAULT_CALIB_FILE
    from eagle3_trt.testing.behaviour_cases import copy_embedded
    from eagle3_trt.testing.tiny_pair import TinyShape, make_pair

    # both sides calibrate on the shipped set; asking for more than it holds would time fewer prompts than the label says
    have = len(load_prompts(DEFAULT_CALIB_FILE, args.samples))
    if have < args.samples:
        ap.error(f"--samples {args.samples}: {DEFAULT_CALIB_FILE} has {have} prompts; pass --samples {have} or less")

    work = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    shape = TinyShape(
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        intermediate_size=3 * args.hidden,
        draft_intermediate_size=3 * args.hidden,
        num_attention_heads=max(4, args.hidden // 64),
    )
    target, draft = copy_embedded("tiny", work / "pair") if args.pair == "embedded" else make_pair(work / "pair", shape)
    n_params = sum(v["bytes"] for v in [{"bytes": (work / "pair/target/model.safetensors").stat().st_size}]) / 2
    gpu = "h100" if args.quant == "fp8" else "b200"
    engine = [
        sys.executable,
        "-m",
        "eagle3_trt.cli",
        "engine",
        "--model",
        "tiny",
        "--target",
        str(target),
        "--draft",
        str(draft),
        "--target-gpu",
        gpu,
        "--quant",
        args.quant,
        "--kv-cache",
        "fp8",
        "--calib-samples",
        str(args.samples),
        "--calib-max-length",
        str(args.max_length),
        "--force",
        "-o",
        str(work / "bundle"),
        *(["--skip-behaviour-checks"] if args.pair == "random" else []),
    ]
    raw = [sys.executable, "-c", RAW, str(target), str(work / "raw"), args.quant, str(args.samples), str(args.max_length), str(DEFAULT_CALIB_FILE)]
    res: dict[str, list[tuple[float, float]]] = {"engine": [], "raw": []}
    try:
        for _ in range(args.repeats):  # alternate so drift on a shared machine hits both sides
            res["raw"].append(run(raw))
            res["engine"].append(run(engine))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {k: (statistics.median(w for w, _ in v), statistics.median(m for _, m in v)) for k, v in res.items()}
    t_ratio, m_ratio = med["engine"][0] / med["raw"][0], med["engine"][1] / med["raw"][1]
    report = {
        "model": {"pair": args.pair, "params_approx": int(n_params), "quant": args.quant, "engine_behaviour_checks": args.pair == "embedded"}
        | ({"hidden": args.hidden, "layers": args.layers} if args.pair == "random" else {}),
        "raw_modelopt": {"wall_s": round(med["raw"][0], 2), "peak_rss_mib": round(med["raw"][1], 1)},
        "eagle3_trt_engine": {"wall_s": round(med["engine"][0], 2), "peak_rss_mib": round(med["engine"][1], 1)},
        "time_ratio": round(t_ratio, 3),
        "memory_ratio": round(m_ratio, 3),
        "goal": {"time_ratio_max": 1.10, "memory_ratio_max": 1.2},
        "meets_goal": t_ratio <= 1.10 and m_ratio <= 1.2,
        "runs": res,
    }
    print(json.dumps(report, indent=2))
    print(
        f"\nengine {med['engine'][0]:.2f} s / {med['engine'][1]:.0f} MiB vs raw ModelOpt {med['raw'][0]:.2f} s / {med['raw'][1]:.0f} MiB"
        f" -> time x{t_ratio:.3f} (goal <= 1.10), memory x{m_ratio:.3f} (goal <= 1.2)"
    )


if __name__ == "__main__":
    main()
