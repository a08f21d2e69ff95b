"""Which number format the FP8 attention's Q and K take: one switch for the kernels, the prep and the emulation.

- ``"int8"``: Q and K rotated by the same Hadamard matrix in the prep (Q Kᵀ unchanged, outlier channels spread
  over all channels), then INT8 with a scale per query row and one per (batch, head) for K; S = Q8 K8ᵀ on the
  int8 tensor cores, exact in int32. Holds on Q/K outlier channels and peaked attention (benchmarks/NOTES.md,
  "FP8 accuracy on real activations").
- ``"e4m3"``: Q and K as float8_e4m3fn with one scale per (batch, head) each (the first kernels' format).

V and P are e4m3 in both. A call names one through ``Fp8Options.qk_format``; ``DITPROF_FP8_QK`` picks the format
for a process (read once, ``fp8_config.default_options``). Without either: INT8 wherever the rotation applies -- a
power-of-two head_dim of at least 16, which covers every head_dim the GPU kernels take (it holds accuracy at a small
speed cost over e4m3; benchmarks/NOTES.md) -- and e4m3 for the other head dims (the tiny test presets' 12, 24, ...).
"""

from __future__ import annotations

from typing import Optional

from ditprof.errors import DitprofError
from ditprof.kernels.fp8_config import default_options

QK_FORMATS = ("e4m3", "int8")
DEFAULT_QK_FORMAT = "int8"
FALLBACK_QK_FORMAT = "e4m3"  # the default where the rotation does not apply


def rotation_applies(head_dim: int) -> bool:
    """Whether the INT8 format's Hadamard rotation (and the Triton prep's ``tl.dot``) takes this head_dim."""
    return head_dim >= 16 and head_dim & (head_dim - 1) == 0


def default_qk_format(head_dim: Optional[int] = None) -> str:
    """The format when neither a call nor ``DITPROF_FP8_QK`` names one (``head_dim`` None: the process default)."""
    if head_dim is not None and not rotation_applies(head_dim):
        return FALLBACK_QK_FORMAT
    return DEFAULT_QK_FORMAT


def qk_format(requested: Optional[str] = None, head_dim: Optional[int] = None) -> str:
    """``requested``, else the process's (``DITPROF_FP8_QK``, through ``fp8_config.default_options``), else the
    default for ``head_dim``; a one-line error for an unknown name."""
    name = requested or default_options().qk_format or default_qk_format(head_dim)
    if name not in QK_FORMATS:
        raise DitprofError(f"unknown fp8 Q/K format {name!r}; known: {', '.join(QK_FORMATS)}")
    return name


__all__ = ["QK_FORMATS", "DEFAULT_QK_FORMAT", "FALLBACK_QK_FORMAT", "rotation_applies", "default_qk_format",
           "qk_format"]
