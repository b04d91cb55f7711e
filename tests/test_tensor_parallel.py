"""The reference runtime split over 2 gloo processes (tensor parallel, core/tensor_parallel.py) measures what
one process measures: the tiny pair's FP8 bundle and its P-EAGLE bundle, greedy, computed in float32.

- Greedy: per request, the generated tokens, the target forwards and the accepted length of every
  verification are identical at TP=2 and TP=1 for the chain, the suffix automaton, the dynamic tree and
  P-EAGLE (one torchrun launch measures them all: eagle3_trt/testing/tp_check.py). The two differ only in
  the order float32 partial sums are added (logits within 6e-6 of each other), which no argmax here
  notices.
- The commands on top (same launch): alpha's estimator with a K sweep, gate's figures and alpha --against's
  comparison are identical at TP=2 and TP=1.
- Sampled (temperature 0.8, the chain, 16 requests): the accepted-length histograms of the two runs are
  one distribution by a chi-square test of homogeneity (2 x (K+1) table) at the 1% level (measured: the
  same samples, p = 1: both runs draw from seed 0 and see the same probabilities to float32 rounding).
- `alpha --tp 2` (it starts torchrun itself) with rank 1 SIGKILLed mid-measurement ends in one line,
  exit 1, no report and no staging directory left; the next run writes a report equal to TP=1's.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from scipy.stats import chi2_contingency

from eagle3_trt.cli import main
from eagle3_trt.pipeline.builder import EngineRequest, build_bundle
from eagle3_trt.pipeline.presets import load_preset
from eagle3_trt.testing.ranks import rank_pid
from eagle3_trt.testing.tp_check import run

TINY = Path(__file__).resolve().parents[1] / "models" / "tiny"
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("tp")
    built = []
    for name, draft in (("fp8", TINY / "draft"), ("peagle", TINY / "draft-peagle")):
        req = EngineRequest(preset=load_preset("tiny"), target=str(TINY / "target"), draft=str(draft), target_gpu="h100", calib_samples=4, out=str(out / name))
        built.append(build_bundle(req).bundle)
    return built[0], built[1]


def _prompts(path: Path, n: int, tokens: int) -> Path:
    held = json.loads((TINY / "heldout_prompts.json").read_text())["prompts"]
    path.write_text(json.dumps({"about": f"{n} held-out prompts, {tokens} tokens each", "prompts": [p[:tokens] for p in held[:n]]}))
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def test_two_ranks_match_one_for_every_method(bundles, tmp_path):
    fp8, peagle = bundles
    prompts, sampled = _prompts(tmp_path / "p.json", 6, 24), _prompts(tmp_path / "s.json", 16, 16)
    one = json.loads(json.dumps(run(fp8, peagle, prompts, MAX_TOKENS, sampled)))  # as rank 0 writes it: JSON keys and lists
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(_free_port())]
    args = [str(fp8), str(peagle), str(prompts), str(MAX_TOKENS), str(sampled), str(tmp_path / "two.json")]
    res = subprocess.run([*cmd, "-m", "eagle3_trt.testing.tp_check", *args], capture_output=True, text=True, timeout=600, env=_env())
    assert res.returncode == 0, res.stderr[-3000:]
    two = json.loads((tmp_path / "two.json").read_text())
    for mode in ("chain", "sa", "dynamic_tree", "peagle"):
        assert two[mode] == one[mode], mode
        assert len(one[mode]) == 6 and all(len(r["tokens"]) == MAX_TOKENS for r in one[mode])
    # the commands over the same path: alpha's estimator with --sweep 1-3, gate, alpha --against (fp8 vs P-EAGLE)
    for what in ("alpha_sweep", "gate", "against"):
        assert two[what] == one[what], what
    assert [len(r["accepted_seq_by_k"]) for r in one["alpha_sweep"]] == [3] * 6 and one["gate"]["turns_measured"] == 6
    # the methods are not all the same run: their target forwards differ
    forwards = {m: sum(r["target_forwards"] for r in one[m]) for m in ("chain", "sa", "dynamic_tree", "peagle")}
    assert len(set(forwards.values())) > 1, forwards
    k = max(a for m in (one, two) for r in m["sampled"] for a in r["accepted_seq"])
    table = [[sum(a == j for r in m["sampled"] for a in r["accepted_seq"]) for j in range(k + 1)] for m in (one, two)]
    keep = [j for j in range(k + 1) if table[0][j] + table[1][j] > 0]
    p = float(chi2_contingency([[row[j] for j in keep] for row in table]).pvalue)
    assert p > 0.01, (table, p)
    same = sum(a == b for a, b in zip(one["sampled"], two["sampled"]))
    print(f"target forwards per method {forwards}; sampled: accepted-length table {table}, chi-square p = {p:.3f}, {same}/16 requests identical")


def test_killed_rank_is_one_line_and_the_next_run_is_clean(bundles, tmp_path, capsys):
    fp8, _ = bundles
    prompts = _prompts(tmp_path / "p.json", 6, 24)
    out = tmp_path / "rep"
    alpha = [sys.executable, "-m", "eagle3_trt.cli", "alpha", str(fp8), "--prompts", str(prompts), "--method", "generate", "--no-bf16", "-o", str(out)]
    run_ = subprocess.Popen(
        [*alpha, "--max-tokens", "64", "--batch-size", "2", "--tp", "2"], stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env()
    )
    lines: list[str] = []
    killed, deadline = False, time.time() + 300
    assert run_.stderr is not None
    for line in run_.stderr:
        lines.append(line)
        if "prompts: 2/6" in line and not killed:  # mid-measurement: the first of three batches is done
            pid = rank_pid(run_, 1)
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            killed = True
        if time.time() > deadline:
            break
    run_.wait(timeout=120)
    err = "".join(lines)
    assert killed and run_.returncode == 1, err[-3000:]
    errors = [x for x in lines if x.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0] and "rank 1" in errors[0] and "Traceback" not in err, err[-3000:]
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], list(tmp_path.iterdir())  # no staging or lock left

    res = subprocess.run([*alpha, "--max-tokens", str(MAX_TOKENS), "--tp", "2", "--json"], capture_output=True, text=True, timeout=600, env=_env())
    assert res.returncode == 0, res.stderr[-3000:]
    two = json.loads((out / "report.json").read_text())
    assert (
        main(["alpha", str(fp8), "--prompts", str(prompts), "--method", "generate", "--no-bf16", "--max-tokens", str(MAX_TOKENS), "-o", str(tmp_path / "one")])
        == 0
    )
    capsys.readouterr()
    one = json.loads((tmp_path / "one" / "report.json").read_text())
    assert (one["settings"]["tensor_parallel"], two["settings"]["tensor_parallel"]) == (1, 2)
    fields = ("id", "generated_tokens", "target_forwards", "accepted_seq")
    req1 = [{f: r[f] for f in fields} for r in one["pairs"]["bundle"]["requests"]]
    req2 = [{f: r[f] for f in fields} for r in two["pairs"]["bundle"]["requests"]]
    assert req1 == req2 and len(req1) == 6
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    print(f"killed run: {errors[0].strip()}")


@pytest.mark.parametrize("which", ["fp8", "nvfp4"])
def test_each_rank_reads_its_slices_of_a_quantized_checkpoint(which, bundles, nvfp4_bundle):
    """A rank keeps only its slices of the stored (FP8, or NVFP4 packed with block scales) tensors as it
    reads them; dequantized, they equal the dense model's slices."""
    import functools

    import torch

    from eagle3_trt.convert.dequantize import load_checkpoint_dequantized
    from eagle3_trt.core.tensor_parallel import shard_state_dict, slicer, take_stored

    target = (bundles[0] if which == "fp8" else nvfp4_bundle) / "target"
    cfg, full, _ = load_checkpoint_dequantized(target, dtype=torch.float32)
    for rank in (0, 1):
        want = shard_state_dict(cfg, full, 2, rank)
        _, got, _ = load_checkpoint_dequantized(target, dtype=torch.float32, take=functools.partial(take_stored, slicer(cfg, 2, rank)))
        assert got.keys() == want.keys()
        for k in want:
            assert torch.equal(got[k], want[k]), (which, rank, k)
    assert full["model.layers.0.mlp.down_proj.weight"].shape[1] == 2 * want["model.layers.0.mlp.down_proj.weight"].shape[1]
