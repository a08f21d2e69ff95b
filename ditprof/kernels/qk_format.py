"""Which number format the FP8 attention's Q and K take: one switch for the kernels, the prep and the emulation.

- ``"int8"``: Q and K rotated by the same Hadamard matrix in the prep (Q Kᵀ unchanged, outlier channels spread
  over all channels), then INT8 with a scale per query row and one per (batch, head) for K; S = Q8 K8ᵀ on the
  int8 tensor cores, exact in int32. Holds on Q/K outlier channels and peaked attention (benchmarks/NOTES.md,
  "Session 8: FP8 accuracy on real activations").
- ``"e4m3"``: Q and K as float8_e4m3fn with one scale per (batch, head) each (the first kernels' format).

V and P are e4m3 in both. ``DITPROF_FP8_QK`` picks the format for a process; a call may name one.
"""

from __future__ import annotations

import os
from typing import Optional

from ditprof.errors import DitprofError

QK_FORMATS = ("e4m3", "int8")
DEFAULT_QK_FORMAT = "e4m3"


def qk_format(requested: Optional[str] = None) -> str:
    """``requested``, else ``DITPROF_FP8_QK``, else the default; a one-line error for an unknown name."""
    name = requested or os.environ.get("DITPROF_FP8_QK") or DEFAULT_QK_FORMAT
    if name not in QK_FORMATS:
        raise DitprofError(f"unknown fp8 Q/K format {name!r}; known: {', '.join(QK_FORMATS)}")
    return name


__all__ = ["QK_FORMATS", "DEFAULT_QK_FORMAT", "qk_format"]
