"""Each known trap fails with one line naming the file/field."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3_trt.convert.draft_format import load_draft
from eagle3_trt.convert.target import read_target
from eagle3_trt.convert.validate import validate_pair
from eagle3_trt.errors import UserError


def run(pair, max_seq_len=512):
    return validate_pair(read_target(pair[0]), load_draft(pair[1]), max_seq_len)


def edit_cfg(path, **kv):
    cfg = json.loads((path / "config.json").read_text())
    for k, v in kv.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (path / "config.json").write_text(json.dumps(cfg))


def edit_tensors(path, fn):
    t = load_file(str(path / "model.safetensors"))
    fn(t)
    save_file(t, str(path / "model.safetensors"))


def fails(pair, *needles):
    with pytest.raises(UserError) as e:
        run(pair)
    line = e.value.line()
    assert "\n" not in line
    for n in needles:
        assert n in line, line
    return line


def test_good_pair_passes_every_check(tiny_pair):
    rep = run(tiny_pair)
    assert [c["check"] for c in rep.checks] == [
        "target_family",
        "target_weights",
        "target_tokenizer",
        "dtypes",
        "tokenizer",
        "shapes",
        "aux_layers",
        "vocab_map",
        "rope",
    ]
    assert rep.aux_layer_ids == (1, 3, 4) and rep.aux_layers_are_default


def test_tokenizer_vocab_mismatch(tiny_pair):
    tj = json.loads((tiny_pair[0] / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    a, b = list(vocab)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (tiny_pair[1] / "tokenizer.json").write_text(json.dumps(tj))
    fails(tiny_pair, "draft", "tokenizer.json", "vocabulary differs")


def test_special_token_mismatch(tiny_pair):
    tj = json.loads((tiny_pair[0] / "tokenizer.json").read_text())
    for t in tj["added_tokens"]:
        if t["content"] == "<|eot_id|>":
            t["id"] = 3
        elif t["id"] == 3:
            t["id"] = 4
    (tiny_pair[1] / "tokenizer.json").write_text(json.dumps(tj))
    fails(tiny_pair, "special token")


def test_draft_vocab_size_for_another_target(tiny_pair):
    edit_cfg(tiny_pair[1], vocab_size=128256)
    fails(tiny_pair, "config.json:vocab_size", "128256")


def test_draft_eos_from_another_tokenizer(tiny_pair):
    edit_cfg(tiny_pair[1], eos_token_id=128009)
    fails(tiny_pair, "eos_token_id")


def test_missing_d2t(tiny_pair):
    edit_tensors(tiny_pair[1], lambda t: (t.pop("d2t"), t.pop("t2d")))
    fails(tiny_pair, ":d2t", "missing", "draft_vocab_size 256")


def test_d2t_out_of_range(tiny_pair):
    def absolute_ids(t):  # a classic mistake: storing target ids instead of offsets
        t["d2t"] = t["d2t"] + torch.arange(256) + 300
        t.pop("t2d")

    edit_tensors(tiny_pair[1], absolute_ids)
    fails(tiny_pair, ":d2t", "outside", "offsets")


def test_d2t_not_injective(tiny_pair):
    def dup(t):
        t["d2t"][1] = t["d2t"][0] - 1  # draft ids 0 and 1 both map to the same target id
        t.pop("t2d")

    edit_tensors(tiny_pair[1], dup)
    fails(tiny_pair, "not injective")


def test_d2t_float_dtype(tiny_pair):
    edit_tensors(tiny_pair[1], lambda t: t.update(d2t=t["d2t"].float()))
    fails(tiny_pair, ":d2t", "integer")


def test_t2d_disagrees_with_d2t(tiny_pair):
    def flip(t):
        t["t2d"][t["t2d"].nonzero()[0]] = False

    edit_tensors(tiny_pair[1], flip)
    fails(tiny_pair, ":t2d", "disagrees")


def test_aux_layers_out_of_range(tiny_pair):
    edit_cfg(tiny_pair[1], eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 3, 8]})
    fails(tiny_pair, "eagle_aux_hidden_state_layer_ids", "[8]", "0..7")


def test_aux_layers_not_distinct(tiny_pair):
    edit_cfg(tiny_pair[1], eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 3, 3]})
    fails(tiny_pair, "not distinct")


def test_explicit_non_default_aux_layers_are_recorded(tiny_pair):
    edit_cfg(tiny_pair[1], eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 2, 6]})
    rep = run(tiny_pair)
    assert rep.aux_layer_ids == (0, 2, 6) and not rep.aux_layers_are_default


@pytest.mark.parametrize("layers", [5, 6])  # 6: {1, 2, 2}, which TensorRT-LLM's L > 5 guard lets through
def test_target_too_shallow_for_default_aux_layers(tiny_pair, layers):
    edit_cfg(tiny_pair[0], num_hidden_layers=layers)
    fails(tiny_pair, f"num_hidden_layers={layers}", "not distinct", "only for L >= 7", "eagle_aux_hidden_state_layer_ids")


def test_hidden_size_mismatch(tiny_pair):
    edit_cfg(tiny_pair[1], target_hidden_size=128)
    fails(tiny_pair, "target_hidden_size", "128", "64")


def test_shape_disagrees_with_config(tiny_pair):
    edit_cfg(tiny_pair[1], intermediate_size=256)
    fails(tiny_pair, "midlayer.mlp.gate_proj.weight", "(192, 64)", "(256, 64)")


def test_unknown_rope_type(tiny_pair):
    edit_cfg(tiny_pair[1], rope_scaling={"rope_type": "wibble", "factor": 2.0})
    fails(tiny_pair, "rope_scaling", "wibble")


def test_rope_mismatch_and_short_window_are_warnings(tiny_pair):
    edit_cfg(tiny_pair[1], rope_theta=500000.0, max_position_embeddings=256)
    rep = run(tiny_pair)
    assert any("rope_theta" in w for w in rep.warnings)
    assert any("max_position_embeddings 256" in w for w in rep.warnings)


def test_integer_draft_weight_refused(tiny_pair):
    edit_tensors(tiny_pair[1], lambda t: t.update({"norm.weight": t["norm.weight"].to(torch.int8)}))
    fails(tiny_pair, "norm.weight", "int8")


def test_already_quantized_target_refused(tiny_pair):
    (tiny_pair[0] / "hf_quant_config.json").write_text("{}")
    fails(tiny_pair, "hf_quant_config.json", "already quantized")


def test_missing_config_field(tiny_pair):
    edit_cfg(tiny_pair[0], hidden_size=None)
    with pytest.raises(UserError, match="config.json:hidden_size: missing"):
        read_target(tiny_pair[0])


def test_non_llama_target(tiny_pair):
    edit_cfg(tiny_pair[0], model_type="gpt2")
    with pytest.raises(UserError, match="model_type"):
        read_target(tiny_pair[0])


def test_draft_without_lm_head_needs_full_vocab(tiny_pair):
    edit_tensors(tiny_pair[1], lambda t: t.pop("lm_head.weight"))
    fails(tiny_pair, "lm_head.weight", "missing")


def test_target_without_tokenizer(tiny_pair):
    (tiny_pair[0] / "tokenizer.json").unlink()
    fails(tiny_pair, "tokenizer.json", "no tokenizer")


def test_truncated_target_shard_is_named_before_loading(tiny_pair):
    f = tiny_pair[0] / "model.safetensors"
    f.write_bytes(f.read_bytes()[:4096])
    fails(tiny_pair, "model.safetensors", "corrupt or truncated")


def test_target_with_missing_layers(tiny_pair):
    edit_cfg(tiny_pair[0], num_hidden_layers=9)
    fails(tiny_pair, "model.layers.8", "num_hidden_layers=9")


def test_identical_tokenizer_in_draft_is_accepted(tiny_pair):
    shutil.copy(tiny_pair[0] / "tokenizer.json", tiny_pair[1] / "tokenizer.json")
    rep = run(tiny_pair)
    assert "identical" in next(c["detail"] for c in rep.checks if c["check"] == "tokenizer")
