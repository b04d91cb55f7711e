"""The ModelOpt adapter on the installed ModelOpt (0.4x under `make test`, 0.37 under `make test-compat`)."""

from __future__ import annotations

import copy

import modelopt.torch.quantization as mtq
import pytest

from eagle3_trt.convert import modelopt_compat
from eagle3_trt.convert.quantize import quant_cfg
from eagle3_trt.errors import UserError


def _entries(cfg: dict) -> list[tuple[str, dict]]:
    """(pattern, attributes) in order, whichever form this ModelOpt's quant_cfg has."""
    qc = cfg["quant_cfg"]
    if isinstance(qc, list):
        return [(e["quantizer_name"], {k: v for k, v in e.items() if k != "quantizer_name"}) for e in qc]
    return list(qc.items())


def _last(cfg: dict, pattern: str) -> dict:
    found = [a for p, a in _entries(cfg) if p == pattern]
    assert found, f"{pattern} not in {cfg['quant_cfg']}"
    return found[-1]


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_quant_cfg_adds_kv_cache_and_exclusions(fmt):
    base = mtq.FP8_DEFAULT_CFG if fmt == "fp8" else mtq.NVFP4_DEFAULT_CFG
    before = copy.deepcopy(base)
    cfg = quant_cfg(fmt, "fp8")
    kv = _last(cfg, "*[kv]_bmm_quantizer")
    assert kv.get("enable", True) is not False and (kv.get("cfg", kv)["num_bits"] == (4, 3))
    for p in ("*lm_head*", "*embed_tokens*"):
        assert _last(cfg, p) == {"enable": False}
    plain = quant_cfg(fmt, "auto", exclude=("*lm_head*",))
    assert "*[kv]_bmm_quantizer" not in [p for p, _ in _entries(plain)]
    assert _last(plain, "*lm_head*") == {"enable": False}
    assert base == before  # ModelOpt's own default is never modified in place


def test_unknown_format_is_a_user_error():
    with pytest.raises(UserError, match="--quant"):
        modelopt_compat.format_config("int4")


@pytest.mark.parametrize("form", ["list", "dict"])
def test_merge_converts_entries_to_the_config_form(form):
    # Both generations' config forms, built by hand: the adapter must handle the one it is not running on too.
    cfg = {"quant_cfg": [] if form == "list" else {}}
    modelopt_compat._merge(cfg, {"*k_bmm*": {"num_bits": (4, 3), "axis": None}, "default": {"enable": False}})
    modelopt_compat.disable_quantizers(cfg, ["*lm_head*"])
    if form == "list":
        assert cfg["quant_cfg"] == [
            {"quantizer_name": "*k_bmm*", "cfg": {"num_bits": (4, 3), "axis": None}},
            {"quantizer_name": "default", "enable": False},
            {"quantizer_name": "*lm_head*", "enable": False},
        ]
    else:
        assert cfg["quant_cfg"] == {"*k_bmm*": {"num_bits": (4, 3), "axis": None}, "default": {"enable": False}, "*lm_head*": {"enable": False}}
