"""The one argument packing of the compiled FP8 attention kernels: ``launch_kernel`` takes every pointer as an int
and launches through TVM-FFI's C ABI (fp8-sm90 compiled with --enable-tvm-ffi) or cute's JIT executor.

cute's JIT executor converts the arguments in Python on every call (make_ptr, Int32 wrappers, ctypes packing), a
large part of a call's host time; fp8-sm90 compiled for TVM-FFI takes raw ints (``data_ptr()``) and floats through
TVM-FFI's C ABI instead. TVM-FFI is used where apache-tvm-ffi is importable (the GPU hosts have it; nothing
launches on the CPU CI) and ``Fp8Options.tvm_ffi`` is on; if a TVM-FFI call fails (argument conversion fails before
anything is launched), the JIT path takes over for the rest of the process and ``LAUNCH_INFO["tvm_ffi_error"]``
keeps the reason. ``LAUNCH_INFO["last_launch"]``: "tvm_ffi" or "jit".

``launch_compiled`` is the same launch on tensors (the prep's buffers), with the argument checks a launch record
makes once per configuration; kernel tests use it.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from ditprof.errors import DitprofError
from ditprof.kernels.compile_cache import KernelSpec, compiled
from ditprof.kernels.prep_layout import padded_lengths

LAUNCH_INFO: dict = {"tvm_ffi_error": None, "last_launch": None}


def tvm_ffi_launch_enabled(wanted: bool = True) -> bool:
    """Whether fp8-sm90 launches through TVM-FFI: ``wanted`` (``Fp8Options.tvm_ffi``), apache-tvm-ffi importable,
    and no TVM-FFI call failed in this process."""
    if not wanted or LAUNCH_INFO["tvm_ffi_error"] is not None:
        return False
    try:
        import tvm_ffi  # noqa: F401
    except ImportError:
        return False
    return True


def launch_kernel(spec: KernelSpec, fn, q8: int, k8: int, v8t: int, scales: int, q_scales: int, key_lens: int,
                  out: int, lse: int, parts: tuple, sizes: tuple, softmax_scale: float, plan: tuple, stream: int,
                  out_strides: Optional[tuple] = None):
    """Launch ``fn`` (compiled for ``spec``) on raw device pointers; ``stream`` a raw CUDA stream handle.

    Arguments in the kernels' order: q8 (q_rot: the 16-bit q), k8, v8t, scales, q_scales (int8 Q/K: the per-row Q
    descales, q_rot: the rotation matrix; else any pointer, never read), key_lens (any pointer unless
    ``spec.key_lens``), out, lse, ``parts`` (the stream-K workspace: (o_part, lse_part), else ()), ``sizes``
    (B, H, Sq, Sk, Sq_pad, Sk_pad), the softmax scale, ``plan`` (the stream-K grid's (n_full, n_tail, T), else ()).
    ``out_strides`` (b, h, s): fp8-sm120's output strides (default: a contiguous (B, Sq, H, D); fp8-sm90 always
    writes that). Returns (spec, fn) actually used: a TVM-FFI call that fails falls back to cute's JIT executor for
    good."""
    if spec.tvm_ffi:
        try:
            fn(q8, k8, v8t, scales, q_scales, key_lens, out, lse, *parts, *sizes, softmax_scale, *plan, stream)
            LAUNCH_INFO["last_launch"] = "tvm_ffi"
            return spec, fn
        except Exception as exc:  # noqa: BLE001 -- argument conversion fails before anything is launched
            LAUNCH_INFO["tvm_ffi_error"] = f"{type(exc).__name__}: {exc}"[:500]
            spec = dataclasses.replace(spec, tvm_ffi=False)
            fn = compiled(spec)
    _launch_jit(spec, fn, q8, k8, v8t, scales, q_scales, key_lens, out, lse, parts, sizes, softmax_scale, plan,
                stream, out_strides)
    LAUNCH_INFO["last_launch"] = "jit"
    return spec, fn


def _launch_jit(spec: KernelSpec, fn, q8, k8, v8t, scales, q_scales, key_lens, out, lse, parts, sizes,
                softmax_scale, plan, stream, out_strides) -> None:
    """cute's JIT executor: the same pointers as typed, aligned cute pointers, the sizes as Int32."""
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute

    gm = cute.AddressSpace.gmem
    f8 = cutlass.Float8E4M3FN
    qk8 = cutlass.Int8 if spec.qk_int8 else f8
    out_ty = cutlass.BFloat16 if spec.out_dtype == "bfloat16" else cutlass.Float16
    f32 = cutlass.Float32

    def ptr(ty, p, align):
        return cute.runtime.make_ptr(ty, p, gm, assumed_align=align)

    I32 = cutlass.Int32
    B, H, Sq, Sk, sq_pad, sk_pad = sizes
    if spec.kernel == "fp8-sm90":
        ws = (ptr(out_ty, parts[0], 16), ptr(f32, parts[1], 4)) if parts else ()
        fn(ptr(qk8, q8, 16), ptr(qk8, k8, 16), ptr(f8, v8t, 16), ptr(f32, scales, 4),
           ptr(f32, q_scales, 16 if spec.q_rot else 4), ptr(cutlass.Int32, key_lens, 4),
           ptr(out_ty, out, 16), ptr(f32, lse, 4), *ws,
           I32(B), I32(H), I32(Sq), I32(Sk), I32(sq_pad), I32(sk_pad), f32(softmax_scale),
           *(I32(x) for x in plan), cuda.CUstream(stream))
        return
    D = spec.head_dim
    sb, sh, ss = out_strides if out_strides is not None else (Sq * H * D, D, H * D)
    fn(ptr(qk8, q8, 16), ptr(qk8, k8, 16), ptr(f8, v8t, 16), ptr(out_ty, out, 16), ptr(f32, lse, 4),
       ptr(f32, scales, 4), ptr(f32, q_scales, 4), ptr(cutlass.Int32, key_lens, 4),
       I32(B), I32(H), I32(Sq), I32(Sk),
       cutlass.Int64(sb), cutlass.Int64(sh), I32(ss), f32(softmax_scale), cuda.CUstream(stream))


def launch_compiled(spec: KernelSpec, fn, q8, k8, v8t, scales, q_scales, key_lens, out, lse, B: int, H: int,
                    Sq: int, Sk: int, softmax_scale: float, stream: int, out_strides: Optional[tuple] = None,
                    streamk: Optional[tuple] = None):
    """``launch_kernel`` on tensors (the prep's buffers), after the argument checks. ``q_scales`` (B, H, Sq_pad)
    float32: the per-row Q descales of int8 Q/K (``spec.qk_int8``), else None; with ``spec.q_rot`` q8 is the
    16-bit q (B, Sq, H, D) and q_scales the rotation matrix. ``streamk`` (o_part, lse_part, (n_full, n_tail, T)):
    the workspace and plan of a ``spec.streamk`` build (the kernel only: the caller merges). Returns (spec, fn)
    actually used."""
    sq_pad, sk_pad = q8.shape[2], k8.shape[2]
    if spec.q_rot:  # q8 is the 16-bit q (B, Sq, H, D): no padded length in its shape
        sq_pad = padded_lengths(Sq, Sk)[0]
    if spec.qk_int8 != (q_scales is not None):
        raise DitprofError("int8 Q/K kernels take per-row Q descales (q_scales), e4m3 ones do not")
    if spec.kernel == "fp8-sm90" and out.data_ptr() % 16:
        raise DitprofError(f"fp8-sm90 stores O in 16-byte words: out must be 16-byte aligned "
                           f"(data_ptr {out.data_ptr():#x})")
    if spec.streamk != (streamk is not None):
        raise DitprofError("a stream-K build takes its workspace and plan (streamk=...), a plain one does not")
    lens_ptr = key_lens.data_ptr() if key_lens is not None else scales.data_ptr()  # not read unless key_lens
    qs_ptr = q_scales.data_ptr() if q_scales is not None else scales.data_ptr()  # not read unless qk_int8
    parts, plan = ((streamk[0].data_ptr(), streamk[1].data_ptr()), tuple(streamk[2])) if streamk else ((), ())
    return launch_kernel(spec, fn, q8.data_ptr(), k8.data_ptr(), v8t.data_ptr(), scales.data_ptr(), qs_ptr,
                         lens_ptr, out.data_ptr(), lse.data_ptr(), parts, (B, H, Sq, Sk, sq_pad, sk_pad),
                         softmax_scale, plan, stream, out_strides)


__all__ = ["LAUNCH_INFO", "launch_compiled", "launch_kernel", "tvm_ffi_launch_enabled"]
