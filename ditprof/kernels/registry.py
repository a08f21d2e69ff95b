"""Attention backends by name (in the spirit of diffusers' ``attention_dispatch`` registry).

A backend is a function ``fn(q, k, v, *, scale=None) -> o`` on ``(B, S, H, D)`` tensors; the output has q's
dtype and ``q`` may have a different sequence length than ``k``/``v`` (cross-attention). Each backend also has
an ``available(device) -> (ok, reason)`` check so that callers can say *why* a backend cannot run here instead
of failing deep inside it.

    @register("sdpa", description="torch SDPA", available=lambda device: (True, ""))
    def sdpa(q, k, v, *, scale=None): ...

The built-in backends live in ``peers.py`` (torch SDPA variants, FA4, SageAttention, and the lazy ``fp8``
entry for our CuTe DSL kernel) and ``fp8_emulation.py`` (``fp8-emulated``). They register themselves on
import; every lookup here imports them first, so ``get("sdpa")`` works without any other import.

What a caller needs to know about an FP8 backend is on its ``Backend``, not in its name: ``qk_format(head_dim)``
("int8" / "e4m3", None for a backend that is not FP8), ``launch_stats`` (a ``LaunchStats``: what the kernel's
launch records ran since a snapshot) and ``with_options(Fp8Options(...))`` (the backend running with those options).
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

import torch

from ditprof.errors import DitprofError

Device = Union[str, torch.device, None]
Availability = Callable[[torch.device], "tuple[bool, str]"]

# Modules whose import registers the built-in backends (order = listing order).
BUILTIN_MODULES = ("ditprof.kernels.peers", "ditprof.kernels.fp8_emulation")


@dataclass(frozen=True)
class LaunchStats:
    """A backend's launch records: ``snapshot()`` now, ``since(snapshot)`` one dict per call configuration called
    since then (shapes, kernel, Q/K format, grid, calls, graph replays)."""

    snapshot_fn: Callable[[], object]
    since_fn: Callable[[object], list]

    def snapshot(self) -> object:
        return self.snapshot_fn()

    def since(self, snapshot: object) -> list[dict]:
        return self.since_fn(snapshot)


@dataclass(frozen=True)
class Backend:
    name: str
    fn: Callable
    description: str
    availability: Availability
    numerics_only: bool = False  # a numerics emulation: its timings say nothing about a kernel's speed
    qk_format: Optional[Callable[[int], str]] = None  # head_dim -> "int8" / "e4m3"; None: not an FP8 backend
    launch_stats: Optional[LaunchStats] = None
    # options -> the fields of the backend running with them (``with_options``); None: takes no options
    options: Optional[Callable[[Any], dict]] = None

    def __call__(self, q, k, v, *, scale=None):
        return self.fn(q, k, v, scale=scale)

    def with_options(self, options) -> "Backend":
        """This backend running with ``options`` (an ``Fp8Options``); a one-line error for a backend without."""
        if self.options is None:
            raise DitprofError(f"attention backend {self.name!r} takes no FP8 options")
        return dataclasses.replace(self, **self.options(options))

    def available(self, device: Device = None) -> tuple[bool, str]:
        """(ok, reason); a check that raises counts as unavailable with the exception as the reason."""
        try:
            ok, reason = self.availability(resolve_device(device))
        except Exception as exc:  # an availability probe must never take the caller down
            return False, f"availability check failed: {type(exc).__name__}: {exc}"
        return bool(ok), reason or ""


_BACKENDS: dict[str, Backend] = {}
_builtins_loaded = False


def resolve_device(device: Device = None) -> torch.device:
    """``None`` means this machine's default: CUDA when present, else CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise DitprofError(f"not a torch device: {device!r} ({exc})") from None


def anywhere(device: torch.device) -> tuple[bool, str]:
    """A backend that runs wherever torch does: on a CUDA device only where this machine has one."""
    if device.type == "cuda" and not torch.cuda.is_available():
        return False, "CUDA is not available (torch.cuda.is_available() is False)"
    return True, ""


def register(name: str, *, description: str = "", available: Optional[Availability] = None,
             numerics_only: bool = False, qk_format: Optional[Callable[[int], str]] = None,
             launch_stats: Optional[LaunchStats] = None, options: Optional[Callable[[Any], dict]] = None):
    """Decorator: register ``fn`` under ``name``. Re-registering a name replaces it (tests rebind names).
    ``numerics_only``: the backend emulates a kernel's numerics (reports never quote its timings as speed);
    ``qk_format``, ``launch_stats``, ``options``: the ``Backend`` fields of an FP8 backend."""

    def decorate(fn: Callable) -> Callable:
        _BACKENDS[name] = Backend(name, fn, description or (fn.__doc__ or "").strip().split("\n")[0],
                                  available or anywhere, numerics_only, qk_format, launch_stats, options)
        return fn

    return decorate


def _load_builtins() -> None:
    global _builtins_loaded
    if _builtins_loaded:
        return
    _builtins_loaded = True
    for module in BUILTIN_MODULES:
        importlib.import_module(module)


def all_backends() -> list[Backend]:
    _load_builtins()
    return list(_BACKENDS.values())


def names() -> list[str]:
    return [b.name for b in all_backends()]


def availability_summary(device: Device = None) -> tuple[list[str], list[str]]:
    """(names available on ``device``, ``"name (reason)"`` for the others)."""
    ok_names, missing = [], []
    for backend in all_backends():
        ok, reason = backend.available(device)
        if ok:
            ok_names.append(backend.name)
        else:
            missing.append(f"{backend.name} ({reason})")
    return ok_names, missing


def is_numerics_only(name: str) -> bool:
    """Whether a registered backend is a numerics emulation (False for unknown names)."""
    _load_builtins()
    b = _BACKENDS.get(name)
    return bool(b and b.numerics_only)


def get(name: str) -> Backend:
    """The backend registered as ``name``; unknown names raise a DitprofError that lists the others."""
    _load_builtins()
    try:
        return _BACKENDS[name]
    except KeyError:
        pass
    device = resolve_device(None)
    ok_names, missing = availability_summary(device)
    msg = f"unknown attention backend {name!r}; available on {device.type}: {', '.join(ok_names) or 'none'}"
    if missing:
        msg += f"; not available: {'; '.join(missing)}"
    raise DitprofError(msg)


def available(name: str, device: Device = None) -> tuple[bool, str]:
    return get(name).available(device)


def require(name: str, device: Device = None) -> Backend:
    """The backend, or a one-line DitprofError saying why it cannot run on ``device``."""
    backend = get(name)
    dev = resolve_device(device)
    ok, reason = backend.available(dev)
    if not ok:
        raise DitprofError(f"attention backend {name!r} is not available on {dev}: {reason}")
    return backend


__all__ = [
    "Backend",
    "LaunchStats",
    "all_backends",
    "anywhere",
    "available",
    "availability_summary",
    "get",
    "names",
    "register",
    "require",
    "resolve_device",
]
