"""Triton kernels of the FP8 prep (see ``prep.py`` for the contract).

Three launches, all deterministic (no atomics):

1. ``_stats_kernel``  grid (chunks, B*H): each program reads CHUNK tokens of Q, K and V of one (b, h) and writes
   partials: amax|Q|, amax|V| (as int32 bits of |x|: an integer max keeps NaN, which sorts above Inf), and per
   channel of K: sum (float64), max, min (NaN counted as +Inf / -Inf).
2. ``_finalize_kernel`` grid (B*H,): reduces the partials in a fixed order; mean_k = fp32(sum64 / Sk);
   amax|K - mean| = max_c max(maxK_c - mean_c, mean_c - minK_c) (exactly the amax of the rounded fp32 differences,
   because rounding is monotonic); descales = amax / 448 (1.0 where amax == 0), IEEE division.
3. ``_quant_kernel``  grid (Q tiles + K tiles + V tiles, B*H), one branch per operand, each branch body a jit
   helper (the compiled path type-checks variables across if/else; the interpreter does not):
   X8 = e4m3(clamp(X / descale, +-448)), IEEE division (``tl.math.div_rn``: a plain ``/`` is div.full.f32),
   round to nearest even; writes q8 and k8 row-major (pad rows zero) and V transposed: each V program owns BLOCK
   output positions (whole 16-key groups), gathers the V rows key_order(p) (each row a contiguous D vector, so
   loads stay coalesced), quantizes, transposes in registers (``tl.trans``) and stores feature-major rows.

Why float64 for the K sum: a sum of bf16/fp16 values in float64 is exact (unless a channel spans > ~30 binades),
so the mean does not depend on the reduction order and the torch reference matches bit for bit.

Importing this module imports triton; ``TRITON_INTERPRET=1`` (set before the import) runs the kernels on CPU
tensors. The interpreter (triton 3.9) rounds fp32 -> e4m3 wrongly when the mantissa carries into the exponent
(125.1 -> 64), so in interpreter mode the kernel rounds to the e4m3 grid in fp32 itself first (``MANUAL_RNE``);
on the GPU the hardware ``cvt.rn.satfinite.e4m3x2.f32`` does it.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

# Launch configuration (tunable; benchmarks/prep_check.py sweeps a few). BLOCK values must divide 128 and be
# multiples of 16 (whole key groups).
STATS_CHUNK = 512
STATS_BLOCK = 16
STATS_WARPS = 4
QUANT_BLOCK = 64
QUANT_WARPS = 4
FINALIZE_CB = 16


@triton.jit
def _key_for_position(p):
    # position p inside each 16-key group holds key g + 8*(e//2) + 2*quad + e%2
    g = (p // 16) * 16
    quad = (p % 16) // 4
    e = p % 4
    return g + 8 * (e // 2) + 2 * quad + (e % 2)


@triton.jit
def _abs_bits(x):
    # |x| as int32 bits: for non-negative floats the integer order is the float order, and NaN (> 0x7F800000)
    # sorts above +Inf, so an integer max of these bits is an amax that cannot drop a NaN
    return x.to(tl.int32, bitcast=True) & 0x7FFFFFFF


@triton.jit
def _to_e4m3(y, MANUAL_RNE: tl.constexpr):
    y = tl.minimum(tl.maximum(y, -448.0), 448.0)
    if MANUAL_RNE:
        # round to the e4m3 grid in fp32 (round half to even), then the cast is exact
        neg = y.to(tl.int32, bitcast=True) < 0
        a = tl.abs(y)
        e = (a.to(tl.int32, bitcast=True) >> 23) - 127
        e = tl.maximum(e, -6)  # below 2^-6: subnormal spacing 2^-9
        ulp = ((e + (127 - 3)) << 23).to(tl.float32, bitcast=True)
        inv_ulp = (((127 + 3) - e) << 23).to(tl.float32, bitcast=True)
        r = a * inv_ulp  # < 16, exact
        r = (r + 8388608.0) - 8388608.0  # fp32 add rounds to an integer, half to even
        a = r * ulp
        y = tl.where(neg, -a, a)
    return y.to(tl.float8e4nv)


@triton.jit
def _stats_kernel(
    q_ptr, k_ptr, v_ptr,
    sqb, sqs, sqh, sqd,
    skb, sks, skh, skd,
    svb, svs, svh, svd,
    qpart_ptr, vpart_ptr, ksum_ptr, kmax_ptr, kmin_ptr,
    H, Sq, Sk, NCHUNK,
    D: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
):
    chunk = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    d = tl.arange(0, D).to(tl.int64)
    q_base = q_ptr + b * sqb + h * sqh
    k_base = k_ptr + b * skb + h * skh
    v_base = v_ptr + b * svb + h * svh

    acc_q = tl.zeros([BLOCK, D], dtype=tl.int32)  # |x| bits, see _abs_bits
    acc_v = tl.zeros([BLOCK, D], dtype=tl.int32)
    acc_kmax = tl.full([BLOCK, D], float("-inf"), dtype=tl.float32)
    acc_kmin = tl.full([BLOCK, D], float("inf"), dtype=tl.float32)
    acc_ksum = tl.zeros([BLOCK, D], dtype=tl.float64)

    start = chunk * CHUNK
    for i in range(0, CHUNK, BLOCK):
        rows = start + i + tl.arange(0, BLOCK)
        r64 = rows.to(tl.int64)

        mq = (rows < Sq)[:, None]
        xq = tl.load(q_base + r64[:, None] * sqs + d[None, :] * sqd, mask=mq, other=0.0).to(tl.float32)
        acc_q = tl.maximum(acc_q, _abs_bits(xq))

        mk = (rows < Sk)[:, None]
        xk = tl.load(k_base + r64[:, None] * sks + d[None, :] * skd, mask=mk, other=0.0).to(tl.float32)
        acc_ksum += xk.to(tl.float64)
        kn = _abs_bits(xk) > 0x7F800000  # NaN: counts as +Inf in the max and -Inf in the min
        acc_kmax = tl.maximum(acc_kmax, tl.where(mk, tl.where(kn, float("inf"), xk), float("-inf")))
        acc_kmin = tl.minimum(acc_kmin, tl.where(mk, tl.where(kn, float("-inf"), xk), float("inf")))

        xv = tl.load(v_base + r64[:, None] * svs + d[None, :] * svd, mask=mk, other=0.0).to(tl.float32)
        acc_v = tl.maximum(acc_v, _abs_bits(xv))

    idx = bh.to(tl.int64) * NCHUNK + chunk
    tl.store(qpart_ptr + idx, tl.max(tl.max(acc_q, axis=1), axis=0))
    tl.store(vpart_ptr + idx, tl.max(tl.max(acc_v, axis=1), axis=0))
    dd = tl.arange(0, D)
    tl.store(ksum_ptr + idx * D + dd, tl.sum(acc_ksum, axis=0))
    tl.store(kmax_ptr + idx * D + dd, tl.max(acc_kmax, axis=0))
    tl.store(kmin_ptr + idx * D + dd, tl.min(acc_kmin, axis=0))


@triton.jit
def _finalize_kernel(
    qpart_ptr, vpart_ptr, ksum_ptr, kmax_ptr, kmin_ptr,
    mean_ptr, scales_ptr,
    Sk, NCHUNK,
    D: tl.constexpr, CB: tl.constexpr, SMOOTH: tl.constexpr,
):
    bh = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, D)
    c = tl.arange(0, CB)
    s = tl.zeros([D], dtype=tl.float64)
    mx = tl.full([D], float("-inf"), dtype=tl.float32)
    mn = tl.full([D], float("inf"), dtype=tl.float32)
    aq = tl.zeros([CB], dtype=tl.int32)
    av = tl.zeros([CB], dtype=tl.int32)
    for c0 in range(0, NCHUNK, CB):
        cc = c0 + c
        m = cc < NCHUNK
        idx = bh * NCHUNK + cc
        aq = tl.maximum(aq, tl.load(qpart_ptr + idx, mask=m, other=0))
        av = tl.maximum(av, tl.load(vpart_ptr + idx, mask=m, other=0))
        offs = idx[:, None] * D + d[None, :]
        s += tl.sum(tl.load(ksum_ptr + offs, mask=m[:, None], other=0.0), axis=0)
        mx = tl.maximum(mx, tl.max(tl.load(kmax_ptr + offs, mask=m[:, None], other=float("-inf")), axis=0))
        mn = tl.minimum(mn, tl.min(tl.load(kmin_ptr + offs, mask=m[:, None], other=float("inf")), axis=0))

    if SMOOTH:
        mean = (s / Sk).to(tl.float32)
        tl.store(mean_ptr + bh * D + d, mean)
        ak = tl.maximum(mx - mean, mean - mn)
    else:
        ak = tl.maximum(mx, -mn)
    # a NaN here (a NaN or +-Inf in K made the mean NaN) must not be dropped by the max: as bits it sorts top
    amax_q = tl.max(aq, axis=0).to(tl.float32, bitcast=True)
    amax_k = tl.max(_abs_bits(ak), axis=0).to(tl.float32, bitcast=True)
    amax_v = tl.max(av, axis=0).to(tl.float32, bitcast=True)
    ds_q = tl.where(amax_q == 0.0, 1.0, tl.math.div_rn(amax_q, 448.0))
    ds_k = tl.where(amax_k == 0.0, 1.0, tl.math.div_rn(amax_k, 448.0))
    ds_v = tl.where(amax_v == 0.0, 1.0, tl.math.div_rn(amax_v, 448.0))
    tl.store(scales_ptr + bh * 3 + 0, ds_q)
    tl.store(scales_ptr + bh * 3 + 1, ds_k)
    tl.store(scales_ptr + bh * 3 + 2, ds_v)


@triton.jit
def _quant_rows(src, s_b, s_s, s_h, s_d, dst, b, h, bh64, t, S, S_pad, mean_ptr, ds,
                D: tl.constexpr, BLOCK: tl.constexpr, SUB_MEAN: tl.constexpr, MANUAL_RNE: tl.constexpr):
    # rows [t*BLOCK, (t+1)*BLOCK) of one (b, h): dst (B*H, S_pad, D) row-major; rows >= S written as zeros
    rows = t * BLOCK + tl.arange(0, BLOCK)
    r64 = rows.to(tl.int64)
    d = tl.arange(0, D).to(tl.int64)
    m = (rows < S)[:, None]
    x = tl.load(src + b * s_b + h * s_h + r64[:, None] * s_s + d[None, :] * s_d, mask=m, other=0.0)
    x = x.to(tl.float32)
    if SUB_MEAN:
        mu = tl.load(mean_ptr + bh64 * D + d)
        x = tl.where(m, x - mu[None, :], 0.0)
    y = _to_e4m3(tl.math.div_rn(x, ds), MANUAL_RNE)
    tl.store(dst + (bh64 * S_pad + r64)[:, None] * D + d[None, :], y, mask=(rows < S_pad)[:, None])


@triton.jit
def _quant_v(src, s_b, s_s, s_h, s_d, dst, b, h, bh64, t, Sk, Sk_pad, ds,
             D: tl.constexpr, BLOCK: tl.constexpr, MANUAL_RNE: tl.constexpr):
    # output positions [t*BLOCK, (t+1)*BLOCK) (whole 16-key groups) of dst (B*H, D, Sk_pad): gather the V rows
    # key_order(p), quantize, transpose in registers, store feature-major
    pos = t * BLOCK + tl.arange(0, BLOCK)
    keys = _key_for_position(pos)
    k64 = keys.to(tl.int64)
    d = tl.arange(0, D).to(tl.int64)
    m = (keys < Sk)[:, None]
    x = tl.load(src + b * s_b + h * s_h + k64[:, None] * s_s + d[None, :] * s_d, mask=m, other=0.0)
    y = _to_e4m3(tl.math.div_rn(x.to(tl.float32), ds), MANUAL_RNE)  # [BLOCK positions, D]
    yt = tl.trans(y)  # [D, BLOCK positions]
    p64 = pos.to(tl.int64)
    tl.store(dst + (bh64 * D + d)[:, None] * Sk_pad + p64[None, :], yt, mask=(pos < Sk_pad)[None, :])


@triton.jit
def _quant_kernel(
    q_ptr, k_ptr, v_ptr,
    sqb, sqs, sqh, sqd,
    skb, sks, skh, skd,
    svb, svs, svh, svd,
    q8_ptr, k8_ptr, v8t_ptr, mean_ptr, scales_ptr,
    H, Sq, Sk, Sq_pad, Sk_pad, NQ, NK,
    D: tl.constexpr, BLOCK: tl.constexpr, SMOOTH: tl.constexpr, MANUAL_RNE: tl.constexpr,
):
    t = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    bh64 = bh.to(tl.int64)
    if t < NQ:
        _quant_rows(q_ptr, sqb, sqs, sqh, sqd, q8_ptr, b, h, bh64, t, Sq, Sq_pad, mean_ptr,
                    tl.load(scales_ptr + bh64 * 3 + 0), D, BLOCK, False, MANUAL_RNE)
    elif t < NQ + NK:
        _quant_rows(k_ptr, skb, sks, skh, skd, k8_ptr, b, h, bh64, t - NQ, Sk, Sk_pad, mean_ptr,
                    tl.load(scales_ptr + bh64 * 3 + 1), D, BLOCK, SMOOTH, MANUAL_RNE)
    else:
        _quant_v(v_ptr, svb, svs, svh, svd, v8t_ptr, b, h, bh64, t - NQ - NK, Sk, Sk_pad,
                 tl.load(scales_ptr + bh64 * 3 + 2), D, BLOCK, MANUAL_RNE)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def prepare_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    smooth_k: bool,
    *,
    quant_block: int | None = None,
    quant_warps: int | None = None,
    stats_chunk: int | None = None,
    stats_block: int | None = None,
    stats_warps: int | None = None,
    out=None,
):
    """Run the three kernels on (B, S, H, D)-indexed views (any strides). Returns (q8, k8, v8t, scales, k_mean).

    ``out``: optional (q8, k8, v8t, scales) contiguous buffers to write into (checked by ``prep.fp8_prepare``).
    No input checks and no finiteness check here: ``prep.fp8_prepare`` does those.
    """
    quant_block = quant_block or QUANT_BLOCK
    quant_warps = quant_warps or QUANT_WARPS
    stats_chunk = stats_chunk or STATS_CHUNK
    stats_block = stats_block or STATS_BLOCK
    stats_warps = stats_warps or STATS_WARPS
    if 128 % quant_block or quant_block % 16:
        raise ValueError(f"quant_block must divide 128 and be a multiple of 16, got {quant_block}")
    if stats_chunk % stats_block:
        raise ValueError(f"stats_chunk {stats_chunk} must be a multiple of stats_block {stats_block}")

    B, Sq, H, D = q.shape
    Sk = k.shape[1]
    Sq_pad = _cdiv(Sq, 128) * 128
    Sk_pad = _cdiv(Sk, 32) * 32
    dev = q.device
    BH = B * H
    f8 = torch.float8_e4m3fn
    if out is not None:
        q8, k8, v8t, scales = out
    else:
        q8 = torch.empty((B, H, Sq_pad, D), dtype=f8, device=dev)
        k8 = torch.empty((B, H, Sk_pad, D), dtype=f8, device=dev)
        v8t = torch.empty((B, H, D, Sk_pad), dtype=f8, device=dev)
        scales = torch.empty((B, H, 3), dtype=torch.float32, device=dev)
    # written by the finalize kernel when smoothing; otherwise never touched (a 1-element placeholder)
    k_mean = torch.empty((B, H, D) if smooth_k else (1,), dtype=torch.float32, device=dev)

    nchunk = _cdiv(max(Sq, Sk), stats_chunk)
    qpart = torch.empty((BH, nchunk), dtype=torch.int32, device=dev)  # amax as |x| bits
    vpart = torch.empty((BH, nchunk), dtype=torch.int32, device=dev)
    ksum = torch.empty((BH, nchunk, D), dtype=torch.float64, device=dev)
    kmax = torch.empty((BH, nchunk, D), dtype=torch.float32, device=dev)
    kmin = torch.empty((BH, nchunk, D), dtype=torch.float32, device=dev)

    nq = Sq_pad // quant_block
    nk = _cdiv(Sk_pad, quant_block)
    # strides are (b, s, h, d) for each tensor: the kernels take them in that order
    sq_ = (q.stride(0), q.stride(1), q.stride(2), q.stride(3))
    sk_ = (k.stride(0), k.stride(1), k.stride(2), k.stride(3))
    sv_ = (v.stride(0), v.stride(1), v.stride(2), v.stride(3))

    ctx = torch.cuda.device(dev) if dev.type == "cuda" else _NullCtx()
    with ctx:
        _stats_kernel[(nchunk, BH)](
            q, k, v, *sq_, *sk_, *sv_,
            qpart, vpart, ksum, kmax, kmin,
            H, Sq, Sk, nchunk,
            D=D, CHUNK=stats_chunk, BLOCK=stats_block, num_warps=stats_warps,
        )
        _finalize_kernel[(BH,)](
            qpart, vpart, ksum, kmax, kmin, k_mean, scales,
            Sk, nchunk,
            D=D, CB=FINALIZE_CB, SMOOTH=bool(smooth_k), num_warps=4,
        )
        _quant_kernel[(nq + 2 * nk, BH)](
            q, k, v, *sq_, *sk_, *sv_,
            q8, k8, v8t, k_mean, scales,
            H, Sq, Sk, Sq_pad, Sk_pad, nq, nk,
            D=D, BLOCK=quant_block, SMOOTH=bool(smooth_k), MANUAL_RNE=INTERPRET, num_warps=quant_warps,
        )
    return q8, k8, v8t, scales, (k_mean if smooth_k else None)


class _NullCtx:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def compile_offline(arch: int = 90, *, dtype: str = "bf16", head_dim: int = 128, smooth_k: bool = True,
                    quant_block: int | None = None, quant_warps: int | None = None):
    """Compile the three kernels for ``sm_<arch>`` without a GPU (triton.compile + the wheel's ptxas), with the
    specializations a real launch gets (16-divisible pointers, strides and padded lengths; unit feature stride).
    Returns {kernel name: CompiledKernel} (``.asm["ptx"]``, ``.asm["cubin"]``, ``.metadata``). For tests and
    inspection (vectorized loads/stores, IEEE division, e4m3 cvt); not used at run time.
    """
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", arch, 32)
    elem = {"bf16": "*bf16", "fp16": "*fp16"}[dtype]
    div16 = {"sqb", "sqs", "sqh", "skb", "sks", "skh", "svb", "svs", "svh", "Sq_pad", "Sk_pad"}
    unit = {"sqd", "skd", "svd"}
    ptr_types = {
        "q_ptr": elem, "k_ptr": elem, "v_ptr": elem,
        "qpart_ptr": "*i32", "vpart_ptr": "*i32", "ksum_ptr": "*fp64", "kmax_ptr": "*fp32", "kmin_ptr": "*fp32",
        "mean_ptr": "*fp32", "scales_ptr": "*fp32",
        "q8_ptr": "*fp8e4nv", "k8_ptr": "*fp8e4nv", "v8t_ptr": "*fp8e4nv",
    }

    def build(fn, consts, num_warps):
        sig, constexprs, attrs = {}, dict(consts), {}
        for i, name in enumerate(fn.arg_names):
            if name in consts:
                sig[name] = "constexpr"
            elif name in unit:
                sig[name] = "constexpr"
                constexprs[name] = 1
            else:
                sig[name] = ptr_types.get(name, "i32")
                if name in ptr_types or name in div16:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        src = ASTSource(fn, sig, constexprs=constexprs, attrs=attrs)
        return triton.compile(src, target=target, options={"num_warps": num_warps, "enable_fp_fusion": True})

    return {
        "stats": build(_stats_kernel, {"D": head_dim, "CHUNK": STATS_CHUNK, "BLOCK": STATS_BLOCK}, STATS_WARPS),
        "finalize": build(_finalize_kernel, {"D": head_dim, "CB": FINALIZE_CB, "SMOOTH": smooth_k}, 4),
        "quant": build(_quant_kernel, {"D": head_dim, "BLOCK": quant_block or QUANT_BLOCK, "SMOOTH": smooth_k,
                                       "MANUAL_RNE": False}, quant_warps or QUANT_WARPS),
    }
