"""``AttentionSwap``: the block's attention runs on a registry backend (``ditprof.dispatch`` does the routing:
diffusers' dispatcher where the processors use it, else the processor with SDPA redirected; every call inside the
``ditprof::attention`` range, masks checked or dropped as ``dispatch.wrap_backend`` says)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Callable

import torch

from ditprof import dispatch
from ditprof.harness.swaps.base import Installed, Swap
from ditprof.kernels.registry import Backend


class AttentionInstalled(Installed):
    """An attention swap in one block: the dispatch state, and the backend's launch record from the measured calls."""

    def __init__(self, swap: "AttentionSwap", state: dispatch.SwapState):
        self.swap = swap
        self.state = state
        self._launches_from = None

    def undo(self) -> None:
        self.state.restore()

    def start_measuring(self) -> None:
        stats = self.swap.backend.launch_stats
        self._launches_from = stats.snapshot() if stats is not None else None

    def launches(self) -> list[dict]:
        stats = self.swap.backend.launch_stats
        if stats is None or self._launches_from is None:
            return []
        return stats.since(self._launches_from)

    def record(self) -> dict:
        return self.swap.record(self)


class AttentionSwap(Swap):
    """Every attention module of the block runs ``backend``. ``uses_dispatcher``: the family's word on the route
    (False: always replace the processor); ``head_dim``: the block's, for the Q/K format an FP8 backend runs."""

    def __init__(self, backend: Backend, *, uses_dispatcher: bool | None = None, head_dim: int | None = None):
        self.backend = backend
        self.name = backend.name
        self.numerics_only = bool(backend.numerics_only)
        self.uses_dispatcher = uses_dispatcher
        self.head_dim = head_dim

    def describe(self) -> str:
        return f"attention on {self.backend.name}" + (f" ({self.backend.description})"
                                                       if self.backend.description else "")

    def wrapped(self, wrap: Callable[[Callable], Callable]) -> "AttentionSwap":
        """A copy of this swap whose backend function is ``wrap(fn)`` (``--attention-alone`` captures each call's
        arguments through it); this swap is left as it is."""
        other = copy.copy(self)
        other.backend = dataclasses.replace(self.backend, fn=wrap(self.backend.fn))
        return other

    def per_module(self) -> dispatch.PerModule | None:
        """Another (name, function) for some attention modules (None: the backend on every one)."""
        return None

    def install(self, block: torch.nn.Module) -> AttentionInstalled:
        state = dispatch.install(block, self.backend.name, self.backend.fn, uses_dispatcher=self.uses_dispatcher,
                                 per_module=self.per_module())
        return AttentionInstalled(self, state)

    def qk_format(self) -> str | None:
        fmt: Callable[[int], str] | None = self.backend.qk_format
        return fmt(self.head_dim) if fmt is not None and self.head_dim else None

    def record(self, inst: AttentionInstalled) -> dict:
        """The report section's fields: backend, route, modules, masks, Q/K format, launch configurations."""
        st = inst.state
        out: dict = {"attention_backend": self.backend.name, "route": st.route}
        if st.member is not None:
            out["diffusers_backend"] = st.member.value
        out["attention_modules"] = list(st.modules)
        if st.masks:
            out["attention_masks"] = dict(st.masks)
        if self.qk_format():
            out["qk_format"] = self.qk_format()
        launches = inst.launches()
        if launches:
            out["fp8_launches"] = launches
        return out


__all__ = ["AttentionInstalled", "AttentionSwap"]
