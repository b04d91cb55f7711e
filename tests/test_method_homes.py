"""P-EAGLE lives in its home (eagle3_trt/speculative/peagle/): generic code asks the registry
(speculative/registry.py) for the method of a head, a bundle's options or a name and calls its hooks.

- Outside the home, three package files name it, each for a reason the home cannot carry: the registry's
  line (and its import), the bundle options' vLLM key (pipeline/llm_options.py ``parallel_drafting``: the
  options file's schema holds every engine key, as it holds the dynamic tree's and sa_config) and
  speculators' format table (formats/draft_producers.py: formats sit below speculative, so the EAGLE-3
  reader names the other producers' model types itself). eagle3_trt/testing/ (test support: the tiny pair's
  maker trains the shipped P-EAGLE head) is not counted.
- Only the registry imports the home (import-linter's "Only the registry imports the P-EAGLE home"; checked
  here on grimp's graph too, so the suite fails without ``make lint``).
- Removing the home and the registry's two lines leaves a package that imports and runs: EAGLE-3 heads
  validate, train-draft offers the chain only, the launchers and the cost model work, and a P-EAGLE head is
  refused in one line by the EAGLE-3 reader.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "eagle3_trt"
HOME = PKG / "speculative" / "peagle"
TINY = ROOT / "models" / "tiny"
# what names the method: its registry name, its display name and vLLM's switch for it (ModelOpt's own
# eagle_config key parallel_draft_step, carried unread in formats/draft_config.py, is another producer's)
NAMES = re.compile(r"peagle|p-eagle|parallel_drafting", re.IGNORECASE)
OUTSIDE_ALLOWED = {"speculative/registry.py", "pipeline/llm_options.py", "formats/draft_producers.py"}


def _package_files() -> list[Path]:
    return [p for p in PKG.rglob("*.py") if HOME not in p.parents and (PKG / "testing") not in p.parents and "__pycache__" not in p.parts]


def test_at_most_three_files_outside_the_home_name_it():
    naming = {p.relative_to(PKG).as_posix() for p in _package_files() if NAMES.search(p.read_text())}
    assert naming == OUTSIDE_ALLOWED, sorted(naming)
    registry_lines = [line for line in (PKG / "speculative" / "registry.py").read_text().splitlines() if NAMES.search(line) or "PEagle" in line]
    assert registry_lines == [
        "from eagle3_trt.speculative.peagle.method import PEagleMethod",
        "    PEagleMethod.name: PEagleMethod,",
    ]
    # the options schema: the one field (and the set listing it as vLLM's); the producer table: speculators' and SpecForge's keys
    options = [line.strip() for line in (PKG / "pipeline" / "llm_options.py").read_text().splitlines() if "parallel_drafting" in line]
    assert len(options) == 2 and options[0].startswith("parallel_drafting: bool | None") and options[1].startswith("VLLM_ONLY_FIELDS")


def test_only_the_registry_imports_the_home():
    import grimp

    graph = grimp.build_graph("eagle3_trt", cache_dir=None)
    home = {m for m in graph.modules if m == "eagle3_trt.speculative.peagle" or m.startswith("eagle3_trt.speculative.peagle.")}
    importers = {imp for m in home for imp in graph.find_modules_that_directly_import(m)} - home
    assert importers == {"eagle3_trt.speculative.registry"}


def _without_the_home(tmp: Path) -> Path:
    """A copy of the package without speculative/peagle/ and the registry's two lines; the data folders
    linked as a wheel packages them (resources.data_dir reads eagle3_trt/_data/<folder> first)."""
    pkg = tmp / "eagle3_trt"
    shutil.copytree(PKG, pkg, ignore=shutil.ignore_patterns("__pycache__", "_data"))
    shutil.rmtree(pkg / "speculative" / "peagle")
    reg = pkg / "speculative" / "registry.py"
    lines = reg.read_text().splitlines(keepends=True)
    kept = [line for line in lines if "PEagleMethod" not in line]
    assert len(lines) - len(kept) == 2
    reg.write_text("".join(kept))
    (pkg / "_data").mkdir()
    for folder in ("build", "convert", "models", "triton_repo"):
        if (ROOT / folder).is_dir():
            (pkg / "_data" / folder).symlink_to(ROOT / folder, target_is_directory=True)
    return pkg


def test_the_package_runs_without_the_home(tmp_path):
    pkg = _without_the_home(tmp_path)
    script = textwrap.dedent(
        f"""
        import contextlib, io, json, sys
        import eagle3_trt
        assert eagle3_trt.__file__.startswith({str(tmp_path)!r}), eagle3_trt.__file__
        from eagle3_trt.speculative.registry import METHODS, method_from_options, step_cost, trainable_methods
        assert set(METHODS) == {{"chain", "sa", "dynamic-tree"}} and list(trainable_methods()) == ["chain"], (list(METHODS), trainable_methods())
        # every module that reaches the registry imports
        import eagle3_trt.convert.draft_format, eagle3_trt.convert.load, eagle3_trt.pipeline.builder, eagle3_trt.pipeline.compile
        import eagle3_trt.measure.against, eagle3_trt.measure.method_choice, eagle3_trt.measure.commands, eagle3_trt.runtime.loader
        import eagle3_trt.train.commands, eagle3_trt.train.train_draft
        from eagle3_trt.cli import main
        from eagle3_trt.pipeline.llm_options import Eagle3Options, LlmApiOptions
        from eagle3_trt.pipeline.other_engines import launcher_files

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["train-draft", "--help"]) == 0
        assert "[chain]" in out.getvalue() and "--mask-token-id" in out.getvalue(), out.getvalue()
        # an EAGLE-3 bundle's launchers: every engine's script
        opts = LlmApiOptions(model="target", speculative_config=Eagle3Options(max_draft_len=3))
        files = launcher_files(opts, target_format="fp8", draft_format="bf16")
        assert {{"vllm.sh", "sglang.sh", "trtllm-serve.sh", "README.md"}} <= set(files), sorted(files)
        # the cost model prices every registered method through its hook
        assert all(callable(step_cost(name)) for name in METHODS)
        # the embedded EAGLE-3 pair validates
        assert main(["validate", "--target", {str(TINY / "target")!r}, "--draft", {str(TINY / "draft")!r}]) == 0
        # a P-EAGLE head: no registered method claims it, so the EAGLE-3 reader refuses it in one line
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = main(["validate", "--target", {str(TINY / "target")!r}, "--draft", {str(TINY / "draft-peagle")!r}])
        print(json.dumps({{"rc": rc, "err": err.getvalue()}}))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    res = __import__("json").loads(r.stdout.strip().splitlines()[-1])
    err = res["err"].strip()
    assert res["rc"] == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "config.json:speculators_model_type" in err and "P-EAGLE" in err, err
    assert pkg.is_dir() and not (pkg / "speculative" / "peagle").exists()
