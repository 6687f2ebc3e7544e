"""Process-group plumbing: who am I, join the group, agree with the other ranks.

- Under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR set) `init_group` joins the
  default group over env://; under plain python the run is rank 0 of 1 and no group exists,
  so every helper here degrades to a local no-op.
- Backend: nccl when CUDA is available, else gloo. `timeout` bounds every collective, so a
  dead peer fails the job instead of hanging it.
- The helpers are collectives: every rank must call them in the same order.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from orch_trainer.errors import UsageError


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the job, from torchrun's environment."""

    rank: int  # global rank
    world_size: int  # number of ranks
    local_rank: int  # rank on this node; selects the GPU
    launched: bool  # started by torchrun (a process group must be joined)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def read_env(environ: Mapping[str, str]) -> DistEnv:
    """Rank, world size and local rank; rank 0 of 1 when not under torchrun."""
    if "RANK" not in environ or "WORLD_SIZE" not in environ:
        return DistEnv(rank=0, world_size=1, local_rank=0, launched=False)
    try:
        rank = int(environ["RANK"])
        world_size = int(environ["WORLD_SIZE"])
        local_rank = int(environ.get("LOCAL_RANK", "0"))
    except ValueError:
        raise UsageError("RANK, WORLD_SIZE and LOCAL_RANK must be integers") from None
    if world_size < 1 or not 0 <= rank < world_size or local_rank < 0:
        raise UsageError(f"inconsistent RANK={rank} WORLD_SIZE={world_size}")
    return DistEnv(rank=rank, world_size=world_size, local_rank=local_rank, launched=True)


def select_device(env: DistEnv) -> torch.device:
    """cuda:<local_rank> (made current) when CUDA is available, else the CPU."""
    if torch.cuda.is_available():
        device = torch.device("cuda", env.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init_group(env: DistEnv, device: torch.device, timeout_s: float) -> bool:
    """Join the default process group when launched by torchrun; return whether joined."""
    if not env.launched:
        return False
    dist.init_process_group(
        backend=backend_for(device),
        init_method="env://",
        rank=env.rank,
        world_size=env.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return True


def active() -> bool:
    return dist.is_available() and dist.is_initialized()


def sum_across(values: Sequence[float], device: torch.device) -> list[float]:
    """Element-wise sum of `values` over all ranks (one all_reduce; local values alone)."""
    tensor = torch.tensor(list(values), dtype=torch.float64, device=device)
    if active():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return [float(v) for v in tensor.tolist()]


def broadcast_from_main(obj: Any) -> Any:
    """Rank 0's `obj` on every rank (pickled; fine for a checkpoint state)."""
    if not active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(device: torch.device) -> None:
    """Wait for every rank (nccl is told which GPU this rank uses)."""
    if active():
        dist.barrier(device_ids=[device.index] if device.type == "cuda" else None)


def shutdown() -> None:
    if active():
        dist.destroy_process_group()
