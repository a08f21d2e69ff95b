"""Which registry backends a run takes: resolve a name to a ``registry.Backend`` usable here (or a one-line error
naming the alternatives), and the defaults of profile / compare."""

from __future__ import annotations

import torch

from ditprof.errors import DitprofError
from ditprof.kernels import registry
from ditprof.kernels.registry import Backend

# Default swap on a GPU: our FP8 kernel, else the fastest available peer.
CUDA_SWAP_PREFERENCE = ("fp8", "fa4", "sdpa-cudnn", "sdpa-flash")
CPU_SWAP = "fp8-emulated"
DEFAULT_BASELINE = "sdpa"


def names() -> list[str]:
    return registry.names()


def availability(name: str, device: torch.device | str) -> tuple[bool, str]:
    """(ok, reason) of backend ``name`` on ``device``."""
    ok, reason = registry.available(name, torch.device(device))
    return bool(ok), str(reason or "")


def resolve(name: str, device: torch.device) -> Backend:
    """A backend usable on ``device``; DitprofError naming alternatives otherwise."""
    known = names()
    if name not in known:
        status = {n: availability(n, device) for n in known}
        ok = [n for n, (a, _) in status.items() if a]
        bad = [f"{n} ({why or 'unavailable'})" for n, (a, why) in status.items() if not a]
        raise DitprofError(
            f"unknown attention backend {name!r}; available on {device.type}: {', '.join(ok) or 'none'}"
            + (f"; not available: {'; '.join(bad)}" if bad else "")
        )
    ok, reason = availability(name, device)
    if not ok:
        raise DitprofError(f"attention backend {name!r} is not available on {device.type}: {reason or 'no reason given'}")
    return registry.get(name)


def default_swap(device: torch.device) -> str:
    if device.type != "cuda":
        return CPU_SWAP
    known = set(names())
    for n in CUDA_SWAP_PREFERENCE:
        if n in known and availability(n, device)[0]:
            return n
    return DEFAULT_BASELINE
