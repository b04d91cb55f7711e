"""P-EAGLE in the decoding loop (core/engine.py through speculative/peagle's MethodRun) on the shipped
tiny pair: greedy output equals the target's own greedy decoding; the bonus-slot draft is the trained
EAGLE-3 head's, so acceptance is real; and every step's K drafts equal ONE forward of the draft over
the whole committed context plus the K-1 mask slots, without a cache: vLLM's parallel-drafting layout
(llm_base_proposer.py ``set_inputs_first_pass``), recomputed independently of the runtime's KV handling.

The head: models/tiny/draft's EAGLE-3 weights with P-EAGLE's two additions (its embed_tokens = the
target's, the table the EAGLE-3 head was trained with; a random mask_hidden), as PEagleDraft loads them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from eagle3_trt.convert.draft_format import load_draft
from eagle3_trt.convert.load import load_target
from eagle3_trt.core.engine import SamplingParams, SpeculativeEngine
from eagle3_trt.errors import UserError
from eagle3_trt.speculative.peagle.draft import PEagleDraft
from eagle3_trt.speculative.peagle.method import PEagleMethod

TINY = Path(__file__).resolve().parents[1] / "models" / "tiny"
K = 3
MASK = 0


@pytest.fixture(scope="module")
def engine() -> SpeculativeEngine:
    ckpt = load_draft(TINY / "draft")
    target = load_target(TINY / "target", dtype=torch.float32, aux_layer_ids=ckpt.config.aux_layer_ids)
    g = torch.Generator().manual_seed(0)
    tensors = dict(ckpt.tensors)
    tensors["embed_tokens.weight"] = target.hf.get_input_embeddings().weight.detach().clone()
    tensors["mask_hidden"] = torch.randn(1, 1, ckpt.config.fuse_width, generator=g)
    draft = PEagleDraft.from_peagle_checkpoint(_Ckpt(ckpt.config, tensors), MASK)
    return SpeculativeEngine(target, draft, max_draft_len=K, draft_embed=draft.embed_tokens, method=PEagleMethod())


@dataclass
class _Ckpt:
    config: Any
    tensors: dict[str, Any]


def prompts(n: int) -> list[list[int]]:
    return [p[:32] for p in json.loads((TINY / "heldout_prompts.json").read_text())["prompts"][:n]]


def test_peagle_greedy_output_equals_target(engine):
    params = SamplingParams(temperature=0.0, max_tokens=24)
    ps = prompts(3)
    spec = engine.generate(ps, params)
    plain = engine.generate(ps, params, speculate=False)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]
    drafted = sum(r.stats.draft_tokens for r in spec)
    accepted = sum(r.stats.accepted_tokens for r in spec)
    assert drafted > 0 and accepted > 0  # the bonus slot is the trained head's first draft
    assert all(len(r.stats.drafted_per_position) == K for r in spec)


class _Recording(PEagleMethod):
    """PEagleMethod whose run records each step's (committed tokens, drafts)."""

    def __init__(self, log: list[tuple[list[int], list[int]]]) -> None:
        object.__setattr__(self, "log", log)

    def start(self, engine, rows, tree, tree_spec, params):  # type: ignore[no-untyped-def]
        run = super().start(engine, rows, tree, tree_spec, params)
        inner = run.draft

        def draft(engine, rows, st, tree, k_eff, active):  # type: ignore[no-untyped-def]
            d = inner(engine, rows, st, tree, k_eff, active)
            self.log.append((list(rows[0].tokens), d.node_tok[0].tolist()))
            return d

        run.draft = draft  # type: ignore[method-assign]
        return run


def test_each_step_is_one_parallel_forward(engine):
    """The runtime's drafts (commit pass on the KV cache + mask slots) equal a cache-free single forward over
    [context slots, bonus slot, K-1 mask slots] at every step of a real decode."""
    (prompt,) = prompts(1)
    params = SamplingParams(temperature=0.0, max_tokens=20)
    log: list[tuple[list[int], list[int]]] = []
    with engine.using(_Recording(log)):
        (res,) = engine.generate([prompt], params)
    plain, (aux,) = engine.generate_with_aux([prompt], params)
    assert plain[0].token_ids == res.token_ids
    d: PEagleDraft = engine.draft
    assert len(log) > 3
    for tokens, drafts in log:
        L = len(tokens)  # draft slots 0..L-2 read token p+1 with the target's aux state at p
        ids = torch.tensor(tokens[1:] + [MASK] * (K - 1))
        with torch.no_grad():
            hid = torch.cat([d.fuse(aux[: L - 1][None].float()), d.mask_state().expand(1, K - 1, -1)], dim=1)
            _, logits, _ = d(d.embed_tokens(ids)[None], hid, torch.arange(L - 1 + K - 1)[None])
        want = engine._d2t_ids[logits[0, L - 2 :].argmax(-1)].tolist()
        assert drafts == want


def test_peagle_refuses_sampling_and_trees(engine):
    with pytest.raises(UserError) as e:
        engine.generate(prompts(1), SamplingParams(temperature=0.7, max_tokens=4))
    assert e.value.where == "temperature"
    with pytest.raises(UserError) as e:
        engine.generate(prompts(1), SamplingParams(temperature=0.0, max_tokens=4), tree=[(0,), (1,), (0, 0)])
    assert e.value.where == "tree"
