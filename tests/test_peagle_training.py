"""`train-draft --method peagle` (speculative/peagle/training.py): the training pass is the served pass,
its attention mask is speculators' own, and the command writes a head that our reader, speculators' loader
and `validate` accept.

- ``parallel_unroll``'s depth-d logits at position t equal ONE cache-free forward of the draft over vLLM's
  layout for the group anchored at t-d (the context up to the anchor, then d mask slots):
  what is trained is what is served.
- ``parallel_mask`` equals speculators 0.9's ``create_peagle_mask_mod`` evaluated on the same dense layout.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from eagle3_trt.cli import main
from eagle3_trt.convert.draft_format import load_draft
from eagle3_trt.core.draft import Eagle3Draft
from eagle3_trt.speculative.peagle.checkpoint import load_peagle
from eagle3_trt.speculative.peagle.training import init_from_eagle3, parallel_mask, parallel_unroll

TINY = Path(__file__).resolve().parents[1] / "models" / "tiny"
S, K = 12, 3


@pytest.fixture(scope="module")
def head():
    ckpt = load_draft(TINY / "draft")
    eagle3 = Eagle3Draft.from_checkpoint(ckpt, dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    embed = torch.randn(ckpt.config.vocab_size, ckpt.config.hidden_size, generator=g)
    return init_from_eagle3(eagle3, embed, mask_token_id=7, seed=3).eval()


def test_parallel_unroll_is_the_served_pass(head):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, head.config.vocab_size, (2, S), generator=g)
    aux = torch.randn(2, S, head.fc.in_features, generator=g)
    with torch.no_grad():
        steps = parallel_unroll(head, ids, aux, K)
        for a in range(S - K + 1):  # the group anchored at a: context 0..a, then K-1 mask slots (vLLM's one forward)
            e = torch.cat([head.embed_tokens(ids[:, : a + 1]), head.embed_tokens(torch.full((2, K - 1), head.mask_token_id))], dim=1)
            h = torch.cat([head.fuse(aux[:, : a + 1]), head.mask_state().expand(2, K - 1, -1)], dim=1)
            pos = torch.arange(a + K)[None].expand(2, -1)
            _, ref, _ = head(e, h, pos)  # causal, no cache
            for d in range(K):
                got = steps[d][:, a + d]
                assert torch.allclose(got, ref[:, a + d], atol=1e-5), (a, d, (got - ref[:, a + d]).abs().max())
                assert torch.equal(got.argmax(-1), ref[:, a + d].argmax(-1))


def test_parallel_mask_is_speculators_mask():
    from speculators.models.peagle.attention import create_peagle_mask_mod

    anchor = torch.cat([torch.arange(S) - d for d in range(K)])
    depth = torch.arange(K).repeat_interleave(S)
    mod = create_peagle_mask_mod(anchor_pos=anchor.clamp(min=0), depth=depth, document_ids=torch.zeros(S, dtype=torch.long))
    q, kv = torch.meshgrid(torch.arange(K * S), torch.arange(K * S), indexing="ij")
    theirs = mod(None, None, q, kv)
    ours = parallel_mask(S, K)
    valid = anchor >= 0  # groups that would start before position 0 are masked out of the loss (and clamped above)
    assert torch.equal(ours[valid][:, valid], theirs[valid][:, valid])


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """Text records: held-out prompts of the tiny pair, decoded."""
    tok = AutoTokenizer.from_pretrained(TINY / "target")
    held = json.loads((TINY / "heldout_prompts.json").read_text())["prompts"]
    p = tmp_path_factory.mktemp("data") / "d.jsonl"
    p.write_text("".join(json.dumps({"text": tok.decode(ids)}) + "\n" for ids in held[:12]))
    return p


def test_train_draft_method_peagle_writes_a_speculators_head(data, tmp_path, capsys):
    out = tmp_path / "head"
    args = ["--target", str(TINY / "target"), "--data", str(data), "-o", str(out), "--init", str(TINY / "draft")]
    small = ["--steps", "2", "--seq-len", "64", "--batch-size", "2", "--eval-samples", "1", "--eval-tokens", "8", "--threads", "1", "--json"]
    assert main(["train-draft", "--method", "peagle", *args, *small]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["after"]["max_draft_len"] == 3
    ckpt = load_peagle(out)
    assert ckpt.head.num_speculative_tokens == 3 and ckpt.config.aux_layer_ids == load_draft(TINY / "draft").config.aux_layer_ids
    # speculators' resolution: the tokenizer has no mask token and no unused embedding slot, so its pad token
    tok = AutoTokenizer.from_pretrained(TINY / "target")
    assert ckpt.head.mask_token_id == tok.pad_token_id
    from speculators.models.peagle import PEagleDraftModel

    theirs = PEagleDraftModel.from_pretrained(str(out))
    assert torch.equal(theirs.mask_hidden.detach().to(torch.bfloat16), ckpt.tensors["mask_hidden"])
    assert torch.equal(theirs.embed_tokens.weight.detach().to(torch.bfloat16), ckpt.tensors["embed_tokens.weight"])
    assert main(["validate", "--target", str(TINY / "target"), "--draft", str(out)]) == 0
    assert "P-EAGLE head: mask_token_id" in capsys.readouterr().out
    # fine-tuning a P-EAGLE head keeps its own tensors (not re-initialised as from an EAGLE-3 head)
    again = tmp_path / "again"
    args2 = ["--target", str(TINY / "target"), "--data", str(data), "-o", str(again), "--init", str(out), "--lr", "1e-6"]
    assert main(["train-draft", "--method", "peagle", *args2, *small]) == 0
    capsys.readouterr()
    tuned = load_peagle(again)
    assert (tuned.tensors["mask_hidden"].float() - ckpt.tensors["mask_hidden"].float()).abs().max() < 0.05


def test_train_draft_method_refusals(data, tmp_path, capsys):
    base = ["train-draft", "--target", str(TINY / "target"), "--data", str(data), "-o", str(tmp_path / "o")]
    cases = [
        (["--mask-token-id", "3"], "--mask-token-id"),  # the default method (chain) has no mask slots
        (["--method", "peagle", "--mask-token-id", "99999", "--steps", "1", "--seq-len", "32", "--eval-samples", "1"], "--mask-token-id"),
        (["--method", "dflash"], "--method"),
        (["--init", str(TINY / "draft-peagle")], "is a peagle head; this trains chain heads"),  # EAGLE-3 training would drop its mask slots
    ]
    for extra, field in cases:
        rc = main([*base, *extra])
        err = capsys.readouterr().err
        assert rc == 2 and field in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    shutil.rmtree(tmp_path / "o.work", ignore_errors=True)
