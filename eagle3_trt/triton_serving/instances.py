"""Which GPUs each Triton model instance gets, and the environment it hands to ``LLM()``.

Upstream semantics (NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/1/model.py
@ 044a90d2): config.pbtxt carries the parameter ``gpu_device_ids`` = ``"0,1;2,3"`` (``;``
between instances, ``,`` between one instance's GPUs); the instance index is the ``_<n>``
suffix of ``model_instance_name``; before TensorRT-LLM (and with it torch/CUDA) is imported the
model sets ``CUDA_VISIBLE_DEVICES`` and ``TRTLLM_VISIBLE_DEVICES`` to the instance's list and
passes ``gpus_per_node = len(list)`` to ``LLM()``. The same file deletes the inherited MPI *job*
variables at import (a Triton started under ``mpirun`` would otherwise make ``LLM()``'s spawned
workers join the launcher's job) and keeps configuration variables (``OMPI_MCA_*``, ``PMIX_MCA_*``).

Pure functions, no CUDA or Triton import: the environment is computed here and tested on CPU.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from eagle3_trt.errors import UserError

# Verbatim from upstream's model.py @ 044a90d2 (`_mpi_job_env_vars`, `_mpi_job_prefixes`).
MPI_JOB_VARS = frozenset(
    [
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_NODE_RANK",
        "OMPI_UNIVERSE_SIZE",
        "OMPI_FIRST_RANKS",
        "OMPI_APP_CTX_NUM_PROCS",
        "PMIX_RANK",
        "PMIX_NAMESPACE",
        "PMIX_SERVER_URI",
        "PMIX_SERVER_URI2",
        "PMIX_SERVER_URI21",
        "PMIX_SERVER_URI3",
        "PMIX_SERVER_TMPDIR",
        "PMIX_SYSTEM_TMPDIR",
        "PMIX_SECURITY_MODE",
        "PMIX_GDS_MODULE",
        "PMIX_BFROPS_MODULE",
        "PMIX_PTL_MODULE",
        "PMIX_VERSION",
        "PMIX_HOSTNAME",
        "PMI_RANK",
        "PMI_SIZE",
        "PMI_FD",
        "PMI_SPAWNED",
        "PMI_APPNUM",
    ]
)
MPI_JOB_PREFIXES = ("OMPI_MCA_orte_", "ORTE_")

_INSTANCE_SUFFIX = re.compile(r"_(\d+)$")


def assign_gpus(instances: int, tp: int, gpus: int) -> str:
    """``gpu_device_ids`` for ``instances`` instances of ``tp`` GPUs each on a ``gpus``-GPU node:
    consecutive blocks, ``"0,1;2,3"``. Refuses (one line) when they do not fit."""
    if instances < 1 or tp < 1:
        raise UserError("--instances", f"instances ({instances}) and tensor_parallel_size ({tp}) must be >= 1")
    need = instances * tp
    if gpus < need:
        raise UserError(
            "--gpus",
            f"{instances} instance(s) x tensor_parallel_size {tp} = {need} GPUs, but --gpus is {gpus}",
            "lower --instances, or serve on a node with more GPUs (each instance needs its own GPUs)",
        )
    return ";".join(",".join(str(i * tp + g) for g in range(tp)) for i in range(instances))


def parse_gpu_device_ids(value: str) -> list[list[str]]:
    return [[g.strip() for g in part.split(",") if g.strip()] for part in value.split(";")]


def instance_index(model_instance_name: str) -> int:
    """Upstream: ``re.search(r'_(\\d+)$', name)``, else 0 (e.g. ``eagle3_0_1`` -> 1)."""
    m = _INSTANCE_SUFFIX.search(model_instance_name or "")
    return int(m.group(1)) if m else 0


def clear_mpi_job_vars(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in MPI_JOB_VARS and not k.startswith(MPI_JOB_PREFIXES)}


def instance_environment(
    env: Mapping[str, str], *, gpu_device_ids: str, instance_count: int, model_instance_name: str, require_gpus: bool = True
) -> tuple[dict[str, str], dict[str, int]]:
    """(environment, extra ``LLM()`` kwargs) for one instance, as upstream computes them.

    ``gpu_device_ids`` is used when set (for one instance too: it pins the GPUs), and is
    required when there is more than one instance (``require_gpus``: the TensorRT-LLM runtime,
    as upstream requires it; the reference runtime on CPU needs no GPUs).
    """
    out = clear_mpi_job_vars(env)
    extra: dict[str, int] = {}
    if not gpu_device_ids:
        if instance_count > 1 and require_gpus:
            raise UserError(
                "config.pbtxt",
                f"instance_group count is {instance_count} but parameters['gpu_device_ids'] is not set",
                "package with --gpus N so each instance gets its own GPUs",
            )
        return out, extra
    lists = parse_gpu_device_ids(gpu_device_ids)
    idx = instance_index(model_instance_name) if instance_count > 1 else 0
    if idx >= len(lists) or not lists[idx]:
        raise UserError("config.pbtxt", f"instance {idx} has no entry in gpu_device_ids '{gpu_device_ids}'", "one ';'-separated GPU list per instance")
    ids = ",".join(lists[idx])
    out["CUDA_VISIBLE_DEVICES"] = ids
    out["TRTLLM_VISIBLE_DEVICES"] = ids
    extra["gpus_per_node"] = len(lists[idx])
    return out, extra
