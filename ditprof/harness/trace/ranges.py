"""The ``record_function`` ranges the harness puts around a block's parts, which the split (``categories``) reads:
one around each block call, one around each attention call (``ditprof.dispatch`` puts it there), the Ulysses
all-to-alls, and one around each norm module's forward (``norm_ranges``)."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch

from ditprof.dispatch import ATTENTION_RANGE  # noqa: F401 -- one of the ranges, defined where it is put

BLOCK_RANGE = "ditprof::block"
COMM_RANGE = "ditprof::all_to_all"
NORM_RANGE_PREFIX = "ditprof::norm"


def _is_norm_module(mod: torch.nn.Module) -> bool:
    if "Norm" not in type(mod).__name__:
        return False
    return not any(isinstance(m, torch.nn.Linear) for m in mod.modules())


@contextlib.contextmanager
def norm_ranges(module: torch.nn.Module) -> Iterator[list[str]]:
    """Wrap every norm module's forward in ``record_function("ditprof::norm/<Class>")``.

    Some norms never reach an aten norm op (diffusers' ``RMSNorm`` is pow/mean/rsqrt/mul); the range lets
    the split count them as norm instead of elementwise. Modules holding a ``Linear`` (AdaLayerNorm*) are
    left alone: their inner norm gets the range, their projection stays a GEMM.
    """
    wrapped: list[tuple[torch.nn.Module, bool, Callable]] = []
    names: list[str] = []
    for name, mod in module.named_modules():
        if not _is_norm_module(mod):
            continue
        label = f"{NORM_RANGE_PREFIX}/{type(mod).__name__}"
        inner = mod.forward
        had_attr = "forward" in mod.__dict__

        def forward(*args, _inner=inner, _label=label, **kwargs):
            if torch.compiler.is_compiling():  # dropped under compile: the norm's kernels are named after its ops
                return _inner(*args, **kwargs)
            with torch.profiler.record_function(_label):
                return _inner(*args, **kwargs)

        mod.forward = forward
        wrapped.append((mod, had_attr, inner))
        names.append(name)
    try:
        yield names
    finally:
        for mod, had_attr, inner in wrapped:
            if had_attr:
                mod.forward = inner
            else:
                del mod.forward
