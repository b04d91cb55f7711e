"""The reference runtime runs engine bundles as built: quantized weights dequantized, activations and
the FP8 KV cache fake-quantized, so measured acceptance is the quantized pair's.

Uses the session bundles of tests/conftest.py (tiny pair through the real ModelOpt pipeline):
FP8 target + BF16 draft + FP8 KV (H100), and NVFP4 target + NVFP4 draft (B200).
"""

from __future__ import annotations

import pytest
import torch

from eagle3_trt.core.engine import SamplingParams, SpeculativeEngine
from eagle3_trt.runtime.loader import engine_from_bundle

PROMPT = [0, 2, 331, 266, 3, 204, 204, 57, 74, 299]


def _logits(eng: SpeculativeEngine, ids: list[int]) -> torch.Tensor:
    n = len(ids)
    allowed = torch.tril(torch.ones(n, n, dtype=torch.bool))[None]
    logits, _ = eng.target.forward(torch.tensor([ids]), torch.arange(n)[None], allowed, eng.target.new_cache())
    return logits[0]


def test_fp8_bundle_runs_quantized(fp8_bundle):
    q = engine_from_bundle(fp8_bundle)
    ref = engine_from_bundle(fp8_bundle, reference=True)  # the BF16 sources in manifest.json
    L = q.target.num_layers
    assert len(q.target.fake_quant_handles) == 7 * L  # q, k, v, o, gate, up, down of every layer
    assert sorted(q.target.kv_scales) == list(range(L))  # FP8 KV cache emulated in every layer
    assert not ref.target.fake_quant_handles and not ref.target.kv_scales
    assert q.max_draft_len == 3 and q.target.aux_layer_ids == (1, 3, 4) and q.tokenizer is not None
    lq, lr = _logits(q, PROMPT), _logits(ref, PROMPT)
    rel = float((lq - lr).norm() / lr.norm())
    assert 1e-4 < rel < 0.2, rel  # quantized: close to the BF16 target, not equal
    # the activation fake quantization is really applied
    for h in q.target.fake_quant_handles:
        h.remove()
    assert not torch.equal(_logits(q, PROMPT), lq)


@pytest.mark.parametrize("tree", [None, [(0,), (1,), (0, 0)]])
def test_quantized_bundles_speculate_consistently(fp8_bundle, nvfp4_bundle, tree):
    for b in (fp8_bundle, nvfp4_bundle):
        eng = engine_from_bundle(b)
        spec = eng.generate([PROMPT, PROMPT[:5]], SamplingParams(max_tokens=16), tree=tree)
        base = eng.generate([PROMPT, PROMPT[:5]], SamplingParams(max_tokens=16), speculate=False)
        assert [r.token_ids for r in spec] == [r.token_ids for r in base]
        assert all(r.stats.draft_tokens > 0 for r in spec)


def test_nvfp4_bundle_quantizes_target_and_draft(nvfp4_bundle):
    eng = engine_from_bundle(nvfp4_bundle)
    assert len(eng.target.fake_quant_handles) == 7 * eng.target.num_layers
    assert len(eng.draft.fake_quant_handles) > 0  # the draft was quantized too (--quantize-draft)
    outs = list(eng.stream(PROMPT, SamplingParams(max_tokens=8, temperature=0.7, seed=3)))
    assert sum(len(o.new_token_ids) for o in outs) == 8 and outs[-1].finish_reason == "length"


def test_bundle_without_bf16_sources_is_a_user_error(fp8_bundle, tmp_path):
    import json
    import shutil

    from eagle3_trt.errors import UserError

    b = tmp_path / "b"
    shutil.copytree(fp8_bundle, b)
    man = json.loads((b / "manifest.json").read_text())
    man["sources"]["target"]["path"] = str(tmp_path / "gone")
    (b / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(UserError, match="does not exist"):
        engine_from_bundle(b, reference=True)
