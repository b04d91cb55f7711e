"""The Dynamo launchers every bundle carries: shell syntax, a dry run of the worker command, flags that
agree with the options file, flag names the installed dynamo.trtllm/frontend define, and a
Kubernetes manifest that validates against the DynamoGraphDeployment CRD's schema (vendored in
tests/data/dynamo, see SOURCE.md there) and whose standard objects validate with kubernetes-validate."""

from __future__ import annotations

import copy
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from eagle3_trt.dynamo_serving.commands import serve_dynamo_cmd
from eagle3_trt.pipeline import dynamo_launch as dl
from eagle3_trt.pipeline.bundle import read_options
from eagle3_trt.triton_serving.commands import serve_cmd

SCRIPTS = (dl.SCRIPT, dl.DISAGG_SCRIPT)
# The v1alpha1 openAPIV3Schema of ai-dynamo/dynamo's DynamoGraphDeployment CRD, descriptions stripped.
DGD_SCHEMA = Path(__file__).resolve().parent / "data" / "dynamo" / "dynamographdeployment.schema.json"


def test_bundle_carries_dynamo_launchers(fp8_bundle):
    launch = fp8_bundle / "launch"
    for name in (*SCRIPTS, dl.AGG_YAML, dl.PREFILL_YAML, dl.DECODE_YAML, dl.K8S_MANIFEST):
        assert (launch / name).is_file(), name
    for name in SCRIPTS:
        assert (launch / name).stat().st_mode & stat.S_IXUSR, name
        r = subprocess.run(["bash", "-n", str(launch / name)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


def _shim(tmp_path: Path) -> Path:
    """A PYTHON that records `-m module args...` calls and runs everything else (the path rewrite) for real."""
    log = tmp_path / "calls.txt"
    shim = tmp_path / "python-shim"
    shim.write_text(f'#!/usr/bin/env bash\nif [ "$1" = "-m" ]; then printf "%s\\n" "$*" >> {log}; exit 0; fi\nexec {sys.executable} "$@"\n')
    shim.chmod(0o755)
    return shim


@pytest.mark.parametrize("role,yaml_name,mode", [("worker", dl.AGG_YAML, None), ("prefill", dl.PREFILL_YAML, "prefill"), ("decode", dl.DECODE_YAML, "decode")])
def test_worker_dry_run_flags_match_options(fp8_bundle, tmp_path, role, yaml_name, mode):
    shim = _shim(tmp_path)
    env = {**os.environ, "PYTHON": str(shim), "ROLE": role, "TMPDIR": str(tmp_path)}
    r = subprocess.run(["bash", str(fp8_bundle / "launch" / dl.SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    argv = (tmp_path / "calls.txt").read_text().split()
    assert argv[:2] == ["-m", "dynamo.trtllm"], argv
    flags = {a: argv[i + 1] for i, a in enumerate(argv) if a.startswith("--")}
    assert set(flags) <= dl.TRTLLM_WORKER_FLAGS, set(flags) - dl.TRTLLM_WORKER_FLAGS
    assert flags.get("--disaggregation-mode") == mode
    assert flags["--model-path"] == str(fp8_bundle.resolve() / "target")
    # The options copy has absolute paths that exist, and every flag that mirrors an option has its value.
    extra = yaml.safe_load(Path(flags["--extra-engine-args"]).read_text())
    assert Path(extra["tokenizer"]).is_absolute() and Path(extra["tokenizer"]).is_dir()
    assert Path(extra["speculative_config"]["speculative_model_dir"]).is_dir()
    assert extra["speculative_config"]["decoding_type"] == "Eagle3"
    opts = read_options(fp8_bundle)
    assert int(flags["--tensor-parallel-size"]) == extra["tensor_parallel_size"] == opts.tensor_parallel_size
    assert int(flags["--pipeline-parallel-size"]) == extra["pipeline_parallel_size"]
    assert int(flags["--max-batch-size"]) == extra["max_batch_size"]
    assert int(flags["--max-num-tokens"]) == extra["max_num_tokens"]
    assert int(flags["--max-seq-len"]) == extra["max_seq_len"]
    assert int(flags["--kv-block-size"]) == extra["kv_cache_config"]["tokens_per_block"]
    assert float(flags["--free-gpu-memory-fraction"]) == extra["kv_cache_config"]["free_gpu_memory_fraction"]
    if mode:
        assert extra["cache_transceiver_config"]["backend"] == "DEFAULT"
    assert (extra.get("disable_overlap_scheduler") is True) == (mode == "prefill")


def test_frontend_role_binds_localhost_by_default(fp8_bundle, tmp_path):
    shim = _shim(tmp_path)
    env = {**os.environ, "PYTHON": str(shim), "ROLE": "frontend", "TMPDIR": str(tmp_path)}
    r = subprocess.run(["bash", str(fp8_bundle / "launch" / dl.SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    argv = (tmp_path / "calls.txt").read_text().split()
    assert argv[:2] == ["-m", "dynamo.frontend"] and argv[argv.index("--http-host") + 1] == "127.0.0.1"
    assert {a for a in argv if a.startswith("--")} <= dl.FRONTEND_FLAGS


def test_bad_role_is_one_line(fp8_bundle, tmp_path):
    r = subprocess.run(["bash", str(fp8_bundle / "launch" / dl.SCRIPT)], env={**os.environ, "ROLE": "nope"}, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "ROLE must be" in r.stderr


@pytest.mark.needs("dynamo")
def test_flag_names_exist_in_installed_dynamo():
    """Every flag the launchers pass is defined by the installed ai-dynamo (read from its source:
    importing dynamo.trtllm needs TensorRT-LLM)."""
    import importlib.util

    spec = importlib.util.find_spec("dynamo")
    assert spec is not None and spec.submodule_search_locations
    root = Path(next(iter(spec.submodule_search_locations)))
    # dynamo.trtllm's parser: its own backend_args.py/args.py plus the shared groups under dynamo/common.
    backend = "".join(f.read_text() for d in ("trtllm", "common") for f in sorted((root / d).rglob("*args*.py")))
    missing = [f for f in dl.TRTLLM_WORKER_FLAGS if f'"{f}"' not in backend]
    assert not missing, missing
    frontend = "".join(f.read_text() for d in ("frontend", "common", "router") if (root / d).is_dir() for f in sorted((root / d).rglob("*args*.py")))
    missing = [f for f in dl.FRONTEND_FLAGS if f'"{f}"' not in frontend]
    assert not missing, missing


@pytest.mark.needs("kubernetes_validate")
def test_k8s_manifest(fp8_bundle):
    import kubernetes_validate as kv  # an optional extra; the test needs it

    doc = yaml.safe_load((fp8_bundle / "launch" / dl.K8S_MANIFEST).read_text())
    assert doc["apiVersion"] == "nvidia.com/v1alpha1" and doc["kind"] == "DynamoGraphDeployment"
    spec = doc["spec"]
    # The values this bundle needs (the CRD schema itself is checked in test_k8s_manifest_matches_dynamo_crd_schema).
    assert spec["backendFramework"] in {"sglang", "vllm", "trtllm"}
    opts = read_options(fp8_bundle)
    for name, svc in spec["services"].items():
        assert isinstance(svc["replicas"], int) and svc["componentType"] in {"frontend", "worker"}, name
        for side in ("limits", "requests"):
            if "resources" in svc:
                assert svc["resources"][side]["gpu"] == str(opts.tensor_parallel_size * opts.pipeline_parallel_size)
        pod = svc["extraPodSpec"]
        # The embedded standard objects: the main container and its volumes as a core/v1 Pod.
        obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"eagle3-{name.lower()}"},
            "spec": {"containers": [pod["mainContainer"]], "volumes": pod["volumes"]},
        }
        kv.validate(obj, kv.latest_version(), strict=True)
        assert pod["mainContainer"]["command"] == ["bash", f"{dl.BUNDLE_MOUNT}/launch/{dl.SCRIPT}"]
    bad = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "x"},
        "spec": {"containers": [{"name": "m", "image": "i", "ports": [{"containerPort": "http"}]}]},
    }
    with pytest.raises(kv.ValidationError):  # the validator can fail
        kv.validate(bad, kv.latest_version(), strict=True)


def _default(cmd, name: str):
    return next(p.default for p in cmd.params if p.name == name)


def test_serve_dynamo_default_port_is_the_makefiles_and_not_tritons():
    # serve-dynamo defaulted to 8000, Triton's HTTP port, while `make serve-dynamo` and the README use 8080.
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    make_port = next(int(line.split("?=")[1]) for line in makefile.splitlines() if line.startswith("DYNAMO_PORT"))
    assert _default(serve_dynamo_cmd, "http_port") == make_port
    assert _default(serve_dynamo_cmd, "http_port") not in {_default(serve_cmd, n) for n in ("http_port", "grpc_port", "metrics_port")}


# --- The DynamoGraphDeployment against the CRD's own schema -------------------------------------------------------


def _as_json_schema(node):
    """The CRD's structural schema as plain JSON Schema (draft 4, which OpenAPI v3 schemas follow), with
    the Kubernetes extensions jsonschema does not know spelled out: x-kubernetes-int-or-string accepts
    an integer or a string, nullable accepts null. Unknown keywords (x-kubernetes-validations CEL rules,
    list/map types) are ignored by jsonschema and by this check."""
    if isinstance(node, list):
        return [_as_json_schema(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {
        k: (
            _as_json_schema(v)
            if k in ("items", "additionalProperties", "not", "anyOf", "allOf", "oneOf")
            else {n: _as_json_schema(x) for n, x in v.items()}
            if k == "properties"
            else v
        )
        for k, v in node.items()
    }
    if out.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    if out.get("nullable") and "type" in out:
        out["type"] = [*([out["type"]] if isinstance(out["type"], str) else out["type"]), "null"]
    return out


def _undeclared(obj, schema, path="") -> list[str]:
    """Paths in obj that the schema does not declare. The API server prunes such fields silently instead
    of rejecting them, so a misspelled field would pass JSON Schema validation and then vanish."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(obj, list):
        return [p for i, x in enumerate(obj) for p in _undeclared(x, schema.get("items", {}), f"{path}[{i}]")]
    if not isinstance(obj, dict):
        return []
    props, extra = schema.get("properties", {}), schema.get("additionalProperties", False)
    bad = []
    for key, value in obj.items():
        sub = props.get(key, extra)
        if sub is False:
            bad.append(f"{path}.{key}")
        elif isinstance(sub, dict):
            bad += _undeclared(value, sub, f"{path}.{key}")
    return bad


# metadata is `type: object` in every CRD schema; the API server checks it as ObjectMeta.
_OBJECT_META = {"name", "namespace", "labels", "annotations"}


def _dgd_problems(doc: dict) -> list[str]:
    schema = json.loads(DGD_SCHEMA.read_text())
    validator = jsonschema.Draft4Validator(_as_json_schema(schema))
    problems = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]
    problems += [f".metadata.{k}: not ObjectMeta" for k in set(doc.get("metadata", {})) - _OBJECT_META]
    return problems + _undeclared({k: v for k, v in doc.items() if k != "metadata"}, schema)


def test_k8s_manifest_matches_dynamo_crd_schema(fp8_bundle):
    docs = list(yaml.safe_load_all((fp8_bundle / "launch" / dl.K8S_MANIFEST).read_text()))
    (doc,) = [d for d in docs if d.get("kind") == "DynamoGraphDeployment"]
    assert doc["apiVersion"] == "nvidia.com/v1alpha1"  # the version the vendored schema is
    assert _dgd_problems(doc) == []


@pytest.mark.parametrize(
    "mutate,expect",
    [
        (
            lambda s: s["services"]["TRTLLMWorker"].update(replica=s["services"]["TRTLLMWorker"].pop("replicas")),
            ".spec.services.TRTLLMWorker.replica",
        ),  # misspelled: would be pruned
        (
            lambda s: s["services"]["Frontend"]["extraPodSpec"]["mainContainer"].update(volumeMount=[]),
            ".spec.services.Frontend.extraPodSpec.mainContainer.volumeMount",
        ),  # misspelled, deep in the PodSpec
        (lambda s: s["services"]["TRTLLMWorker"].update(replicas="1"), "is not of type 'integer'"),
        (lambda s: s.update(backendFramework="tensorrt"), "is not one of"),
        (lambda s: s["services"]["TRTLLMWorker"]["resources"]["limits"].update(gpu=1), "is not of type 'string'"),
        (lambda s: s["services"]["Frontend"]["extraPodSpec"]["mainContainer"]["ports"][0].pop("containerPort"), "'containerPort' is a required property"),
        (
            lambda s: s["services"]["Frontend"]["extraPodSpec"]["mainContainer"].update(resources={"limits": {"cpu": [2]}}),
            "is not of type 'integer', 'string'",
        ),  # Quantity: int-or-string
    ],
)
def test_dgd_schema_check_can_fail(fp8_bundle, mutate, expect):
    doc = yaml.safe_load((fp8_bundle / "launch" / dl.K8S_MANIFEST).read_text())
    bad = copy.deepcopy(doc)
    mutate(bad["spec"])
    problems = _dgd_problems(bad)
    assert any(expect in p for p in problems), problems


def test_int_or_string_fields_take_both():
    ok = {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": "x"},
        "spec": {"services": {"W": {"extraPodSpec": {"mainContainer": {"name": "main", "resources": {"limits": {"cpu": 2, "memory": "1Gi"}}}}}}},
    }
    assert _dgd_problems(ok) == []
