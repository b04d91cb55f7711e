"""train-draft on the random tiny pair: TTT equals the inference chain, fine-tuning raises held-out
acceptance, speculative decoding reproduces greedy decoding, the output is a loadable SafeAILab head,
and a killed run resumes to the same weights."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from eagle3_trt.convert.draft_format import load_draft
from eagle3_trt.convert.load import load_target
from eagle3_trt.convert.target import read_target
from eagle3_trt.core.draft import Eagle3Draft
from eagle3_trt.core.engine import SamplingParams, SpeculativeEngine
from eagle3_trt.testing.tiny_pair import make_pair
from eagle3_trt.train.evaluate import torch_threads
from eagle3_trt.train.hidden_states import HiddenCache
from eagle3_trt.train.train_draft import TrainDraftOptions, train_draft
from eagle3_trt.train.trainer import ttt_mask, ttt_unroll

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "then", "it", "ran", "to", "the", "red", "house", "by", "the", "sea", "while", "a", "dog", "slept"]


def write_data(path: Path, n: int = 40, seed: int = 0) -> Path:
    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(n):
            k = rng.randrange(len(WORDS))
            f.write(json.dumps({"text": " ".join(WORDS[(k + j) % len(WORDS)] for j in range(60))}) + "\n")
    return path


def hf_greedy(target_dir: Path, prompt: list[int], n: int, stop_ids: tuple[int, ...] = ()) -> list[int]:
    """The independent reference: transformers' own greedy ``generate``, cut after the first stop token."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, num_beams=1, eos_token_id=list(stop_ids) or None, pad_token_id=0)[
        0, len(prompt) :
    ].tolist()
    cut = next((j + 1 for j, t in enumerate(out) if t in stop_ids), len(out))
    return out[:cut]


def pretrain_target(target: Path, data: Path, steps: int = 120) -> None:
    """Teach the random tiny target the cyclic word text, so that its greedy continuation is
    something a head can learn in a few steps (a random target's is not)."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(target))
    rows = [tok.encode(json.loads(line)["text"])[:48] for line in data.read_text().splitlines()]
    x = torch.tensor([r for r in rows if len(r) == 48])
    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(str(target), dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    with torch_threads(1):
        for _step in range(steps):
            batch = x[torch.randint(0, len(x), (8,))]
            loss = model(input_ids=batch, labels=batch).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.to(torch.bfloat16).save_pretrained(str(target))


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    target, draft = make_pair(root / "pair")
    data = write_data(root / "data.jsonl")
    pretrain_target(target, data)
    opts = TrainDraftOptions(
        target=target,
        data=data,
        out=root / "head",
        init=draft,
        steps=40,
        seq_len=64,
        batch_size=8,
        lr=1e-3,
        eval_samples=8,
        eval_tokens=32,
        eval_prompt_len=16,
        quiet=True,
        threads=1,
    )
    report = train_draft(opts)
    return root, target, draft, report


def test_ttt_unroll_equals_incremental_inference(tmp_path):
    """Step k of the unrolled window at position t == k-th draft of the chain from real position t-k+1,
    computed the way inference does (KV cache, one token at a time)."""
    _, draft_dir = make_pair(tmp_path / "pair")
    torch.manual_seed(0)
    d = Eagle3Draft.from_checkpoint(load_draft(draft_dir), torch.float32)
    for p in d.parameters():
        p.data.normal_(0, 0.1)
    S, K = 10, 3
    emb, aux = torch.randn(1, S, 64), torch.randn(1, S, 192)
    with torch.no_grad():
        unrolled = ttt_unroll(d, emb, aux, K)
        for r in range(S - K + 1):
            h, lg, kv = d(emb[:, : r + 1], d.fuse(aux[:, : r + 1]), torch.arange(r + 1)[None])
            torch.testing.assert_close(lg[0, r], unrolled[0][0, r], atol=1e-5, rtol=1e-4)
            hid = h[:, -1:]
            for k in range(2, K + 1):
                t = r + k - 1
                hid, lg, kv = d(emb[:, t : t + 1], hid, torch.tensor([[t]]), past=kv)
                torch.testing.assert_close(lg[0, 0], unrolled[k - 1][0, t], atol=1e-4, rtol=1e-4)
    m = ttt_mask(5, 3)
    assert m.shape == (5, 15)
    assert m[4, :5].tolist() == [True, True, True, False, False]  # real context up to t-k+1
    assert m[4, 5:10].tolist() == [False, False, False, True, False]  # step-2 key of its chain at t-1
    assert m[4, 10:].tolist() == [False, False, False, False, True]  # itself


def test_finetune_raises_heldout_acceptance(finetuned):
    _, _, init_dir, report = finetuned
    before, after = report["before"], report["after"]
    assert after["prompts"] == before["prompts"] == 8
    assert after["acceptance_length"] >= before["acceptance_length"] + 0.2, (before, after)
    assert after["teacher_forced_accuracy"][0] > before["teacher_forced_accuracy"][0] + 0.1
    assert len(after["per_step"]) == 3
    assert report["final_loss"] < report["settings"]["steps"] * 1e9  # a number, not None


def test_output_is_a_safeailab_head_that_fits(finetuned):
    root, _, init_dir, report = finetuned
    out = root / "head"
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "train_report.json"]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["draft_vocab_size"] == 256 and cfg["vocab_size"] == 512
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    ck, init = load_draft(out), load_draft(init_dir)
    assert ck.config.source_format == "safeailab"
    assert ck.tensors["fc.weight"].dtype == torch.bfloat16
    assert torch.equal(ck.tensors["d2t"], init.tensors["d2t"])  # fine-tuning keeps the vocabulary
    assert int(ck.tensors["t2d"].sum()) == 256
    assert not torch.equal(ck.tensors["fc.weight"], init.tensors["fc.weight"])
    assert not (root / "head.work").exists()  # work files removed after success
    Eagle3Draft.from_checkpoint(ck, torch.float32)


def test_speculative_decoding_reproduces_greedy(finetuned):
    """The trained head served by the runtime's loop gives transformers' own greedy output."""
    from transformers import AutoTokenizer

    root, target, _, _ = finetuned
    tok = AutoTokenizer.from_pretrained(str(target))
    eng = SpeculativeEngine(
        load_target(target, dtype=torch.float32, aux_layer_ids=(1, 3, 4)),
        Eagle3Draft.from_checkpoint(load_draft(root / "head"), torch.float32),
        max_draft_len=3,
    )
    accepted = 0
    with torch_threads(1):
        for words in (WORDS[:6], WORDS[3:12], WORDS[8:11]):
            prompt = [tok.bos_token_id] + tok.encode(" ".join(words), add_special_tokens=False)
            res = eng.generate([prompt], SamplingParams(max_tokens=24))[0]
            assert res.token_ids == hf_greedy(target, prompt, 24)
            accepted += res.stats.accepted_tokens
    assert accepted > 0  # the comparison covered accepted drafts, not only rejections


def test_fresh_head_via_cli_and_resume(tmp_path, monkeypatch):
    """A fresh head from the command line (reduced vocabulary from the data), then a run killed
    at step 3 that --resume finishes with the same weights as an uninterrupted run."""
    from click.testing import CliRunner

    from eagle3_trt.train import trainer as trainer_mod
    from eagle3_trt.train.commands import train_draft_cmd

    target, _ = make_pair(tmp_path / "pair")
    data = write_data(tmp_path / "data.jsonl", n=12)
    args = [
        "--target",
        str(target),
        "--data",
        str(data),
        "--steps",
        "6",
        "--draft-vocab",
        "128",
        "--seq-len",
        "32",
        "--batch-size",
        "4",
        "--eval-samples",
        "2",
        "--eval-tokens",
        "8",
        "--threads",
        "1",
        "--json",
    ]
    res = CliRunner().invoke(train_draft_cmd, args + ["-o", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["draft_vocab_size"] == 128 and report["init"] is None
    ck = load_draft(tmp_path / "a")
    assert ck.config.draft_vocab_size == 128 and ck.tensors["lm_head.weight"].shape == (128, 64)
    ids = torch.arange(128) + ck.tensors["d2t"]
    assert torch.equal(ids, torch.nonzero(ck.tensors["t2d"]).flatten())  # d2t and t2d agree
    assert int(ids.max()) < 512

    # killed at step 3 (Ctrl-C saves a checkpoint), then resumed
    real_train = trainer_mod.Trainer.train

    def interrupted(self, on_step=None):
        def stop(step, rec):
            if step == 3:
                raise KeyboardInterrupt

        return real_train(self, on_step=stop)

    with monkeypatch.context() as mp:
        mp.setattr(trainer_mod.Trainer, "train", interrupted)
        res = CliRunner().invoke(train_draft_cmd, args + ["-o", str(tmp_path / "b")])
    assert res.exit_code != 0  # click turns KeyboardInterrupt into Abort
    assert json.loads((tmp_path / "b.work" / "ckpt" / "state.json").read_text())["step"] == 3
    assert not (tmp_path / "b").exists()
    res = CliRunner().invoke(train_draft_cmd, args + ["-o", str(tmp_path / "b"), "--resume"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["resumed_from_step"] == 3
    a, b = load_draft(tmp_path / "a").tensors, load_draft(tmp_path / "b").tensors
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=0, rtol=0)


def test_generate_trains_on_the_targets_own_continuations(finetuned, tmp_path):
    """--generate on raw text: every training window becomes its opening + the target's greedy
    continuation (checked against plain greedy decoding in the cached training windows)."""
    _, target, draft, _ = finetuned
    data = write_data(tmp_path / "d.jsonl", n=6, seed=1)
    report = train_draft(
        TrainDraftOptions(
            target=target,
            data=data,
            out=tmp_path / "o",
            init=draft,
            steps=1,
            seq_len=40,
            generate=True,
            gen_tokens=24,
            eval_prompt_len=16,
            batch_size=4,
            eval_samples=1,
            eval_tokens=4,
            quiet=True,
            threads=1,
            keep_work=True,
        )
    )
    assert report["generated_responses"] is True
    batch = next(HiddenCache(tmp_path / "o.work" / "cache_train").iter_all(64))
    info = read_target(target)
    assert batch["input_ids"].shape[0] == report["train_windows"] >= 4
    with torch_threads(1):
        for ids, real in zip(batch["input_ids"].tolist(), batch["real"].tolist()):
            n = sum(real)
            assert n == 40
            assert ids[16:n] == hf_greedy(target, ids[:16], 24, tuple(info.eos_token_ids))
