"""The prep's names the launch path uses, imported in this one place (the prep may move them between modules).
The Triton ones load on first use: importing the front door stays free of Triton."""

from __future__ import annotations

import importlib

from ditprof.kernels.prep import padded_lengths

_TRITON_NAMES = ("FixedLaunch", "PrepPlan", "sm_count")


def __getattr__(name: str):
    if name in _TRITON_NAMES:
        return getattr(importlib.import_module("ditprof.kernels.prep_triton"), name)
    raise AttributeError(f"module 'ditprof.kernels.prep_api' has no attribute {name!r}")


__all__ = ["FixedLaunch", "PrepPlan", "padded_lengths", "sm_count"]
