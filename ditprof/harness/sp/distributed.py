"""torch.distributed plumbing for ``--sp P``: launching P ranks, process groups, the Ulysses all-to-all.

Two launchers, one rank body:

* ``torch.multiprocessing``: the CLI process starts P ranks (start method ``forkserver`` with torch,
  diffusers and ditprof preloaded in the server; ``DITPROF_SP_START_METHOD=spawn`` for plain spawn) and a
  TCP rendezvous on a free local port; it waits for them and turns a failed rank into one error.
* ``torchrun``: when ``torchrun --nproc-per-node P -m ditprof compare --sp P`` started the process
  (``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` set), every process is already a rank (``env://`` rendezvous).

NCCL on CUDA (one GPU per rank, ``cuda:<local_rank>``), gloo on CPU. NVLink multicast (NVLS) stays off in
every rank: ``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``, ``NVSHMEM_DISABLE_NVLS=1``.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import socket
from typing import Iterator

import torch
import torch.distributed as dist

from ditprof.errors import DitprofError

MULTICAST_OFF_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
COMM_RANGE = "ditprof::all_to_all"  # mirrors categories.COMM_RANGE (kept import-free of the harness)
TIMEOUT = _dt.timedelta(minutes=10)


@contextlib.contextmanager
def multicast_off_env() -> Iterator[dict]:
    """Set the multicast-off variables for the duration (spawned ranks inherit them)."""
    old = {k: os.environ.get(k) for k in MULTICAST_OFF_ENV}
    os.environ.update(MULTICAST_OFF_ENV)
    try:
        yield dict(MULTICAST_OFF_ENV)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_env() -> tuple[int, int, int] | None:
    """(rank, world_size, local_rank) when this process was started by torchrun, else None."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
        rank = int(os.environ["RANK"])
        world = int(os.environ["WORLD_SIZE"])
        return rank, world, int(os.environ.get("LOCAL_RANK", rank))
    return None


def pg_backend(device_type: str) -> str:
    return "nccl" if device_type == "cuda" else "gloo"


def rank_device(device_type: str, local_rank: int) -> torch.device:
    if device_type == "cuda":
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init(rank: int, world: int, device: torch.device, init_method: str) -> str:
    """Join the process group; returns its backend name."""
    os.environ.update(MULTICAST_OFF_ENV)  # before NCCL reads them (torchrun ranks were not set up by us)
    backend = pg_backend(device.type)
    kwargs = {}
    if device.type == "cuda":
        torch.cuda.set_device(device)
        kwargs["device_id"] = device  # eager NCCL init bound to this rank's GPU
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world, timeout=TIMEOUT,
                            **kwargs)
    return backend


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.barrier()  # a rank leaving while a peer is still inside a gloo call aborts the peer
        dist.destroy_process_group()


# --------------------------------------------------------------------------- Ulysses all-to-all

def seq_to_heads(xs: list[torch.Tensor], world: int, group=None) -> list[torch.Tensor]:
    """Ulysses regroup: each (B, s, H, D) -- local tokens x all heads -- becomes (B, s*world, H/world, D),
    all tokens x this rank's heads. Tensors of one shape and dtype (q, k, v) share one collective.

    Rank j's tokens land at ``[j*s:(j+1)*s]`` (the contiguous shard order of the block input); rank r gets
    heads ``[r*H/P:(r+1)*H/P]``.
    """
    if len({(tuple(x.shape), x.dtype) for x in xs}) > 1:
        return [t for x in xs for t in seq_to_heads([x], world, group)]
    b, s, h, d = xs[0].shape
    if h % world:
        raise DitprofError(f"all-to-all: {h} heads are not divisible by {world} ranks")
    hp = h // world
    send = xs[0].new_empty((world, len(xs), b, s, hp, d))
    for i, x in enumerate(xs):  # chunk j (heads j*hp..) goes to rank j
        send[:, i].copy_(x.reshape(b, s, world, hp, d).movedim(2, 0))
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    # recv[j, i] = rank j's tokens of tensor i, my heads -> (B, P, s, hp, D) -> (B, P*s, hp, D)
    return [recv[:, i].movedim(0, 1).reshape(b, world * s, hp, d) for i in range(len(xs))]


def heads_to_seq(x: torch.Tensor, world: int, group=None) -> torch.Tensor:
    """Inverse regroup: (B, S, H/P, D) all tokens x my heads -> (B, S/P, H, D) my tokens x all heads."""
    b, S, hp, d = x.shape
    if S % world:
        raise DitprofError(f"all-to-all: {S} tokens are not divisible by {world} ranks")
    s = S // world
    send = x.reshape(b, world, s, hp, d).movedim(1, 0).contiguous()  # token chunk j goes back to rank j
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    # recv[j] = my tokens, rank j's heads -> (B, s, P, hp, D) -> (B, s, H, D)
    return recv.movedim(0, 2).reshape(b, s, world * hp, d)


def all_gather_tokens(x: torch.Tensor, world: int, device: torch.device, dim: int = 1) -> torch.Tensor:
    """Concatenate every rank's shard of ``x`` along ``dim`` (on the host)."""
    if world == 1:
        return x.detach().to("cpu")
    local = x.detach().to(device).contiguous()
    parts = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(parts, local)
    return torch.cat([p.to("cpu") for p in parts], dim=dim)


def all_gather_heads(x: torch.Tensor, world: int, group=None) -> torch.Tensor:
    """(B, T, H/P, D) this rank's heads of replicated tokens -> (B, T, H, D) all heads (rank order)."""
    if world == 1:
        return x
    local = x.contiguous()
    parts = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(parts, local, group=group)
    return torch.cat(parts, dim=2)
