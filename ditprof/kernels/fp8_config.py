"""The FP8 attention's settings as frozen configs (a leaf module: no torch, no other ditprof import but errors).

``PrepConfig`` is the Triton prep's launch configuration, ``Fp8Options`` what a caller may choose about a call
(kernel, Q/K format, grid, graph replay, launcher, finite checks). The defaults are the shipped choices; a
non-default value is built by a caller (a benchmark in ``benchmarks/experimental/``, a CLI flag) and passed
explicitly; a call that passes none takes ``default_options()`` (the defaults plus the two documented user
settings, DITPROF_FP8_QK and DITPROF_FP8_CHECK).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

KERNEL_CHOICES = ("auto", "fp8-sm90", "fp8-sm120")
QK_FORMAT_CHOICES = ("int8", "e4m3")
CHECK_CHOICES = ("defer", "sync")


@dataclass(frozen=True)
class PrepConfig:
    """Launch configuration of the Triton prep (``prep_triton``); every field is one the shipped prep uses."""

    stats_chunk: int = 512
    stats_programs_per_sm: int = 6
    stats_r: int = 8
    stats_warps: int = 4
    quant_block: int = 32
    quant_warps: int = 4
    finalize_cb: int = 16
    qk_rows: int = 512
    qk_block: int = 64
    stats_rot_rows: int = 0
    stats_rot16_programs_per_sm: int = 24
    qk_stages: int = 1
    split_v: bool = True
    qk_prefetch: bool = True
    fast_div: bool = True
    qk_recip: bool = True
    stats_v_mult: int = 2
    stats_v_first: bool = False
    stats_rot_tail: bool = True
    # with the fused prologue (its fp32 rows and RoPE tables take registers): the INT8 quantize's rows per tl.dot
    # and the stats pass's rotated K tile rows, in place of qk_block / stats_rot_rows
    prologue_qk_block: int = 32
    prologue_stats_rot_rows: int = 16


@dataclass(frozen=True)
class Fa3PrologueConfig:
    """Launch configuration of ``kernels.fa3_prologue`` (FA3 FP8's inputs made by the fused prologue):
    ``stats_chunk`` rows per amax program (on a GPU halved, down to 128, while the amax grid has fewer than
    ``stats_programs_per_sm`` programs per SM), ``quant_rows`` rows per quantize program (a multiple of 64),
    ``warps`` per program of both launches."""

    stats_chunk: int = 1024
    stats_programs_per_sm: int = 4
    quant_rows: int = 128
    warps: int = 4


@dataclass(frozen=True)
class SelfCheckConfig:
    """fp8-sm120's first-use self-check (``kernels.self_check``): the fixed problem (fresh seeded Gaussian q, k, v
    of (batch, seq, heads, head_dim) on the device) and the rel-RMS bound of the kernel's output against the
    emulation's. The bound is the kernel-vs-emulation agreement the GPU tests require (tests/test_fp8_kernel_gpu.py,
    tests/test_fp8_sm120_two_level_gpu.py: below 1 %); a flipped e4m3 rounding of a P element is the typical
    difference, a wrong mma gives tens of percent."""

    batch: int = 1
    heads: int = 2
    seq: int = 256
    seed: int = 0
    bound: float = 0.01


@dataclass(frozen=True)
class Fp8Options:
    """What a caller may choose about an FP8 attention call; the defaults are what ships."""

    kernel: str = "auto"  # "auto": fp8-sm90 on sm_90a, fp8-sm120 elsewhere; naming one forces it
    qk_format: Optional[str] = None  # None: "int8" where the rotation applies (power-of-two head_dim >= 16)
    streamk: bool = True  # fp8-sm90 may run a few-round grid as stream-K (kernel + merge)
    q_in_kernel: bool = True  # fp8-sm90 INT8 on the plain grid rotates and quantizes Q itself
    graphs: bool = True  # a call repeating an earlier one's arguments replays its launches as one CUDA graph
    branch: bool = True  # the prep's V quantize may branch onto a side stream
    tvm_ffi: bool = True  # launch through TVM-FFI where apache-tvm-ffi is importable
    check: str = "defer"  # "defer": NaN/Inf checks read later without a sync; "sync": every call waits for its own
    prep: PrepConfig = field(default_factory=PrepConfig)
    smooth_k: bool = True  # subtract each (batch, head)'s K mean before quantizing (softmax-invariant)
    # fp8-sm120's first call per configuration compares the kernel with its emulation on a small problem and
    # falls back (pv_mma "f32", then SDPA) where they disagree (kernels.self_check)
    self_check: bool = True


_DEFAULTS: dict = {}  # (DITPROF_FP8_QK, DITPROF_FP8_CHECK) -> the one Fp8Options of those values


def default_options() -> Fp8Options:
    """The options of a call that passes none: the shipped defaults plus the two documented user settings as
    os.environ has them now, ``DITPROF_FP8_QK`` ("int8" / "e4m3": the Q/K format where a call names none; checked
    where it is used, ``qk_format.qk_format``) and ``DITPROF_FP8_CHECK=sync`` (every call waits for its own NaN/Inf
    check). One object per pair of values, so launch records keyed on it are reused. A caller that passes
    ``Fp8Options`` reads no environment at all."""
    key = (os.environ.get("DITPROF_FP8_QK") or None, os.environ.get("DITPROF_FP8_CHECK") == "sync")
    opts = _DEFAULTS.get(key)
    if opts is None:
        opts = _DEFAULTS[key] = Fp8Options(qk_format=key[0], check="sync" if key[1] else "defer")
    return opts
