"""Experimental single-pass INT8 prep (issue 20 lever 1): Q, K and V read once, no stats pass.

The shipped INT8 prep (``ditprof/kernels/prep_triton.py``) needs a stats pass first because its K mean, K descale and
V descale are per (b, h) over all keys. Here every scale is local to what one program reads, with the numerics of
``fp8_accuracy_study.py``'s row "single pass: K and V per tile, K mean of 64 keys" (as accurate as the shipped ones;
benchmarks/NOTES.md, "Session 11 (CPU): issue 20 lever 1"):

- Q: as shipped: Q' = (Q @ Rpm1) / D, one descale per row = amax/127 (1.0 for a zero row), codes
  int8(clamp(rne(Q' / descale), +-127)); ``q_scales`` (B, H, Sq_pad), pad rows: codes 0, descale 1.0.
- K: mu = fp32(sum_fp64(K[idx_i]) / n) over the n = min(64, Sk) sampled keys idx_i = i * Sk // n of the (b, h)
  (exact for 16-bit inputs, so every program computes the same mu without talking to the others);
  mu' = fp32(sum_fp64(mu_c * Rpm1[c, :])); K' = fp32(K @ Rpm1) - mu'; one descale per kernel key tile of TILE = 160
  keys (tile j = keys [160 j, 160 j + 160)): amax over the tile's valid keys / 127 (1.0 for 0); pad rows zero.
  ``k_tile_scales`` (B, H, n_tiles), n_tiles = ceil(Sk_pad / 160); ``k_mean`` (B, H, D) = mu (unrotated basis).
- V: e4m3 codes with one descale per 160-key tile = amax|V| / 448 (1.0 for 0) in ``v_tile_scales``; ``v8t``
  (B, H, D, Sk_pad) in the kernel's key order, as shipped (a 160-key tile is 10 whole 16-key groups, so the key
  order permutes inside tiles only: positions [160 j, 160 j + 160) hold exactly the keys of tile j).
- ``flags`` int32 x 3: sticky non-finite flags of q, k, v (set when a Q row descale, a K tile descale or a V tile
  descale is not finite; never cleared here).

Programs (one grid; ``SPLIT_V`` gives V its own launch):
- Q programs: Q_ROWS rows each, Q_BLOCK rows per ``tl.dot`` with the +-1 matrix (loaded once per program), the next
  block's load issued before the current block's rotation (as the shipped prep's QK_PREFETCH).
- K programs: K_TILES whole 160-key tiles each. Each first computes mu and mu' for itself (64 sampled rows, from
  L2 after the first program of the (b, h); D / MEAN_CB steps of a [64, MEAN_CB] float64 sum and a [MEAN_CB, D]
  float64 product with rows of Rpm1), then per tile: Triton shapes are powers of two, so a tile is 5 blocks of
  SUB = 32 rows. ``K_TWO_PASS=False``: the 5 rotated blocks stay in registers (5 x 32 x D fp32: 80 registers per
  thread at D = 128 and 8 warps) until the tile's amax is known; ``True``: a first sweep rotates the 5 blocks for
  the amax only, a second loads (L1/L2 hits) and rotates them again to quantize (2x the tensor-core work, few
  registers).
- V programs: one 160-key tile each (5 blocks of 32 positions gathered in key order, kept in registers in the input
  dtype), the amax, then codes stored transposed as the shipped prep does.
The rotating programs keep the rotation matrix in shared memory; V's do not need it, and the shipped prep measured
that sharing a launch caps V's occupancy (its SPLIT_V), hence ``SPLIT_V = True``; ``False`` is one launch.

Division and rounding are the shipped prep's jit helpers (Markstein division = the IEEE quotient, ``_to_int8``,
``_to_e4m3`` with MANUAL_RNE under the interpreter; F32DOT there, as the shipped prep). Tensor-core sums of the
rotation are not the torch reference's float64 sums: an int8 code may be one off and a Q row / K tile descale may
differ in the last bits (``test_prep_single_pass.py`` states the tolerance); V codes, V scales and k_mean are bit
for bit.

``prepare_single_pass`` runs the kernels on (B, S, H, D) views (CUDA, or CPU with TRITON_INTERPRET=1 set before
triton is imported); ``prepare_single_pass_torch`` is the torch reference; ``dequantize`` rebuilds fp32 Q', K', V;
``SinglePassPlan`` fixes the launches once (the benchmark calls it per iteration); ``compile_offline`` +
``resource_usage`` give the sm_90 build's registers, spills and shared memory without a GPU.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import torch
import triton
import triton.language as tl

from ditprof.kernels.key_order import key_order_for_positions, unpermute_keys
from ditprof.kernels.prep import FP8_MAX, int8_descale, padded_lengths, quantize_int8, rotate_qk
from ditprof.kernels.prep_triton import (
    _abs_bits,
    _device_rotation,
    _div_by_descale,
    _div_rows,
    _key_for_position,
    FixedLaunch,
    _load_rows,
    _rot_dot,
    _to_e4m3,
    _to_int8,
)
from ditprof.kernels.rotation import rotation_pm1

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

TILE = 160  # keys per kernel tile (the sm90 kernel's key tile): one K and one V descale each
SUB = 32  # rows per block inside a tile (TILE = 5 * SUB: Triton shapes are powers of two)
K_MEAN_KEYS = 64  # sampled keys of the K mean
MEAN_CB = 16  # channels per step of the K-mean computation (a [64, MEAN_CB] and a [MEAN_CB, D] float64 tile)

# knobs (module constants so that a sweep can patch them before building a plan)
K_TWO_PASS = False  # False: a K tile's 5 rotated blocks stay in registers; True: rotate twice (amax, then codes)
SPLIT_V = True  # V's programs in a launch of their own (no rotation matrix in their shared memory)
Q_ROWS = 512  # rows per Q program (a multiple of 128, the Q padding)
Q_BLOCK = 64  # rows per tl.dot in a Q program (divides 128)
K_TILES = 4  # 160-key tiles per K program (the 64-row mean and the rotation matrix are paid once per program)
# num_stages of the K programs' tile loop: None = Triton's software pipelining (the next tile's 5 blocks load into
# shared memory by cp.async during the current tile: 2 x 40 KiB at D = 128, 116 KiB in all: one CTA per SM), 1 = none
# (72 KiB: two CTAs of 8 warps per SM; sm_90 numbers in benchmarks/NOTES.md, "Single-pass INT8 prep")
K_STAGES = 1
QK_WARPS = 8  # 8: a K tile's 5 x 32 x D fp32 in registers fit (80 per thread at D = 128)
# register cap of the Q/K programs (ptxas maxnreg; None: ptxas's choice). sm_90, bf16, D = 128: uncapped 167
# registers (one 8-warp CTA per SM), capped at 128 two CTAs per SM with a 48-byte stack frame of spill slots in the
# K tile path (D = 64: 127 registers, no spills). The benchmark times both (its "no_reg_cap" setting)
QK_MAXNREG = 128
# V: 8 warps, uncapped: 124 registers at D = 128 (two CTAs, 16 warps per SM), no spills; at 4 warps ptxas takes 215
# (capped at 128 it spills 280 bytes)
V_WARPS = 8
V_MAXNREG = None
FAST_DIV = True

OUTPUT_KEYS = ("q8", "k8", "v8t", "q_scales", "k_tile_scales", "v_tile_scales", "k_mean", "flags")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def n_tiles(sk: int) -> int:
    """160-key tiles over the padded key axis (Sk_pad = ceil(Sk / 32) * 32)."""
    return _cdiv(padded_lengths(1, sk)[1], TILE)


# ---------------------------------------------------------------- kernels

@triton.jit
def _max_bits(x):
    # amax|x| of a 2-D fp32 block as int32 bits (integer max: a NaN sorts above Inf and survives)
    return tl.max(tl.max(_abs_bits(x), axis=1), axis=0)


@triton.jit
def _descale(bits, top: tl.constexpr):
    # fp32(amax / top) (IEEE), 1.0 where amax == 0; NaN / Inf stay non-finite
    amax = bits.to(tl.float32, bitcast=True)
    return tl.where(amax == 0.0, 1.0, tl.math.div_rn(amax, top))


@triton.jit
def _flag_if_nonfinite(flags_ptr, which: tl.constexpr, ds):
    # sticky flag: x - x is 0 for finite x, NaN for NaN and Inf
    tl.store(flags_ptr + which, 1, mask=(ds - ds) != 0.0)


@triton.jit
def _q_rows(src, s_b, s_s, s_h, s_d, dst, qs_ptr, flags_ptr, rot_ptr, b, h, bh64, t, S, S_pad,
            D: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, FAST: tl.constexpr, F32DOT: tl.constexpr):
    # rows [t*ROWS, (t+1)*ROWS) (< S_pad) of one (b, h): Q' = (Q @ Rpm1) / D, a descale per row, int8 codes
    d = tl.arange(0, D).to(tl.int64)
    rot = tl.load(rot_ptr + d[:, None] * D + d[None, :])
    base = src + b * s_b + h * s_h
    first = t * ROWS
    n = tl.minimum(ROWS, S_pad - first)
    end = tl.minimum(S, first + n)
    x_next = _load_rows(base, s_s, s_d, first, end, d, BLOCK)
    for i in tl.range(0, n, BLOCK):
        rows = (first + i + tl.arange(0, BLOCK)).to(tl.int64)
        x = x_next
        x_next = _load_rows(base, s_s, s_d, first + i + BLOCK, end, d, BLOCK)  # in flight during the dot
        xr = _rot_dot(x, rot, F32DOT) * (1.0 / D)  # a power of two: exact
        bits = tl.max(_abs_bits(xr), axis=1)
        amax = bits.to(tl.float32, bitcast=True)
        qs = tl.where(amax == 0.0, 1.0, tl.math.div_rn(amax, 127.0))  # pad rows (zeros): 1.0
        codes = _to_int8(_div_rows(xr, qs, FAST))
        ok = rows < S_pad
        tl.store(qs_ptr + bh64 * S_pad + rows, qs, mask=ok)
        tl.store(dst + (bh64 * S_pad + rows)[:, None] * D + d[None, :], codes, mask=ok[:, None])
        bad = tl.max((bits >= 0x7F800000).to(tl.int32), axis=0)
        tl.store(flags_ptr + 0, 1, mask=bad > 0)


@triton.jit
def _k_mean_rot(base, s_s, s_d, rot_ptr, kmean_ptr, bh64, n_write, Sk,
                D: tl.constexpr, NS: tl.constexpr, CB: tl.constexpr):
    # mu = fp32(sum_fp64(K[idx_i]) / n), idx_i = i * Sk // n, n = min(NS, Sk) (its first ``n_write`` channels
    # written to kmean_ptr: D or 0); returns mu' = fp32(sum_fp64(mu_c * Rpm1[c, :])). Exact float64 sums of
    # 16-bit values (and of the +-mu_c): the same bits in every program of the (b, h) and in the torch reference
    n = tl.minimum(Sk, NS)
    i = tl.arange(0, NS)
    idx = (i.to(tl.int64) * Sk) // n
    ok = (i < n)[:, None]
    c = tl.arange(0, CB).to(tl.int64)
    d = tl.arange(0, D).to(tl.int64)
    acc = tl.zeros([D], dtype=tl.float64)
    for c0 in range(0, D, CB):
        cc = c0 + c
        x = tl.load(base + idx[:, None] * s_s + cc[None, :] * s_d, mask=ok, other=0.0)
        mu = (tl.sum(x.to(tl.float64), axis=0) / n).to(tl.float32)  # [CB]
        tl.store(kmean_ptr + bh64 * D + cc, mu, mask=cc < n_write)
        rr = tl.load(rot_ptr + cc[:, None] * D + d[None, :]).to(tl.float64)  # rows cc of Rpm1
        acc += tl.sum(mu.to(tl.float64)[:, None] * rr, axis=0)
    return acc.to(tl.float32)


@triton.jit
def _k_centred(x, r0, Sk, rot, mu_r, SUB: tl.constexpr, F32DOT: tl.constexpr):
    # fp32(x @ Rpm1) - mu' for rows [r0, r0 + SUB); rows >= Sk zero (they leave the amax and give zero codes)
    rows = r0 + tl.arange(0, SUB)
    xr = _rot_dot(x, rot, F32DOT)
    return tl.where((rows < Sk)[:, None], xr - mu_r[None, :], 0.0)


@triton.jit
def _store_k(y, ds, dst, bh64, r0, S_pad, d, D: tl.constexpr, SUB: tl.constexpr, FAST: tl.constexpr):
    rows = (r0 + tl.arange(0, SUB)).to(tl.int64)
    tl.store(dst + (bh64 * S_pad + rows)[:, None] * D + d[None, :], _to_int8(_div_by_descale(y, ds, FAST)),
             mask=(rows < S_pad)[:, None])


@triton.jit
def _k_tile_in_registers(base, s_s, s_d, dst, bh64, r0, Sk, Sk_pad, rot, mu_r, d,
                         D: tl.constexpr, SUB: tl.constexpr, FAST: tl.constexpr, F32DOT: tl.constexpr):
    # the tile's 5 loads issue together, the 5 rotated blocks stay live until the tile's descale is known
    x0 = _load_rows(base, s_s, s_d, r0, Sk, d, SUB)
    x1 = _load_rows(base, s_s, s_d, r0 + SUB, Sk, d, SUB)
    x2 = _load_rows(base, s_s, s_d, r0 + 2 * SUB, Sk, d, SUB)
    x3 = _load_rows(base, s_s, s_d, r0 + 3 * SUB, Sk, d, SUB)
    x4 = _load_rows(base, s_s, s_d, r0 + 4 * SUB, Sk, d, SUB)
    y0 = _k_centred(x0, r0, Sk, rot, mu_r, SUB, F32DOT)
    y1 = _k_centred(x1, r0 + SUB, Sk, rot, mu_r, SUB, F32DOT)
    y2 = _k_centred(x2, r0 + 2 * SUB, Sk, rot, mu_r, SUB, F32DOT)
    y3 = _k_centred(x3, r0 + 3 * SUB, Sk, rot, mu_r, SUB, F32DOT)
    y4 = _k_centred(x4, r0 + 4 * SUB, Sk, rot, mu_r, SUB, F32DOT)
    bits = tl.maximum(tl.maximum(tl.maximum(_max_bits(y0), _max_bits(y1)), tl.maximum(_max_bits(y2), _max_bits(y3))),
                      _max_bits(y4))
    ds = _descale(bits, 127.0)
    _store_k(y0, ds, dst, bh64, r0, Sk_pad, d, D, SUB, FAST)
    _store_k(y1, ds, dst, bh64, r0 + SUB, Sk_pad, d, D, SUB, FAST)
    _store_k(y2, ds, dst, bh64, r0 + 2 * SUB, Sk_pad, d, D, SUB, FAST)
    _store_k(y3, ds, dst, bh64, r0 + 3 * SUB, Sk_pad, d, D, SUB, FAST)
    _store_k(y4, ds, dst, bh64, r0 + 4 * SUB, Sk_pad, d, D, SUB, FAST)
    return ds


@triton.jit
def _k_tile_two_pass(base, s_s, s_d, dst, bh64, r0, Sk, Sk_pad, rot, mu_r, d,
                     D: tl.constexpr, SUB: tl.constexpr, FAST: tl.constexpr, F32DOT: tl.constexpr):
    # the amax from a first rotation of the 5 blocks, then each block loaded (L1/L2) and rotated again to quantize
    bits = 0
    for s in tl.static_range(5):
        x = _load_rows(base, s_s, s_d, r0 + s * SUB, Sk, d, SUB)
        bits = tl.maximum(bits, _max_bits(_k_centred(x, r0 + s * SUB, Sk, rot, mu_r, SUB, F32DOT)))
    ds = _descale(bits, 127.0)
    for s in tl.static_range(5):
        x = _load_rows(base, s_s, s_d, r0 + s * SUB, Sk, d, SUB)
        y = _k_centred(x, r0 + s * SUB, Sk, rot, mu_r, SUB, F32DOT)
        _store_k(y, ds, dst, bh64, r0 + s * SUB, Sk_pad, d, D, SUB, FAST)
    return ds


@triton.jit
def _k_tiles(src, s_b, s_s, s_h, s_d, dst, ks_ptr, kmean_ptr, flags_ptr, rot_ptr, b, h, bh64, t, Sk, Sk_pad, NT,
             D: tl.constexpr, K_TILES: tl.constexpr, TWO_PASS: tl.constexpr, SUB: tl.constexpr, NS: tl.constexpr,
             CB: tl.constexpr, STAGES: tl.constexpr, FAST: tl.constexpr, F32DOT: tl.constexpr):
    # tiles [t*K_TILES, (t+1)*K_TILES) (< NT) of one (b, h); program 0 of the (b, h) also writes k_mean
    base = src + b * s_b + h * s_h
    d = tl.arange(0, D).to(tl.int64)
    mu_r = _k_mean_rot(base, s_s, s_d, rot_ptr, kmean_ptr, bh64, tl.where(t == 0, D, 0), Sk, D, NS, CB)
    rot = tl.load(rot_ptr + d[:, None] * D + d[None, :])
    for j in tl.range(t * K_TILES, tl.minimum((t + 1) * K_TILES, NT), num_stages=STAGES):
        if TWO_PASS:
            ds = _k_tile_two_pass(base, s_s, s_d, dst, bh64, j * 5 * SUB, Sk, Sk_pad, rot, mu_r, d, D, SUB, FAST,
                                  F32DOT)
        else:
            ds = _k_tile_in_registers(base, s_s, s_d, dst, bh64, j * 5 * SUB, Sk, Sk_pad, rot, mu_r, d, D, SUB, FAST,
                                      F32DOT)
        tl.store(ks_ptr + bh64 * NT + j, ds)
        _flag_if_nonfinite(flags_ptr, 1, ds)


@triton.jit
def _v_rows(base, s_s, s_d, p0, Sk, d, SUB: tl.constexpr):
    # the V rows stored at positions [p0, p0 + SUB): keys key_order(p), each row a contiguous D vector
    keys = _key_for_position(p0 + tl.arange(0, SUB))
    return tl.load(base + keys.to(tl.int64)[:, None] * s_s + d[None, :] * s_d, mask=(keys < Sk)[:, None], other=0.0)


@triton.jit
def _store_v(x, ds, dst, bh64, p0, Sk_pad, d, D: tl.constexpr, SUB: tl.constexpr, MANUAL_RNE: tl.constexpr,
             FAST: tl.constexpr):
    y = _to_e4m3(_div_by_descale(x.to(tl.float32), ds, FAST), MANUAL_RNE)  # [SUB positions, D]
    pos = (p0 + tl.arange(0, SUB)).to(tl.int64)
    tl.store(dst + (bh64 * D + d)[:, None] * Sk_pad + pos[None, :], tl.trans(y), mask=(pos < Sk_pad)[None, :])


@triton.jit
def _v_tile(src, s_b, s_s, s_h, s_d, dst, vs_ptr, flags_ptr, b, h, bh64, j, Sk, Sk_pad, NT,
            D: tl.constexpr, SUB: tl.constexpr, MANUAL_RNE: tl.constexpr, FAST: tl.constexpr):
    # tile j of one (b, h): positions [160 j, 160 j + 160) hold the tile's own keys (whole 16-key groups)
    base = src + b * s_b + h * s_h
    d = tl.arange(0, D).to(tl.int64)
    p0 = j * 5 * SUB
    x0 = _v_rows(base, s_s, s_d, p0, Sk, d, SUB)
    x1 = _v_rows(base, s_s, s_d, p0 + SUB, Sk, d, SUB)
    x2 = _v_rows(base, s_s, s_d, p0 + 2 * SUB, Sk, d, SUB)
    x3 = _v_rows(base, s_s, s_d, p0 + 3 * SUB, Sk, d, SUB)
    x4 = _v_rows(base, s_s, s_d, p0 + 4 * SUB, Sk, d, SUB)
    bits = tl.maximum(tl.maximum(tl.maximum(_max_bits(x0.to(tl.float32)), _max_bits(x1.to(tl.float32))),
                                 tl.maximum(_max_bits(x2.to(tl.float32)), _max_bits(x3.to(tl.float32)))),
                      _max_bits(x4.to(tl.float32)))
    ds = _descale(bits, 448.0)
    _store_v(x0, ds, dst, bh64, p0, Sk_pad, d, D, SUB, MANUAL_RNE, FAST)
    _store_v(x1, ds, dst, bh64, p0 + SUB, Sk_pad, d, D, SUB, MANUAL_RNE, FAST)
    _store_v(x2, ds, dst, bh64, p0 + 2 * SUB, Sk_pad, d, D, SUB, MANUAL_RNE, FAST)
    _store_v(x3, ds, dst, bh64, p0 + 3 * SUB, Sk_pad, d, D, SUB, MANUAL_RNE, FAST)
    _store_v(x4, ds, dst, bh64, p0 + 4 * SUB, Sk_pad, d, D, SUB, MANUAL_RNE, FAST)
    tl.store(vs_ptr + bh64 * NT + j, ds)
    _flag_if_nonfinite(flags_ptr, 2, ds)


@triton.jit
def _single_pass_kernel(
    q_ptr, k_ptr, v_ptr,
    sqb, sqs, sqh, sqd,
    skb, sks, skh, skd,
    svb, svs, svh, svd,
    q8_ptr, k8_ptr, v8t_ptr, qs_ptr, ks_ptr, vs_ptr, kmean_ptr, flags_ptr, rot_ptr,
    H, Sq, Sk, Sq_pad, Sk_pad, NT, NQ, NK,
    D: tl.constexpr, Q_ROWS: tl.constexpr, Q_BLOCK: tl.constexpr, K_TILES: tl.constexpr, TWO_PASS: tl.constexpr,
    SUB: tl.constexpr, NS: tl.constexpr, CB: tl.constexpr, K_STAGES: tl.constexpr, MANUAL_RNE: tl.constexpr,
    FAST: tl.constexpr, F32DOT: tl.constexpr, DO_QK: tl.constexpr, DO_V: tl.constexpr,
):
    # grid (NQ + NK [+ NT], B*H): Q programs, K programs, V programs (V's own launch with DO_QK = False). Each
    # branch body is a jit helper: the compiled path type-checks variables across if/else
    t = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    bh64 = bh.to(tl.int64)
    if DO_QK:
        if t < NQ:
            _q_rows(q_ptr, sqb, sqs, sqh, sqd, q8_ptr, qs_ptr, flags_ptr, rot_ptr, b, h, bh64, t, Sq, Sq_pad,
                    D, Q_ROWS, Q_BLOCK, FAST, F32DOT)
        elif t < NQ + NK:
            _k_tiles(k_ptr, skb, sks, skh, skd, k8_ptr, ks_ptr, kmean_ptr, flags_ptr, rot_ptr, b, h, bh64, t - NQ,
                     Sk, Sk_pad, NT, D, K_TILES, TWO_PASS, SUB, NS, CB, K_STAGES, FAST, F32DOT)
        else:
            if DO_V:
                _v_tile(v_ptr, svb, svs, svh, svd, v8t_ptr, vs_ptr, flags_ptr, b, h, bh64, t - NQ - NK, Sk, Sk_pad,
                        NT, D, SUB, MANUAL_RNE, FAST)
    else:
        _v_tile(v_ptr, svb, svs, svh, svd, v8t_ptr, vs_ptr, flags_ptr, b, h, bh64, t, Sk, Sk_pad, NT, D, SUB,
                MANUAL_RNE, FAST)


# ---------------------------------------------------------------- host side

_DYNAMIC = ("q_ptr", "k_ptr", "v_ptr", "q8_ptr", "k8_ptr", "v8t_ptr", "qs_ptr", "ks_ptr", "vs_ptr", "kmean_ptr",
            "flags_ptr", "rot_ptr")
_DTYPES = (torch.bfloat16, torch.float16)


def check_inputs(q, k, v) -> None:
    """One-line ValueError naming the first problem with (B, S, H, D) q, k, v (device rules included)."""
    _check_shapes(q, k, v)
    devices = {x.device for x in (q, k, v)}
    if len(devices) > 1:
        raise ValueError(f"q, k, v must be on one device, got {sorted(map(str, devices))}")
    if q.device.type == "cuda":
        return
    if q.device.type == "cpu" and INTERPRET:
        return
    if q.device.type == "cpu":
        raise ValueError("CPU tensors need the Triton interpreter (TRITON_INTERPRET=1 set before triton is "
                         "imported); use prepare_single_pass_torch")
    raise ValueError(f"the single-pass prep runs on CUDA tensors, got {q.device.type}")


def _check_shapes(q, k, v) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            raise ValueError(f"{name} must be a 4-D (B, S, H, D) tensor, got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        if x.dtype not in _DTYPES:
            raise ValueError(f"{name} must be bfloat16 or float16, got {x.dtype}")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have one shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    (B, Sq, H, D), (Bk, Sk, Hk, Dk) = q.shape, k.shape
    if (B, H, D) != (Bk, Hk, Dk):
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} differ in batch, heads or head_dim")
    if Sq < 1 or Sk < 1 or B < 1 or H < 1:
        raise ValueError(f"empty input: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if D < 16 or D > 256 or D & (D - 1):
        raise ValueError(f"head_dim must be a power of two in [16, 256] (tl.dot, the rotation), got {D}")


def _launch_options(num_warps: int, maxnreg) -> dict:
    # the interpreter takes no register cap
    return {"num_warps": num_warps, **({"maxnreg": maxnreg} if maxnreg and not INTERPRET else {})}


class SinglePassPlan:
    """The launches (one, two with ``split_v``) for one configuration (shapes, strides, dtype, knobs), computed
    once; ``launch`` pays only the launches (after the first call, the compiled launcher directly when given a
    stream; ``prep_triton.FixedLaunch``). Knobs default to the module constants."""

    def __init__(self, q, k, v, *, two_pass=None, split_v=None, k_tiles=None, q_rows=None, q_block=None,
                 qk_warps=None, v_warps=None, fast_div=None, k_stages=0):
        two_pass = K_TWO_PASS if two_pass is None else bool(two_pass)
        split_v = SPLIT_V if split_v is None else bool(split_v)
        k_tiles, q_rows, q_block = k_tiles or K_TILES, q_rows or Q_ROWS, q_block or Q_BLOCK
        qk_warps, v_warps = qk_warps or QK_WARPS, v_warps or V_WARPS
        fast_div = FAST_DIV if fast_div is None else bool(fast_div)
        k_stages = K_STAGES if k_stages == 0 else k_stages  # 0: the module's; None: Triton's default
        if q_rows % 128 or 128 % q_block or q_block < 16:
            raise ValueError(f"q_rows must be a multiple of 128 and q_block a divisor of 128 >= 16, got {q_rows}, "
                             f"{q_block}")
        check_inputs(q, k, v)
        B, Sq, H, D = q.shape
        Sk = k.shape[1]
        self.B, self.Sq, self.Sk, self.H, self.D, self.dtype = B, Sq, Sk, H, D, q.dtype
        self.Sq_pad, self.Sk_pad = padded_lengths(Sq, Sk)
        self.n_tiles = _cdiv(self.Sk_pad, TILE)
        nq, nk, nv = _cdiv(self.Sq_pad, q_rows), _cdiv(self.n_tiles, k_tiles), self.n_tiles
        if q.device.type == "cuda" and not torch.cuda.is_current_stream_capturing():
            _device_rotation(D, q.dtype, q.device)
        strides = {pre + axis: st for pre, x in (("sq", q), ("sk", k), ("sv", v))
                   for axis, st in zip("bshd", x.stride())}
        static = dict(strides, H=H, Sq=Sq, Sk=Sk, Sq_pad=self.Sq_pad, Sk_pad=self.Sk_pad, NT=self.n_tiles, NQ=nq,
                      NK=nk, D=D, Q_ROWS=q_rows, Q_BLOCK=q_block, K_TILES=k_tiles, TWO_PASS=two_pass, SUB=SUB,
                      NS=K_MEAN_KEYS, CB=min(MEAN_CB, D), K_STAGES=k_stages, MANUAL_RNE=INTERPRET, FAST=fast_div,
                      F32DOT=INTERPRET)
        grid_y = B * H
        qk_opts, v_opts = _launch_options(qk_warps, QK_MAXNREG), _launch_options(v_warps, V_MAXNREG)
        if split_v:
            self.launches = (
                FixedLaunch(_single_pass_kernel, (nq + nk, grid_y), qk_opts, dict(static, DO_QK=True, DO_V=False),
                        _DYNAMIC),
                FixedLaunch(_single_pass_kernel, (nv, grid_y), v_opts, dict(static, NQ=0, NK=0, DO_QK=False, DO_V=True),
                        _DYNAMIC),
            )
        else:
            self.launches = (FixedLaunch(_single_pass_kernel, (nq + nk + nv, grid_y), qk_opts,
                                     dict(static, DO_QK=True, DO_V=True), _DYNAMIC),)

    def shapes(self) -> dict:
        """{output name: (shape, dtype)}."""
        B, H, D, nt = self.B, self.H, self.D, self.n_tiles
        f32 = torch.float32
        return {
            "q8": ((B, H, self.Sq_pad, D), torch.int8), "k8": ((B, H, self.Sk_pad, D), torch.int8),
            "v8t": ((B, H, D, self.Sk_pad), torch.float8_e4m3fn), "q_scales": ((B, H, self.Sq_pad), f32),
            "k_tile_scales": ((B, H, nt), f32), "v_tile_scales": ((B, H, nt), f32), "k_mean": ((B, H, D), f32),
            "flags": ((3,), torch.int32),
        }

    def buffers(self, device, out: dict | None = None) -> dict:
        """The outputs (``out``'s tensors where given: contiguous, right shape, dtype and device, else a one-line
        ValueError) plus the read-only rotation matrix ``rot``. New ``flags`` are zeros (sticky: never cleared
        here)."""
        device = torch.device(device)
        out = out or {}
        unknown = set(out) - set(OUTPUT_KEYS)
        if unknown:
            raise ValueError(f"out has unknown keys {sorted(unknown)}; outputs are {', '.join(OUTPUT_KEYS)}")
        bufs = {}
        for name, (shape, dtype) in self.shapes().items():
            t = out.get(name)
            if t is None:
                t = torch.zeros(shape, dtype=dtype, device=device) if name == "flags" else \
                    torch.empty(shape, dtype=dtype, device=device)
            elif tuple(t.shape) != shape or t.dtype != dtype or t.device != device or not t.is_contiguous():
                raise ValueError(f"out[{name!r}] must be a contiguous {dtype} tensor of shape {shape} on {device}, "
                                 f"got {t.dtype} {tuple(t.shape)} on {t.device}")
            bufs[name] = t
        bufs["rot"] = _device_rotation(self.D, self.dtype, device)
        return bufs

    def launch(self, q, k, v, bufs: dict, stream: int | None = None) -> None:
        b = bufs
        values = (q, k, v, b["q8"], b["k8"], b["v8t"], b["q_scales"], b["k_tile_scales"], b["v_tile_scales"],
                  b["k_mean"], b["flags"], b["rot"])
        for launch in self.launches:
            launch(values, stream)


class _NullCtx:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def prepare_single_pass(q, k, v, *, out: dict | None = None, **knobs) -> dict:
    """The single-pass prep on (B, S, H, D) views (any strides): {q8, k8, v8t, q_scales, k_tile_scales,
    v_tile_scales, k_mean, flags} (module docstring). ``out``: some or all of those tensors to write into.
    ``knobs``: ``SinglePassPlan``'s (two_pass, split_v, k_tiles, ...)."""
    plan = SinglePassPlan(q, k, v, **knobs)
    bufs = plan.buffers(q.device, out)
    ctx = torch.cuda.device(q.device) if q.device.type == "cuda" else _NullCtx()
    with ctx:
        plan.launch(q, k, v, bufs)
    return {name: bufs[name] for name in OUTPUT_KEYS}


# ---------------------------------------------------------------- torch reference

def _tile_amax(x: torch.Tensor, nt: int) -> torch.Tensor:
    """(B, H, S, D) -> amax|x| per 160-key tile (B, H, nt); keys past S count as 0; NaN propagates."""
    rows = x.abs().amax(dim=3)
    rows = torch.nn.functional.pad(rows, (0, nt * TILE - rows.shape[2]))
    return rows.reshape(*rows.shape[:2], nt, TILE).amax(dim=3)


def _per_key(tile_scales: torch.Tensor, s: int) -> torch.Tensor:
    """(B, H, nt) -> (B, H, s, 1): each key's tile value."""
    return tile_scales.repeat_interleave(TILE, dim=2)[:, :, :s, None]


def sampled_k_mean(kh: torch.Tensor) -> torch.Tensor:
    """(B, H, Sk, D) 16-bit K -> mu (B, H, D) fp32: the float64 mean of the keys i * Sk // n, n = min(64, Sk)."""
    Sk = kh.shape[2]
    n = min(K_MEAN_KEYS, Sk)
    idx = torch.arange(n, device=kh.device) * Sk // n
    # divide by a device tensor: CUDA turns x / python_scalar into x * (1 / scalar)
    return (kh[:, :, idx].double().sum(dim=2) / torch.tensor(float(n), dtype=torch.float64, device=kh.device)).float()


def prepare_single_pass_torch(q, k, v) -> dict:
    """The reference of ``prepare_single_pass`` as torch ops (any device; float64 where the shipped reference chain
    uses it: the rotation's sums, the K mean and its rotation). Same outputs; ``flags`` from the descales."""
    _check_shapes(q, k, v)
    B, Sq, H, D = q.shape
    Sk = k.shape[1]
    Sq_pad, Sk_pad = padded_lengths(Sq, Sk)
    nt = _cdiv(Sk_pad, TILE)
    dev = q.device
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
    qr, kr = rotate_qk(qh, kh)  # fp32(Q @ Rpm1) / D, fp32(K @ Rpm1), float64 sums

    q_rows = int8_descale(qr.abs().amax(dim=3))  # (B, H, Sq)
    q8 = torch.zeros((B, H, Sq_pad, D), dtype=torch.int8, device=dev)
    q8[:, :, :Sq] = quantize_int8(qr, q_rows[..., None])
    q_scales = torch.ones((B, H, Sq_pad), dtype=torch.float32, device=dev)
    q_scales[:, :, :Sq] = q_rows

    mu = sampled_k_mean(kh)
    mu_r = (mu.double() @ rotation_pm1(D, torch.float64, dev)).float()
    kc = kr - mu_r[:, :, None, :]
    k_tile_scales = int8_descale(_tile_amax(kc, nt))
    k8 = torch.zeros((B, H, Sk_pad, D), dtype=torch.int8, device=dev)
    k8[:, :, :Sk] = quantize_int8(kc, _per_key(k_tile_scales, Sk))

    vf = vh.float()
    amax_v = _tile_amax(vf, nt)
    v_tile_scales = amax_v / torch.tensor(FP8_MAX, dtype=torch.float32, device=dev)
    v_tile_scales = torch.where(amax_v == 0, torch.ones_like(v_tile_scales), v_tile_scales)
    v8 = torch.zeros((B, H, Sk_pad, D), dtype=torch.uint8, device=dev)
    v8[:, :, :Sk] = (vf / _per_key(v_tile_scales, Sk)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(
        torch.uint8)
    perm = key_order_for_positions(torch.arange(Sk_pad, device=dev))
    v8t = v8[:, :, perm].transpose(2, 3).contiguous().view(torch.float8_e4m3fn)

    bad = [not bool(torch.isfinite(s).all()) for s in (q_rows, k_tile_scales, v_tile_scales)]
    flags = torch.tensor(bad, dtype=torch.int32, device=dev)
    return dict(q8=q8, k8=k8, v8t=v8t, q_scales=q_scales, k_tile_scales=k_tile_scales, v_tile_scales=v_tile_scales,
                k_mean=mu, flags=flags)


def dequantize(res: dict, sq: int, sk: int) -> dict:
    """Codes and scales back to fp32, unpadded, (B, H, S, D): ``q`` = Q' (rotated, / D), ``k`` = K' (rotated,
    centred by mu'), ``v`` = V in natural key order; ``k_mean`` passed through. q @ k^T = Q K^T - Q . mu per row
    up to the quantization (a per-row shift the softmax ignores)."""
    q = res["q8"][:, :, :sq].float() * res["q_scales"][:, :, :sq, None]
    k = res["k8"][:, :, :sk].float() * _per_key(res["k_tile_scales"], sk)
    v8 = unpermute_keys(res["v8t"].view(torch.uint8).transpose(2, 3), dim=2)[:, :, :sk]
    v = v8.contiguous().view(torch.float8_e4m3fn).float() * _per_key(res["v_tile_scales"], sk)
    return {"q": q, "k": k, "v": v, "k_mean": res["k_mean"]}


# ---------------------------------------------------------------- offline compile (no GPU)

def compile_offline(arch: int = 90, *, dtype: str = "bf16", head_dim: int = 128, two_pass: bool | None = None,
                    split_v: bool | None = None, k_tiles: int | None = None, qk_warps: int | None = None,
                    v_warps: int | None = None, k_stages=0, maxnreg=0) -> dict:
    """Compile the kernel(s) for ``sm_<arch>`` without a GPU (triton.compile + the wheel's ptxas) with a real
    launch's specializations (16-divisible pointers, strides and padded lengths; unit feature strides).
    ``k_stages`` / ``maxnreg``: 0 = the module's (K_STAGES; QK_MAXNREG and V_MAXNREG), else that value. Returns
    {"qk": ..., "v": ...} (``split_v``) or {"qkv": ...}: CompiledKernels (``.asm``, ``.metadata``)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    two_pass = K_TWO_PASS if two_pass is None else bool(two_pass)
    split_v = SPLIT_V if split_v is None else bool(split_v)
    elem = {"bf16": "*bf16", "fp16": "*fp16"}[dtype]
    ptrs = {"q_ptr": elem, "k_ptr": elem, "v_ptr": elem, "rot_ptr": elem, "q8_ptr": "*i8", "k8_ptr": "*i8",
            "v8t_ptr": "*fp8e4nv", "qs_ptr": "*fp32", "ks_ptr": "*fp32", "vs_ptr": "*fp32", "kmean_ptr": "*fp32",
            "flags_ptr": "*i32"}
    div16 = {"sqb", "sqs", "sqh", "skb", "sks", "skh", "svb", "svs", "svh", "Sq_pad", "Sk_pad"}
    unit = {"sqd", "skd", "svd"}
    consts = dict(D=head_dim, Q_ROWS=Q_ROWS, Q_BLOCK=Q_BLOCK, K_TILES=k_tiles or K_TILES, TWO_PASS=two_pass, SUB=SUB,
                  NS=K_MEAN_KEYS, CB=min(MEAN_CB, head_dim), K_STAGES=K_STAGES if k_stages == 0 else k_stages,
                  MANUAL_RNE=False, FAST=FAST_DIV, F32DOT=False)

    def build(extra: dict, num_warps: int, maxnreg):
        fn = _single_pass_kernel
        const = dict(consts, **extra)
        sig, constexprs, attrs = {}, dict(const), {}
        for i, name in enumerate(fn.arg_names):
            if name in const:
                sig[name] = "constexpr"
            elif name in unit:
                sig[name], constexprs[name] = "constexpr", 1
            else:
                sig[name] = ptrs.get(name, "i32")
                if name in ptrs or name in div16:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        src = ASTSource(fn, sig, constexprs=constexprs, attrs=attrs)
        opts = dict(_launch_options(num_warps, maxnreg), enable_fp_fusion=True)
        return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=opts)

    qw, vw = qk_warps or QK_WARPS, v_warps or V_WARPS
    qr, vr = (QK_MAXNREG, V_MAXNREG) if maxnreg == 0 else (maxnreg, maxnreg)
    if split_v:
        return {"qk": build({"DO_QK": True, "DO_V": False}, qw, qr),
                "v": build({"DO_QK": False, "DO_V": True}, vw, vr)}
    return {"qkv": build({"DO_QK": True, "DO_V": True}, qw, qr)}


def resource_usage(kernel) -> dict:
    """{registers, stack_bytes, spill_bytes, shared_bytes, num_warps} of an offline-compiled kernel: registers, the
    per-thread stack frame (where ptxas puts spill slots: 0 for every uncapped build here) and other local memory
    from ``cuobjdump -res-usage`` of its cubin (the wheel's cuobjdump), shared memory from Triton's metadata (the
    dynamic allocation)."""
    from triton.backends.nvidia import compiler as nv

    tool = Path(nv.__file__).resolve().parent / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(kernel.asm["cubin"])
        text = subprocess.run([str(tool), "-res-usage", str(path)], check=True, capture_output=True,
                              text=True).stdout
    fields = dict(item.split(":", 1) for line in text.splitlines() if "REG:" in line for item in line.split())
    return {"registers": int(fields["REG"]), "spill_bytes": int(fields["LOCAL"]),
            "stack_bytes": int(fields["STACK"]), "shared_bytes": int(kernel.metadata.shared),
            "num_warps": int(kernel.metadata.num_warps)}


OFFLINE_SETTINGS = {  # name: compile_offline keywords (the default first)
    "default": {},
    "two_pass": {"two_pass": True},
    "pipelined": {"k_stages": None},
    "no_cap": {"maxnreg": None},
    "v_4_warps_capped": {"v_warps": 4, "maxnreg": 128},
    "one_launch": {"split_v": False},
}


def offline_table(arch: int = 90) -> list[dict]:
    """Registers, spills and shared memory of each kernel of each OFFLINE_SETTINGS entry, bf16, D = 128 and 64."""
    rows = []
    for D in (128, 64):
        for name, kw in OFFLINE_SETTINGS.items():
            for kernel, compiled in compile_offline(arch, head_dim=D, **kw).items():
                ptx = compiled.asm["ptx"]
                mma = "wgmma" if "wgmma.mma_async" in ptx else ("mma.sync" if "mma.sync" in ptx else "-")
                rows.append({"head_dim": D, "setting": name, "kernel": kernel, "mma": mma,
                             **resource_usage(compiled)})
    return rows


def main() -> int:
    """Print the offline-compile numbers (sm_90, bf16) of each setting."""
    for r in offline_table():
        print(f"D={r['head_dim']:<4} {r['setting']:16} {r['kernel']:4} regs {r['registers']:3}  stack (spills) "
              f"{r['stack_bytes']:4} B  local {r['spill_bytes']} B  smem {r['shared_bytes'] / 1024:6.1f} KiB  "
              f"warps {r['num_warps']}  {r['mma']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
