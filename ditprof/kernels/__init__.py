"""Attention backends: the registry, torch/FA4/Sage peers, the FP8 numerics emulation and our FP8 kernel.

Kept light on purpose (the CLI imports this package to build its parser): submodules load on first use, and
``fp8_attention`` (the CuTe DSL kernel, ``interface.py``) is imported only when accessed.
"""

from __future__ import annotations

import importlib

_LAZY = {
    "fp8_attention": ("ditprof.kernels.interface", "fp8_attention"),
    "fp8_attention_emulated": ("ditprof.kernels.fp8_emulation", "fp8_attention_emulated"),
    "attention_reference": ("ditprof.kernels.reference", "attention_reference"),
    "get": ("ditprof.kernels.registry", "get"),
    "require": ("ditprof.kernels.registry", "require"),
    "available": ("ditprof.kernels.registry", "available"),
    "all_backends": ("ditprof.kernels.registry", "all_backends"),
    "register": ("ditprof.kernels.registry", "register"),
}


def __getattr__(name: str):
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'ditprof.kernels' has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), attr)


__all__ = sorted(_LAZY)
