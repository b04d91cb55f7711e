"""`eagle3-trt package` never destroys what it did not write (issue 21 C4): it adds or updates only
its own model directories, keeps other models, and refuses (naming the file) where a file it wrote
was edited since, unless --force, which still rewrites only its own models. The refusal to touch a
repository a running server has loaded is tested against a real server in test_triton_server.py.

Real files and the real CLI (in a subprocess); the bundle is the embedded tiny pair's dry run
(configs only: packaging reads no weights)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from eagle3_trt.testing.forked_cli import ForkedCli

pytestmark = pytest.mark.needs("tritonclient")  # config.pbtxt is checked with Triton's own protobuf

ROOT = Path(__file__).resolve().parents[1]
OTHER_PBTXT = 'name: "other"\nbackend: "python"\nmax_batch_size: 0\n'


@pytest.fixture(scope="module")
def cli() -> Iterator[Callable[..., subprocess.CompletedProcess]]:
    """cli(*args) runs ``eagle3-trt ARGS`` in the repository root, forked from one process that
    imported the CLI once (~20 runs; testing/forked_cli.py)."""
    forked = ForkedCli(300)
    yield lambda *args: forked.run([str(a) for a in args], ROOT)
    forked.close()


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (hidden staging or lock entries included), by relative path."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def bundle(cli, tmp_path_factory) -> Path:
    b = tmp_path_factory.mktemp("bundle") / "dry"
    r = cli("engine", "--model", "tiny", "--target-gpu", "h100", "--dry-run", "-o", b)
    assert r.returncode == 0, r.stderr
    return b


@pytest.fixture()
def repo(cli, bundle, tmp_path) -> Path:
    """A repository holding another model (not ours), then ours packaged beside it."""
    repo = tmp_path / "repo"
    (repo / "other" / "1").mkdir(parents=True)
    (repo / "other" / "config.pbtxt").write_text(OTHER_PBTXT)
    (repo / "other" / "1" / "model.py").write_text("# someone else's model\n")
    r = cli("package", bundle, "-o", repo)
    assert r.returncode == 0, r.stderr
    return repo


def test_package_adds_its_model_beside_another_and_leaves_it_alone(cli, repo, bundle):
    assert sorted(p.name for p in repo.iterdir()) == ["eagle3", "other"]
    assert tree(repo / "other") == {"config.pbtxt": OTHER_PBTXT.encode(), "1/model.py": b"# someone else's model\n"}
    # again, with more models of ours: ours are updated or added, the other one stays as it was
    other = tree(repo / "other")
    r = cli("package", bundle, "-o", repo, "--with-unary", "--with-baseline")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in repo.iterdir()) == ["eagle3", "eagle3_nospec", "eagle3_unary", "other"]
    assert tree(repo / "other") == other
    assert not [p for p in [*repo.iterdir(), *repo.parent.iterdir()] if p.name.startswith(".")]  # no staging or lock left


def test_an_edited_model_yaml_is_refused_by_name_and_nothing_changes(cli, repo, bundle):
    my = repo / "eagle3" / "1" / "model.yaml"
    my.write_text(my.read_text() + "# my edit: keep this\n")
    before = tree(repo.parent)
    r = cli("package", bundle, "-o", repo, "--with-unary")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    [line] = r.stderr.strip().splitlines()
    assert line.startswith(f"error: {my}: differs from what `eagle3-trt package` wrote; nothing written") and "--force" in line
    assert tree(repo.parent) == before  # not even the unary twin was added

    # --force overwrites our model only: the edit is gone, the other model is not
    r = cli("package", bundle, "-o", repo, "--force")
    assert r.returncode == 0, r.stderr
    assert "my edit" not in my.read_text()
    assert tree(repo / "other") == {k.removeprefix("repo/other/"): v for k, v in before.items() if k.startswith("repo/other/")}
    assert cli("package", bundle, "-o", repo).returncode == 0  # and the record follows the rewrite


@pytest.mark.parametrize(
    "edit, names",
    [
        (lambda m: (m / "config.pbtxt").unlink(), "eagle3/config.pbtxt"),
        (lambda m: (m / "1" / "notes.txt").write_text("mine"), "eagle3/1/notes.txt"),
        (lambda m: (m / "eagle3-package.json").unlink(), "eagle3: a model `eagle3-trt package` did not write"),
        (lambda m: (m / "eagle3-package.json").write_text("{}"), "eagle3-package.json: unreadable package record"),
    ],
    ids=["removed", "added", "no-record", "bad-record"],
)
def test_any_file_not_as_package_wrote_it_is_refused(cli, repo, bundle, edit, names):
    edit(repo / "eagle3")
    before = tree(repo)
    r = cli("package", bundle, "-o", repo)
    assert r.returncode == 2 and names in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert tree(repo) == before


def test_tritons_own_pycache_is_not_an_edit(cli, repo, bundle):
    (repo / "eagle3" / "1" / "__pycache__").mkdir()
    (repo / "eagle3" / "1" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    assert cli("package", bundle, "-o", repo).returncode == 0
