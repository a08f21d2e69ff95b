"""Which registry backends a run takes: resolve a name to a ``registry.Backend`` usable here (or a one-line error
naming the alternatives), and the defaults of profile / compare."""

from __future__ import annotations

import dataclasses
from typing import Iterable, Optional

import torch

from ditprof.errors import DitprofError
from ditprof.kernels import registry
from ditprof.kernels.fp8_config import Fp8Options, default_options
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


def resolve(name: str, device: torch.device, options: Optional[Fp8Options] = None) -> Backend:
    """A backend usable on ``device``; DitprofError naming alternatives otherwise. ``options`` (the run's
    ``Fp8Options``, None: the process's): a backend that takes FP8 options runs with them
    (``Backend.with_options``); the others ignore them."""
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
    b = registry.get(name)
    return b.with_options(options) if options is not None and b.options is not None else b


def options_used(options: Optional[Fp8Options], names_: Iterable[Optional[str]]) -> Optional[dict]:
    """The report's ``settings.fp8_options``: the ``Fp8Options`` the run's backends ``names_`` ran with, as a dict
    (None: the process's, ``default_options()``); None when none of them takes FP8 options."""
    if not any(n and registry.get(n).options is not None for n in names_):
        return None
    return dataclasses.asdict(options if options is not None else default_options())


def default_swap(device: torch.device) -> str:
    if device.type != "cuda":
        return CPU_SWAP
    known = set(names())
    for n in CUDA_SWAP_PREFERENCE:
        if n in known and availability(n, device)[0]:
            return n
    return DEFAULT_BASELINE
