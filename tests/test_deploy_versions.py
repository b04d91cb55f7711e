"""`eagle3-trt deploy --offline` on disk: version directories, rollback, the package record (no server)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml


@pytest.fixture(scope="module")
def k5_bundle(tiny_pair_session, tmp_path_factory) -> Path:
    """The tiny FP8 bundle's pair again, at K=5: the same target, another head configuration."""
    from eagle3_trt.pipeline.builder import EngineRequest, build_bundle
    from eagle3_trt.pipeline.presets import load_preset

    t, d = tiny_pair_session
    out = tmp_path_factory.mktemp("b") / "k5"
    return build_bundle(EngineRequest(preset=load_preset("tiny"), target=str(t), draft=str(d), target_gpu="h100", max_draft_len=5, out=str(out))).bundle


def _main(capsys, *argv: str) -> tuple[int, str, str]:
    from eagle3_trt.cli import main

    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def _untouched(mdir: Path) -> None:
    """The record covers every file of the model (what a later `package` checks)."""
    from eagle3_trt.triton_serving.package import _changed_file, read_record

    rec = read_record(mdir)
    assert rec is not None and _changed_file(mdir, rec) is None


def test_deploy_rollback_and_redeploy_on_disk(fp8_bundle, k5_bundle, tmp_path, capsys):
    from eagle3_trt.triton_serving.deploy import version_numbers
    from eagle3_trt.triton_serving.package import check_repository, package_bundle

    repo = tmp_path / "repo"
    package_bundle(fp8_bundle, repo)
    mdir = repo / "eagle3"
    state = tmp_path / "state"

    rc, out, err = _main(capsys, "deploy", str(k5_bundle), "--repo", str(repo), "--state-dir", str(state), "--offline")
    assert rc == 0, err
    assert "version 2" in out and "replaces version 1" in out and "--offline" in out
    assert version_numbers(mdir) == [1, 2]
    v2 = yaml.safe_load((mdir / "2" / "eagle3.yaml").read_text())
    v1 = yaml.safe_load((mdir / "1" / "eagle3.yaml").read_text())
    assert v2["bundle"] == str(k5_bundle.resolve()) and {k: v for k, v in v2.items() if k != "bundle"} == {k: v for k, v in v1.items() if k != "bundle"}
    assert yaml.safe_load((mdir / "2" / "model.yaml").read_text())["speculative_config"]["max_draft_len"] == 5
    assert (mdir / "2" / "model.py").read_bytes() == (mdir / "1" / "model.py").read_bytes()
    _untouched(mdir)
    check_repository(repo)  # what `serve` checks still passes
    assert not any(p.name.startswith(".") for p in list(repo.iterdir()) + list(mdir.iterdir())), "staging or lock left"

    rc, out, err = _main(capsys, "deploy", "--rollback", "--repo", str(repo), "--state-dir", str(state), "--offline")
    assert rc == 0, err
    assert "rolled back 'eagle3': version 1" in out
    assert version_numbers(mdir) == [1] and (mdir / "rolled-back-2" / "eagle3.yaml").is_file()
    _untouched(mdir)

    # a number is never reused: Triton must not take a new version for one it has loaded before
    rc, out, err = _main(capsys, "deploy", str(k5_bundle), "--repo", str(repo), "--state-dir", str(state), "--offline")
    assert rc == 0, err
    assert version_numbers(mdir) == [1, 3]
    _untouched(mdir)

    _main(capsys, "deploy", "--rollback", "--repo", str(repo), "--state-dir", str(state), "--offline")
    rc, out, err = _main(capsys, "deploy", "--rollback", "--repo", str(repo), "--state-dir", str(state), "--offline")
    assert rc == 2 and "version 1 is the only version; there is nothing to roll back to" in err
    assert len(err.strip().splitlines()) == 1


def test_a_deploy_that_fails_changes_nothing(fp8_bundle, tmp_path, capsys):
    """A bundle that cannot be read: refused before anything is written (and the arguments are checked)."""
    from eagle3_trt.triton_serving.package import package_bundle

    repo = tmp_path / "repo"
    package_bundle(fp8_bundle, repo)
    before = sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*"))
    broken = tmp_path / "broken"
    shutil.copytree(fp8_bundle, broken)
    (broken / "manifest.json").unlink()
    rc, _, err = _main(capsys, "deploy", str(broken), "--repo", str(repo), "--offline")
    assert rc == 2 and "broken" in err and len(err.strip().splitlines()) == 1
    rc, _, err = _main(capsys, "deploy", str(fp8_bundle), "--rollback", "--repo", str(repo), "--offline")
    assert rc == 2 and "--rollback: takes no bundle" in err
    rc, _, err = _main(capsys, "deploy", "--repo", str(repo), "--offline")
    assert rc == 2 and "NEW: missing" in err
    assert sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*")) == before
