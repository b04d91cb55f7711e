"""`train-draft` under ``torchrun --nproc-per-node N``: the process group, and how the head is wrapped.

torchrun sets ``WORLD_SIZE``/``RANK``/``LOCAL_RANK`` (and the rendezvous address) in every worker's
environment; a plain ``train-draft`` sees none of them and runs as one process. Every rank reads the
same hidden-state cache and reads only its own rows of each *global* batch (``rows``): the global
batch is ``--batch-size`` rows whatever the number of processes and the shard sizes (a batch smaller
than the number of processes is refused), so N processes follow the one-process loss
curve (the loss is normalised by the global token count, see ``trainer.Trainer``).

Wrapping: DDP (every rank holds the whole head, gradients averaged) when the head's training state
fits one device, FSDP (``torch.distributed.fsdp.fully_shard``: parameters, gradients and AdamW
state sharded across ranks) when it does not, or when asked (``--parallel fsdp``). The gloo backend
runs both on CPU (what CI tests); NCCL on CUDA.

What each holds per rank (fp32 throughout; ``pipeline/train_plan.py`` prices exactly this, and
tests/test_train_plan.py ties its constants to these):

- DDP: the whole weights, gradients and AdamW moments (16 B/param) plus DDP's gradient buckets:
  with torch's defaults (``bucket_cap_mb=25``, ``gradient_as_bucket_view=False``) every gradient is
  copied into a bucket before the all-reduce, and the buckets together hold every gradient once
  more (4 B/param), whatever the bucket size.
- FSDP: ``fully_shard`` is applied to the whole training module, so the head is ONE unit (the
  EAGLE-3 head has one decoder layer, and the TTT unroll calls it and the lm_head K times per
  step): the unit's shards of weights, gradients and AdamW moments (16 B/param / N), and, from the
  all-gather before the forward to the reduce-scatter after the backward, the whole weights and
  the whole gradients (8 B/param; the root unit is not resharded between forward and backward).
  Sharding saves the optimizer state, not that peak.
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
DDP_BUCKET_CAP_MB = 25  # torch's DistributedDataParallel default, passed explicitly
DDP_GRADIENT_AS_BUCKET_VIEW = False  # torch's default: gradients are copied into the buckets
DDP_BUCKET_BYTES_PER_PARAM = 0 if DDP_GRADIENT_AS_BUCKET_VIEW else 4  # the buckets: every fp32 gradient once more
FSDP_UNITS = 1  # fully_shard on the whole training module (see above)
FSDP_UNSHARDED_BYTES_PER_PARAM = 8  # the one unit's whole fp32 weights + gradients, forward to backward
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

    def check_batch(self, batch_size: int) -> None:
        """Every rank trains on at least one row of every global batch."""
        if batch_size < self.world:
            raise UserError("--batch-size", f"{batch_size} rows cannot be split over {self.world} processes", f"use --batch-size {self.world} or more")

    def per_rank(self, values: list[int]) -> list[list[int]]:
        """Each rank's ``values``, in rank order, on every rank (a collective)."""
        if not self.active:
            return [list(values)]
        slots = [0.0] * (self.world * len(values))
        slots[self.rank * len(values) : (self.rank + 1) * len(values)] = [float(v) for v in values]
        got = self.sum(slots)
        return [[round(x) for x in got[r * len(values) : (r + 1) * len(values)]] for r in range(self.world)]

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

        return DistributedDataParallel(
            module,
            device_ids=[torch.device(device).index] if device.startswith("cuda") else None,
            bucket_cap_mb=DDP_BUCKET_CAP_MB,
            gradient_as_bucket_view=DDP_GRADIENT_AS_BUCKET_VIEW,
        )
    if d.mode == "fsdp":
        from torch.distributed.fsdp import fully_shard  # local: only FSDP runs need it

        return fully_shard(module)  # one unit: FSDP_UNITS
    return module


def stop() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
