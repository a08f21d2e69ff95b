"""The one compile cache of the FP8 attention kernels: ``KernelSpec`` (frozen) is everything a compiled kernel is
specialised for, ``compiled(spec)`` compiles it once per process (both kernels, every caller), ``compile_spec``
compiles without caching (``fake=True``: no GPU, for inspection on any machine)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Optional

import torch

from ditprof.errors import DitprofError

DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


@dataclass(frozen=True)
class KernelSpec:
    """What one compiled FP8 attention kernel is specialised for (the compile cache's key)."""

    kernel: str  # "fp8-sm90" | "fp8-sm120"
    arch: str  # e.g. "sm_90a", "sm_120a", "sm_89"
    head_dim: int
    out_dtype: str  # "bfloat16" | "float16"
    write_lse: bool
    key_lens: bool  # per-batch key counts read on the device
    tvm_ffi: bool = False  # compiled for TVM-FFI's C ABI (raw ints for pointers and the stream)
    qk_int8: bool = False  # Q and K int8 with per-row Q descales (kernels.qk_format "int8")
    streamk: bool = False  # fp8-sm90 on the stream-K grid (fp8_fwd_sm90_streamk: workspace + merge)
    q_rot: bool = False  # fp8-sm90 INT8 with Q rotated and quantized in the kernel (16-bit q, the rotation matrix)
    pv_mma: str = "f32"  # fp8-sm120's P V mma: "f32" (QMMA.F32) or "block_scaled" (QMMA.SF, unit scales; sm_12x)
    # fp8-sm90's Sm90Config as picked for the call (launch_choice.choose_launch); None: config_for(arch, head_dim)
    config: Optional[Any] = None


_COMPILED: dict = {}
_COMPILE_LOCK = threading.Lock()
COMPILE_STATS = {"compiles": 0, "hits": 0}


def compile_spec(spec: KernelSpec, *, fake: bool = False, options_extra: str = ""):
    """Compile ``spec`` (``fake``: no GPU needed, for inspection on any machine)."""
    if spec.kernel == "fp8-sm90":
        from ditprof.kernels import fp8_fwd_sm90 as K

        if spec.pv_mma != "f32":
            raise ValueError("fp8-sm90's P V is its wgmma (pv_mma is fp8-sm120's choice)")

        if not spec.write_lse:
            raise ValueError("fp8-sm90 always writes the LSE")
        if spec.streamk:
            from ditprof.kernels.fp8_fwd_sm90_streamk import compile_streamk

            if spec.q_rot:
                raise ValueError("the stream-K grid takes the prep's Q (no q_rot build)")

            return compile_streamk(spec.head_dim, spec.out_dtype, fake=fake, arch=spec.arch,
                                   options_extra=options_extra, tvm_ffi=spec.tvm_ffi, key_lens=spec.key_lens,
                                   qk_int8=spec.qk_int8, config=spec.config)
        return K.compile_sm90(spec.head_dim, spec.out_dtype, fake=fake, arch=spec.arch, options_extra=options_extra,
                              tvm_ffi=spec.tvm_ffi, key_lens=spec.key_lens, qk_int8=spec.qk_int8, q_rot=spec.q_rot,
                              config=spec.config)
    if spec.kernel == "fp8-sm120":
        from ditprof.kernels import fp8_fwd_sm120 as K

        if spec.tvm_ffi or spec.streamk or spec.q_rot:
            raise ValueError("fp8-sm120 launches through cute's JIT executor, on its plain grid, with the prep's Q")
        return K.compile_fp8_fwd(spec.arch, spec.head_dim, spec.out_dtype, write_lse=spec.write_lse,
                                 early_v=K.default_early_v(spec.arch), extra_options=options_extra,
                                 key_lens=spec.key_lens, qk_int8=spec.qk_int8, pv_mma=spec.pv_mma)
    raise DitprofError(f"unknown fp8 kernel {spec.kernel!r}")


def compiled(spec: KernelSpec):
    """The compiled kernel for ``spec`` on the current device (compiled once per process)."""
    fn = _COMPILED.get(spec)
    if fn is not None:
        COMPILE_STATS["hits"] += 1
        return fn
    with _COMPILE_LOCK:
        fn = _COMPILED.get(spec)
        if fn is None:
            fn = compile_spec(spec)
            _COMPILED[spec] = fn
            COMPILE_STATS["compiles"] += 1
    return fn


def clear() -> None:
    """Drop every compiled kernel (``launch_record.clear_cache`` also drops the launch records)."""
    _COMPILED.clear()


__all__ = ["COMPILE_STATS", "DTYPE_NAMES", "KernelSpec", "clear", "compile_spec", "compiled"]
