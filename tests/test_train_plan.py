"""`plan MODEL --train --records N`: hidden-state storage, GPU memory per rank per backend and time for
retraining the head, from config files alone; the README's 70B runbook shows what it prints."""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner

from eagle3_trt.cli import main
from eagle3_trt.pipeline.model_size import read_config
from eagle3_trt.pipeline.plan_command import plan_cmd
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
    # TensorRT-LLM serves the FP8 plan's TP2 instances: its weights per GPU plus the writer's buffer
    assert be["trtllm"]["bytes_per_gpu"] > out["target_weight_bytes_per_gpu"] and be["trtllm"]["gpus"] == 8
    assert t["hs_seconds"]["trtllm"] < t["hs_seconds"]["hf"]  # 8 GPUs at FP8 vs one GPU at a time
    # the head: DDP when its AdamW state fits half a GPU; FSDP divides that state by the ranks
    assert t["train_mode"] == "ddp" and t["train_bytes_per_rank_fsdp"] < t["train_bytes_per_rank_ddp"]
    assert t["train_bytes_per_rank_ddp"] - t["train_bytes_per_rank_fsdp"] == t["draft_params"] * 16 - t["draft_params"] * 16 // 8
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
