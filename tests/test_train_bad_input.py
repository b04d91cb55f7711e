"""train-draft refuses bad input with one clear UserError each, before any training starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3_trt.errors import UserError
from eagle3_trt.testing.tiny_pair import TinyShape, make_pair
from eagle3_trt.train.train_draft import TrainDraftOptions, train_draft


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    return make_pair(tmp_path_factory.mktemp("pair"))


@pytest.fixture
def data(tmp_path) -> Path:
    p = tmp_path / "data.jsonl"
    p.write_text("\n".join(json.dumps({"text": f"line {i} of some text to train on"}) for i in range(6)) + "\n")
    return p


def opts(target: Path, data: Path, out: Path, **kw) -> TrainDraftOptions:
    return TrainDraftOptions(target=target, data=data, out=out, steps=2, seq_len=32, eval_samples=1, eval_tokens=4, quiet=True, threads=1, **kw)


def test_target_too_shallow_for_three_aux_layers(tmp_path, data):
    target, _ = make_pair(tmp_path / "shallow", TinyShape(num_hidden_layers=4))
    with pytest.raises(UserError) as e:
        train_draft(opts(target, data, tmp_path / "out"))
    msg = str(e.value)
    assert "config.json:num_hidden_layers" in msg and "4 decoder layers" in msg and "three distinct" in msg
    assert not (tmp_path / "out").exists()


def test_aux_layers_out_of_range(tmp_path, pair, data):
    with pytest.raises(UserError, match=r"--aux-layers.*not three distinct layers in 0\.\.7"):
        train_draft(opts(pair[0], data, tmp_path / "out", aux_layers=(1, 3, 9)))


@pytest.mark.parametrize(
    "name,content",
    [
        ("empty.jsonl", ""),
        ("no_fields.jsonl", '{"text": ""}\n{"question": "no text field"}\n{"turns": ["", "  "]}\n'),
        ("blank.txt", "\n\n   \n"),
    ],
)
def test_data_without_usable_text(tmp_path, pair, name, content):
    p = tmp_path / name
    p.write_text(content)
    with pytest.raises(UserError, match="no usable text") as e:
        train_draft(opts(pair[0], p, tmp_path / "out"))
    assert str(p) in str(e.value) and "hint:" in str(e.value)


def test_data_with_broken_json_names_the_line(tmp_path, pair):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"text": "fine"}\n{"text": "broken\n')
    with pytest.raises(UserError, match=r"bad\.jsonl:2: not valid JSON"):
        train_draft(opts(pair[0], p, tmp_path / "out"))


def test_init_head_of_another_shape(tmp_path, pair, data):
    _, other = make_pair(tmp_path / "other", TinyShape(hidden_size=32, intermediate_size=96, draft_intermediate_size=96))
    with pytest.raises(UserError) as e:
        train_draft(opts(pair[0], data, tmp_path / "out", init=other))
    msg = str(e.value)
    assert str(other) in msg and "does not fit the target" in msg
    assert "target_hidden_size 32 != target hidden_size 64" in msg


def test_init_head_with_wrong_tensor_shape(tmp_path, pair, data):
    """Config matches the target but a tensor does not match the config (a truncated/edited head)."""
    from safetensors.torch import load_file, save_file

    _, other = make_pair(tmp_path / "edited")
    t = load_file(str(other / "model.safetensors"))
    t["midlayer.mlp.down_proj.weight"] = t["midlayer.mlp.down_proj.weight"][:, :100].contiguous()
    save_file(t, str(other / "model.safetensors"))
    with pytest.raises(UserError, match=r"midlayer\.mlp\.down_proj\.weight has shape \[64, 100\], expected \[64, 192\]"):
        train_draft(opts(pair[0], data, tmp_path / "out", init=other))


def test_cli_reports_user_error(tmp_path, pair):
    from click.testing import CliRunner

    from eagle3_trt.train.commands import train_draft_cmd

    p = tmp_path / "empty.txt"
    p.write_text("")
    res = CliRunner().invoke(train_draft_cmd, ["--target", str(pair[0]), "--data", str(p), "-o", str(tmp_path / "o")])
    assert res.exit_code != 0
    assert isinstance(res.exception, UserError) and "no usable text" in str(res.exception)


def test_existing_output_needs_overwrite(tmp_path, pair, data):
    (tmp_path / "out").mkdir()
    with pytest.raises(UserError, match="output directory exists"):
        train_draft(opts(pair[0], data, tmp_path / "out"))
