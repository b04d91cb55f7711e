"""Serving without a server: model.yaml read the way upstream's llmapi model.py reads it, each
instance's GPU environment, and the LLM-API driver over the reference runtime (stop strings,
token counts, acceptance statistics)."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from pathlib import Path

import pytest
import yaml

from eagle3_trt.testing.pytest_guard import require

require("tritonclient")

from eagle3_trt.errors import UserError
from eagle3_trt.pipeline.trtllm_names import DOCUMENTED_NESTED, DOCUMENTED_TOP_LEVEL
from eagle3_trt.runtime.llm_api import SamplingParamError, SamplingParams
from eagle3_trt.runtime.request_contract import ClientRequest
from eagle3_trt.triton_serving.instances import MPI_JOB_VARS, assign_gpus, instance_environment, instance_index
from eagle3_trt.triton_serving.job import LlmServing, derive_positions
from eagle3_trt.triton_serving.package import UNARY_SUFFIX, package_bundle
from eagle3_trt.triton_serving.request_params import GenRequest, RequestError, check_parameters


# ---- model.yaml as upstream reads it --------------------------------------------------------------
def upstream_get_model_config(model_dir: Path, filename: str, include_keys=None, exclude_keys=None):
    """Replica of upstream's reader: NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/
    tensorrt_llm/1/model.py @ 044a90d209e380c95e23e8ae42f3583fa05ada78, get_model_config()
    (``pb_utils.get_model_dir()`` is the version directory holding model.py)."""
    engine_args_filepath = os.path.join(model_dir, filename)
    engine_config = None
    if os.path.isfile(engine_args_filepath):
        with open(engine_args_filepath) as file:
            engine_config = yaml.safe_load(file)
    assert engine_config is not None, f"'{filename}' containing TRT-LLM engine args not found in '{model_dir}'"
    if include_keys:
        engine_config = {k: v for k, v in engine_config.items() if k in include_keys}
    if exclude_keys:
        engine_config = {k: v for k, v in engine_config.items() if k not in exclude_keys}
    return engine_config


@pytest.mark.parametrize("decoupled", [True, False])
def test_model_yaml_loads_in_upstream_llmapi_model(fp8_bundle, tmp_path, decoupled):
    package_bundle(fp8_bundle, tmp_path / "repo", decoupled=decoupled, with_baseline=True)
    for name in ("eagle3", "eagle3_nospec"):
        vdir = tmp_path / "repo" / name / "1"
        # auto_complete_config / initialize: both keys are indexed, so both must be present.
        triton_config = upstream_get_model_config(vdir, "model.yaml", include_keys=["triton_config"])["triton_config"]
        assert bool(triton_config["decoupled"]) is decoupled
        assert int(triton_config["max_batch_size"]) == 0
        assert int(triton_config["cancellation_check_period_ms"]) > 0
        # initialize: every other key goes to update_llm_args_with_extra_dict -> LLM(**args).
        llm_args = upstream_get_model_config(vdir, "model.yaml", exclude_keys=["triton_config"])
        unknown = sorted(set(llm_args) - DOCUMENTED_TOP_LEVEL)
        assert not unknown, f"model.yaml keys LLM() would reject: {unknown}"
        for key, value in llm_args.items():
            if key in DOCUMENTED_NESTED and isinstance(value, dict):
                assert set(value) <= DOCUMENTED_NESTED[key], (key, set(value) - DOCUMENTED_NESTED[key])
        assert Path(llm_args["model"]).is_absolute() and (Path(llm_args["model"]) / "config.json").is_file()
        spec = llm_args.get("speculative_config")
        if name == "eagle3":
            # the name every release accepts (speculative_model came later as the new name)
            assert (Path(spec["speculative_model_dir"]) / "config.json").is_file() and spec["decoding_type"] == "Eagle3"
        else:
            assert spec is None
        # Our own settings are not in model.yaml; they live in a file upstream never opens.
        assert not {"runtime", "bundle", "device", "python_path", "speculation"} & set(llm_args)
        assert yaml.safe_load((vdir / "eagle3.yaml").read_text())["runtime"] == "reference"
    cfg = (tmp_path / "repo" / "eagle3" / "config.pbtxt").read_text()
    assert f"decoupled: {str(decoupled).lower()}" in cfg


# ---- instances and GPUs ---------------------------------------------------------------------------
def test_gpu_assignment_and_refusal():
    assert assign_gpus(2, 2, 4) == "0,1;2,3"
    assert assign_gpus(1, 8, 8) == "0,1,2,3,4,5,6,7"
    assert assign_gpus(3, 1, 4) == "0;1;2"
    with pytest.raises(UserError) as e:
        assign_gpus(2, 4, 4)
    assert e.value.line().count("\n") == 0 and "2 instance(s) x tensor_parallel_size 4 = 8 GPUs, but --gpus is 4" in e.value.line()


def test_each_instance_environment_for_llm():
    inherited = {
        "PATH": "/bin",
        "OMPI_COMM_WORLD_RANK": "0",
        "OMPI_COMM_WORLD_SIZE": "8",
        "PMIX_RANK": "0",
        "PMI_SIZE": "8",
        "OMPI_MCA_orte_hnp_uri": "x",
        "ORTE_FOO": "y",
        "OMPI_MCA_btl": "^openib",
        "PMIX_MCA_gds": "hash",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
    }
    envs = []
    for i in range(2):
        env, extra = instance_environment(inherited, gpu_device_ids="0,1;2,3", instance_count=2, model_instance_name=f"eagle3_0_{i}")
        envs.append(env)
        assert extra == {"gpus_per_node": 2}
        assert env["TRTLLM_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"]
        # job variables gone, configuration variables kept (as upstream)
        assert not (set(env) & MPI_JOB_VARS) and "OMPI_MCA_orte_hnp_uri" not in env and "ORTE_FOO" not in env
        assert env["OMPI_MCA_btl"] == "^openib" and env["PMIX_MCA_gds"] == "hash" and env["PATH"] == "/bin"
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0,1", "2,3"]
    assert inherited["OMPI_COMM_WORLD_RANK"] == "0"  # pure: the input is not modified
    # one instance, not pinned: the GPUs are left as they are, the MPI job is still cleared
    env, extra = instance_environment(inherited, gpu_device_ids="", instance_count=1, model_instance_name="eagle3_0_0")
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3" and extra == {} and "PMIX_RANK" not in env
    with pytest.raises(UserError, match="gpu_device_ids"):
        instance_environment(inherited, gpu_device_ids="", instance_count=2, model_instance_name="eagle3_0_1")
    with pytest.raises(UserError, match="instance 2 has no entry"):
        instance_environment(inherited, gpu_device_ids="0;1", instance_count=3, model_instance_name="eagle3_0_2")
    assert instance_index("tensorrt_llm_0_12") == 12 and instance_index("x") == 0


def test_package_gives_each_instance_its_gpus(fp8_bundle, tmp_path):
    models = package_bundle(fp8_bundle, tmp_path / "r", runtime="trtllm", instance_count=2, gpus=4, with_unary=True)
    assert [(m.name, m.decoupled, m.gpu_device_ids) for m in models] == [("eagle3", True, "0;1"), ("eagle3" + UNARY_SUFFIX, False, "2;3")]
    assert 'string_value: "0;1"' in (tmp_path / "r" / "eagle3" / "config.pbtxt").read_text()
    with pytest.raises(UserError, match="--gpus"):  # 2 models x 2 instances x TP 1 = 4 > 3
        package_bundle(fp8_bundle, tmp_path / "r2", runtime="trtllm", instance_count=2, gpus=3, with_unary=True)
    with pytest.raises(UserError, match="--gpus"):  # several TensorRT-LLM instances, GPUs not given
        package_bundle(fp8_bundle, tmp_path / "r3", runtime="trtllm", instance_count=2)
    assert not (tmp_path / "r2").exists() and not (tmp_path / "r3").exists()
    # the reference runtime on CPU needs no GPUs
    assert package_bundle(fp8_bundle, tmp_path / "r4", device="cpu", instance_count=2)[0].gpu_device_ids == ""


# ---- request fields -------------------------------------------------------------------------------
def test_unknown_generate_keys_are_refused_by_name():
    check_parameters({"triton_enable_empty_final_response": True})
    check_parameters({"id": "r1"})  # /generate's request id reaches the model as a parameter too
    with pytest.raises(RequestError) as e:
        check_parameters({"max_tokens": 4})
    assert e.value.field == "max_tokens" and "sampling_param_max_tokens" in str(e.value)
    with pytest.raises(RequestError, match="foo: not an input"):
        check_parameters({"foo": 1})


def test_derive_positions_from_stream():
    # prefill 1 token, then iterations adding 3, 1, 4 tokens (K = 3)
    als, drafted, accepted = derive_positions([1, 3, 1, 4], 3)
    assert als == [3, 1, 4] and drafted == [3, 3, 3] and accepted == [2, 2, 1]
    assert sum(accepted) == sum(a - 1 for a in als)


# ---- the driver over the reference runtime, in process ----------------------------------------------
class _Sink:
    def __init__(self):
        self.emissions, self.error, self.done = [], None, threading.Event()

    def emit(self, e):
        self.emissions.append(e)
        if e.final:
            self.done.set()

    def fail(self, message, cancelled=False, bad_request=False, unavailable=False):
        self.error = (message, cancelled)
        self.done.set()

    def is_cancelled(self):
        return False


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The shipped (trained) tiny pair, built: its draft is accepted, unlike the random pair's."""
    from eagle3_trt.convert.embedded import embedded_pair, heldout_prompts
    from eagle3_trt.pipeline.builder import EngineRequest, build_bundle
    from eagle3_trt.pipeline.presets import load_preset
    from eagle3_trt.runtime.factory import open_llm

    t, _ = embedded_pair("tiny")
    prompts = heldout_prompts(t.parent)
    if not prompts:
        raise AssertionError("every embedded pair ships held-out prompts")
    bundle = build_bundle(EngineRequest(preset=load_preset("tiny"), target_gpu="h100", out=str(tmp_path_factory.mktemp("emb") / "b"))).bundle
    llm = open_llm(bundle, "reference", device="cpu")
    summaries = []
    sv = LlmServing(
        llm,
        max_seq_len=512,
        max_draft_len=3,
        speculation=True,
        default_max_tokens=16,
        cancel_period_ms=20,
        decoupled=True,
        on_done=summaries.append,
        log=print,
    )
    texts = [llm.tokenizer.decode(p) for p in prompts[:3]]
    yield sv, texts, summaries
    sv.shutdown()


def _run(sv, prompt, streaming=False, speculative=True, **sampling):
    s = _Sink()
    req = GenRequest(
        prompt=prompt,
        sampling=ClientRequest(**sampling),
        streaming=streaming,
        speculative=speculative,
        exclude_input_from_output=True,
        return_perf_metrics=True,
        return_stop_reason=True,
    )
    sv.submit(req, s, "", time.monotonic_ns())
    assert s.done.wait(120)
    return s


def test_stop_string_counts_only_returned_tokens(served):
    """Speculation on and off return the same text AND the same token count at a stop string;
    the accepted drafts past it are taken out of the statistics, which stay consistent."""
    sv, texts, summaries = served
    prompt = texts[0]
    full = _run(sv, prompt, max_tokens=24)
    text = "".join(e.text for e in full.emissions)
    perf = full.emissions[-1].perf
    assert perf.accepted_tokens > 0  # drafts are accepted: the case that over-counted
    # stop at every later position: the count must equal the no-speculation count each time
    checked = 0
    for cut in range(4, min(len(text), 40), 3):
        stop = text[cut : cut + 2]
        if not stop.strip() or text.index(stop) != cut:
            continue
        on = _run(sv, prompt, max_tokens=24, stop=(stop,), streaming=True)
        off = _run(sv, prompt, max_tokens=24, stop=(stop,), speculative=False)
        t_on = "".join(e.text for e in on.emissions)
        t_off = "".join(e.text for e in off.emissions)
        assert t_on == t_off == text[:cut]
        n_on = sum(e.n_tokens for e in on.emissions)
        assert n_on == off.emissions[-1].n_tokens, (stop, n_on, off.emissions[-1].n_tokens)
        assert on.emissions[-1].finish_reason == "stop" and on.emissions[-1].stop_reason == stop
        p = on.emissions[-1].perf
        # tokens = accepted drafts + target forwards (each forward adds one token of its own)
        assert n_on == p.accepted_tokens + round(n_on / p.acceptance_length)
        assert p.acceptance_rate == pytest.approx(p.accepted_tokens / p.draft_tokens)
        checked += 1
    assert checked >= 3
    time.sleep(0.2)
    s = [x for x in summaries if x.speculation][-1]
    assert sum(s.accepted_per_position) == s.accepted_tokens and sum(s.drafted_per_position) == s.draft_tokens
    assert sum(s.step_acceptance_lengths) == s.accepted_tokens + len(s.step_acceptance_lengths)


def test_reference_llm_api_shape(served):
    """The LLM-API surface the driver relies on, used directly: async iteration, abort."""
    sv, texts, _ = served
    llm = sv.llm
    ids = sv.encode(texts[1])

    async def go():
        out = llm.generate_async(ids, SamplingParams(max_tokens=200, top_k=1, return_perf_metrics=True), streaming=True)
        seen = []
        async for o in out:
            seen.append(len(o.outputs[0].token_ids))
            if len(seen) == 3:
                out.abort()
        return out, seen

    out, seen = asyncio.run(go())
    assert out.finished and out.outputs[0].finish_reason == "cancelled"
    assert seen == sorted(seen) and seen[-1] < 200
    assert out.outputs[0].request_perf_metrics.speculative_decoding.total_draft_tokens > 0
    # refused with the field named as data (the Triton driver maps it to sampling_param_<field>)
    with pytest.raises(SamplingParamError, match="frequency_penalty") as e:
        SamplingParams(frequency_penalty=0.5)
    assert e.value.field == "frequency_penalty"


def test_refused_sampling_value_names_the_request_field(served):
    """The runtime's refusal reaches the client as the request tensor it came from, nothing started."""
    sv, texts, _ = served
    before = sv.in_flight()
    with pytest.raises(RequestError) as e:
        sv.submit(GenRequest(prompt=texts[0], sampling=ClientRequest(presence_penalty=0.5)), _Sink(), "", time.monotonic_ns())
    assert e.value.field == "sampling_param_presence_penalty" and "not supported by the reference runtime" in e.value.message
    assert sv.in_flight() == before


def test_serve_refuses_a_state_dir_whose_server_is_alive_and_ignores_an_empty_one(tmp_path):
    """A live recorded server is refused (by its pid, before anything starts); no record is no refusal."""
    from eagle3_trt.triton_serving.server import STATE_FILE, ServerHandle, start_server

    state = tmp_path / "state"
    state.mkdir()
    ServerHandle(os.getpid(), str(tmp_path), 1, 2, 3, str(tmp_path / "log"), str(state)).save()
    with pytest.raises(UserError, match="a server is already running here"):
        start_server(tmp_path, state_dir=state, validate=False)
    (state / STATE_FILE).unlink()
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:  # past the state check: the next refusal is the port, so nothing was started
        with pytest.raises(UserError, match=f"port {busy.getsockname()[1]}"):
            start_server(tmp_path, state_dir=state, http_port=busy.getsockname()[1], validate=False)
    finally:
        busy.close()


# ---- stop: says when it had to kill, leaves no shared memory behind --------------------------------
def test_stop_kills_a_hung_server_says_so_and_removes_its_shared_memory(tmp_path):
    import subprocess
    import sys
    import uuid

    from eagle3_trt.triton_serving.server import ServerHandle

    prefix = f"eagle3_{uuid.uuid4().hex[:12]}_"
    shm = Path("/dev/shm")
    # A "server" that ignores SIGTERM, as tritonserver does when its exit timeout hangs.
    proc = subprocess.Popen(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    other = shm / "eagle3_someoneelse_0"
    try:
        assert proc.stdout.readline().strip() == "up"
        regions = [shm / f"{prefix}{i}" for i in range(2)]
        for p in regions:
            p.write_bytes(b"x")
        other.write_bytes(b"x")  # another server's region: must survive
        state = tmp_path / "state"
        state.mkdir()
        ServerHandle(proc.pid, "repo", 1, 2, 3, str(state / "log"), str(state), [], 0.0, prefix).save()
        r = subprocess.run(
            [sys.executable, "-m", "eagle3_trt.cli", "stop", "--state-dir", str(state), "--timeout", "1"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=Path(__file__).resolve().parents[1],
        )
        assert r.returncode == 1, r.stdout + r.stderr
        assert "did not exit within 1 s of SIGTERM: killed its process group" in r.stderr
        assert "removed 2 shared-memory region(s)" in r.stderr
        assert proc.wait(10) == -9
        assert not any(p.exists() for p in regions) and other.exists()
        assert not (state / "server.json").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
        other.unlink(missing_ok=True)
