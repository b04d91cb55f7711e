"""The file readers of eagle3_trt.formats: one answer per fact, whichever consumer asks."""

import json

import pytest
import transformers

from eagle3_trt.core.tree import parse_tree
from eagle3_trt.errors import UserError
from eagle3_trt.formats.draft_config import draft_config
from eagle3_trt.formats.generation import eos_token_ids, pad_token_id, token_text
from eagle3_trt.formats.hf_config import DEFAULT_MAX_POSITIONS, max_positions_of


def _write(d, name, obj):
    (d / name).write_text(json.dumps(obj))


def test_eos_ids_from_int_list_and_tokenizer_fallback(tmp_path):
    _write(tmp_path, "generation_config.json", {"eos_token_id": 7})  # one id
    _write(tmp_path, "config.json", {"eos_token_id": [7, 9], "pad_token_id": 3})  # a list, 7 repeated
    # the tokenizer names its eos by text; its id is an added token of tokenizer.json
    _write(tmp_path, "tokenizer_config.json", {"eos_token": {"content": "<|eot|>", "special": True}})
    _write(tmp_path, "tokenizer.json", {"added_tokens": [{"content": "<|eot|>", "id": 12}, {"content": "<|pad|>", "id": 13}]})
    assert eos_token_ids(tmp_path) == (7, 9, 12)
    assert pad_token_id(tmp_path) == 3

    only_tokenizer = tmp_path / "tok"
    only_tokenizer.mkdir()
    _write(only_tokenizer, "tokenizer_config.json", {"eos_token": "<|pad|>"})
    _write(only_tokenizer, "tokenizer.json", {"added_tokens": [{"content": "<|pad|>", "id": 13}]})
    assert eos_token_ids(only_tokenizer) == (13,)
    assert eos_token_ids(tmp_path, only_tokenizer) == (7, 9, 12, 13)
    assert pad_token_id(only_tokenizer) == 0  # no config.json: the runtime's default pad
    assert token_text({"content": "<s>"}) == "<s>" and token_text("<s>") == "<s>" and token_text(None) is None


def test_corrupt_generation_config_is_a_user_error(tmp_path):
    (tmp_path / "generation_config.json").write_text("{not json")
    with pytest.raises(UserError):
        eos_token_ids(tmp_path)


def test_default_max_positions_is_transformers_llama_default():
    assert transformers.LlamaConfig().max_position_embeddings == DEFAULT_MAX_POSITIONS
    assert max_positions_of({}) == DEFAULT_MAX_POSITIONS
    assert max_positions_of({"max_position_embeddings": None}) == DEFAULT_MAX_POSITIONS
    assert max_positions_of({"max_position_embeddings": 8192}) == 8192
    head = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 100}
    assert draft_config(head, "draft/config.json", "safeailab", None).max_position_embeddings == DEFAULT_MAX_POSITIONS


def test_tree_choices_from_json_text():
    assert parse_tree("[[0], [1], [0, 0]]").size == 3
    with pytest.raises(UserError):
        parse_tree("[[0], [1]")
