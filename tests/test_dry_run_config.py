"""A dry-run bundle carries the draft config a real build of the same inputs writes (issue 21 C1):
both go through export.write_draft_config with draft_format.config_for_max_seq_len's config."""

from __future__ import annotations

import json
from pathlib import Path

from eagle3_trt import cli


def _engine(args: list[str], out: Path, capsys) -> list[str]:
    """The build's warnings, as its manifest records them."""
    assert cli.main(["engine", *args, "--target-gpu", "h100", "-o", str(out)]) == 0, capsys.readouterr().err
    return json.loads((out / "manifest.json").read_text())["validation"]["warnings"]


def test_dry_run_and_real_build_write_the_same_draft_config(tiny_pair, tmp_path, capsys):
    t, d = tiny_pair
    # a table shorter than the preset's max_seq_len (512): the build raises it, and so must the dry run
    cfg = json.loads((d / "config.json").read_text())
    cfg["max_position_embeddings"] = 256
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    pair = ["--model", "tiny", "--target", str(t), "--draft", str(d)]

    real_log = _engine([*pair, "--calib-samples", "2"], tmp_path / "real", capsys)
    dry_log = _engine([*pair, "--dry-run"], tmp_path / "dry", capsys)

    real = (tmp_path / "real" / "draft" / "config.json").read_bytes()
    assert (tmp_path / "dry" / "draft" / "config.json").read_bytes() == real
    assert json.loads(real)["max_position_embeddings"] == 512
    # and both say the same thing about it
    said = "draft max_position_embeddings 256 < max_seq_len 512: the bundle's draft config is raised to 512"
    assert any(said in w for w in real_log) and any(said in w for w in dry_log), (real_log, dry_log)
    assert not any("acceptance drops" in w for w in dry_log)


def test_dry_run_of_the_embedded_pair_flattens_its_draft_config_as_a_build_does(tmp_path, capsys):
    """models/tiny ships its head with an eagle_config block and midlayer.* tensors; the build writes
    the SafeAILab layout with the target's bos/eos, which the dry run now reads from the same place."""
    _engine(["--model", "tiny", "--dry-run"], tmp_path / "dry", capsys)
    dry = json.loads((tmp_path / "dry" / "draft" / "config.json").read_text())
    assert dry["architectures"] == ["LlamaForCausalLMEagle3"] and "bos_token_id" in dry and "eos_token_id" in dry
