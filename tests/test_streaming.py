"""Shard-by-shard conversion: names, dtypes, shard bounds and atomicity, checked against
checkpoints written and read back by the safetensors library itself."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3_trt.convert.streaming import INDEX_FILE, read_header, stream_convert, write_tensors
from eagle3_trt.errors import UserError
from eagle3_trt.formats.checkpoint_io import tensor_shapes


@pytest.fixture
def src(tmp_path) -> tuple[Path, dict[str, torch.Tensor]]:
    """Two shards + index, written by safetensors, mixed dtypes including an empty tensor."""
    g = torch.Generator().manual_seed(0)
    a = {
        "model.embed_tokens.weight": torch.randn(64, 16, generator=g).to(torch.bfloat16),
        "model.layers.0.mlp.up_proj.weight": torch.randn(48, 16, generator=g).to(torch.bfloat16),
        "model.layers.0.input_layernorm.weight": torch.randn(16, generator=g),
    }
    b = {
        "model.layers.1.mlp.up_proj.weight": torch.randn(48, 16, generator=g).to(torch.bfloat16),
        "d2t": torch.arange(32, dtype=torch.int64),
        "model.scale": torch.tensor(0.5),
        "model.empty": torch.empty(0, 16, dtype=torch.bfloat16),
        "lm_head.weight": torch.randn(64, 16, generator=g).to(torch.float8_e4m3fn),
    }
    d = tmp_path / "src"
    d.mkdir()
    save_file(a, d / "model-00001-of-00002.safetensors", metadata={"format": "pt"})
    save_file(b, d / "model-00002-of-00002.safetensors", metadata={"format": "pt"})
    wm = {**{k: "model-00001-of-00002.safetensors" for k in a}, **{k: "model-00002-of-00002.safetensors" for k in b}}
    (d / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    return d, {**a, **b}


def load_dir(d: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def test_rename_drop_and_bounded_shards(src, tmp_path):
    d, tensors = src
    rename = lambda n: None if n.startswith("model.layers.1.") else n.removeprefix("model.")  # noqa: E731
    rep = stream_convert(d, tmp_path / "out", rename, max_shard_bytes=2048)
    out = load_dir(tmp_path / "out")
    expect = {rename(k): v for k, v in tensors.items() if rename(k) is not None}
    assert set(out) == set(expect) and rep.skipped == ["model.layers.1.mlp.up_proj.weight"]
    for k, v in expect.items():
        assert out[k].dtype == v.dtype and out[k].shape == v.shape
        assert torch.equal(out[k].reshape(-1).view(torch.uint8), v.reshape(-1).view(torch.uint8))  # bit-exact, FP8 too
    index = json.loads((tmp_path / "out" / INDEX_FILE).read_text())
    assert set(index["weight_map"]) == set(expect) and index["metadata"]["total_size"] == rep.bytes_written
    for f in (tmp_path / "out").glob("*.safetensors"):
        header, _ = read_header(f)
        assert header["__metadata__"] == {"format": "pt"}
        sizes = [e - b for k, (b, e) in ((k, v["data_offsets"]) for k, v in header.items() if k != "__metadata__")]
        # A shard holds at most max_shard_bytes, unless one tensor alone is larger.
        assert sum(sizes) <= 2048 or len(sizes) == 1
    assert len(rep.shards) > 1 and rep.largest_tensor_bytes == 64 * 16 * 2
    # The header-only reader used for validation sees the same shapes.
    shapes = tensor_shapes(tmp_path / "out")
    assert shapes["embed_tokens.weight"] == ((64, 16), "bfloat16")


def test_single_shard_is_model_safetensors(src, tmp_path):
    d, tensors = src
    rep = stream_convert(d, tmp_path / "one", lambda n: n)
    assert rep.shards == ["model.safetensors"] and not (tmp_path / "one" / INDEX_FILE).exists()
    assert rep.tensors == len(tensors) and rep.bytes_read == rep.bytes_written


def test_cast_is_elementwise_and_chunked(src, tmp_path, monkeypatch):
    import eagle3_trt.convert.streaming as st

    monkeypatch.setattr(st, "CHUNK_BYTES", 40)  # several chunks per tensor, odd element counts per chunk
    d, tensors = src
    cast = lambda n, dt: "float16" if dt in ("bfloat16", "float32") else None  # noqa: E731
    prev = torch.get_num_threads()
    torch.set_num_threads(3)  # not the single thread the cast runs on, so a missing restore shows
    try:
        stream_convert(d, tmp_path / "cast", lambda n: n, cast=cast)
        threads_after = torch.get_num_threads()
    finally:
        torch.set_num_threads(prev)
    assert threads_after == 3  # restored after the single-threaded cast
    out = load_dir(tmp_path / "cast")
    for k, v in tensors.items():
        if v.dtype in (torch.bfloat16, torch.float32):
            assert out[k].dtype == torch.float16 and torch.equal(out[k], v.to(torch.float16)), k
        else:
            assert out[k].dtype == v.dtype, k


def test_transform_whole_tensor_and_shape_promise(src, tmp_path):
    d, tensors = src
    tr = lambda n, t: t.t().contiguous() if t.dim() == 2 and t.dtype == torch.bfloat16 else None  # noqa: E731
    stream_convert(d, tmp_path / "t", lambda n: n, transform=tr)
    out = load_dir(tmp_path / "t")
    assert torch.equal(out["model.embed_tokens.weight"], tensors["model.embed_tokens.weight"].t())
    assert torch.equal(out["d2t"], tensors["d2t"])

    liar = lambda n, t: t[:1] if t.device.type != "meta" and t.dim() == 2 and t.numel() else (t if t.dim() == 2 else None)  # noqa: E731
    with pytest.raises(UserError) as e:
        stream_convert(d, tmp_path / "bad", lambda n: n, transform=liar)
    assert "promised" in e.value.what
    assert not (tmp_path / "bad").exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_refusals_leave_nothing_behind(src, tmp_path):
    d, _ = src
    with pytest.raises(UserError) as e:
        stream_convert(d, tmp_path / "dup", lambda n: "same")
    assert "both map to" in e.value.what
    (tmp_path / "exists").mkdir()
    with pytest.raises(UserError):
        stream_convert(d, tmp_path / "exists", lambda n: n)
    # Truncate the second shard: its last tensor now ends past the end of the file.
    f = d / "model-00002-of-00002.safetensors"
    f.write_bytes(f.read_bytes()[:-10])
    with pytest.raises(UserError) as e:
        stream_convert(d, tmp_path / "trunc", lambda n: n)
    assert "truncated" in e.value.hint or "past the end" in e.value.what
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exists", "src"]


def test_write_tensors_produces_loadable_files(tmp_path):
    p = tmp_path / "x.safetensors"
    n = write_tensors(p, [("a", (3, 4), "bfloat16"), ("b", (5,), "int32")], lambda name, e: e.fill_(2 if name == "a" else 7))
    t = load_file(p)
    assert n == 3 * 4 * 2 + 5 * 4 and torch.equal(t["a"], torch.full((3, 4), 2, dtype=torch.bfloat16)) and t["b"].tolist() == [7] * 5


def test_benchmark_runs_small(capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    try:
        import bench_large_checkpoint as bench
    finally:
        sys.path.pop(0)
    rc = bench.main(["--size-gb", "0.02", "--shard-gb", "0.008", "--out-shard-gb", "0.01", "--json"])
    res = json.loads(capsys.readouterr().out)
    assert rc == 0 and res["checkpoint_bytes"] >= 0.02e9
    phases = {p["phase"].split(" (")[0]: p for p in res["phases"]}
    conv = phases["stream_convert rename"]
    assert conv["result"]["verified"] is True and conv["result"]["shards"] > 1
    assert all(p["within_goal"] and p["peak_rss_bytes"] > 0 for p in res["phases"])
