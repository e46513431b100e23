"""The data-parallel learner: one trainer per process, launched by `torchrun`, e.g.

    torchrun --nproc_per_node 2 --no-python agentrl train --method grpo --out runs/dp2

`train()` reads torchrun's environment (`WORLD_SIZE`, `RANK`, `LOCAL_RANK`, `MASTER_ADDR`,
`MASTER_PORT`) through `from_env`; with one process everything here is a no-op (`Local`).

[our choice] Each rank rolls out its share of the step's tasks (task i goes to rank i mod N)
on its own engine, with its own generator (the step seed salted by the rank; rank 0 draws
exactly what a single process draws), and computes credit on its own episodes: a GRPO group is
one task, so groups never span ranks. (Rank 0 rolling out and scattering would leave N-1
engines idle.) Statistics over the whole batch (advantage whitening) are per rank, and a token
budget `rollout.budget_tokens` is split evenly between ranks.

The update: the loss weights of the micro-batches divide by the *global* token (or row) count
of the minibatch (`all_sum`), gradients accumulate over a rank's micro-batches, then one
all-reduce (sum) per optimiser step; clipping and AdamW then see the same gradient on every
rank, so the parameters stay identical (checked at the end of `train`). This equals one process
taking the same global batch, to float tolerance (tested with 2 CPU processes over gloo).
[our choice] Gradients are all-reduced by hand, in buckets, not by the DDP wrapper: DDP's
hooks fire only through `DDP.forward`, while the trainer reaches the backbone and the LM head
separately (chunked log-probs). FSDP2 (sharded parameters) is not implemented: every rank holds
the whole model and optimiser.

Rank 0 alone evaluates (its result is broadcast) and writes metrics, checkpoints and the
summary; a step's metrics are averaged over ranks, with `rollout/tokens` summed. Ray rollout
workers (`rollout.workers`) are not combined with data parallelism.
"""
from __future__ import annotations

import os
from typing import Any, Callable

import torch
import torch.distributed as dist

from ..config import RunConfig
from ..errors import ConfigError

BUCKET_BYTES = 32 * 2**20  # gradients all-reduced in flat buckets of about this size


class Local:
    """One process: every collective is the identity."""

    rank, world = 0, 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_sum(self, xs: list[float]) -> list[float]:
        return list(xs)

    def sum_dict(self, d: dict[str, float]) -> dict[str, float]:
        return dict(d)

    def reduce_grads(self, params: list[torch.nn.Parameter]) -> None:
        pass

    def share(self, items: list) -> list:
        return list(items)

    def on_main(self, fn: Callable[..., Any], *args) -> Any:
        """fn(*args) on rank 0; its result on every rank."""
        return fn(*args)

    def first(self, fn: Callable[[], Any]) -> Any:
        """fn() on rank 0 first, then on the others (e.g. building a cached model once)."""
        return fn()

    def reduce_row(self, row: dict, sums: tuple[str, ...] = ()) -> dict:
        return row

    def broadcast_params(self, params: list[torch.nn.Parameter]) -> None:
        pass

    def check_same(self, params: list[torch.nn.Parameter]) -> None:
        pass

    def close(self) -> None:
        pass


class DataParallel(Local):
    """`world` processes in the default torch.distributed group (gloo on CPU, nccl on GPU)."""

    def __init__(self, device: torch.device):
        self.dist = dist
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device = device

    def all_sum(self, xs: list[float]) -> list[float]:
        t = torch.tensor(xs, dtype=torch.float64, device=self.device)
        self.dist.all_reduce(t)
        return t.tolist()

    def _gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world
        self.dist.all_gather_object(out, obj)
        return out

    def sum_dict(self, d: dict[str, float]) -> dict[str, float]:
        total: dict[str, float] = {}
        for part in self._gather(d):
            for k, v in part.items():
                total[k] = total.get(k, 0.0) + v
        return total

    def reduce_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Sum every parameter's gradient over ranks (a rank without one contributes zeros; a
        parameter no rank has a gradient for keeps none, as in one process)."""
        has = torch.tensor([p.grad is not None for p in params], dtype=torch.float32, device=self.device)
        self.dist.all_reduce(has)
        live = [p for p, h in zip(params, has.tolist()) if h > 0]
        for p in live:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        bucket: list[torch.nn.Parameter] = []
        size = 0
        for p in live:
            bucket.append(p)
            size += p.grad.numel() * p.grad.element_size()
            if size >= BUCKET_BYTES:
                self._reduce_bucket(bucket)
                bucket, size = [], 0
        if bucket:
            self._reduce_bucket(bucket)

    def _reduce_bucket(self, bucket: list[torch.nn.Parameter]) -> None:
        flat = torch.cat([p.grad.reshape(-1) for p in bucket])
        self.dist.all_reduce(flat)
        offset = 0
        for p in bucket:
            n = p.grad.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
            offset += n

    def share(self, items: list) -> list:
        return list(items)[self.rank::self.world]

    def on_main(self, fn: Callable[..., Any], *args) -> Any:
        box = [fn(*args) if self.rank == 0 else None]
        self.dist.broadcast_object_list(box, src=0)
        return box[0]

    def first(self, fn: Callable[[], Any]) -> Any:
        if self.rank == 0:
            out = fn()
            self.dist.barrier()
            return out
        self.dist.barrier()
        return fn()

    def reduce_row(self, row: dict, sums: tuple[str, ...] = ()) -> dict:
        rows = self._gather(row)
        out = dict(row)
        for k, v in row.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or k == "step":
                continue
            vals = [r[k] for r in rows if isinstance(r.get(k), (int, float))]
            out[k] = sum(vals) if k in sums else sum(vals) / len(vals)
        return out

    def broadcast_params(self, params: list[torch.nn.Parameter]) -> None:
        with torch.no_grad():
            for p in params:
                self.dist.broadcast(p.data, src=0)

    def check_same(self, params: list[torch.nn.Parameter]) -> None:
        """Raise if the ranks' parameters differ (they are updated identically, bit for bit)."""
        with torch.no_grad():
            mine = torch.stack([torch.stack([p.double().sum(), p.double().abs().sum()]) for p in params])
        every = self._gather(mine.cpu())
        if any(not torch.equal(every[0], other) for other in every[1:]):
            raise RuntimeError("data-parallel ranks ended with different parameters")

    def close(self) -> None:
        """Every rank reaches the end before any tears its process group down (a rank that
        destroyed it while another still had traffic in flight aborted at exit with gloo)."""
        self.dist.barrier()
        self.dist.destroy_process_group()


def from_env(cfg: RunConfig) -> Local:
    """`Local()` unless torchrun started several processes; then join the process group."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Local()
    if cfg.rollout.workers > 0:
        raise ConfigError("rollout.workers > 0 is not combined with data parallelism (torchrun); "
                          "use one or the other")
    if cfg.rollout.tasks_per_step < world:
        raise ConfigError(f"rollout.tasks_per_step ({cfg.rollout.tasks_per_step}) must be >= the "
                          f"number of processes ({world}): each rank rolls out whole tasks")
    use_cuda = torch.cuda.is_available() and cfg.model.device != "cpu"
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo")
    return DataParallel(torch.device("cuda", torch.cuda.current_device()) if use_cuda
                        else torch.device("cpu"))
