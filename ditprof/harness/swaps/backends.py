"""The harness's view of ``ditprof.kernels.registry``: resolve names, explain unavailability, pick defaults."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ditprof.errors import DitprofError

# Default swap on a GPU: our FP8 kernel, else the fastest available peer.
CUDA_SWAP_PREFERENCE = ("fp8", "fa4", "sdpa-cudnn", "sdpa-flash")
CPU_SWAP = "fp8-emulated"
DEFAULT_BASELINE = "sdpa"


@dataclass
class BackendInfo:
    name: str
    description: str
    available: bool
    reason: str
    fn: Callable | None


def names() -> list[str]:
    from ditprof.kernels import registry

    return registry.names()


def availability(name: str, device: torch.device | str) -> tuple[bool, str]:
    from ditprof.kernels import registry

    ok, reason = registry.available(name, torch.device(device))
    return bool(ok), str(reason or "")


def info(name: str, device: torch.device | str) -> BackendInfo:
    from ditprof.kernels import registry

    entry = registry.get(name)
    ok, reason = availability(name, device)
    return BackendInfo(name, entry.description, ok, reason, entry.fn)


def describe_all(device: torch.device | str) -> list[BackendInfo]:
    return [info(n, device) for n in names()]


def resolve(name: str, device: torch.device) -> BackendInfo:
    """A backend usable on ``device``; DitprofError naming alternatives otherwise."""
    known = names()
    if name not in known:
        infos = describe_all(device)
        ok = [i.name for i in infos if i.available]
        bad = [f"{i.name} ({i.reason or 'unavailable'})" for i in infos if not i.available]
        raise DitprofError(
            f"unknown attention backend {name!r}; available on {device.type}: {', '.join(ok) or 'none'}"
            + (f"; not available: {'; '.join(bad)}" if bad else "")
        )
    b = info(name, device)
    if not b.available:
        raise DitprofError(f"attention backend {name!r} is not available on {device.type}: {b.reason or 'no reason given'}")
    return b


def default_swap(device: torch.device) -> str:
    if device.type != "cuda":
        return CPU_SWAP
    known = set(names())
    for n in CUDA_SWAP_PREFERENCE:
        if n in known and availability(n, device)[0]:
            return n
    return DEFAULT_BASELINE
