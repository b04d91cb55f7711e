"""launch/ files for NVIDIA Dynamo with TensorRT-LLM: scripts, engine options and a Kubernetes manifest.

What is written (``dynamo_launch_files(opts)``; ``build/bundle.py`` adds them to ``launch/``):

* ``dynamo-trtllm.yaml``: the ``--extra-engine-args`` file of ``python -m dynamo.trtllm``
  (aggregated); ``dynamo-trtllm-prefill.yaml`` / ``dynamo-trtllm-decode.yaml``: the same plus what
  disaggregated serving needs (``cache_transceiver_config``; the prefill side runs without the
  overlap scheduler, as TensorRT-LLM's disaggregated-serving docs require of context servers).
  They are the trtllm-serve options for TensorRT-LLM 1.3+ (``ai-dynamo[trtllm]`` 1.6.1 pins
  ``tensorrt-llm==1.3.0rc29``), paths relative to the bundle.
* ``dynamo-trtllm.sh``: ``ROLE=all`` (frontend + one worker on this node), ``frontend``, ``worker``,
  ``prefill``, ``decode`` or ``disagg`` (frontend + prefill + decode on this node). It copies the
  options file to ``$TMPDIR`` with absolute paths (``dynamo.trtllm`` merges the file over its own
  arguments with TensorRT-LLM's ``update_llm_args_with_extra_options``, so a relative path would be
  resolved against the worker's working directory: dynamo/trtllm/workers/llm_worker.py, ai-dynamo
  1.6.1). ``dynamo-trtllm-disagg.sh`` is ``ROLE=disagg`` of the same script.
* ``dynamo-k8s.yaml``: a ``DynamoGraphDeployment`` (nvidia.com/v1alpha1) with a frontend and a
  TensorRT-LLM worker that mount the bundle at ``/bundle`` (PVC ``eagle3-bundle``) and run the
  script above.

Flags next to the options file. ``dynamo.trtllm`` builds its own arguments first
(``--tensor-parallel-size``, ``--max-batch-size``, ``--max-num-tokens``, ``--max-seq-len``,
``--free-gpu-memory-fraction``, ``--kv-block-size``, defaults from TensorRT-LLM's BuildConfig) and
the options file overrides them, but the router and the model card read the flags
(``runtime_config.context_length = config.max_seq_len``, ``kv_cache_block_size =
config.kv_block_size``). So every such flag is passed with the bundle's own value, never a
different one (``worker_flags``; the tests compare them with the options).

EAGLE-3 with disaggregated prefill/decode. ``dynamo.trtllm`` 1.6.1 has no check that refuses a
``speculative_config`` in prefill or decode mode: the prefill handler only forces ``max_tokens=1``
and the decode handler requires ``disaggregated_params`` (dynamo/trtllm/request_handlers/
handler_base.py); speculative settings only feed ``get_spec_decode_runtime_data``
(dynamo/trtllm/utils/trtllm_utils.py). Dynamo's own examples deploy EAGLE one-model disaggregated
(ai-dynamo/dynamo components/backends/trtllm/llama4_plus_eagle.md, eagle_prefill.yaml and
eagle_decode.yaml). Both sides therefore carry the same speculative_config (the decode side drafts;
the prefill side must load the same draft so the KV layout both sides exchange matches).
"""

from __future__ import annotations

import shlex

import yaml

from eagle3_trt.pipeline.llm_options import LlmApiOptions
from eagle3_trt.pipeline.other_engines import TRTLLM_SERVE_YAML, trtllm_serve_yamls

AGG_YAML = "dynamo-trtllm.yaml"
PREFILL_YAML = "dynamo-trtllm-prefill.yaml"
DECODE_YAML = "dynamo-trtllm-decode.yaml"
SCRIPT = "dynamo-trtllm.sh"
DISAGG_SCRIPT = "dynamo-trtllm-disagg.sh"
K8S_MANIFEST = "dynamo-k8s.yaml"
BUNDLE_MOUNT = "/bundle"
K8S_PVC = "eagle3-bundle"
# The Dynamo TensorRT-LLM runtime image (NGC); the tag is the Dynamo release the launchers were checked against.
DYNAMO_VERSION = "1.6.1"
IMAGE = f"nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:{DYNAMO_VERSION}"

# dynamo.trtllm flags these launchers pass (names from dynamo/trtllm/backend_args.py, ai-dynamo 1.6.1).
TRTLLM_WORKER_FLAGS = frozenset(
    {
        "--model-path",
        "--served-model-name",
        "--extra-engine-args",
        "--tensor-parallel-size",
        "--pipeline-parallel-size",
        "--max-batch-size",
        "--max-num-tokens",
        "--max-seq-len",
        "--kv-block-size",
        "--free-gpu-memory-fraction",
        "--disaggregation-mode",
    }
)
FRONTEND_FLAGS = frozenset({"--http-host", "--http-port", "--router-mode", "--migration-limit"})


def engine_yamls(opts: LlmApiOptions) -> dict[str, dict]:
    """File name -> options dict (aggregated, prefill, decode), from the 1.3+ trtllm-serve options."""
    text = trtllm_serve_yamls(opts)[TRTLLM_SERVE_YAML]
    agg = yaml.safe_load(text)
    transceiver = {"cache_transceiver_config": {"backend": "DEFAULT"}}
    return {AGG_YAML: agg, PREFILL_YAML: {**agg, **transceiver, "disable_overlap_scheduler": True}, DECODE_YAML: {**agg, **transceiver}}


def worker_flags(opts: LlmApiOptions) -> list[str]:
    """The dynamo.trtllm flags that mirror options-file values, each with the bundle's value."""
    kv = opts.kv_cache_config
    flags = [
        "--tensor-parallel-size",
        str(opts.tensor_parallel_size),
        "--pipeline-parallel-size",
        str(opts.pipeline_parallel_size),
        "--max-batch-size",
        str(opts.max_batch_size),
        "--max-num-tokens",
        str(opts.max_num_tokens),
    ]
    if opts.max_seq_len:
        flags += ["--max-seq-len", str(opts.max_seq_len)]
    flags += ["--kv-block-size", str(kv.tokens_per_block), "--free-gpu-memory-fraction", str(kv.free_gpu_memory_fraction)]
    return flags


def _yaml_text(name: str, d: dict) -> str:
    return (
        f"# {name}: --extra-engine-args of `python -m dynamo.trtllm` (TensorRT-LLM 1.3+), paths relative to the bundle.\n"
        f"# launch/{SCRIPT} passes a copy with absolute paths.\n" + yaml.safe_dump(d, sort_keys=False)
    )


_ABS_PATHS_PY = """import os, sys, yaml
bundle, src, out = sys.argv[1:]
d = yaml.safe_load(open(src))
for k in ("model", "tokenizer"):
    if d.get(k):
        d[k] = os.path.join(bundle, d[k])
sc = d.get("speculative_config") or {}
for k in ("speculative_model_dir", "speculative_model"):
    if sc.get(k):
        sc[k] = os.path.join(bundle, sc[k])
with open(out, "w") as f:
    yaml.safe_dump(d, f, sort_keys=False)
"""


def script(opts: LlmApiOptions) -> str:
    flags = " ".join(shlex.quote(f) for f in worker_flags(opts))
    tp = opts.tensor_parallel_size * opts.pipeline_parallel_size
    return f"""#!/usr/bin/env bash
# NVIDIA Dynamo with TensorRT-LLM (python -m dynamo.frontend + python -m dynamo.trtllm), EAGLE-3 one-model,
# K={opts.speculative_config.max_draft_len}, TP={opts.tensor_parallel_size}. Written by eagle3-trt; finds the bundle from its own location.
#   ROLE=all       frontend + one aggregated worker on this node (default)
#   ROLE=frontend  the OpenAI frontend only          ROLE=worker   one aggregated worker only
#   ROLE=prefill / ROLE=decode  one disaggregated worker   ROLE=disagg  frontend + prefill + decode on this node
#                  (PREFILL_GPUS / DECODE_GPUS: CUDA_VISIBLE_DEVICES of each, {tp} GPU(s) apiece)
# One node needs neither etcd nor NATS (file discovery, TCP request plane). Several nodes: run etcd (and NATS
# for KV events), export DYN_DISCOVERY_BACKEND=etcd ETCD_ENDPOINTS=http://<etcd>:2379, start ROLE=frontend
# on one node and ROLE=worker (or prefill/decode) on the others, each with its GPUs in CUDA_VISIBLE_DEVICES.
# HOST/PORT: the frontend's address (default 127.0.0.1:8000). Extra arguments go to every dynamo.trtllm worker.
set -euo pipefail
BUNDLE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")/.." && pwd)"
HOST="${{HOST:-127.0.0.1}}"
PORT="${{PORT:-8000}}"
ROLE="${{ROLE:-all}}"
MODEL_NAME="${{MODEL_NAME:-eagle3}}"
PYTHON="${{PYTHON:-python3}}"
export DYN_DISCOVERY_BACKEND="${{DYN_DISCOVERY_BACKEND:-file}}"
export DYN_REQUEST_PLANE="${{DYN_REQUEST_PLANE:-tcp}}"
if [ "$DYN_DISCOVERY_BACKEND" = file ]; then
  export DYN_FILE_KV="${{DYN_FILE_KV:-${{TMPDIR:-/tmp}}/eagle3-dynamo-kv}}"
fi

# dynamo.trtllm merges the options file over its own arguments; bundle-relative paths would resolve
# against the worker's working directory, so each worker gets a copy with absolute paths.
options() {{
  local out
  out="$(mktemp --suffix=.yaml "${{TMPDIR:-/tmp}}/eagle3-dynamo.XXXXXX")"
  "$PYTHON" - "$BUNDLE" "$BUNDLE/launch/$1" "$out" <<'PY'
{_ABS_PATHS_PY}PY
  printf '%s\\n' "$out"
}}

# The flags mirror the options file (same values): the router and the model card read the flags.
worker() {{
  local file="$1"; shift
  local opts
  opts="$(options "$file")"
  "$PYTHON" -m dynamo.trtllm --model-path "$BUNDLE/target" --served-model-name "$MODEL_NAME" \\
    --extra-engine-args "$opts" {flags} "$@"
}}

frontend() {{
  "$PYTHON" -m dynamo.frontend --http-host "$HOST" --http-port "$PORT" --router-mode round-robin --migration-limit 3
}}

case "$ROLE" in
  frontend) frontend ;;
  worker) worker {AGG_YAML} "$@" ;;
  prefill) worker {PREFILL_YAML} --disaggregation-mode prefill "$@" ;;
  decode) worker {DECODE_YAML} --disaggregation-mode decode "$@" ;;
  all)
    trap 'kill 0' EXIT
    frontend &
    worker {AGG_YAML} "$@" ;;
  disagg)
    trap 'kill 0' EXIT
    frontend &
    CUDA_VISIBLE_DEVICES="${{PREFILL_GPUS:?set PREFILL_GPUS, e.g. 0}}" worker {PREFILL_YAML} --disaggregation-mode prefill "$@" &
    CUDA_VISIBLE_DEVICES="${{DECODE_GPUS:?set DECODE_GPUS, e.g. 1}}" worker {DECODE_YAML} --disaggregation-mode decode "$@" ;;
  *) echo "{SCRIPT}: ROLE must be all, frontend, worker, prefill, decode or disagg (got $ROLE)" >&2; exit 2 ;;
esac
"""


def disagg_script() -> str:
    return f"""#!/usr/bin/env bash
# Disaggregated prefill/decode under NVIDIA Dynamo: {SCRIPT} with ROLE=disagg (frontend + prefill + decode on
# this node; PREFILL_GPUS and DECODE_GPUS pick their GPUs). For several nodes use {SCRIPT} with ROLE=prefill
# and ROLE=decode on each node (see its header).
set -euo pipefail
export ROLE="${{ROLE:-disagg}}"
exec "$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)/{SCRIPT}" "$@"
"""


def k8s_manifest(opts: LlmApiOptions, name: str = "eagle3") -> dict:
    gpus = opts.tensor_parallel_size * opts.pipeline_parallel_size
    volume = {"name": "bundle", "persistentVolumeClaim": {"claimName": K8S_PVC, "readOnly": True}}
    mount = [{"name": "bundle", "mountPath": BUNDLE_MOUNT, "readOnly": True}]

    def container(role: str, port: int | None) -> dict:
        c = {
            "name": "main",
            "image": IMAGE,
            "command": ["bash", f"{BUNDLE_MOUNT}/launch/{SCRIPT}"],
            "env": [{"name": "ROLE", "value": role}, {"name": "HOST", "value": "0.0.0.0"}, {"name": "TMPDIR", "value": "/tmp"}],
            "volumeMounts": mount,
        }
        if port:
            c["ports"] = [{"name": "http", "containerPort": port, "protocol": "TCP"}]
        return c

    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": name},
        "spec": {
            "backendFramework": "trtllm",
            "services": {
                "Frontend": {"componentType": "frontend", "replicas": 1, "extraPodSpec": {"mainContainer": container("frontend", 8000), "volumes": [volume]}},
                "TRTLLMWorker": {
                    "componentType": "worker",
                    "replicas": 1,
                    "resources": {"limits": {"gpu": str(gpus)}, "requests": {"gpu": str(gpus)}},
                    "extraPodSpec": {"mainContainer": container("worker", None), "volumes": [volume]},
                },
            },
        },
    }


def k8s_text(opts: LlmApiOptions) -> str:
    return (
        "# NVIDIA Dynamo on Kubernetes (the Dynamo operator's DynamoGraphDeployment, nvidia.com/v1alpha1).\n"
        f"# Put this bundle on a ReadOnlyMany PVC named {K8S_PVC} (mounted at {BUNDLE_MOUNT}); the pods run\n"
        f"# launch/{SCRIPT} with ROLE=frontend / ROLE=worker; the operator sets discovery. Scale TRTLLMWorker.replicas.\n"
        + yaml.safe_dump(k8s_manifest(opts), sort_keys=False)
    )


def dynamo_launch_files(opts: LlmApiOptions) -> dict[str, str]:
    """File name -> text of the Dynamo files in launch/ (scripts are written executable by the caller)."""
    files = {name: _yaml_text(name, d) for name, d in engine_yamls(opts).items()}
    files[SCRIPT] = script(opts)
    files[DISAGG_SCRIPT] = disagg_script()
    files[K8S_MANIFEST] = k8s_text(opts)
    return files
