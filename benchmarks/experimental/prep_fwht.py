"""The INT8 prep's Q/K rotate-and-quantize launch with the Hadamard rotation as a fast Walsh-Hadamard transform in
registers instead of a tensor-core dot with the +-1 matrix (issue 17's short shapes; experiment, not shipped).

Why (ncu at Flux's shape, session 13): the shipped launch (``prep_triton._quant_rows_int8``) holds the 32 KiB
rotation matrix in shared memory and 255 registers per thread, so 2 programs of 4 warps fit an SM (12.5 %
occupancy, 1.64 waves, 1.3 TB/s: 53 µs of the 124 µs INT8 prep). X @ Rpm1 = (X * signs) @ H with H the Sylvester
matrix (``kernels/rotation.py``), and X @ H is log2(D) butterfly stages of adds (pairs i, i + h inside blocks of
2h), no matrix, no shared memory for it. Outcome (H200, session 13): correct, but +31 to +90 % slower than the
shipped launch at flux and ltx (each stage's permute / reshape is a layout conversion through shared memory);
benchmarks/NOTES.md "Session 13".

``_fwht`` does the stages on a [ROWS, D] fp32 tile with reshape / permute / split / join. The sums are fp32 adds in
butterfly order where the dot sums products in its own order: a code may be one off and a Q descale may differ in
its last bits (the tolerance the shipped prep's tests already allow against the torch chain).

``quantize_qk_fwht(plan, q, k, bufs, ...)`` writes q8 / k8 / q_scales from what the shipped stats launch left in
``bufs`` (the K mean in the rotated basis and K's descale); ``prep_fwht_bench.py`` times it against the shipped
Q/K launch. Tests: ``test_prep_fwht.py`` (the interpreter, CPU; the GPU).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ditprof.kernels.prep_triton import (
    INTERPRET, _abs_bits, _div_by_descale, _div_rows, _load_rows, _to_int8)
from ditprof.kernels.rotation import hadamard_signs


@triton.jit
def _fwht_stage(x, R: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr):
    # pairs columns i and i + HALF inside blocks of 2 HALF columns into (a + b, a - b)
    y = tl.reshape(x, (R, D // (2 * HALF), 2, HALF))
    a, b = tl.split(tl.permute(y, (0, 1, 3, 2)))
    y = tl.permute(tl.join(a + b, a - b), (0, 1, 3, 2))
    return tl.reshape(y, (R, D))


@triton.jit
def _fwht(x, R: tl.constexpr, D: tl.constexpr, LOG2D: tl.constexpr):
    # x [R, D] fp32 -> x @ H, H[i, j] = (-1)^popcount(i & j): log2(D) butterfly stages
    for s in tl.static_range(LOG2D):
        x = _fwht_stage(x, R, D, 1 << s)
    return x


@triton.jit
def _quant_rows_fwht(src, s_b, s_s, s_h, s_d, dst, b, h, bh64, t, S, S_pad, signs, mean_ptr, ds, qs_ptr,
                     scales_ptr, flags_ptr, D: tl.constexpr, LOG2D: tl.constexpr, ROWS: tl.constexpr,
                     BLOCK: tl.constexpr, IS_Q: tl.constexpr, SUB_MEAN: tl.constexpr, FAST: tl.constexpr):
    # ``prep_triton._quant_rows_int8`` with the rotation as (x * signs) then ``_fwht``
    d = tl.arange(0, D).to(tl.int64)
    if SUB_MEAN:
        mu = tl.load(mean_ptr + bh64 * D + d)
    base = src + b * s_b + h * s_h
    n = tl.minimum(ROWS, S_pad - t * ROWS)
    end = tl.minimum(S, t * ROWS + n)
    for i in tl.range(0, n, BLOCK):
        rows = t * ROWS + i + tl.arange(0, BLOCK)
        r64 = rows.to(tl.int64)
        m = (rows < S)[:, None]
        x = _load_rows(base, s_s, s_d, t * ROWS + i, end, d, BLOCK).to(tl.float32)
        xr = _fwht(x * signs[None, :], BLOCK, D, LOG2D)
        if IS_Q:
            xr = xr * (1.0 / D)
            amax_bits = tl.max(_abs_bits(xr), axis=1)
            amax = amax_bits.to(tl.float32, bitcast=True)
            qs = tl.where(amax == 0.0, 1.0, tl.math.div_rn(amax, 127.0))
            y = _div_rows(xr, qs, FAST)
            tl.store(qs_ptr + bh64 * S_pad + r64, qs, mask=rows < S_pad)
            bad = tl.max((amax_bits >= 0x7F800000).to(tl.int32), axis=0)
            tl.store(flags_ptr + 0, 1, mask=bad > 0)
            tl.store(scales_ptr + bh64 * 3 + 0, float("nan"), mask=bad > 0)
        else:
            if SUB_MEAN:
                xr = tl.where(m, xr - mu[None, :], 0.0)
            y = _div_by_descale(xr, ds, FAST)
        tl.store(dst + (bh64 * S_pad + r64)[:, None] * D + d[None, :], _to_int8(y), mask=(rows < S_pad)[:, None])


@triton.jit
def _qk_fwht_kernel(q_ptr, k_ptr, sqb, sqs, sqh, sqd, skb, sks, skh, skd, q8_ptr, k8_ptr, mean_ptr, scales_ptr,
                    qs_ptr, signs_ptr, flags_ptr, H, Sq, Sk, Sq_pad, Sk_pad, NQ,
                    D: tl.constexpr, LOG2D: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
                    SMOOTH: tl.constexpr, FAST: tl.constexpr):
    t = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    bh64 = bh.to(tl.int64)
    signs = tl.load(signs_ptr + tl.arange(0, D))
    if t < NQ:
        _quant_rows_fwht(q_ptr, sqb, sqs, sqh, sqd, q8_ptr, b, h, bh64, t, Sq, Sq_pad, signs, mean_ptr, 1.0, qs_ptr,
                         scales_ptr, flags_ptr, D, LOG2D, ROWS, BLOCK, True, False, FAST)
    else:
        _quant_rows_fwht(k_ptr, skb, sks, skh, skd, k8_ptr, b, h, bh64, t - NQ, Sk, Sk_pad, signs, mean_ptr,
                         tl.load(scales_ptr + bh64 * 3 + 1), qs_ptr, scales_ptr, flags_ptr, D, LOG2D, ROWS, BLOCK,
                         False, SMOOTH, FAST)


_SIGNS: dict = {}


def _signs(D: int, device) -> torch.Tensor:
    key = (D, torch.device(device))
    if key not in _SIGNS:
        _SIGNS[key] = hadamard_signs(D).to(torch.float32).to(device)
    return _SIGNS[key]


def quantize_qk_fwht(plan, q, k, bufs: dict, rows: int = 256, block: int = 32, warps: int = 4,
                     fast: bool = True) -> None:
    """q8, k8 and q_scales of ``bufs`` (a ``prep_triton.PrepPlan``'s buffers in INT8 mode, after its stats launch)
    from q, k (B, S, H, D) on the current stream (Triton's JIT launch)."""
    if not plan.qk_int8:
        raise ValueError("the FWHT quantize is the INT8 Q/K mode's")
    B, Sq, H, D = q.shape
    Sk = k.shape[1]
    nq, nk = -(-plan.Sq_pad // rows), -(-plan.Sk_pad // rows)
    _qk_fwht_kernel[(nq + nk, B * H)](
        q, k, *q.stride(), *k.stride(), bufs["q8"], bufs["k8"], bufs["k_mean_rot"], bufs["scales"],
        bufs["q_scales"], _signs(D, q.device), bufs["flags"], H, Sq, Sk, plan.Sq_pad, plan.Sk_pad, nq,
        D=D, LOG2D=int(math.log2(D)), ROWS=rows, BLOCK=block, SMOOTH=plan.smooth_k, FAST=fast and not INTERPRET,
        num_warps=warps)


__all__ = ["quantize_qk_fwht"]
