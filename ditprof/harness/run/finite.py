"""Where NaN/Inf first appears when a block's output is not finite: a weight, an input, or the first module (in
execution order) whose output holds one."""

from __future__ import annotations

import torch

from ditprof.errors import DitprofError


class NonFiniteOutput(DitprofError):
    """The block's output holds NaN/Inf (raised by the measurement, located by ``first_nonfinite``)."""


def _bad(x) -> bool:
    if isinstance(x, torch.Tensor):
        return x.is_floating_point() and not bool(torch.isfinite(x).all())
    if isinstance(x, (tuple, list)):
        return any(_bad(v) for v in x)
    if isinstance(x, dict):
        return any(_bad(v) for v in x.values())
    return False


def first_nonfinite(module: torch.nn.Module, run) -> str:
    """Where the first NaN/Inf of ``run()`` (one call of ``module``) comes from, in words."""
    for name, t in list(module.named_parameters()) + list(module.named_buffers()):
        if _bad(t):
            return f"the block's weight {name} holds NaN/Inf (as loaded from the checkpoint)"
    first: list[str] = []

    def hook(name):
        def check(mod, args, kwargs, out):
            if first:
                return
            if _bad(out):
                where = f"the output of {name} ({type(mod).__name__})"
                first.append(where if not (_bad(args) or _bad(kwargs)) else f"the input of {name} "
                             f"({type(mod).__name__})")
        return check

    handles = [m.register_forward_hook(hook(n), with_kwargs=True) for n, m in module.named_modules() if n]
    try:
        with torch.inference_mode():
            run()
    except DitprofError as exc:  # a backend that checks its own inputs stops first
        first.append(f"{exc}")
    finally:
        for h in handles:
            h.remove()
    return f"NaN/Inf first appears in {first[0]}" if first else "no submodule output holds NaN/Inf"


def check_inputs(kwargs: dict) -> None:
    """One line naming the first block input that holds NaN/Inf."""
    for name, v in kwargs.items():
        if _bad(v):
            raise DitprofError(f"block input {name} holds NaN/Inf")
