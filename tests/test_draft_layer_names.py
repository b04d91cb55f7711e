"""One renaming rule for draft heads saved as ``layers.{i}.*`` (formats/draft_layer_names.py): the
EAGLE-3 reader (convert/draft_format.py) and the P-EAGLE reader (speculative/peagle/checkpoint.py) both use it."""

from eagle3_trt.convert import draft_format
from eagle3_trt.formats.draft_layer_names import trtllm_layer_names
from eagle3_trt.speculative.peagle import checkpoint


def test_one_layer_head_takes_midlayer_and_a_stray_layer_keeps_its_name():
    got = trtllm_layer_names({"layers.0.self_attn.q_proj.weight": 1, "layers.1.mlp.up_proj.weight": 2, "fc.weight": 3}, 1)
    # a second layer in a one-layer head is not folded onto layer 0: the shape checks name it
    assert got == {"midlayer.self_attn.q_proj.weight": 1, "layers.1.mlp.up_proj.weight": 2, "fc.weight": 3}


def test_several_layers_are_indexed_and_a_later_input_norm_is_hidden_norm():
    got = trtllm_layer_names({"layers.0.input_layernorm.weight": 1, "layers.1.input_layernorm.weight": 2, "layers.1.mlp.down_proj.weight": 3}, 2)
    assert got == {"midlayer.0.input_layernorm.weight": 1, "midlayer.1.hidden_norm.weight": 2, "midlayer.1.mlp.down_proj.weight": 3}


def test_both_readers_use_the_one_rule():
    assert draft_format.trtllm_layer_names is trtllm_layer_names
    assert checkpoint.trtllm_layer_names is trtllm_layer_names
    assert not hasattr(draft_format, "_layer_names") and not hasattr(checkpoint, "_core_names")
