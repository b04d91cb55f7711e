"""The three published draft layouts normalize to the same internal form."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3_trt.convert.draft_format import load_draft


def _rewrite(draft_dir, cfg_fn, rename_fn):
    cfg = json.loads((draft_dir / "config.json").read_text())
    (draft_dir / "config.json").write_text(json.dumps(cfg_fn(cfg)))
    t = load_file(str(draft_dir / "model.safetensors"))
    save_file({rename_fn(k): v for k, v in t.items()}, str(draft_dir / "model.safetensors"))


def test_safeailab_layout(tiny_pair):
    d = load_draft(tiny_pair[1])
    assert d.config.source_format == "safeailab"
    assert d.config.aux_layer_ids is None and d.config.num_aux_layers == 3
    assert d.config.draft_vocab_size == 256 and d.config.vocab_size == 512
    assert "midlayer.self_attn.q_proj.weight" in d.tensors and d.has_d2t


def test_modelopt_layout_normalizes_to_same_tensors(tiny_pair):
    ref = load_draft(tiny_pair[1])

    def cfg_fn(c):
        c["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, 3, 4], "use_aux_hidden_state": True, "next_layer_regular": True}
        return c

    _rewrite(tiny_pair[1], cfg_fn, lambda k: k.replace("midlayer.", "layers.0."))
    d = load_draft(tiny_pair[1])
    assert d.config.source_format == "modelopt"
    assert d.config.aux_layer_ids == (1, 3, 4)
    assert d.config.extra == {"next_layer_regular": True}
    assert set(d.tensors) == set(ref.tensors)
    assert all(torch.equal(d.tensors[k], ref.tensors[k]) for k in ref.tensors)


def test_speculators_layout_converts_aux_ids_to_trtllm_convention(tiny_pair):
    ref = load_draft(tiny_pair[1])

    def cfg_fn(c):
        layer = {k: v for k, v in c.items() if k not in ("draft_vocab_size", "target_hidden_size", "architectures")}
        return {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "transformer_layer_config": layer,
            "draft_vocab_size": c["draft_vocab_size"],
            "target_hidden_size": c["target_hidden_size"],
            "norm_before_residual": False,
            # vLLM convention: inputs of layers 2, 4, 5 == outputs of layers 1, 3, 4
            "eagle_aux_hidden_state_layer_ids": [2, 4, 5],
            "speculators_config": {"algorithm": "eagle3"},
        }

    _rewrite(tiny_pair[1], cfg_fn, lambda k: k.replace("midlayer.", "layers.0."))
    d = load_draft(tiny_pair[1])
    assert d.config.source_format == "speculators"
    assert d.config.aux_layer_ids == (1, 3, 4)
    assert d.config.hidden_size == ref.config.hidden_size and d.config.draft_vocab_size == 256
    assert set(d.tensors) == set(ref.tensors)


def test_pytorch_model_bin_draft_loads(tiny_pair):
    t = load_file(str(tiny_pair[1] / "model.safetensors"))
    (tiny_pair[1] / "model.safetensors").unlink()
    torch.save(t, tiny_pair[1] / "pytorch_model.bin")
    d = load_draft(tiny_pair[1])
    assert d.config.source_format == "safeailab" and d.tensors["fc.weight"].shape == (64, 192)


def test_not_an_eagle_head(tiny_pair):
    from eagle3_trt.errors import UserError

    with pytest.raises(UserError, match="not an EAGLE-3 head"):
        load_draft(tiny_pair[0])


def test_qwen3_style_qk_norm_tensors_are_refused(tiny_pair, capsys):
    """q_norm/k_norm were "ignored" and still shipped: TensorRT-LLM's Eagle3Attention applies no q/k norm,
    so a head trained with them is another function; refused in one line naming the tensor."""
    from eagle3_trt.cli import main

    t = load_file(str(tiny_pair[1] / "model.safetensors"))
    t["midlayer.self_attn.q_norm.weight"] = torch.ones(16, dtype=torch.bfloat16)
    t["midlayer.self_attn.k_norm.weight"] = torch.ones(16, dtype=torch.bfloat16)
    save_file(t, str(tiny_pair[1] / "model.safetensors"))
    rc = main(["validate", "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1])])
    _, err = capsys.readouterr()
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "midlayer.self_attn.k_norm.weight" in err and "q_norm/k_norm" in err
