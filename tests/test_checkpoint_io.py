import json

import pytest
import torch
from safetensors.torch import save_file

from eagle3_trt.errors import UserError
from eagle3_trt.formats.checkpoint_io import load_tensors, sha256_file, tensor_shapes, weight_files


def test_truncated_safetensors_is_named(tmp_path):
    save_file({"a": torch.ones(64, 64)}, str(tmp_path / "model.safetensors"))
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError) as e:
        load_tensors(tmp_path)
    assert "model.safetensors" in e.value.line() and "corrupt or truncated" in e.value.line()


def test_garbage_safetensors_header(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 100)
    with pytest.raises(UserError, match="corrupt or truncated"):
        tensor_shapes(tmp_path)


def test_plain_tensor_pickle_loads_weights_only(tmp_path):
    torch.save({"fc.weight": torch.ones(2, 3), "d2t": torch.zeros(4, dtype=torch.int64)}, tmp_path / "pytorch_model.bin")
    t = load_tensors(tmp_path)
    assert set(t) == {"fc.weight", "d2t"} and t["fc.weight"].shape == (2, 3)


class Payload:
    """Any non-tensor object: the weights-only loader must refuse to rebuild it."""

    def __reduce__(self):
        return (print, ("this must never run",))


def test_pickle_with_code_is_refused(tmp_path, capsys):
    torch.save({"fc.weight": torch.ones(1), "evil": Payload()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(UserError) as e:
        load_tensors(tmp_path)
    assert "refused" in e.value.line() and "pytorch_model.bin" in e.value.line()
    assert "this must never run" not in capsys.readouterr().out


def test_pickle_of_non_tensor_values_is_refused(tmp_path):
    torch.save({"fc.weight": torch.ones(1), "step": 3}, tmp_path / "draft.pt")
    with pytest.raises(UserError, match="other than a name -> tensor"):
        load_tensors(tmp_path)


def test_sharded_index_with_missing_shard(tmp_path):
    save_file({"a": torch.ones(2)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})
    )
    with pytest.raises(UserError, match="missing"):
        weight_files(tmp_path)


def test_no_weights_at_all(tmp_path):
    with pytest.raises(UserError, match="no weight files"):
        weight_files(tmp_path)


def test_sha256_streams_and_matches_hashlib(tmp_path):
    import hashlib

    p = tmp_path / "x"
    p.write_bytes(b"abc" * 5_000_000)
    assert sha256_file(p) == hashlib.sha256(p.read_bytes()).hexdigest()
