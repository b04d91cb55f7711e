"""A vllm-project/speculators head keeps its variant flags (config written by hand here; heads made
with speculators' own code are tests/test_peer_heads.py).

speculators (0.9.0, models/eagle3/config.py and core.py) writes norm_before_fc, fc_norm and
norm_output at the top level of its config and trains them with TensorRT-LLM's meaning and tensor
names (input_norm.weight, fc_norm.{i}.weight, post-norm feedback). They used to be dropped for this
layout, so such a head was measured, and exported for TensorRT-LLM, as a different function. Its
own converter (Eagle3Converter) also drops input_norm/fc_norm tensors; such an incomplete head must
be refused in one line, not served without its norm. norm_before_residual (its training default) is
a function TensorRT-LLM cannot serve: refused (formats/draft_producers.py)."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3_trt.cli import main
from eagle3_trt.convert.draft_format import load_draft
from eagle3_trt.formats.draft_config import trtllm_config


def _to_speculators(draft_dir, extra_tensors=None, **flags):
    c = json.loads((draft_dir / "config.json").read_text())
    layer = {k: v for k, v in c.items() if k not in ("draft_vocab_size", "target_hidden_size", "architectures", "eagle_config")}
    cfg = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": layer,
        "draft_vocab_size": c["draft_vocab_size"],
        "target_hidden_size": c["target_hidden_size"],
        "norm_before_residual": False,
        "speculators_config": {"algorithm": "eagle3"},
        **flags,
    }
    (draft_dir / "config.json").write_text(json.dumps(cfg))
    t = {k.replace("midlayer.", "layers.0."): v for k, v in load_file(str(draft_dir / "model.safetensors")).items()}
    t.update(extra_tensors or {})
    save_file(t, str(draft_dir / "model.safetensors"))
    return c["target_hidden_size"]


@pytest.mark.parametrize(
    "flag, attr, exported",
    [
        ("norm_output", "return_hidden_post_norm", ("eagle_config", "return_hidden_post_norm")),
        ("norm_before_fc", "norm_before_fc", ("eagle_config", "norm_before_fc")),
        ("fc_norm", "fc_norm", ("fc_norm",)),
    ],
)
def test_speculators_flag_is_carried(tiny_pair, flag, attr, exported):
    T = json.loads((tiny_pair[1] / "config.json").read_text())["target_hidden_size"]
    extra = {
        "norm_before_fc": {"input_norm.weight": torch.ones(3 * T, dtype=torch.bfloat16)},
        "fc_norm": {f"fc_norm.{i}.weight": torch.ones(T, dtype=torch.bfloat16) for i in range(3)},
    }.get(flag)
    _to_speculators(tiny_pair[1], extra, **{flag: True})
    d = load_draft(tiny_pair[1])
    assert d.config.source_format == "speculators" and getattr(d.config, attr) is True
    out = trtllm_config(d.config, {})
    for key in exported[:-1]:
        out = out[key]
    assert out[exported[-1]] is True
    for name in extra or {}:
        assert name in d.tensors


@pytest.mark.parametrize("flag, missing", [("norm_before_fc", "input_norm.weight"), ("fc_norm", "fc_norm.0.weight")])
def test_speculators_head_without_its_norm_is_refused(tiny_pair, capsys, flag, missing):
    # what speculators 0.9.0's own Eagle3Converter writes for such a head
    _to_speculators(tiny_pair[1], **{flag: True})
    rc = main(["validate", "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1])])
    _, err = capsys.readouterr()
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"tensor {missing} missing" in err


def test_speculators_norm_before_residual_is_refused(tiny_pair, capsys):
    """It used to be built with a warning, the served draft agreeing with the trained function on 21% of top-1 tokens."""
    _to_speculators(tiny_pair[1])
    c = json.loads((tiny_pair[1] / "config.json").read_text())
    c["norm_before_residual"] = True
    (tiny_pair[1] / "config.json").write_text(json.dumps(c))
    rc = main(["validate", "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1])])
    _, err = capsys.readouterr()
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "config.json:norm_before_residual" in err and "speculators" in err


def test_speculators_flag_must_be_boolean(tiny_pair, capsys):
    _to_speculators(tiny_pair[1], norm_output="false")
    rc = main(["validate", "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1])])
    _, err = capsys.readouterr()
    assert rc == 2 and "config.json:norm_output" in err and "Traceback" not in err


def test_dry_run_reads_a_speculators_head_like_a_real_build(tiny_pair, tmp_path, capsys):
    """The dry run parses the head's config with the loader's own code (nested layer config, vLLM
    aux ids one above TensorRT-LLM's, an unsorted list naming a set of layers): it used to read the top
    level by hand and refuse every speculators head ("vocab_size: None")."""
    _to_speculators(tiny_pair[1])
    c = json.loads((tiny_pair[1] / "config.json").read_text())
    c["eagle_aux_hidden_state_layer_ids"] = [5, 2, 7]  # vLLM ids: inputs of layers 5, 2, 7
    (tiny_pair[1] / "config.json").write_text(json.dumps(c))
    outs = {}
    for mode in ("--dry-run", None):
        out = tmp_path / f"b{mode is None}"
        argv = ["engine", "--model", "tiny", "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]), "-o", str(out)]
        assert main(argv + ([mode] if mode else [])) == 0, capsys.readouterr().err
        outs[mode] = (out / "llm_api_options.yaml").read_text()
    for text in outs.values():
        assert "eagle3_layers_to_capture:\n  - 1\n  - 4\n  - 6\n" in text.replace("    ", "  ")
