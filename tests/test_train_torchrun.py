"""train-draft under torchrun: 2 gloo processes on CPU follow the one-process loss curve (same
global batch), and a run whose rank 1 is SIGKILLed mid-run resumes (--resume) to the same result.

Tolerance: the two runs differ only in the order gloo sums the two ranks' gradients and losses
(float32), so losses agree to 1e-4 relative and weights to 1e-4 absolute after 60 AdamW steps
(measured: identical to the 5 printed digits of the loss; the exported bf16 weights at most one bf16
step apart)."""

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
import torch

from eagle3_trt.convert.draft_format import load_draft
from eagle3_trt.testing.ranks import rank_pid
from eagle3_trt.train.train_draft import TrainDraftOptions, train_draft

STEPS, SAVE_EVERY = 60, 10
WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "then", "it", "ran", "to", "the", "red", "house", "by", "the", "sea", "while", "a", "dog", "slept"]


def _data(path: Path) -> Path:
    import random

    rng = random.Random(0)
    with path.open("w") as f:
        for _ in range(24):
            k = rng.randrange(len(WORDS))
            f.write(json.dumps({"text": " ".join(WORDS[(k + j) % len(WORDS)] for j in range(60))}) + "\n")
    return path


def _args(target: Path, data: Path) -> list[str]:
    return [
        "--target", str(target), "--data", str(data), "--steps", str(STEPS), "--save-every", str(SAVE_EVERY),
        "--draft-vocab", "128", "--seq-len", "32", "--batch-size", "8", "--lr", "1e-3",
        "--eval-samples", "2", "--eval-tokens", "8", "--threads", "1", "--json",
    ]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchrun_cmd() -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(_free_port())]


def _torchrun(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [*_torchrun_cmd(), "-m", "eagle3_trt.cli", "train-draft", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def _checkpoint_step(ckpt: Path) -> int:
    try:
        return int(json.loads((ckpt / "state.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0


def test_two_gloo_processes_match_one_and_resume_after_a_killed_rank(tiny_pair, tmp_path):
    target, _ = tiny_pair
    data = _data(tmp_path / "data.jsonl")
    args = _args(target, data)

    # one process, in this process
    one = train_draft(
        TrainDraftOptions(target=target, data=data, out=tmp_path / "one", steps=STEPS, save_every=SAVE_EVERY, draft_vocab=128, seq_len=32, batch_size=8,
                          lr=1e-3, eval_samples=2, eval_tokens=8, threads=1, quiet=True)
    )  # fmt: skip
    assert one["processes"] == 1 and one["parallel"] == "none"

    # two processes; rank 1 SIGKILLed once the first checkpoint is on disk
    out = tmp_path / "two"
    ckpt = Path(str(out) + ".work") / "ckpt"
    run = _torchrun([*args, "-o", str(out)])
    killed_at, deadline = None, time.time() + 120
    while run.poll() is None and time.time() < deadline:
        if _checkpoint_step(ckpt) >= SAVE_EVERY:
            pid = rank_pid(run, 1)
            if pid is not None:
                killed_at = _checkpoint_step(ckpt)
                os.kill(pid, signal.SIGKILL)
                break
        time.sleep(0.02)
    _, err = run.communicate(timeout=120)
    assert killed_at is not None and run.returncode != 0, err[-2000:]
    assert not out.exists()  # nothing half-written

    res = subprocess.run(
        [*_torchrun_cmd(), "-m", "eagle3_trt.cli", "train-draft", *args, "-o", str(out), "--resume"],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    two = json.loads(res.stdout)
    assert two["processes"] == 2 and two["parallel"] == "ddp"
    assert SAVE_EVERY <= two["resumed_from_step"] < STEPS, two["resumed_from_step"]

    # the loss curve (every 10 steps, the pre-kill part read back from the checkpoint) and the weights
    curve_one = [(h["step"], h["loss"]) for h in _history(tmp_path / "one", one)]
    curve_two = [(h["step"], h["loss"]) for h in _history(out, two)]
    assert [s for s, _ in curve_one] == [s for s, _ in curve_two] == list(range(10, STEPS + 1, 10))
    for (_, a), (_, b) in zip(curve_one, curve_two):
        assert abs(a - b) <= 1e-4 * abs(a), (curve_one, curve_two)
    assert abs(one["final_loss"] - two["final_loss"]) <= 1e-4 * abs(one["final_loss"])
    wa, wb = load_draft(tmp_path / "one").tensors, load_draft(out).tensors
    assert wa.keys() == wb.keys()
    # the head is exported in bf16: float32 differences of ~1e-6 may round to neighbouring bf16 values
    worst = max(float(((wa[k].float() - wb[k].float()).abs() / wa[k].float().abs().clamp_min(1e-3)).max()) for k in wa)
    assert worst <= 2**-7, worst  # at most one bf16 step apart
    same = sum(int(torch.equal(wa[k], wb[k])) for k in wa)
    print(f"loss curve 1 process: {curve_one}\nloss curve 2 processes (rank 1 killed after step {killed_at}, resumed): {curve_two}")
    print(f"weights: {same}/{len(wa)} tensors bit-identical, worst relative difference {worst:.2e}")


def _history(out: Path, report: dict) -> list[dict]:
    return list(json.loads((out / "train_report.json").read_text())["history"])


def test_fsdp_from_a_hidden_state_cache_matches_one_process(tiny_pair, tmp_path):
    """--parallel fsdp (the head sharded over 2 gloo ranks) training from an engine's cache
    (train-draft --hidden-states, the 70B path: no target forward) ends where one process ends."""
    from click.testing import CliRunner

    from eagle3_trt.cli import cli

    target, _ = tiny_pair
    data = _data(tmp_path / "data.jsonl")
    res = CliRunner().invoke(cli, ["hidden-states", "collect", "--backend", "hf", "--device-map", "cpu", "--target", str(target), "--data", str(data),
                                   "-o", str(tmp_path / "hs"), "--seq-len", "32"])  # fmt: skip
    assert res.exit_code == 0, res.output
    common = ["--target", str(target), "--hidden-states", str(tmp_path / "hs"), "--steps", "20", "--draft-vocab", "128", "--batch-size", "8",
              "--lr", "1e-3", "--threads", "1", "--json"]  # fmt: skip
    one = CliRunner().invoke(cli, ["train-draft", *common, "-o", str(tmp_path / "one")])
    assert one.exit_code == 0, one.output
    r1 = json.loads(one.stdout)
    two = subprocess.run([*_torchrun_cmd(), "-m", "eagle3_trt.cli", "train-draft", *common, "--parallel", "fsdp", "-o", str(tmp_path / "two")],
                         capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert two.returncode == 0, two.stderr[-3000:]
    r2 = json.loads(two.stdout)
    assert (r1["processes"], r1["parallel"], r2["processes"], r2["parallel"]) == (1, "none", 2, "fsdp")
    assert r1["producer"] == r2["producer"] == "hf"
    for a, b in zip(r1["history"], r2["history"], strict=True):
        assert a["step"] == b["step"] and abs(a["loss"] - b["loss"]) <= 1e-4 * abs(a["loss"]), (r1["history"], r2["history"])
    wa, wb = load_draft(tmp_path / "one").tensors, load_draft(tmp_path / "two").tensors
    worst = max(float(((wa[k].float() - wb[k].float()).abs() / wa[k].float().abs().clamp_min(1e-3)).max()) for k in wa)
    assert worst <= 2**-7, worst
    print(f"fsdp: loss curve 1 process {[(h['step'], h['loss']) for h in r1['history']]}, 2 ranks {[(h['step'], h['loss']) for h in r2['history']]}")


def _one_row_shards(src: Path, out: Path) -> int:
    """``src`` re-written with one row per shard (a 70B row at 2,048 tokens fills a shard alone)."""
    from eagle3_trt.train.hidden_states import HiddenCache, ShardWriter

    cache = HiddenCache(src)
    m = cache.meta
    out.mkdir()
    w = ShardWriter(out, m.seq_len, m.target_hidden_size, len(m.aux_layer_ids), len(cache), rows_per_shard=1)
    for b in cache.iter_all(1):
        w.add(b["input_ids"], b["real"], b["aux"], b["last"])
    assert w.finish(m.key, m.aux_layer_ids, m.producer).shards == [1] * len(cache)
    return len(cache)


def test_one_row_shards_train_the_requested_batch_on_every_rank(tiny_pair, tmp_path):
    """Batches span shards: with one row per shard, every step of a 2-rank run trains 8 rows, 4 on
    each rank, and the loss curve is one process's."""
    from click.testing import CliRunner

    from eagle3_trt.cli import cli

    target, _ = tiny_pair
    data = _data(tmp_path / "data.jsonl")
    res = CliRunner().invoke(cli, ["hidden-states", "collect", "--target", str(target), "--data", str(data), "-o", str(tmp_path / "hs"), "--seq-len", "32"])
    assert res.exit_code == 0, res.output
    rows = _one_row_shards(tmp_path / "hs", tmp_path / "hs1")
    assert rows > 8
    steps, batch = 20, 8
    common = ["--target", str(target), "--hidden-states", str(tmp_path / "hs1"), "--steps", str(steps), "--draft-vocab", "128",
              "--batch-size", str(batch), "--lr", "1e-3", "--threads", "1", "--json"]  # fmt: skip
    one = CliRunner().invoke(cli, ["train-draft", *common, "-o", str(tmp_path / "one")])
    assert one.exit_code == 0, one.output
    r1 = json.loads(one.stdout)
    two = subprocess.run([*_torchrun_cmd(), "-m", "eagle3_trt.cli", "train-draft", *common, "-o", str(tmp_path / "two")],
                         capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert two.returncode == 0, two.stderr[-3000:]
    r2 = json.loads(two.stdout)
    assert (r1["processes"], r2["processes"], r2["parallel"]) == (1, 2, "ddp")
    assert r1["rows_per_rank"] == [steps * batch] and r2["rows_per_rank"] == [steps * batch // 2] * 2, (r1["rows_per_rank"], r2["rows_per_rank"])
    assert min(r2["tokens_per_rank"]) > 0 and sum(r2["tokens_per_rank"]) == r1["tokens_per_rank"][0], (r1["tokens_per_rank"], r2["tokens_per_rank"])
    for a, b in zip(r1["history"], r2["history"], strict=True):
        assert a["step"] == b["step"] and abs(a["loss"] - b["loss"]) <= 1e-4 * abs(a["loss"]), (r1["history"], r2["history"])
    print(f"one-row shards ({rows}): rows per rank 1 process {r1['rows_per_rank']}, 2 ranks {r2['rows_per_rank']}; tokens {r2['tokens_per_rank']}")


def test_a_batch_smaller_than_the_world_is_refused():
    from eagle3_trt.errors import UserError
    from eagle3_trt.train.distributed import Dist

    Dist(rank=0, world=4).check_batch(4)
    with pytest.raises(UserError) as e:
        Dist(rank=1, world=4).check_batch(3)
    assert e.value.where == "--batch-size"
