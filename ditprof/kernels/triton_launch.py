"""Launching a Triton kernel without Triton's per-call argument handling (``FixedLaunch``), and the device's SM
count the launch rules size their grids by (``sm_count``). Used by the prep (``prep_triton``) and the stream-K merge
(``streamk_merge``)."""

from __future__ import annotations

import torch
import triton

_SMS: dict = {}


def sm_count(index) -> int:
    """The SM count of CUDA device ``index`` (None: the current one), read once per device."""
    index = torch.cuda.current_device() if index is None else index
    if index not in _SMS:
        _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SMS[index]


_RUNTIME_KNOBS = getattr(getattr(triton, "knobs", None), "runtime", None)


def _launch_hooks_set() -> bool:
    # a launch hook (proton, a user's) must see every launch: then every launch goes through Triton's JIT. Newer
    # Triton keeps the hooks as HookChain objects (never None; empty ``calls`` when nothing is hooked)
    rt = _RUNTIME_KNOBS
    if rt is None:
        return False
    enter, leave = rt.launch_enter_hook, rt.launch_exit_hook
    return bool(getattr(enter, "calls", enter is not None)) or bool(getattr(leave, "calls", leave is not None))


class FixedLaunch:
    """One Triton kernel with its grid, options and argument list fixed but for the tensors. The first call goes
    through the JIT (which specialises, compiles and returns the CompiledKernel); later calls on CUDA call that
    kernel's launcher directly (what the JIT itself calls after its per-call argument specialisation, which costs
    host time on every call), unless a launch hook is set. The arguments a plan fixes (sizes, strides, alignment
    of the buffers) are what the JIT specialised on, so the compiled kernel stays valid for every call of the
    plan."""

    def __init__(self, fn, grid: tuple, options: dict, static: dict, dynamic: tuple):
        self.fn = fn
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.options = options
        names = list(fn.arg_names)
        self.names = names
        self.template = [static.get(n) for n in names]
        self.slots = tuple(names.index(n) for n in dynamic)  # where each per-call tensor goes
        missing = set(names) - set(static) - set(dynamic)
        if missing:
            raise ValueError(f"{fn.__name__}: no value for {sorted(missing)}")
        self.compiled = None

    def __call__(self, values: tuple, stream: int | None) -> None:
        args = self.template.copy()
        for i, val in zip(self.slots, values):
            args[i] = val
        ck = self.compiled
        if ck is not None and stream is not None and not _launch_hooks_set():
            ck.run(self.grid[0], self.grid[1], self.grid[2], stream, ck.function, ck.packed_metadata, None, None,
                   None, *args)
            return
        res = self.fn[self.grid](**dict(zip(self.names, args)), **self.options)
        if stream is not None and all(hasattr(res, a) for a in ("run", "function", "packed_metadata")):
            self.compiled = res
