"""`plan MODEL --measure`: memory per GPU and time per 1,000 prompts of measuring alpha with the reference
runtime split over a node's GPUs (pipeline/reference_memory.py), checked by hand arithmetic at
Llama-3.3-70B's shape (hidden 8192, 80 layers, 64 heads / 8 KV heads of 128, MLP 28672, vocab 128,256,
untied) and its EAGLE-3 head (1 layer, draft vocabulary 32,000) on 8 H100s."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from eagle3_trt.cli import main
from eagle3_trt.errors import UserError
from eagle3_trt.formats.tp_layout import head_ranges
from eagle3_trt.pipeline.gpus import GPUS
from eagle3_trt.pipeline.plan_command import plan_cmd
from eagle3_trt.pipeline.plan_presets import MODEL_CONFIG_DIR
from eagle3_trt.pipeline.reference_memory import ALLREDUCE_S, FLOPS_EFFICIENCY, HBM_EFFICIENCY
from eagle3_trt.testing.readme_blocks import doc_pages

ROOT = Path(__file__).resolve().parents[1]

H, LAYERS, HEADS, KV, D, FF, VOCAB, DRAFT_VOCAB = 8192, 80, 64, 8, 128, 28672, 128256, 32000


def _plan(capsys, *args: str) -> dict:
    assert main(["plan", "llama3.3-70b", "--gpu", "h100", "--gpus", "8", "--measure", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["measure"]


def test_the_configs_are_the_70b_shape():
    t = json.loads((MODEL_CONFIG_DIR / "llama3.3-70b" / "target" / "config.json").read_text())
    d = json.loads((MODEL_CONFIG_DIR / "llama3.3-70b" / "draft" / "config.json").read_text())
    assert (t["hidden_size"], t["num_hidden_layers"], t["num_attention_heads"], t["num_key_value_heads"], t["intermediate_size"], t["vocab_size"]) == (
        H, LAYERS, HEADS, KV, FF, VOCAB,
    )  # fmt: skip
    assert not t.get("tie_word_embeddings") and (d["num_hidden_layers"], d["draft_vocab_size"], d["intermediate_size"]) == (1, DRAFT_VOCAB, FF)


def test_memory_and_time_at_tp8_by_arithmetic(capsys):
    m = _plan(capsys, "--measure-tp", "8")
    mem, batch, prompt, gen, k = m["memory_per_gpu"], 16, 512, 128, m["max_draft_len"]
    assert (m["tp"], mem["batch"], mem["context"], m["prompts"]) == (8, batch, prompt + gen, 1000)
    # a rank: 8 query heads (1024 rows of q, o's 1024 columns), 1 KV head (128 rows of k and v), 3584 MLP rows; BF16
    per_layer = H * 1024 + 2 * H * 128 + 1024 * H + 3 * H * 3584
    assert per_layer == 106_954_752
    replicated = 2 * VOCAB * H + LAYERS * 2 * H + H  # embedding, lm_head, norms on every rank
    assert mem["target_weights"] == (LAYERS * per_layer + replicated) * 2 == 21_318_090_752  # 19.9 GiB
    # the head: fc 3H -> H, one layer reading 2H (q 64 heads, k/v 8), MLP, 3 norms + final, lm_head over 32,000
    draft = H * 3 * H + (2 * H * H + 2 * 2 * H * 1024 + H * H) + 3 * H * FF + 4 * H + DRAFT_VOCAB * H
    assert mem["draft_weights"] == draft * 2 == 2_806_054_912
    assert mem["kv"] == 2 * LAYERS * 1 * D * 2 * batch * (prompt + gen) == 419_430_400
    assert mem["activations"] == batch * (prompt + gen) * DRAFT_VOCAB * 4
    assert mem["total"] == 21_318_090_752 + 2_806_054_912 + 419_430_400 + 1_310_720_000  # 24.0 GiB of the H100's 79.6
    # time: per batch, a prefill at 30% of BF16 peak, 128 decode steps reading the rank's weights and KV at 50% of HBM
    # bandwidth plus 2 all-reduces per layer, and K draft passes; 1000 prompts = 63 batches of 16
    g = GPUS["h100"]
    bw, flops = g.bandwidth_tbs * 1e12 * HBM_EFFICIENCY, g.bf16_tflops * 1e12 * FLOPS_EFFICIENCY
    active = 70_553_706_496 - VOCAB * H  # parameters a token runs through (the embedding is a lookup)
    step = (mem["target_weights"] + mem["kv"] * (prompt + gen / 2) / (prompt + gen)) / bw + 2 * LAYERS * ALLREDUCE_S
    prefill = 2 * active / 8 * batch * prompt / flops
    drafts = k * (draft * 2 / bw + 2 * draft * batch * (prompt + gen) / flops)
    t = m["time"]
    assert t["batches"] == math.ceil(1000 / batch) == 63
    for name, want in (("target_step_s", step), ("prefill_s", prefill), ("draft_passes_s", drafts), ("total_s", 63 * (prefill + gen * step + drafts))):
        assert t[name] == pytest.approx(want, rel=1e-12), name
    assert 0.014 < step < 0.018 and 120 < t["total_s"] < 300  # ~16 ms a step, ~3 min per 1,000 prompts


def test_default_tp_is_the_fewest_gpus_that_fit_and_the_text_says_it(capsys):
    m = _plan(capsys)
    # TP=2 needs 67.7 + 2.6 + 1.6 + 1.2 GiB, over 79.6 GiB with the 10% margin; TP=4 fits
    assert m["tp"] == 4 and m["memory_per_gpu"]["total"] * 1.1 <= GPUS["h100"].memory_bytes
    assert main(["plan", "llama3.3-70b", "--gpu", "h100", "--gpus", "8", "--measure"]) == 0
    out = capsys.readouterr().out
    assert "at TP=4" in out and "per 1,000 prompts" in out and "--tp 4" in out


def test_what_does_not_fit_is_one_line_with_the_memory_per_gpu(capsys):
    assert main(["plan", "llama3.3-70b", "--gpu", "h100", "--gpus", "8", "--measure", "--measure-tp", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--measure-tp" in err and "per GPU at TP=1" in err and "GiB" in err, err
    assert main(["plan", "llama3.3-70b", "--gpu", "h100", "--gpus", "8", "--measure-tp", "4"]) == 2  # without --measure
    assert "add --measure" in capsys.readouterr().err


def test_runbook_quotes_what_the_measure_plan_prints():
    """docs/gpu-runbook.md step 4 runs `plan ... --measure` (block plan-70b-measure) and quotes its lines."""
    docs = "\n".join(p.read_text() for p in doc_pages(ROOT))
    m = re.search(r"<!-- docs-check: run plan-70b-measure -->\n```bash\n(.*?)\n```", docs, re.S)
    assert m, "the runbook has no plan-70b-measure block"
    args = m.group(1).split()
    assert args[:3] == [".venv/bin/eagle3-trt", "plan", "llama3.3-70b"] and "--measure" in args
    res = CliRunner().invoke(plan_cmd, args[2:])
    assert res.exit_code == 0, res.output
    printed = res.stdout[res.stdout.index("measuring (alpha") :].strip().splitlines()
    quoted = re.search(r"prints, after the deployment plan:\n\n```text\n(.*?)\n```", docs[m.end() :], re.S)
    assert quoted and quoted.group(1).splitlines() == printed


def test_head_splits_and_refusals():
    # ranks that divide the KV heads take whole groups; ranks sharing one KV head split its query heads
    assert [head_ranges(64, 8, 8, r) for r in (0, 7)] == [((0, 8), (0, 1)), ((56, 64), (7, 8))]
    assert [head_ranges(3, 1, 2, r) for r in (0, 1)] == [((0, 2), (0, 1)), ((2, 3), (0, 1))]  # the tiny target at TP=2
    for heads, kv, world in ((3, 1, 4), (64, 8, 3)):
        with pytest.raises(UserError, match="cannot split"):
            head_ranges(heads, kv, world, 0)


def test_a_bundle_that_does_not_fit_is_refused_before_loading(fp8_bundle, tmp_path, capsys):
    """The tiny bundle with a 70B config.json: refused from the config in one line with the memory per GPU,
    before a weight is read (the weights would not even match) and with nothing written."""
    big = tmp_path / "big"
    shutil.copytree(fp8_bundle, big)
    cfg = json.loads((big / "target" / "config.json").read_text())
    cfg.update(hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=D, intermediate_size=FF, vocab_size=VOCAB)
    (big / "target" / "config.json").write_text(json.dumps(cfg))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"text": "def f(x):"}) + "\n")
    assert main(["alpha", str(big), "--prompts", str(prompts), "-o", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # float32 on a CPU: (70.55e9 parameters) x 4 bytes = 262.8 GiB
    assert len(err) == 1 and err[0].startswith("error: --tp: measuring big needs 262.8 GiB per GPU at TP=1") and "Traceback" not in err[0], err
    assert not (tmp_path / "rep").exists()
