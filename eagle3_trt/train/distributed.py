"""`train-draft` under ``torchrun --nproc-per-node N``: the process group, and how the head is wrapped.

torchrun sets ``WORLD_SIZE``/``RANK``/``LOCAL_RANK`` (and the rendezvous address) in every worker's
environment; a plain ``train-draft`` sees none of them and runs as one process. Every rank reads the
same hidden-state cache and takes its own rows of each *global* batch (``rows``): the global batch
is ``--batch-size`` whatever the number of processes, so N processes follow the one-process loss
curve (the loss is normalised by the global token count, see ``trainer.Trainer``).

Wrapping: DDP (every rank holds the whole head, gradients averaged) when the head's training state
fits one device, FSDP (``torch.distributed.fsdp.fully_shard``: parameters, gradients and AdamW
state sharded across ranks) when it does not, or when asked (``--parallel fsdp``). The gloo backend
runs both on CPU (what CI tests); NCCL on CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from eagle3_trt.errors import UserError
from eagle3_trt.procs import torchrun_env

# AdamW training state per parameter, fp32: weight 4 + grad 4 + exp_avg 4 + exp_avg_sq 4 bytes.
TRAIN_BYTES_PER_PARAM = 16
PARALLEL_MODES = ("auto", "ddp", "fsdp")


@dataclass(frozen=True)
class Dist:
    """This process's place in the run: rank 0 of 1 when not under torchrun."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    mode: str = "none"  # none | ddp | fsdp

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def rows(self, n: int) -> slice:
        """This rank's rows of a global batch of n rows (contiguous blocks, the first ranks one larger)."""
        base, extra = divmod(n, self.world)
        start = self.rank * base + min(self.rank, extra)
        return slice(start, start + base + (1 if self.rank < extra else 0))

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum over ranks (float64 on CPU: gloo reduces CPU tensors)."""
        if not self.active:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t)
        return t.tolist()


def start(device: str, parallel: str) -> tuple[Dist, str]:
    """Join torchrun's process group (when there is one); returns the rank info (its mode decided
    later by ``decide``, once the head's size is known) and this rank's device."""
    if parallel not in PARALLEL_MODES:
        raise UserError("--parallel", f"{parallel!r} is not one of {', '.join(PARALLEL_MODES)}")
    rank, world, local = torchrun_env()
    if world <= 1:
        if parallel == "fsdp":
            raise UserError("--parallel", "fsdp shards the head across processes; this run has one", "run under torchrun --nproc-per-node N")
        return Dist(), device
    if device.startswith("cuda"):
        n = torch.cuda.device_count()
        if local >= n:
            raise UserError("--nproc-per-node", f"local rank {local} has no GPU (torch sees {n})", f"use at most {n} processes per node")
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    return Dist(rank=rank, world=world, local_rank=local, mode="ddp"), device


def decide(d: Dist, parallel: str, head_params: int, device: str) -> Dist:
    """The run's wrapping, now that the head's parameter count is known."""
    if not d.active:
        return d
    device_bytes = torch.cuda.get_device_properties(torch.device(device)).total_memory if device.startswith("cuda") else None
    return replace(d, mode=choose_mode(parallel, head_params, device_bytes))


def choose_mode(parallel: str, head_params: int, device_bytes: int | None) -> str:
    """DDP when the head's AdamW training state fits in half a device (the rest is activations), else FSDP."""
    if parallel != "auto":
        return parallel
    if device_bytes is None:  # CPU: host memory is not the constraint DDP/FSDP trade against
        return "ddp"
    return "ddp" if head_params * TRAIN_BYTES_PER_PARAM <= device_bytes // 2 else "fsdp"


def wrap(module: torch.nn.Module, d: Dist, device: str) -> Any:
    """The training module as this run runs it: itself, DDP(module) or fully_shard(module)."""
    if d.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel  # local: only multi-process runs need it

        return DistributedDataParallel(module, device_ids=[torch.device(device).index] if device.startswith("cuda") else None)
    if d.mode == "fsdp":
        from torch.distributed.fsdp import fully_shard  # local: only FSDP runs need it

        return fully_shard(module)
    return module


def stop() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
