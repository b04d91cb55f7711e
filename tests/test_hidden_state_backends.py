"""Hidden states through an engine and through other trainers' formats, on the tiny pair (CPU):

- the Hugging Face backend (transformers, device_map="cpu") gives the reference backend's states;
- a cache goes to ModelOpt's offline .pt dump and speculators 0.9's offline data, is read there by
  their own dataset classes (ModelOpt's OfflineSupervisedDataset, speculators' ArrowDataset), and
  comes back to the same cache;
- TensorRT-LLM's SaveHiddenStates file layout is read into the cache;
- what cannot work is refused in one line."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from eagle3_trt.cli import cli, main
from eagle3_trt.errors import UserError
from eagle3_trt.train import hs_backends, hs_convert
from eagle3_trt.train.hidden_states import HiddenCache

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "then", "it", "ran", "to", "red", "house", "by", "sea", "while", "dog", "slept"]
AUX = (1, 3, 4)  # the tiny target's default capture layers (8 layers: 1, L//2-1, L-4)


def _data(path: Path, n: int = 6) -> Path:
    rng = random.Random(1)
    with path.open("w") as f:
        for _ in range(n):
            f.write(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(rng.randrange(10, 30)))}) + "\n")
    return path


def _collect(backend: str, target: Path, data: Path, out: Path, *extra: str) -> dict:
    args = ["hidden-states", "collect", "--backend", backend, "--target", str(target), "--data", str(data), "-o", str(out), "--seq-len", "32", *extra]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def caches(tmp_path_factory, tiny_pair_session):
    target, _ = tiny_pair_session
    root = tmp_path_factory.mktemp("hs")
    data = _data(root / "data.jsonl")
    ref = _collect("reference", target, data, root / "ref")
    hf = _collect("hf", target, data, root / "hf", "--device-map", "cpu")
    return target, root, ref, hf


def _all(cache_dir: Path) -> dict[str, torch.Tensor]:
    return next(HiddenCache(cache_dir).iter_all(10_000))


def test_hf_device_map_backend_gives_the_reference_states(caches):
    target, root, ref, hf = caches
    assert ref["producer"] == "reference" and hf["producer"] == "hf"
    assert ref["rows"] == hf["rows"] >= 6 and ref["aux_layer_ids"] == hf["aux_layer_ids"] == list(AUX)
    a, b = _all(root / "ref"), _all(root / "hf")
    assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["real"], b["real"])
    m = a["real"]
    # both computed in float32 and stored in bf16: at most a bf16 rounding step apart
    for k in ("aux", "last"):
        x, y = a[k][m].float(), b[k][m].float()
        assert float((x - y).abs().max()) <= 2**-7 * float(x.abs().max()), k
    # and before the bf16 store, on one batch: float32 agreement
    ids = a["input_ids"][:2]
    r = hs_backends.reference_backend(target, AUX)
    h = hs_backends.HFBackend(target, AUX, device_map="cpu", dtype=torch.float32)
    (ra, rl), (ha, hl) = r.teacher_forced(ids), h.teacher_forced(ids)
    torch.testing.assert_close(ra, ha, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(rl, hl, atol=1e-4, rtol=1e-4)


@pytest.mark.needs("modelopt_offline_dataset")
def test_modelopt_round_trip_read_by_modelopt(caches, tmp_path):
    from modelopt.torch.speculative.eagle.utils import OfflineSupervisedDataset

    _, root, ref, _ = caches
    n = hs_convert.to_modelopt(root / "ref", tmp_path / "mo")
    assert n == ref["rows"]
    files = sorted((tmp_path / "mo").glob("*.pt"), key=lambda p: int(p.stem))
    ds = OfflineSupervisedDataset(files, answer_only_loss=True)
    rows = list(hs_convert.iter_rows(root / "ref"))
    for i, r in enumerate(rows):
        item = ds[i]
        assert torch.equal(item["input_ids"], r.input_ids)
        assert torch.equal(item["aux_hidden_states"], r.aux) and torch.equal(item["base_model_hidden_states"], r.last)
        assert item["base_hidden_prenorm"] is False and torch.equal(item["loss_mask"], r.mask.long())
    back = tmp_path / "back"
    res = CliRunner().invoke(cli, ["hidden-states", "convert", str(tmp_path / "mo"), str(back), "--from", "modelopt", "--to", "cache", "--aux-layers", "1,3,4"])
    assert res.exit_code == 0, res.output
    a, b = _all(root / "ref"), _all(back)
    assert torch.equal(a["real"], b["real"])
    m = a["real"]  # padding is not carried over: ModelOpt stores each conversation at its own length
    for k in ("input_ids", "aux", "last"):
        assert torch.equal(a[k][m], b[k][m]), k  # lossless both ways
    assert HiddenCache(back).meta.producer == "modelopt"


def test_speculators_round_trip_read_by_speculators(caches, tmp_path):
    from speculators.train.data import ArrowDataset

    target, root, ref, _ = caches
    out = tmp_path / "spec"
    res = CliRunner().invoke(cli, ["hidden-states", "convert", str(root / "ref"), str(out), "--from", "cache", "--to", "speculators", "--target", str(target)])
    assert res.exit_code == 0, res.output
    w, eps = hs_convert.target_norm(target)
    ds = ArrowDataset(max_len=64, datapath=out, on_missing="raise")
    rows = list(hs_convert.iter_rows(root / "ref"))
    assert len(ds) == len(rows)
    for i, r in enumerate(rows):
        item = ds[i]
        assert torch.equal(item["input_ids"], r.input_ids) and torch.equal(item["hidden_states"], r.aux)
        # speculators applies the verifier's norm to its last state: that gives our post-norm state
        normed = hs_convert.rms_norm(item["verifier_last_hidden_states"], w, eps)
        assert float((normed - r.last.float()).abs().max()) <= 2**-6 * float(r.last.float().abs().max())
    back = tmp_path / "back"
    args = ["hidden-states", "convert", str(out), str(back), "--from", "speculators", "--to", "cache", "--target", str(target), "--aux-layers", "1,3,4"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    a, b = _all(root / "ref"), _all(back)
    m = a["real"]
    assert torch.equal(a["real"], b["real"]) and torch.equal(a["input_ids"][m], b["input_ids"][m]) and torch.equal(a["aux"][m], b["aux"][m])
    assert float((a["last"][m].float() - b["last"][m].float()).abs().max()) <= 2**-6 * float(a["last"].float().abs().max())


def test_trtllm_savestate_files_are_read(caches, tmp_path):
    """Files laid out as TensorRT-LLM's writer lays them out (save_hidden_state.py: a list of dicts
    per file; -1 captured, so the features carry the post-norm slot last) become the same cache."""
    _, root, ref, _ = caches
    rows = list(hs_convert.iter_rows(root / "ref"))
    dump = tmp_path / "dump"
    dump.mkdir()
    for n, r in enumerate(rows, start=1):
        rec = {"id": n, "input_ids": r.input_ids, "hidden_state": r.last, "aux_hidden_states": torch.cat([r.aux, r.last], dim=-1)}
        torch.save([rec], str(dump / f"{hs_backends.SAVE_STATE_PREFIX}_{n}.pt"))
    back = tmp_path / "back"
    res = CliRunner().invoke(cli, ["hidden-states", "convert", str(dump), str(back), "--from", "trtllm", "--to", "cache", "--aux-layers", "1,3,4"])
    assert res.exit_code == 0, res.output
    a, b = _all(root / "ref"), _all(back)
    m = a["real"]
    for k in ("input_ids", "aux", "last"):
        assert torch.equal(a[k][m], b[k][m]), k


def test_refusals(caches, tmp_path, capsys):
    target, root, _, _ = caches
    with pytest.raises(UserError, match="last layer"):
        hs_backends.HFBackend(target, (1, 3, 7), device_map="cpu")
    cases = [
        (["hidden-states", "convert", str(root / "ref"), str(tmp_path / "x"), "--from", "cache", "--to", "cache"], "one side must be"),
        (["hidden-states", "convert", str(root / "ref"), str(tmp_path / "x"), "--from", "cache", "--to", "speculators"], "--target"),
        (["hidden-states", "convert", str(root), str(tmp_path / "x"), "--from", "modelopt", "--to", "cache"], "--aux-layers"),
        (["hidden-states", "convert", str(root / "ref"), str(tmp_path / "x"), "--from", "modelopt", "--to", "cache", "--aux-layers", "1,3,4"], "no *.pt"),
    ]
    tgt = ["train-draft", "--target", str(target), "-o", str(tmp_path / "x")]
    cases += [
        ([*tgt, "--hidden-states", str(root / "ref"), "--data", str(root / "data.jsonl")], "--data: does not apply with --hidden-states"),
        ([*tgt, "--heldout-hidden-states", str(root / "ref"), "--data", str(root / "data.jsonl")], "only applies with --hidden-states"),
        ([*tgt, "--hidden-states", str(root)], "has no manifest.json"),
        ([*tgt, "--hidden-states", str(root / "ref"), "--aux-layers", "1,2,4"], "the cache holds layers [1, 3, 4]"),
    ]
    if not hs_backends.save_state_available():
        cases.append(
            (
                ["hidden-states", "collect", "--backend", "trtllm", "--bundle", str(root), "--data", str(root / "data.jsonl"), "-o", str(tmp_path / "x")],
                "trtllm",
            )
        )
    for args, needle in cases:
        rc, err = _main(args, capsys)
        assert rc != 0 and needle in err and err.count("\n") == 1 and err.startswith("error: "), (args, err)
        assert not (tmp_path / "x").exists()
    # a .pt holding something other than tensors is refused, never unpickled
    bad = tmp_path / "bad"
    bad.mkdir()
    torch.save({"input_ids": torch.zeros(3), "x": Path("/")}, str(bad / "0.pt"))
    rc, err = _main(["hidden-states", "convert", str(bad), str(tmp_path / "y"), "--from", "modelopt", "--to", "cache", "--aux-layers", "1,3,4"], capsys)
    assert rc != 0 and "weights-only" in err and err.count("\n") == 1, err
    assert not (tmp_path / "y").exists()


def _main(args: list[str], capsys) -> tuple[int, str]:
    """The CLI as a user runs it (errors printed by eagle3_trt.cli.main)."""
    capsys.readouterr()
    rc = main(args)
    return rc, capsys.readouterr().err


def test_trtllm_kwargs_go_through_the_adapter(fp8_bundle, tmp_path):
    """The trtllm backend's LLM(...) kwargs: the bundle's target as served (adapter), no draft, the SaveState writer."""
    kw = hs_backends.trtllm_llm_kwargs(fp8_bundle, tmp_path / "dump", AUX)
    spec = kw["speculative_config"]
    assert spec == {
        "decoding_type": "SaveState",
        "output_directory": str((tmp_path / "dump").resolve()),
        "write_interval": 1,
        "file_prefix": hs_backends.SAVE_STATE_PREFIX,
        "eagle3_layers_to_capture": [1, 3, 4, -1],
    }
    assert Path(kw["model"]).is_dir() and "speculative_model" not in json.dumps(kw)


def test_cache_batches_span_shards_and_read_rows_alone(caches, tmp_path):
    """The endless row order serves the full batch whatever the shard sizes, and reading rows from
    disk (a cache too large for memory) gives what the in-memory cache gives."""
    from eagle3_trt.train.hidden_states import ShardWriter

    _, root, ref, _ = caches
    src = HiddenCache(root / "ref")
    m = src.meta
    (tmp_path / "one").mkdir()
    w = ShardWriter(tmp_path / "one", m.seq_len, m.target_hidden_size, len(m.aux_layer_ids), len(src), rows_per_shard=1)
    for b in src.iter_all(1):
        w.add(b["input_ids"], b["real"], b["aux"], b["last"])
    w.finish(m.key, m.aux_layer_ids, m.producer)
    mem, disk = HiddenCache(tmp_path / "one", in_memory=True), HiddenCache(tmp_path / "one", in_memory=False)
    n = len(mem)
    assert mem.counts == [1] * n == [1] * ref["rows"] and n < 12
    seen = []
    for step in range(3):  # 3 steps of 4 rows cross the end of an epoch of n < 12 rows
        a, b = mem.batch(step, 4, 0), disk.batch(step, 4, 0)
        assert a["input_ids"].shape[0] == 4 and all(torch.equal(a[k], b[k]) for k in a)
        halves = [disk.batch(step, 4, 0, part) for part in (slice(0, 2), slice(2, 4))]
        assert all(torch.equal(torch.cat([h[k] for h in halves]), a[k]) for k in a)
        seen += [tuple(r.tolist()) for r in a["input_ids"]]
    first_epoch = seen[:n]
    assert len(set(first_epoch)) == len({tuple(r.tolist()) for r in _all(root / "ref")["input_ids"]})  # an epoch is every row once


def test_shard_writer_streams_safetensors_own_bytes(tmp_path):
    """The cache's writer puts each row into its place in a pre-sized shard (memory: one row); the
    shards are byte for byte what safetensors' save_file writes for the same tensors."""
    from safetensors.torch import save_file

    from eagle3_trt.train.hidden_states import ShardWriter

    g = torch.Generator().manual_seed(0)
    S, T, A, N = 7, 16, 3, 5
    rows = {
        "input_ids": torch.randint(0, 100, (N, S), generator=g),
        "real": torch.rand(N, S, generator=g) > 0.3,
        "aux": torch.randn(N, S, A * T, generator=g).to(torch.bfloat16),
        "last": torch.randn(N, S, T, generator=g).to(torch.bfloat16),
    }
    w = ShardWriter(tmp_path, S, T, A, N, rows_per_shard=2)
    w.add(*(rows[k][:3] for k in ("input_ids", "real", "aux", "last")))
    w.add(*(rows[k][3:] for k in ("input_ids", "real", "aux", "last")))
    assert w.finish("k", list(AUX), "reference").shards == [2, 2, 1]
    for i, sl in enumerate((slice(0, 2), slice(2, 4), slice(4, 5))):
        save_file({k: v[sl].contiguous() for k, v in rows.items()}, str(tmp_path / "ref.safetensors"))
        assert (tmp_path / f"shard_{i:05d}.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes(), i
    with pytest.raises(ValueError):  # sized for N rows: one more is an error, not a silent extra shard
        w.add(*(rows[k][:1] for k in ("input_ids", "real", "aux", "last")))
