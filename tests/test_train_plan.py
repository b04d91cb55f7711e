"""`plan MODEL --train --records N`: hidden-state storage, GPU memory per rank per backend and time for
retraining the head, from config files alone; the README's 70B runbook shows what it prints."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from eagle3_trt.cli import main
from eagle3_trt.pipeline.gpus import get_gpu
from eagle3_trt.pipeline.model_size import read_config
from eagle3_trt.pipeline.plan_command import plan_cmd
from eagle3_trt.pipeline.plan_report import DISK_BYTES_PER_S
from eagle3_trt.testing.readme_blocks import doc_pages

ROOT = Path(__file__).resolve().parents[1]
CFG = ROOT / "build" / "model_configs" / "llama3.3-70b"


def _plan(*args: str) -> dict:
    res = CliRunner().invoke(plan_cmd, ["llama3.3-70b", "--gpu", "h100", "--gpus", "8", "--quant", "fp8", "--train", "--json", *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_70b_train_plan_figures_follow_from_the_configs():
    out = _plan("--records", "50000")
    t = out["train"]
    cfg = read_config(CFG / "target" / "config.json")
    T, L, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    assert (T, L, V) == (8192, 80, 128256)
    # storage: 3 aux layers + the post-norm last state in bf16, plus id and mask, per token
    assert t["tokens"] == 50000 * 2048 and t["hs_bytes_per_token"] == 4 * T * 2 + 9
    assert t["hs_storage_bytes"] == t["tokens"] * (4 * T * 2 + 9)
    be = {b["backend"]: b for b in t["backends"]}
    # the reference backend holds the whole BF16 target (141 GB) on one GPU: it cannot run on an H100
    assert be["reference"]["bytes_per_gpu"] > out["target"]["total"] * 2 and not be["reference"]["fits"]
    assert t["hs_seconds"]["reference"] is None
    # Hugging Face device_map spreads the BF16 weights over the 8 GPUs
    assert out["target"]["total"] * 2 / 8 < be["hf"]["bytes_per_gpu"] < 0.9 * out["gpu_memory_bytes"] and be["hf"]["fits"]
    # TensorRT-LLM serves the FP8 plan's TP2 model (the collector builds one): its weights per GPU plus the writer's buffer
    assert be["trtllm"]["bytes_per_gpu"] > out["target_weight_bytes_per_gpu"] and be["trtllm"]["gpus"] == out["tp"] == 2
    assert t["hs_seconds"]["trtllm"] < t["hs_seconds"]["hf"]  # 2 GPUs at FP8 vs one GPU at a time in BF16
    # the head: DDP when its AdamW state fits half a GPU; FSDP divides that state by the ranks
    assert t["train_mode"] == "ddp" and t["train_bytes_per_rank_fsdp"] < t["train_bytes_per_rank_ddp"]
    P = t["draft_params"]
    assert t["train_bytes_per_rank_ddp"] - t["train_bytes_per_rank_fsdp"] == P * (16 + 4) - (P * 16 // 8 + P * 8)
    # twice the records: twice the storage and more time
    t2 = _plan("--records", "100000")["train"]
    assert t2["hs_storage_bytes"] == 2 * t["hs_storage_bytes"] and t2["train_seconds"] > t["train_seconds"]


def test_train_options_refused_alone(capsys):
    for args, needle in ((["--train"], "--train and --records"), (["--records", "10"], "--train and --records"), (["--train", "--records", "0"], "--records")):
        capsys.readouterr()
        assert main(["plan", "llama3.3-70b", "--gpus", "8", *args]) == 2
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1, err


def test_readme_runbook_shows_the_printed_numbers():
    """The README's 70B retraining subsection quotes what `plan --train` prints, line for line."""
    readme = "\n".join(p.read_text() for p in doc_pages(ROOT))  # the README and the docs pages (the runbook is docs/gpu-runbook.md)
    m = re.search(r"<!-- docs-check: run plan-70b-train -->\n```bash\n(.*?)\n```", readme, re.S)
    assert m, "README has no plan-70b-train block"
    args = m.group(1).split()
    assert args[:3] == [".venv/bin/eagle3-trt", "plan", "llama3.3-70b"]
    res = CliRunner().invoke(plan_cmd, args[2:])
    assert res.exit_code == 0, res.output
    train_lines = res.stdout[res.stdout.index("train plan:") :].strip().splitlines()
    quoted = re.search(r"prints:\n\n```text\n(.*?)\n```", readme[m.end() :], re.S)
    assert quoted, "the block is not followed by the printed train plan"
    assert quoted.group(1).splitlines() == train_lines


def test_70b_training_figures_by_arithmetic():
    """hidden 8192, 80 target layers, 2,048-token rows, 8 GPUs: every training figure the plan prints, by hand."""
    out = _plan("--records", "50000")
    t = out["train"]
    assert out["max_draft_len"] == 4
    T, I, V, Dv, H, KV, D, S, G = 8192, 28672, 128256, 32000, 64, 8, 128, 2048, 8
    K = 4  # the preset's max_draft_len: the TTT unroll's steps
    fc = 3 * T * T  # the three captured layers -> hidden
    attn = (2 * T) * (H * D) + 2 * (2 * T) * (KV * D) + (H * D) * T  # q, k, v read [embedding, hidden]; o
    mlp = 3 * T * I
    norms = 3 * T + T
    lm_head = Dv * T
    P = fc + attn + mlp + norms + lm_head
    assert P == 1_403_027_456 == t["draft_params"]
    frozen = V * T * 2 * 2  # the target's embedding and lm_head, BF16
    local = 8 // G  # global batch 8 over 8 ranks: one row each
    # per token, BF16 under autocast: at step k 11 T-wide + 3 query-wide (= T) + 2k repeated keys/values
    # + 4 I-wide saved tensors, the logits (BF16, their fp32 copy, fp32 log-softmax); once: fc input 3T,
    # 2 fp32 label distributions; and one row's fp32 target logits over the 128,256-token vocabulary
    per_token = sum((11 * T + 3 * T + 2 * k * T + 4 * I) * 2 + Dv * (2 + 4 + 4) for k in range(1, K + 1)) + 3 * T * 2 + 2 * Dv * 4
    act = local * S * per_token + S * V * 4
    assert (t["train_frozen_bytes"], t["train_activation_bytes"]) == (frozen, act) == (4_202_692_608, 8_726_249_472)
    # DDP: weights + grads + AdamW (16 B/param) + torch's buckets, a copy of every gradient (4 B/param)
    assert t["train_bytes_per_rank_ddp"] == P * 20 + frozen + act == 40_989_491_200  # 40.99 GB
    # FSDP, one unit: 16 B/param over 8 ranks + the whole weights and gradients at the peak (8 B/param)
    assert t["train_bytes_per_rank_fsdp"] == P * 16 // 8 + P * 8 + frozen + act == 26_959_216_640  # 26.96 GB
    # the runbook's command: one epoch of 50,000 rows at --batch-size 8
    assert (t["train_batch"], t["train_steps"]) == (8, 6250)
    # the trtllm collector: ONE model at the bundle's TP (2 GPUs), one window per request
    be = {b["backend"]: b for b in t["backends"]}
    assert out["tp"] == 2 and be["trtllm"]["gpus"] == 2
    h100 = get_gpu("h100")
    fwd = 2 * out["target"]["total"] * 50000 * 2048
    assert t["hs_seconds"]["trtllm"] == pytest.approx(fwd / (2 * h100.fp8_tflops * 1e12 * 0.35) + t["hs_storage_bytes"] / DISK_BYTES_PER_S)
    assert 4.7 * 3600 < t["hs_seconds"]["trtllm"] < 4.8 * 3600  # ~4 h 46 min: one TP2 group, not the plan's four instances


def test_runbook_training_command_is_the_one_the_plan_priced():
    """docs/gpu-runbook.md's torchrun train-draft: the --batch-size and --steps `plan --train` priced (one epoch)."""
    text = (ROOT / "docs" / "gpu-runbook.md").read_text()
    plan_args = re.search(r"<!-- docs-check: run plan-70b-train -->\n```bash\n(.*?)\n```", text, re.S).group(1).split()  # type: ignore[union-attr]
    records = int(plan_args[plan_args.index("--records") + 1])
    t = _plan("--records", str(records))["train"]
    cmd = re.search(r"torchrun --nproc-per-node (\d+) -m eagle3_trt.cli train-draft (.*?)-o head70b-new", text, re.S)
    assert cmd, "no torchrun train-draft command in the runbook"
    words = cmd.group(2).replace("\\\n", " ").split()
    assert int(cmd.group(1)) == t["train_ranks"]
    assert int(words[words.index("--batch-size") + 1]) == t["train_batch"] and int(words[words.index("--steps") + 1]) == t["train_steps"], words


def _torchrun_memory(target: Path, cache: Path, parallel: str, out: Path) -> list[dict]:
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
           "-m", "eagle3_trt.testing.train_memory", "--target", str(target), "--hidden-states", str(cache), "--parallel", parallel, "--batch-size", "16", "--out", str(out)]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    return [json.loads((out / f"rank_{r}.json").read_text()) for r in range(2)]


def test_plan_prices_what_the_trainer_allocates_on_cpu(tiny_pair, tmp_path):
    """The trainer as train-draft --hidden-states runs it under 2 gloo ranks, with torch's allocator
    counted (eagle3_trt.testing.train_memory): the parameter count, DDP's buckets and FSDP's units
    are the plan's, and each rank's peak is compared with the plan's formula at the same shapes
    (fp32 on CPU): within 15%. Measured: 0.92-0.96 of the peak at --batch-size 16 (8 rows a rank)."""
    from eagle3_trt.cli import cli
    from eagle3_trt.pipeline import train_plan
    from eagle3_trt.pipeline.model_size import count_draft, parse_shape
    from eagle3_trt.train import distributed

    target, _ = tiny_pair
    data = tmp_path / "data.jsonl"
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "then", "it", "ran", "to", "the", "red", "house", "by", "the", "sea", "while", "a", "dog", "slept"]
    data.write_text("".join(json.dumps({"text": " ".join(words[(k + j) % len(words)] for j in range(60))}) + "\n" for k in range(24)))
    res = CliRunner().invoke(cli, ["hidden-states", "collect", "--target", str(target), "--data", str(data), "-o", str(tmp_path / "hs"), "--seq-len", "32"])
    assert res.exit_code == 0, res.output
    tcfg = read_config(target / "config.json")
    shape = parse_shape(tcfg, "target")
    # the plan's constants are the trainer's (pipeline/ cannot import train/: tied here)
    assert train_plan.TRAIN_BYTES_PER_PARAM == distributed.TRAIN_BYTES_PER_PARAM
    assert train_plan.DDP_BUCKET_BYTES_PER_PARAM == distributed.DDP_BUCKET_BYTES_PER_PARAM == 4
    assert train_plan.FSDP_UNSHARDED_BYTES_PER_PARAM == distributed.FSDP_UNSHARDED_BYTES_PER_PARAM and distributed.FSDP_UNITS == 1
    lines = []
    for mode in ("ddp", "fsdp"):
        ranks = _torchrun_memory(target, tmp_path / "hs", mode, tmp_path / mode)
        for r in ranks:
            assert (r["mode"], r["world"], r["local_batch"]) == (mode, 2, 8)
            P = r["draft_params"]
            assert count_draft(r["draft_config"], shape).total == P  # the plan's parameter count is the module's
            if mode == "ddp":  # what torch's reducer built: a copy of every fp32 gradient, in 25 MiB buckets
                assert r["ddp_bucket_bytes"] == train_plan.DDP_BUCKET_BYTES_PER_PARAM * P
                assert r["ddp_bucket_cap_bytes"] == distributed.DDP_BUCKET_CAP_MB << 20 and r["ddp_gradient_as_bucket_view"] is False
            else:
                assert r["fsdp_units"] == distributed.FSDP_UNITS
            mem = train_plan.train_memory_per_rank(
                P, shape.vocab, shape.hidden, shape.intermediate, r["draft_vocab"], 3, r["seq_len"], r["local_batch"], 2, frozen_bytes=4, act_bytes=4
            )
            state = mem[mode] - mem["activations"]  # what the wrapping and optimizer hold, and the frozen head
            assert r["peak_bytes"] >= state, (mode, r["peak_bytes"], state)
            assert abs(mem[mode] - r["peak_bytes"]) <= 0.15 * r["peak_bytes"], (mode, mem, r)
            lines.append(
                f"{mode} rank {r['rank']}: measured peak {r['peak_bytes'] / 1e6:.2f} MB, planned {mem[mode] / 1e6:.2f} MB "
                f"(state {state / 1e6:.2f} + activations {mem['activations'] / 1e6:.2f}), planned/measured {mem[mode] / r['peak_bytes']:.2f}"
            )
    print("\n".join(lines))
