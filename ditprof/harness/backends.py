"""The harness's view of ``ditprof.kernels.registry``: resolve names, explain unavailability, pick defaults."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ditprof.errors import DitprofError

# Default swap on a GPU: our FP8 kernel, else the fastest available peer.
CUDA_SWAP_PREFERENCE = ("fp8", "fa4", "sdpa-cudnn", "sdpa-flash")
CPU_SWAP = "fp8-emulated"
DEFAULT_BASELINE = "sdpa"


def _registry():
    try:
        from ditprof.kernels import registry
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("ditprof.kernels"):
            raise DitprofError("the attention backend registry (ditprof.kernels.registry) is not installed") from None
        raise
    return registry


@dataclass
class BackendInfo:
    name: str
    description: str
    available: bool
    reason: str
    fn: Callable | None


def _entry_fn(entry: Any) -> Callable | None:
    if entry is None:
        return None
    for attr in ("fn", "func", "function", "impl"):
        f = getattr(entry, attr, None)
        if callable(f):
            return f
    return entry if callable(entry) else None


def names() -> list[str]:
    reg = _registry()
    out = reg.all_backends()
    if isinstance(out, dict):
        return list(out)
    return [b if isinstance(b, str) else getattr(b, "name") for b in out]


def availability(name: str, device: torch.device | str) -> tuple[bool, str]:
    reg = _registry()
    res = reg.available(name, str(torch.device(device).type if not isinstance(device, str) else device))
    if isinstance(res, tuple):
        ok, reason = res[0], (res[1] if len(res) > 1 else "")
    else:
        ok, reason = bool(res), ""
    return bool(ok), str(reason or "")


def info(name: str, device: torch.device | str) -> BackendInfo:
    reg = _registry()
    entry = reg.get(name)
    ok, reason = availability(name, device)
    return BackendInfo(name, str(getattr(entry, "description", "") or ""), ok, reason, _entry_fn(entry))


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
    if b.fn is None:
        raise DitprofError(f"attention backend {name!r} has no callable in the registry")
    return b


def default_swap(device: torch.device) -> str:
    if device.type != "cuda":
        return CPU_SWAP
    known = set(names())
    for n in CUDA_SWAP_PREFERENCE:
        if n in known and availability(n, device)[0]:
            return n
    return DEFAULT_BASELINE
