"""Shared fixtures: tiny model pairs and bundles built once per test session on real files."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared"

# The suite builds bundles from random-weight pairs (eagle3_trt.testing.tiny_pair), which the build's
# behaviour checks rightly refuse (loss ~ log V, agreement ~ chance): skipped for every build here,
# CLI subprocesses included (they inherit the environment). tests/test_behaviour_checks.py clears it.
os.environ.setdefault("EAGLE3_TRT_SKIP_BEHAVIOUR_CHECKS", "1")

# One torch thread in every process the suite starts (CLI runs, builds, servers, their workers), not only in
# this one (_one_torch_thread below): torch's default is a thread per core, and on a 2-core machine running
# two xdist workers their OpenMP threads spin against each other (a CLI build of the tiny bundle took
# 32 CPU-seconds with the default, 13 with one thread). An OMP_NUM_THREADS already set is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")


# Where the reference runtime's engine runs (issue 32). ReferenceLLM starts a worker interpreter by default
# (python -m eagle3_trt.runtime.executor_worker, as TensorRT-LLM's GenerationExecutorProxy does): it imports
# torch and loads the bundle again, ~4.6 CPU-seconds per ReferenceLLM, and every Triton stub and Dynamo worker
# opens one. TLLM_WORKER_USE_SINGLE_PROCESS=1 (TensorRT-LLM's own switch) runs the same Scheduler on a thread
# of the caller instead: same engine, same tokens (test_executor_process.py checks the two agree). The
# files below test the worker, the servers' handling of their processes, or the served path exactly as
# production runs it, and always get the worker; every other file runs single-process, servers included (the
# variable reaches the CLI's servers through the environment). An explicit TLLM_WORKER_USE_SINGLE_PROCESS
# in the environment (`TLLM_WORKER_USE_SINGLE_PROCESS=0 make test`) applies to those other files instead.
REAL_EXECUTOR_WORKER = {
    "test_executor_process.py": "the worker process itself: separate pid, same tokens as the thread, errors, shutdown",
    "test_serving_delivery.py": "issue 32's hand-offs from the worker's dispatcher thread to the serving loop",
    "test_serving_wakeups.py": "issue 32's wake-ups per round, as the dispatcher delivers them",
    "test_triton_server.py": "the served path end to end, stubs with their workers as production runs them",
    "test_dynamo_serving.py": "the served path end to end, Dynamo workers with their executor workers",
    "test_triton_stop.py": "stop under load: drains, kills and finds the stubs' workers (process trees)",
    "test_dynamo_stop.py": "stop-dynamo under load: nothing of the deployment left, process groups included",
    "test_deploy_triton.py": "deploy/rollback drains versions whose stubs run workers",
    "test_deploy_dynamo.py": "deploy-dynamo drains and stops workers' process groups (c2d0f3f: SIGTERM killed the worker)",
    "test_readme_commands.py": "the README's commands as a user types them, in the user's default environment",
    "test_benchmarks_smoke.py": "the benchmarks as a user runs them (they measure the served path with its worker)",
}
assert all((Path(__file__).parent / f).is_file() for f in REAL_EXECUTOR_WORKER), "a renamed file left REAL_EXECUTOR_WORKER"
_SINGLE_PROCESS_ENV = "TLLM_WORKER_USE_SINGLE_PROCESS"  # eagle3_trt.runtime.reference_llm.SINGLE_PROCESS_ENV
_SINGLE_PROCESS_OUTER = os.environ.get(_SINGLE_PROCESS_ENV)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before any fixture of the test is set up (module-scoped servers start in their file's first test)."""
    if item.path.name in REAL_EXECUTOR_WORKER:
        os.environ.pop(_SINGLE_PROCESS_ENV, None)
    else:
        os.environ[_SINGLE_PROCESS_ENV] = _SINGLE_PROCESS_OUTER if _SINGLE_PROCESS_OUTER is not None else "1"


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    """OpenMP spin-waiting on a shared 2-core machine makes tiny models up to ~50x slower."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_pair_session(tmp_path_factory) -> tuple[Path, Path]:
    from eagle3_trt.testing.tiny_pair import make_pair

    return make_pair(tmp_path_factory.mktemp("tiny-pair"))


@pytest.fixture()
def tiny_pair(tiny_pair_session, tmp_path) -> tuple[Path, Path]:
    """A private copy a test may break."""
    t, d = tiny_pair_session
    shutil.copytree(t, tmp_path / "target")
    shutil.copytree(d, tmp_path / "draft")
    return tmp_path / "target", tmp_path / "draft"


def _build(preset: str = "tiny", **kw):
    from eagle3_trt.pipeline.builder import EngineRequest, build_bundle
    from eagle3_trt.pipeline.presets import load_preset

    return build_bundle(EngineRequest(preset=load_preset(preset), **kw))


@pytest.fixture(scope="session")
def fp8_bundle(tiny_pair_session, tmp_path_factory) -> Path:
    t, d = tiny_pair_session
    return _build(target=str(t), draft=str(d), target_gpu="h100", out=str(tmp_path_factory.mktemp("b") / "fp8")).bundle


@pytest.fixture(scope="session")
def k5_bundle(tiny_pair_session, tmp_path_factory) -> Path:
    """The tiny FP8 pair at K=5 (fp8_bundle is K=3): a second bundle for deploy tests to tell apart."""
    t, d = tiny_pair_session
    return _build(target=str(t), draft=str(d), target_gpu="h100", max_draft_len=5, out=str(tmp_path_factory.mktemp("b") / "k5")).bundle


@pytest.fixture(scope="session")
def nvfp4_bundle(tiny_pair_session, tmp_path_factory) -> Path:
    t, d = tiny_pair_session
    return _build(target=str(t), draft=str(d), target_gpu="b200", quantize_draft=True, out=str(tmp_path_factory.mktemp("b") / "nvfp4")).bundle


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """../shared; tests that use it carry @pytest.mark.needs("shared")."""
    assert SHARED.is_dir(), "mark the test @pytest.mark.needs('shared')"
    return SHARED


@pytest.fixture()
def alpha_on_heldout():
    """The function below, for tests (``--import-mode=importlib``: fixtures are how tests share code)."""
    return _alpha_on_heldout


def _alpha_on_heldout(bundle: Path, pair: Path, out: Path, n: int = 3, max_tokens: int = 24) -> dict:
    """`eagle3-trt alpha` on the first ``n`` held-out prompts an embedded pair ships (32 tokens of each,
    decoded to text as a user would send them); returns report.json."""
    import json

    import transformers

    from eagle3_trt.cli import main

    held = json.loads((pair / "heldout_prompts.json").read_text())["prompts"]
    tok = transformers.AutoTokenizer.from_pretrained(pair / "target")
    out.mkdir(parents=True, exist_ok=True)
    prompts = out / "p.jsonl"
    prompts.write_text("".join(json.dumps({"text": tok.decode(p[:32])}) + "\n" for p in held[:n]))
    assert main(["alpha", str(bundle), "--prompts", str(prompts), "--max-tokens", str(max_tokens), "-o", str(out / "rep")]) == 0
    return json.loads((out / "rep" / "report.json").read_text())


# Files that take minutes (real servers, deploys, every benchmark, the README's blocks, CLI subprocesses by the
# dozen), run first, longest first: under make test's xdist (--dist loadfile) a worker takes whole files in this
# order, so a long file reached last would leave the other worker idle at the end. The seconds are wall times
# of the file run alone on the shared 2-core machine (load 3-6) this session, for the order only; the first
# four kept the order the last fresh-clone run's --durations gave them.
SLOW_FIRST = (
    "test_deploy_dynamo.py",  # 240: two rolls of two Dynamo workers under 16 clients
    "test_readme_commands.py",
    "test_benchmarks_smoke.py",
    "test_bad_inputs.py",
    "test_triton_package_ownership.py",  # 160: ~20 CLI subprocesses
    "test_executor_process.py",  # ~110
    "test_triton_stop.py",  # ~100: four servers stopped under load
    "test_clients.py",  # 96
    "test_families.py",  # 92
    "test_deploy_triton.py",  # 86
    "test_permissions.py",  # 87
    "test_bench_openai.py",  # 85
    "test_request_contract.py",  # 77
    "test_dynamo_stop.py",
    "test_train_torchrun.py",
    "test_tensor_parallel.py",  # 200: three torchrun launches of 2 ranks
    "test_capture_dynamo.py",  # 49
    "test_traffic_alpha_gate.py",  # 48 (214 with an executor worker and torch's default threads)
    "test_dynamo_serving.py",
    "test_triton_server.py",
    "test_train_from_traffic_endpoint.py",  # 64
    "test_train_from_traffic.py",  # 51
    "test_capture_triton.py",  # 47
    "test_traffic_alpha_triton.py",  # 37
    "test_packaging.py",  # 29
)
assert all((Path(__file__).parent / f).is_file() for f in SLOW_FIRST), "a renamed file left SLOW_FIRST"


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist 3.x reorders --dist loadfile's files by their number of tests (most first) unless told
    # --no-loadscope-reorder: the order below was ignored, and the one-test files that take minutes ran last.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))  # stable: file order otherwise kept
