"""Triton kernels of the FP8 prep (see ``prep.py`` for the contract).

Two launches in e4m3 mode (three in INT8 mode, below), all deterministic (the one atomic counts arrivals; no value is
accumulated atomically):

1. ``_stats_kernel``  grid (Q chunks + K chunks + V chunks, B*H): each program reads CHUNK tokens of ONE operand
   of one (b, h) and writes partials: amax|Q| or amax|V| (as int32 bits of |x|: an integer max keeps NaN, which
   sorts above Inf), or per channel of K: sum (float64), max and min (fp32; NaN/Inf show up in the sum).
   Memory parallelism: each iteration loads R sub-tiles of [W, D] (W rows span the CTA once with 16-byte loads),
   unrolled (``tl.static_range``) and unmasked (only a ragged last iteration clamps its row indices onto the
   chunk's last row: a duplicate row changes no max/min; the K sum masks it), so all R loads of a thread are in
   flight together; each is folded elementwise into [W, D] accumulators (no reductions, no shared memory in the
   loop). Q/V amax runs on the raw 16-bit patterns (signed and unsigned max, 16x2 at a time); K's max/min in
   fp32 (exact); K's sum in float64. Then each program counts itself done on its (b, h)'s counter; the last one
   runs the finalize for that (b, h) (``_finalize_bh``) and resets the counter (one launch, and its host time,
   less than a separate finalize kernel):
   the finalize reduces the partials in a fixed order; mean_k = fp32(sum64 / n) (n = Sk, or with ``key_lens``
   the item's own key count: its K and V stats cover only those rows);
   amax|K - mean| = max_c max(maxK_c - mean_c, mean_c - minK_c) (exactly the amax of the rounded fp32 differences,
   because rounding is monotonic); a non-finite K sum (K holds a NaN or Inf) makes amax_k NaN;
   descales = amax / 448 (1.0 where amax == 0), IEEE division; a non-finite descale also sets a sticky flag for
   q, k or v (``flags``, int32 x 3: what ``kernels.finite_checks`` reads instead of every call's descales).
2. ``_quant_kernel``  grid (Q tiles + K tiles + V tiles, B*H), one branch per operand, each branch body a jit
   helper (the compiled path type-checks variables across if/else; the interpreter does not):
   X8 = e4m3(clamp(X / descale, +-448)), round to nearest even (V: e4m3(clamp(V * RN(1 / descale), +-448)), see
   ``prep.quantize_v_e4m3``); writes q8 and k8 row-major (pad rows zero) and V
   transposed: each V program owns BLOCK output positions (whole 16-key groups), gathers the V rows key_order(p)
   (each row a contiguous D vector, so loads stay coalesced), quantizes, transposes in registers (``tl.trans``)
   and stores feature-major rows.

INT8 Q/K mode (``qk_int8=True``; ``prep.py`` has the contract): the stats launch has no Q programs (Q's scales are
per token); its K programs take the same per-channel sum/max/min of K' = K @ Rpm1 (``tl.dot`` of 16- or 32-row
tiles, ``stats_rot_rows_for``, with the +-1 matrix ``rot``, passed in the inputs' dtype, fp32 accumulation; the
tiles folded elementwise, the sum in fp32 per program until its row reduction), and the finalize writes mu' (rotated,
``k_mean_rot``, for the quantize pass), the reported mean mu' @ Rpm1^T / D (float64 sum: the torch chain's value
for the same mu') and descale_k = amax / 127. The quantize launch's Q and K programs take ``qk_rows`` rows each
(the rotation matrix loaded to shared memory once per program), ``qk_block`` rows per ``tl.dot``: Q' = (Q @ Rpm1) / D
with a descale per row (integer max of the |x| bits, so a NaN row stays NaN; a non-finite row sets Q's sticky flag
and NaN in scales[b, h, 0], which is how every finiteness check sees Q in this mode), K' - mu' with the per-head
descale; codes int8(clamp(rne(X' * RN(1 / descale)), +-127)) (``qk_recip``; without it the correctly rounded
quotient below, per row for Q). V's programs are the e4m3 mode's, in a launch of their own (``split_v``: the
rotating programs' shared memory would cap V's occupancy too), and the rotating loops load the next row block
before they rotate the current one (``qk_prefetch``). Tensor-core sums are not the torch chain's float64 sums: a
code may be one off (tests/test_prep_int8.py states the tolerance). Under the interpreter the dot runs in fp32
(``F32DOT``: its numpy dot mishandles bf16).

Fused prologue (INT8 Q/K with the prep's Q; ``PrepPlan(prologue=spec, pro_groups=G)``, ``launch(pro=(wq, wk, cos,
sin, text_rows))``): q and k are the projections' raw rows, and every Q/K tile the rotating loops load (the K stats
pass and the Q/K quantize pass) first goes through ``_prologue_rows``: the processor's per-head RMSNorm with its
weight (G = 2: rows below ``text_rows`` take row 0) and RoPE over the first R channels, in fp32, rounded once to the
inputs' dtype, as ``prologue.prologue_torch``; the RoPE partner of a channel is a register swap (interleaved) or
two shifted loads of the same rows (half), and the rotary table comes as one (cos, sin) per rotated pair
(``prologue.pair_tables``, (S, R/2) float32 each).
The rest is unchanged. ``rms_across`` (PRO_NORM 2, Wan's norm over all heads): the row factors come computed
(``prologue.row_factors``, (B, S) float32 each for q and k, ``rsq_ptr``/``rsk_ptr``) and are loaded per row in
place of the per-head reduction, and the weight is (H, D): the kernels offset both pointers to the program's batch
item and head. The constexprs PRO, PRO_NORM (0 none, 1 per head, 2 across heads), PRO_ROPE (0 none, 1 half, 2
interleaved), PRO_R, PRO_G2 gate it; without a prologue its pointers and scalars are None (constexpr), and so are the
row-factor pointers of every norm but ``rms_across``, so those builds are the code they were.
``text_rows`` is never specialised on (``do_not_specialize``): a plan's compiled launch serves every value.

The division X / descale of Q and K (e4m3 mode; INT8 without ``qk_recip``) is the IEEE (correctly rounded) fp32
quotient, computed without a divide per element (``_div_by_descale``): inv = RN(1 / descale) once per program, q =
RN(x * inv), then two Markstein corrections q <- RN(q + RN(x - q * descale) * inv) (fma). After the first, q is within
one ulp of x / descale; Markstein's theorem (inv within half an ulp of 1/descale, q within an ulp) makes the second
exactly RN(x / descale). The corrections can turn a -0 quotient into +0, so the sign bit of x is ORed back in (the
quotient's sign is x's). Valid without underflow of the remainder: for descale < 1e-26 (amax < ~4.5e-24) the program
takes ``tl.math.div_rn`` (a plain ``/`` would be div.full.f32, not IEEE). tests/test_prep.py checks the sequence
against the exact quotient on every bf16 and fp16 value. The explicit +-448 clamp is left to the conversion on the GPU
(``cvt.rn.satfinite.e4m3x2.f32`` saturates to 448 exactly as the clamp would).

Why float64 for the K sum: a sum of bf16/fp16 values in float64 is exact (unless a channel spans > ~30 binades),
so the mean does not depend on the reduction order and the torch reference matches bit for bit.

Launch configuration: a ``fp8_config.PrepConfig`` (frozen; its defaults are what ships), passed to ``PrepPlan``,
``prepare_triton`` and ``compile_offline``. Its fields (benchmarks/NOTES.md has the measurements behind each
default; benchmarks/prep_check.py and the INT8 sweep time alternatives):

- ``stats_chunk`` rows per stats program; ``stats_r`` rows per thread per stats iteration (16-byte loads in
  flight); ``stats_warps``, ``quant_warps`` the launches' warps; ``quant_block`` rows (positions for V) per e4m3
  quantize program: divides 128 and is a multiple of 16 (whole key groups); ``finalize_cb`` chunks per finalize
  step.
- ``stats_programs_per_sm`` (INT8 Q/K): the stats chunk halves (down to 128 rows) while the K and V stats grid has
  fewer programs per SM than this, because each K program rotates its chunk serially, so a grid under a few waves is
  latency-bound (0: always ``stats_chunk``).
- ``stats_rot_rows``: rows of the stats pass's rotated K tiles, 16 or 32 (0: ``stats_rot_rows_for`` picks: 16 at
  head_dim >= 128 once the stats grid has ``stats_rot16_programs_per_sm`` programs per SM, where the smaller
  accumulators double the programs per SM and the grid streams in many waves; 32 in a grid of a few waves, where
  each program's serial loop is the latency, and at head_dim 64).
- ``qk_rows`` rows per INT8 Q/K quantize program (the rotation matrix is loaded once per program), ``qk_block``
  rows per ``tl.dot`` there; ``qk_stages`` those loops' ``tl.range`` num_stages (1: deeper pipelining failed to
  compile in Triton's pipeliner).
- ``split_v``, ``qk_prefetch``: the INT8 work layout above (the other layouts measured slower).
- ``fast_div``: the Markstein division above (False: ``tl.math.div_rn`` per element).
- ``qk_recip``: INT8 Q/K codes from X' * RN(1 / descale) (one FMUL, or one FFMA with K's mean folded in) instead of
  the correctly rounded quotient (five FMAs and a sign fix per element): the two differ by at most one fp32 ulp
  before the integer rounding, so a code moves only where X' / descale lands within an ulp of a half-integer --
  inside the INT8 contract's "a code may be one off"; the rotating programs are issue-bound, not byte-bound. V's
  e4m3 codes are always v * RN(1 / descale): the torch chain (``prep.quantize_v_e4m3``) computes them the same
  way, so they stay bit for bit.
- ``stats_v_mult`` (INT8 Q/K): V amax programs of this many K chunks each (fewer, longer V programs beside the
  rotating K programs, which are the launch's latency); ``stats_v_first`` puts them at the front of the grid.
- ``prologue_qk_block``, ``prologue_stats_rot_rows``: ``qk_block`` and ``stats_rot_rows`` of a plan with the fused
  prologue (``build_config``): its fp32 rows, partners and RoPE tables live beside the tiles, and at 64 / 32 rows
  the kernels ran out of registers (spills).
- ``stats_rot_tail``: the stats pass's rotating K loop folds the chunk's whole tiles without per-element row masks
  and masks only a ragged last tile (fewer instructions per tile, same bits; the same split in the K quantize loop
  measured slower).

Importing this module imports triton; ``TRITON_INTERPRET=1`` (set before the import) runs the kernels on CPU
tensors. The interpreter (triton 3.9) rounds fp32 -> e4m3 wrongly when the mantissa carries into the exponent
(125.1 -> 64), so in interpreter mode the kernel rounds to the e4m3 grid in fp32 itself first (``MANUAL_RNE``);
on the GPU the hardware ``cvt.rn.satfinite.e4m3x2.f32`` does it.
"""

from __future__ import annotations

import dataclasses
import os

import torch
import triton
import triton.language as tl

from ditprof.kernels.fp8_config import PrepConfig
from ditprof.kernels.prep_layout import padded_lengths
from ditprof.kernels.prologue import PrologueSpec, norm_groups
from ditprof.kernels.rotation import rotation_pm1
from ditprof.kernels.triton_launch import FixedLaunch, sm_count

# Triton's own switch, read once here as Triton reads it: interpreted kernels need the fp32 workarounds below
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

_INT_MIN = tl.constexpr(-2147483648)


@triton.jit
def _key_for_position(p):
    # the device-side twin of key_order.key_order_for_positions (Triton cannot call it): position p inside each
    # 16-key group holds key g + 8*(e//2) + 2*quad + e%2; the prep's tests compare the V layout with key_order
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
    if MANUAL_RNE:
        y = tl.minimum(tl.maximum(y, -448.0), 448.0)
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
    # on the GPU: cvt.rn.satfinite.e4m3x2.f32 saturates |y| > 448 to 448, which is what the clamp gives
    return y.to(tl.float8e4nv)


@triton.jit
def _refined_quotient(x, inv, ds):
    # RN(x / ds) from inv = RN(1 / ds): two Markstein steps, then x's sign on a zero quotient (module docstring)
    q = x * inv
    q = tl.fma(tl.fma(-q, ds, x), inv, q)
    q = tl.fma(tl.fma(-q, ds, x), inv, q)
    return (q.to(tl.int32, bitcast=True) | (x.to(tl.int32, bitcast=True) & _INT_MIN)).to(tl.float32, bitcast=True)


@triton.jit
def _div_by_descale(x, ds, FAST: tl.constexpr):
    # RN(x / ds) for fp32 x and a positive per-program scalar ds (see the module docstring)
    if FAST:
        if ds >= 1e-26:
            y = _refined_quotient(x, tl.math.div_rn(1.0, ds), ds)
        else:
            y = tl.math.div_rn(x, ds)
    else:
        y = tl.math.div_rn(x, ds)
    return y


# ---------------------------------------------------------------- stats

# (the casts back: triton 3.6 computes a bf16 maximum in fp32; exact, since the result is one of the operands)
@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b).to(a.dtype)


@triton.jit
def _min_combine(a, b):
    return tl.minimum(a, b).to(a.dtype)


@triton.jit
def _amax_tile(base, s_s, s_d, acc_s, acc_u, start, i, end, MASKED: tl.constexpr,
               D: tl.constexpr, R: tl.constexpr, W: tl.constexpr):
    # R sub-tiles of W rows (unrolled: one basic block, so all R 16-byte loads of a thread issue together).
    # 16-bit inputs as raw bits: the signed max finds the largest non-negative value (if any), the unsigned max
    # the largest-magnitude negative one (if any); no per-element masking, and both maxes run on 16x2 pairs
    d = tl.arange(0, D).to(tl.int64)[None, :]
    for r in tl.static_range(R):
        rows = start + i + r * W + tl.arange(0, W)
        if MASKED:
            rows = tl.minimum(rows, end - 1)  # a duplicate row changes no max
        x = tl.load(base + rows.to(tl.int64)[:, None] * s_s + d * s_d)
        acc_s = _max_combine(acc_s, x.to(tl.int16, bitcast=True))
        acc_u = _max_combine(acc_u, x.to(tl.uint16, bitcast=True))
    return acc_s, acc_u


@triton.jit
def _stats_amax(src, s_b, s_s, s_h, s_d, part_ptr, b, h, bh64, c, S, NC,
                D: tl.constexpr, CHUNK: tl.constexpr, R: tl.constexpr, W: tl.constexpr):
    # amax|x| (stored as fp32 |x| bits: NaN sorts above Inf) over rows [c*CHUNK, min((c+1)*CHUNK, S)) of one (b, h)
    base = src + b * s_b + h * s_h
    start = c * CHUNK
    end = tl.minimum(start + CHUNK, S)
    acc_s = tl.full([W, D], -32768, dtype=tl.int16)
    acc_u = tl.zeros([W, D], dtype=tl.uint16)
    for i in range(0, CHUNK, R * W):  # constant trip count; tiles at or past `end` are skipped
        if start + i + R * W <= end:
            acc_s, acc_u = _amax_tile(base, s_s, s_d, acc_s, acc_u, start, i, end, False, D, R, W)
        elif start + i < end:
            acc_s, acc_u = _amax_tile(base, s_s, s_d, acc_s, acc_u, start, i, end, True, D, R, W)
    ms = tl.reduce(tl.reduce(acc_s, 1, _max_combine), 0, _max_combine)
    mu = tl.reduce(tl.reduce(acc_u, 1, _max_combine), 0, _max_combine)
    dt = src.dtype.element_ty
    a_s = _abs_bits(ms.to(dt, bitcast=True).to(tl.float32))
    a_u = _abs_bits(mu.to(dt, bitcast=True).to(tl.float32))
    tl.store(part_ptr + bh64 * NC + c, tl.maximum(a_s, a_u))


@triton.jit
def _k_tile(base, s_s, s_d, acc_sum, acc_max, acc_min, start, i, end, MASKED: tl.constexpr,
            D: tl.constexpr, R: tl.constexpr, W: tl.constexpr):
    d = tl.arange(0, D).to(tl.int64)[None, :]
    for r in tl.static_range(R):
        rows = start + i + r * W + tl.arange(0, W)
        if MASKED:
            rc = tl.minimum(rows, end - 1)  # a duplicate row changes no max/min; the sum masks it
        else:
            rc = rows
        x = tl.load(base + rc.to(tl.int64)[:, None] * s_s + d * s_d).to(tl.float32)
        # NaN is ignored by the max/min here and caught by the sum in the finalize
        acc_max = tl.maximum(acc_max, x)
        acc_min = tl.minimum(acc_min, x)
        xs = x.to(tl.float64)
        if MASKED:
            xs = tl.where((rows < end)[:, None], xs, 0.0)
        acc_sum += xs
    return acc_sum, acc_max, acc_min


@triton.jit
def _stats_k(src, s_b, s_s, s_h, s_d, ksum_ptr, kmax_ptr, kmin_ptr, b, h, bh64, c, S, NC,
             D: tl.constexpr, CHUNK: tl.constexpr, R: tl.constexpr, W: tl.constexpr):
    # per channel of K over rows [c*CHUNK, min((c+1)*CHUNK, S)): sum (float64: exact, and non-finite iff some
    # value is), max and min
    base = src + b * s_b + h * s_h
    start = c * CHUNK
    end = tl.minimum(start + CHUNK, S)
    acc_sum = tl.zeros([W, D], dtype=tl.float64)
    acc_max = tl.full([W, D], float("-inf"), dtype=tl.float32)
    acc_min = tl.full([W, D], float("inf"), dtype=tl.float32)
    for i in range(0, CHUNK, R * W):
        if start + i + R * W <= end:
            acc_sum, acc_max, acc_min = _k_tile(base, s_s, s_d, acc_sum, acc_max, acc_min, start, i, end, False,
                                                D, R, W)
        elif start + i < end:
            acc_sum, acc_max, acc_min = _k_tile(base, s_s, s_d, acc_sum, acc_max, acc_min, start, i, end, True,
                                                D, R, W)
    dd = tl.arange(0, D)
    off = (bh64 * NC + c) * D + dd
    tl.store(ksum_ptr + off, tl.sum(acc_sum, axis=0))
    tl.store(kmax_ptr + off, tl.max(acc_max, axis=0))
    tl.store(kmin_ptr + off, tl.min(acc_min, axis=0))


@triton.jit
def _rot_dot(x, rot, F32DOT: tl.constexpr):
    # X @ Rpm1 with fp32 accumulation: on the GPU a bf16/fp16 tensor-core dot; under the interpreter in fp32 (its
    # numpy dot mishandles bf16 operands; fp32 products of 16-bit values are exact, so only the order differs)
    if F32DOT:
        y = tl.dot(x.to(tl.float32), rot.to(tl.float32), input_precision="ieee", out_dtype=tl.float32)
    else:
        y = tl.dot(x, rot, out_dtype=tl.float32)
    return y


@triton.jit
def _load_rows(base, s_s, s_d, first, end, d, ROWS: tl.constexpr):
    # rows [first, first + ROWS) of one (b, h), zeros from ``end`` on (a fully masked load reads no memory)
    rows = first + tl.arange(0, ROWS)
    return tl.load(base + rows.to(tl.int64)[:, None] * s_s + d[None, :] * s_d, mask=(rows < end)[:, None],
                   other=0.0)


@triton.jit
def _prologue_weight(w_ptr, c, rows, text_rows, D: tl.constexpr, G2: tl.constexpr):
    # the norm weight of channels c (int64 [D]) as fp32, [1, D]; G2: [ROWS, D], row 0 for rows < text_rows,
    # else row 1
    w = tl.load(w_ptr + c).to(tl.float32)[None, :]
    if G2:
        w1 = tl.load(w_ptr + D + c).to(tl.float32)[None, :]
        w = tl.where((rows < text_rows)[:, None], w, w1)
    return w


@triton.jit
def _rotate_half_partner(n, base, s_s, s_d, rows, ok, d, rs, w_ptr, text_rows, D: tl.constexpr, NORM: tl.constexpr,
                         R: tl.constexpr, G2: tl.constexpr):
    # the "half" form's partner of every channel d < R, normed like n: d < R/2 takes d + R/2, d in [R/2, R) takes
    # d - R/2. R/2 need not divide D (96 of 128), so the partner is two loads of the same rows shifted by +-R/2
    # (each a contiguous run: vector loads, cache hits), not a gather at computed channels.
    lo = d < R // 2
    row_off = rows.to(tl.int64)[:, None] * s_s
    x_hi = tl.load(base + row_off + (d + R // 2)[None, :] * s_d, mask=ok & lo[None, :], other=0.0)
    x_lo = tl.load(base + row_off + (d - R // 2)[None, :] * s_d, mask=ok & (~lo & (d < R))[None, :], other=0.0)
    np_ = tl.where(lo[None, :], x_hi, x_lo).to(tl.float32)
    if NORM:
        p = tl.where(lo, d + R // 2, tl.where(d < R, d - R // 2, d))
        np_ = np_ * rs * _prologue_weight(w_ptr, p, rows, text_rows, D, G2)
    return tl.where(lo[None, :], -np_, np_)


@triton.jit
def _rotate_interleaved(n, ROWS: tl.constexpr, D: tl.constexpr):
    # the "interleaved" form's rotate(n) in registers: channel 2i takes -n[2i + 1], 2i + 1 takes n[2i] (a pair
    # sits in one thread's registers, so the swap moves no data between threads)
    even, odd = tl.split(tl.reshape(n, [ROWS, D // 2, 2]))
    return tl.reshape(tl.join(-odd, even), [ROWS, D])


@triton.jit
def _prologue_rows(x, base, s_s, s_d, first, end, d, ROWS: tl.constexpr, w_ptr, cos_ptr, sin_ptr, text_rows, eps,
                   D: tl.constexpr, NORM: tl.constexpr, ROPE: tl.constexpr, R: tl.constexpr, G2: tl.constexpr,
                   INTERP: tl.constexpr, rs_ptr=None):
    # the fused prologue (kernels/prologue.py, ``prologue_torch``) on rows [first, first + ROWS) of one (b, h), x
    # as ``_load_rows`` gave it (zeros from ``end`` on), d the channels (int64): per row in fp32,
    # n = x * 1/sqrt(mean(x^2) + eps) * w, then on channels < R  n * cos + rotate(n) * sin, one rounding to x's
    # dtype. rotate(n): in registers for "interleaved" (``_rotate_interleaved``), from two shifted loads of the
    # same rows for "half" (``_rotate_half_partner``); either way normed with the same per-row factor, the same
    # arithmetic. NORM 2 (``rms_across``): the factor of each row is loaded from rs_ptr (this batch item's (S,)
    # row factors) instead, and w_ptr is this head's weight row (the caller offsets both). Rows >= end stay exact
    # zeros. INTERP: the interpreter (triton 3.9) truncates fp32 -> bf16, so
    # there the bits are rounded to nearest even first.
    rows = first + tl.arange(0, ROWS)
    ok = (rows < end)[:, None]
    n, rs = _prologue_norm(x, rows, end, d, w_ptr, text_rows, eps, ROWS, D, NORM, G2, rs_ptr)
    rot, c, sn = n, n, n  # placeholders: without RoPE none of them is read
    if ROPE != 0:
        rot = _prologue_rotate(n, base, s_s, s_d, rows, ok, d, rs, w_ptr, text_rows, ROWS, D, NORM, ROPE, R, G2)
        c, sn = _rope_rows(cos_ptr, sin_ptr, rows, ok, d, ROWS, D, ROPE, R)
    return _prologue_combine(x, n, rot, c, sn, ok, d, D, ROPE, R, INTERP)


@triton.jit
def _prologue_norm(x, rows, end, d, w_ptr, text_rows, eps, ROWS: tl.constexpr, D: tl.constexpr,
                   NORM: tl.constexpr, G2: tl.constexpr, rs_ptr):
    # the prologue's RMSNorm of x's rows in fp32: (n, the per-row factor rs [ROWS, 1]; 1 without a norm)
    n = x.to(tl.float32)
    rs = tl.full([ROWS, 1], 1.0, tl.float32)
    if NORM:
        if NORM == 2:
            rs = tl.load(rs_ptr + rows, mask=rows < end, other=0.0)[:, None]
        else:
            ms = tl.sum(n * n, axis=1) * (1.0 / D)  # 1 / D: a power of two
            rs = tl.math.div_rn(1.0, tl.math.sqrt_rn(ms + eps))[:, None]
        n = n * rs * _prologue_weight(w_ptr, d, rows, text_rows, D, G2)
    return n, rs


@triton.jit
def _prologue_rotate(n, base, s_s, s_d, rows, ok, d, rs, w_ptr, text_rows, ROWS: tl.constexpr, D: tl.constexpr,
                     NORM: tl.constexpr, ROPE: tl.constexpr, R: tl.constexpr, G2: tl.constexpr):
    # rotate(n) of the RoPE form ROPE (1 "half", 2 "interleaved")
    if ROPE == 1:
        rot = _rotate_half_partner(n, base, s_s, s_d, rows, ok, d, rs, w_ptr, text_rows, D, NORM, R, G2)
    else:
        rot = _rotate_interleaved(n, ROWS, D)
    return rot


@triton.jit
def _rope_rows(cos_ptr, sin_ptr, rows, ok, d, ROWS: tl.constexpr, D: tl.constexpr, ROPE: tl.constexpr,
               R: tl.constexpr):
    # the fp32 (cos, sin) of ``rows`` on channels < R (zeros elsewhere), [ROWS, D], from the pair tables (S, R/2)
    # of ``prologue.pair_tables`` (one angle per rotated pair: half the bytes of the processor's (S, R) tables):
    # "interleaved" pair j is channels (2j, 2j + 1), the loaded [ROWS, D/2] tile widened in registers (as
    # ``_rotate_interleaved``); "half" pair j is channels (j, j + R/2), two contiguous runs of the same row
    if ROPE == 2:
        j = tl.arange(0, D // 2).to(tl.int64)
        used = j < R // 2
    else:
        j = tl.where(d < R // 2, d, d - R // 2)
        used = d < R
    cs = rows.to(tl.int64)[:, None] * (R // 2) + j[None, :]
    m = ok & used[None, :]
    c = tl.load(cos_ptr + cs, mask=m, other=0.0)
    sn = tl.load(sin_ptr + cs, mask=m, other=0.0)
    if ROPE == 2:
        c = tl.reshape(tl.join(c, c), [ROWS, D])
        sn = tl.reshape(tl.join(sn, sn), [ROWS, D])
    return c, sn


@triton.jit
def _prologue_combine(x, n, rot, c, sn, ok, d, D: tl.constexpr, ROPE: tl.constexpr, R: tl.constexpr,
                      INTERP: tl.constexpr):
    # n * cos + rotate(n) * sin on channels < R (ROPE), rows past the end zero, one rounding to x's dtype
    if ROPE != 0:
        r = n * c + rot * sn
        if R < D:
            r = tl.where((d < R)[None, :], r, n)
        n = r
    n = tl.where(ok, n, 0.0)
    if INTERP:
        if x.dtype == tl.bfloat16:
            bits = n.to(tl.int32, bitcast=True)
            n = ((bits + (0x7FFF + ((bits >> 16) & 1))) & -65536).to(tl.float32, bitcast=True)
    return n.to(x.dtype)


@triton.jit
def _load_rows_pro(base, s_s, s_d, first, end, d, ROWS: tl.constexpr, w_ptr, cos_ptr, sin_ptr, text_rows, eps,
                   D: tl.constexpr, PRO: tl.constexpr, NORM: tl.constexpr, ROPE: tl.constexpr, R: tl.constexpr,
                   G2: tl.constexpr, INTERP: tl.constexpr, rs_ptr=None):
    # ``_load_rows``, then (PRO) the fused prologue on the rows (rs_ptr: NORM 2's row factors)
    x = _load_rows(base, s_s, s_d, first, end, d, ROWS)
    if PRO:
        x = _prologue_rows(x, base, s_s, s_d, first, end, d, ROWS, w_ptr, cos_ptr, sin_ptr, text_rows, eps, D, NORM,
                           ROPE, R, G2, INTERP, rs_ptr)
    return x


@triton.jit
def _fold_rot_tile(x, rot, acc_sum, acc_max, acc_min, first, end, RT: tl.constexpr, F32DOT: tl.constexpr,
                   MASKED: tl.constexpr):
    # the rotated tile of rows [first, first + RT) into the [RT, D] accumulators; rows >= end (MASKED: the tile may
    # hold some) were loaded as zeros, which rotate to exact zeros: the sum needs no mask, the max/min do
    xr = _rot_dot(x, rot, F32DOT)
    acc_sum += xr
    if MASKED:
        ok = (first + tl.arange(0, RT) < end)[:, None]
        acc_max = tl.maximum(acc_max, tl.where(ok, xr, float("-inf")))
        acc_min = tl.minimum(acc_min, tl.where(ok, xr, float("inf")))
    else:
        acc_max = tl.maximum(acc_max, xr)
        acc_min = tl.minimum(acc_min, xr)
    return acc_sum, acc_max, acc_min


@triton.jit
def _stats_k_rot(src, s_b, s_s, s_h, s_d, rot_ptr, ksum_ptr, kmax_ptr, kmin_ptr, b, h, bh64, c, S, NC,
                 w_ptr, cos_ptr, sin_ptr, text_rows, eps,
                 D: tl.constexpr, CHUNK: tl.constexpr, RT: tl.constexpr, F32DOT: tl.constexpr,
                 PREFETCH: tl.constexpr, TAIL: tl.constexpr, PRO: tl.constexpr, PRO_NORM: tl.constexpr,
                 PRO_ROPE: tl.constexpr, PRO_R: tl.constexpr, PRO_G2: tl.constexpr, rs_ptr=None):
    # INT8 Q/K mode: the same per-channel partials of K' = K @ Rpm1 (``tl.dot`` of RT-row tiles with the +-1
    # matrix, fp32 accumulation), the rotated tiles folded elementwise into [RT, D] accumulators and reduced over
    # rows once, after the loop, so the loop carries no cross-thread reduction (faster than reducing each tile in
    # the loop; a float64 elementwise sum would take so many registers that the programs per SM halve).
    # TAIL (``stats_rot_tail``): the chunk's whole tiles fold without the max/min row masks (two FSEL per
    # element) and only a ragged last tile takes them;
    # otherwise every tile is masked. The sum runs in fp32 across the chunk's tiles (CHUNK / RT terms per
    # accumulator, at most 32 at the shipped sizes) and in float64 from the row reduction on; the mean may differ
    # from a float64 sum's in its last bits (the K descale is exact: max and min are).
    # PRO: the fused prologue (``_prologue_rows``; rs_ptr: PRO_NORM 2's row factors) on each tile as it is loaded,
    # before the rotation.
    base = src + b * s_b + h * s_h
    start = c * CHUNK
    end = tl.minimum(start + CHUNK, S)
    dd = tl.arange(0, D)
    d = dd.to(tl.int64)
    rot = tl.load(rot_ptr + d[:, None] * D + d[None, :])
    acc_sum = tl.zeros([RT, D], dtype=tl.float32)
    acc_max = tl.full([RT, D], float("-inf"), dtype=tl.float32)
    acc_min = tl.full([RT, D], float("inf"), dtype=tl.float32)
    n = end - start
    n_main = n
    if TAIL:
        n_main = n - n % RT  # whole tiles: every row < end
    if PREFETCH:
        x_next = _load_rows_pro(base, s_s, s_d, start, end, d, RT, w_ptr, cos_ptr, sin_ptr, text_rows, eps, D, PRO,
                                PRO_NORM, PRO_ROPE, PRO_R, PRO_G2, F32DOT, rs_ptr)
    for i in range(0, n_main, RT):
        if PREFETCH:
            x = x_next
            x_next = _load_rows_pro(base, s_s, s_d, start + i + RT, end, d, RT, w_ptr, cos_ptr, sin_ptr, text_rows,
                                    eps, D, PRO, PRO_NORM, PRO_ROPE, PRO_R, PRO_G2, F32DOT, rs_ptr)
        else:
            x = _load_rows_pro(base, s_s, s_d, start + i, end, d, RT, w_ptr, cos_ptr, sin_ptr, text_rows, eps, D,
                               PRO, PRO_NORM, PRO_ROPE, PRO_R, PRO_G2, F32DOT, rs_ptr)
        acc_sum, acc_max, acc_min = _fold_rot_tile(x, rot, acc_sum, acc_max, acc_min, start + i, end, RT, F32DOT,
                                                   not TAIL)
    if TAIL:
        if n_main < n:
            if PREFETCH:
                x = x_next
            else:
                x = _load_rows_pro(base, s_s, s_d, start + n_main, end, d, RT, w_ptr, cos_ptr, sin_ptr, text_rows,
                                   eps, D, PRO, PRO_NORM, PRO_ROPE, PRO_R, PRO_G2, F32DOT, rs_ptr)
            acc_sum, acc_max, acc_min = _fold_rot_tile(x, rot, acc_sum, acc_max, acc_min, start + n_main, end, RT,
                                                       F32DOT, True)
    off = (bh64 * NC + c) * D + dd
    tl.store(ksum_ptr + off, tl.sum(acc_sum.to(tl.float64), axis=0))
    tl.store(kmax_ptr + off, tl.max(acc_max, axis=0))
    tl.store(kmin_ptr + off, tl.min(acc_min, axis=0))


@triton.jit(do_not_specialize=["text_rows"])  # per call: a value 1 or a multiple of 16 must not be baked in
def _stats_kernel(
    q_ptr, k_ptr, v_ptr,
    sqb, sqs, sqh, sqd,
    skb, sks, skh, skd,
    svb, svs, svh, svd,
    qpart_ptr, vpart_ptr, ksum_ptr, kmax_ptr, kmin_ptr,
    mean_ptr, scales_ptr, flags_ptr, count_ptr, klens_ptr, rot_ptr, kmr_ptr,
    H, Sq, Sk, NCQ, NCK, NCV,
    wq_ptr, wk_ptr, cos_ptr, sin_ptr, text_rows, eps, rsq_ptr, rsk_ptr,
    D: tl.constexpr, CHUNK: tl.constexpr, R: tl.constexpr, W: tl.constexpr,
    CB: tl.constexpr, SMOOTH: tl.constexpr, KLENS: tl.constexpr, QK_INT8: tl.constexpr, RT: tl.constexpr,
    F32DOT: tl.constexpr, QK_STAGES: tl.constexpr, PREFETCH: tl.constexpr, V_MULT: tl.constexpr,
    V_FIRST: tl.constexpr, TAIL: tl.constexpr,
    PRO: tl.constexpr, PRO_NORM: tl.constexpr, PRO_ROPE: tl.constexpr, PRO_R: tl.constexpr, PRO_G2: tl.constexpr,
):
    # programs: NCQ Q chunks, NCK K chunks, NCV V chunks of V_MULT * CHUNK rows (V_FIRST: the V chunks first)
    t = tl.program_id(0)
    if V_FIRST:
        t = tl.where(t < NCV, t + NCQ + NCK, t - NCV)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    bh64 = bh.to(tl.int64)
    n_keys = Sk  # keys of this batch item: the first key_lens[b] (clamped to [0, Sk]) with KLENS
    if KLENS:
        n_keys = tl.minimum(tl.maximum(tl.load(klens_ptr + b), 0), Sk)
    if t < NCQ:
        _stats_amax(q_ptr, sqb, sqs, sqh, sqd, qpart_ptr, b, h, bh64, t, Sq, NCQ, D, CHUNK, R, W)
    elif t < NCQ + NCK:
        if QK_INT8:
            if PRO_NORM == 2:  # norm across heads: head h's weight row, batch item b's row factors
                wk_ptr = wk_ptr + h * D
                rsk_ptr = rsk_ptr + b * Sk
            _stats_k_rot(k_ptr, skb, sks, skh, skd, rot_ptr, ksum_ptr, kmax_ptr, kmin_ptr, b, h, bh64, t - NCQ,
                         n_keys, NCK, wk_ptr, cos_ptr, sin_ptr, text_rows, eps, D, CHUNK, RT, F32DOT, PREFETCH, TAIL,
                         PRO, PRO_NORM, PRO_ROPE, PRO_R, PRO_G2, rsk_ptr)
        else:
            _stats_k(k_ptr, skb, sks, skh, skd, ksum_ptr, kmax_ptr, kmin_ptr, b, h, bh64, t - NCQ, n_keys, NCK,
                     D, CHUNK, R, W)
    else:
        _stats_amax(v_ptr, svb, svs, svh, svd, vpart_ptr, b, h, bh64, t - NCQ - NCK, n_keys, NCV, D,
                    CHUNK * V_MULT, R, W)
    # the last of this (b, h)'s programs to finish reduces its partials (in a fixed order: deterministic) and sets
    # the counter back to 0 for the next launch. The barrier puts every thread's partial stores before the
    # counter's release; the acquire puts the last program's loads after everyone's stores.
    tl.debug_barrier()
    arrived = tl.atomic_add(count_ptr + bh64, 1, sem="acq_rel", scope="gpu")
    if arrived == NCQ + NCK + NCV - 1:
        _finalize_bh(bh64, qpart_ptr, vpart_ptr, ksum_ptr, kmax_ptr, kmin_ptr, mean_ptr, scales_ptr, flags_ptr,
                     rot_ptr, kmr_ptr, n_keys, NCQ, NCK, NCV, D, CB, SMOOTH, QK_INT8)
        tl.store(count_ptr + bh64, 0)


# ---------------------------------------------------------------- finalize

@triton.jit
def _finalize_bh(
    bh, qpart_ptr, vpart_ptr, ksum_ptr, kmax_ptr, kmin_ptr,
    mean_ptr, scales_ptr, flags_ptr, rot_ptr, kmr_ptr,
    Sk, NCQ, NCK, NCV,
    D: tl.constexpr, CB: tl.constexpr, SMOOTH: tl.constexpr, QK_INT8: tl.constexpr,
):
    # the partials were written by other programs of this launch: loads bypass L1 (.cg)
    d = tl.arange(0, D)
    c = tl.arange(0, CB)
    aq = tl.zeros([CB], dtype=tl.int32)
    for c0 in range(0, NCQ, CB):
        cc = c0 + c
        aq = tl.maximum(aq, tl.load(qpart_ptr + bh * NCQ + cc, mask=cc < NCQ, other=0, cache_modifier=".cg"))
    s = tl.zeros([D], dtype=tl.float64)
    mx = tl.full([D], float("-inf"), dtype=tl.float32)
    mn = tl.full([D], float("inf"), dtype=tl.float32)
    av = tl.zeros([CB], dtype=tl.int32)
    for c0 in range(0, NCV, CB):
        cc = c0 + c
        av = tl.maximum(av, tl.load(vpart_ptr + bh * NCV + cc, mask=cc < NCV, other=0, cache_modifier=".cg"))
    for c0 in range(0, NCK, CB):
        cc = c0 + c
        m = cc < NCK
        idx = bh * NCK + cc
        offs = idx[:, None] * D + d[None, :]
        s += tl.sum(tl.load(ksum_ptr + offs, mask=m[:, None], other=0.0, cache_modifier=".cg"), axis=0)
        mx = tl.maximum(mx, tl.max(tl.load(kmax_ptr + offs, mask=m[:, None], other=float("-inf"),
                                           cache_modifier=".cg"), axis=0))
        mn = tl.minimum(mn, tl.min(tl.load(kmin_ptr + offs, mask=m[:, None], other=float("inf"),
                                           cache_modifier=".cg"), axis=0))

    # the float64 sum of finite 16-bit values is finite: it is not iff K holds a NaN or +-Inf (which the max/min
    # may have skipped); then amax_k is NaN
    bad_k = tl.max(((s - s) != 0.0).to(tl.int32), axis=0)
    if SMOOTH:
        mean = (s / tl.maximum(Sk, 1)).to(tl.float32)
        if QK_INT8:
            # mu' (rotated basis) for the quantize pass; the reported mean in the original basis,
            # fp32(sum_fp64(mu'_c * Rpm1[j, c]) / D) (exact products and sum: the torch chain's value)
            tl.store(kmr_ptr + bh * D + d, mean)
            m64 = mean.to(tl.float64)
            for j0 in range(0, D, CB):
                j = j0 + c
                rr = tl.load(rot_ptr + j[:, None] * D + d[None, :]).to(tl.float64)  # rows j of Rpm1
                tl.store(mean_ptr + bh * D + j, (tl.sum(rr * m64[None, :], axis=1) / D).to(tl.float32))
        else:
            tl.store(mean_ptr + bh * D + d, mean)
        ak = tl.maximum(mx - mean, mean - mn)
    else:
        ak = tl.maximum(mx, -mn)
    ak = tl.where(mx >= mn, ak, 0.0)  # no key at all (a fully masked batch item): amax 0, descale 1
    amax_q = tl.max(aq, axis=0).to(tl.float32, bitcast=True)
    amax_k_bits = tl.max(_abs_bits(ak), axis=0)
    amax_k = tl.where(bad_k > 0, 0x7FC00000, amax_k_bits).to(tl.float32, bitcast=True)
    amax_v = tl.max(av, axis=0).to(tl.float32, bitcast=True)
    ds_q = tl.where(amax_q == 0.0, 1.0, tl.math.div_rn(amax_q, 448.0))  # INT8 Q/K: no Q partials, 1.0
    if QK_INT8:
        ds_k = tl.where(amax_k == 0.0, 1.0, tl.math.div_rn(amax_k, 127.0))
    else:
        ds_k = tl.where(amax_k == 0.0, 1.0, tl.math.div_rn(amax_k, 448.0))
    ds_v = tl.where(amax_v == 0.0, 1.0, tl.math.div_rn(amax_v, 448.0))
    tl.store(scales_ptr + bh * 3 + 0, ds_q)
    tl.store(scales_ptr + bh * 3 + 1, ds_k)
    tl.store(scales_ptr + bh * 3 + 2, ds_v)
    # sticky non-finite flags of q, k, v (int32 x 3, zeroed by the caller): a launch record reads them every few
    # calls instead of copying every call's descales to the host (x - x is 0 for finite x, NaN for NaN and Inf)
    tl.store(flags_ptr + 0, 1, mask=(ds_q - ds_q) != 0.0)
    tl.store(flags_ptr + 1, 1, mask=(ds_k - ds_k) != 0.0)
    tl.store(flags_ptr + 2, 1, mask=(ds_v - ds_v) != 0.0)


# ---------------------------------------------------------------- quantize

@triton.jit
def _quant_rows(src, s_b, s_s, s_h, s_d, dst, b, h, bh64, t, S, S_pad, mean_ptr, ds,
                D: tl.constexpr, BLOCK: tl.constexpr, SUB_MEAN: tl.constexpr, MANUAL_RNE: tl.constexpr,
                FAST: tl.constexpr):
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
    y = _to_e4m3(_div_by_descale(x, ds, FAST), MANUAL_RNE)
    tl.store(dst + (bh64 * S_pad + r64)[:, None] * D + d[None, :], y, mask=(rows < S_pad)[:, None])


@triton.jit
def _div_scalar(x, ds, FAST: tl.constexpr, RECIP: tl.constexpr):
    # x / ds for one positive descale: the correctly rounded quotient, or (RECIP) x * RN(1 / ds), unless ds is so
    # small that 1 / ds could overflow
    if RECIP:
        if ds >= 1e-26:
            y = x * tl.math.div_rn(1.0, ds)
        else:
            y = _div_by_descale(x, ds, FAST)
    else:
        y = _div_by_descale(x, ds, FAST)
    return y


@triton.jit
def _quant_v(src, s_b, s_s, s_h, s_d, dst, b, h, bh64, t, Sk, Sk_pad, ds,
             D: tl.constexpr, BLOCK: tl.constexpr, MANUAL_RNE: tl.constexpr, FAST: tl.constexpr):
    # output positions [t*BLOCK, (t+1)*BLOCK) (whole 16-key groups) of dst (B*H, D, Sk_pad): gather the V rows
    # key_order(p), quantize, transpose in registers, store feature-major
    pos = t * BLOCK + tl.arange(0, BLOCK)
    keys = _key_for_position(pos)
    k64 = keys.to(tl.int64)
    d = tl.arange(0, D).to(tl.int64)
    m = (keys < Sk)[:, None]
    x = tl.load(src + b * s_b + h * s_h + k64[:, None] * s_s + d[None, :] * s_d, mask=m, other=0.0)
    y = _to_e4m3(_div_scalar(x.to(tl.float32), ds, FAST, True), MANUAL_RNE)  # [BLOCK positions, D]
    yt = tl.trans(y)  # [D, BLOCK positions]
    p64 = pos.to(tl.int64)
    tl.store(dst + (bh64 * D + d)[:, None] * Sk_pad + p64[None, :], yt, mask=(pos < Sk_pad)[None, :])


@triton.jit
def _to_int8(y):
    # int8(clamp(rne(y), -127, 127)): clamp first (an integer bound, so the order does not matter), then the
    # fp32 add of 1.5 * 2^23 rounds |y| <= 127 to an integer, half to even; the cast is then exact
    y = tl.minimum(tl.maximum(y, -127.0), 127.0)
    r = (y + 12582912.0) - 12582912.0
    return r.to(tl.int8)


@triton.jit
def _div_rows(x, ds, FAST: tl.constexpr):
    # RN(x / ds) for fp32 x [BLOCK, D] and a positive descale per row ds [BLOCK] (``_div_by_descale`` per row)
    if FAST:
        if tl.min(ds, axis=0) >= 1e-26:
            inv = tl.math.div_rn(tl.full(ds.shape, 1.0, tl.float32), ds)[:, None]
            y = _refined_quotient(x, inv, ds[:, None])
        else:
            y = tl.math.div_rn(x, ds[:, None])
    else:
        y = tl.math.div_rn(x, ds[:, None])
    return y


@triton.jit
def _codes_q(xr, qs, FAST: tl.constexpr, RECIP: tl.constexpr):
    # Q' / qs per row (``qk_recip``: times RN(1 / qs), unless a descale is so small that 1 / qs could overflow)
    if RECIP:
        if tl.min(qs, axis=0) >= 1e-26:
            y = xr * tl.math.div_rn(tl.full(qs.shape, 1.0, tl.float32), qs)[:, None]
        else:
            y = _div_rows(xr, qs, FAST)
    else:
        y = _div_rows(xr, qs, FAST)
    return y


@triton.jit
def _codes_k(xr, m, mu, ds, SUB_MEAN: tl.constexpr, FAST: tl.constexpr, RECIP: tl.constexpr):
    # (K' - mu') / ds, pad rows (m False) zero (``qk_recip``: one FFMA with RN(1 / ds) and -mu' * RN(1 / ds))
    if RECIP and SUB_MEAN:
        if ds >= 1e-26:
            inv = tl.math.div_rn(1.0, ds)
            y = tl.where(m, tl.fma(xr, inv, (-mu * inv)[None, :]), 0.0)
        else:
            y = _div_by_descale(tl.where(m, xr - mu[None, :], 0.0), ds, FAST)
    else:
        if SUB_MEAN:
            xr = tl.where(m, xr - mu[None, :], 0.0)
        y = _div_scalar(xr, ds, FAST, RECIP)
    return y


@triton.jit
def _quant_rows_int8(src, s_b, s_s, s_h, s_d, dst, b, h, bh64, t, S, S_pad, rot_ptr, mean_ptr, ds, qs_ptr,
                     scales_ptr, flags_ptr, w_ptr, cos_ptr, sin_ptr, text_rows, eps,
                     D: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
                     IS_Q: tl.constexpr, SUB_MEAN: tl.constexpr, FAST: tl.constexpr, F32DOT: tl.constexpr,
                     STAGES: tl.constexpr, PREFETCH: tl.constexpr, RECIP: tl.constexpr, PRO: tl.constexpr,
                     PRO_NORM: tl.constexpr, PRO_ROPE: tl.constexpr, PRO_R: tl.constexpr, PRO_G2: tl.constexpr,
                     rs_ptr=None):
    # INT8 Q/K mode: rows [t*ROWS, (t+1)*ROWS) of one (b, h) (< S_pad), BLOCK at a time, the +-1 rotation matrix
    # loaded once per program. Q: X' = (X @ Rpm1) / D, a descale per row (written to qs_ptr; 1.0 for zero and pad
    # rows), and a non-finite row sets Q's sticky flag and NaN in scales[b, h, 0]. K: X' = X @ Rpm1 - mu' with the
    # per-head descale ``ds``. Codes int8(clamp(rne(X' / descale), +-127)), rows >= S zero. PRO: the fused
    # prologue (``_prologue_rows``, weight ``w_ptr``, PRO_NORM 2's row factors ``rs_ptr``) on each block of rows as it
    # is loaded, before the rotation.
    d = tl.arange(0, D).to(tl.int64)
    rot = tl.load(rot_ptr + d[:, None] * D + d[None, :])
    mu = tl.zeros([D], dtype=tl.float32)
    if SUB_MEAN:
        mu = tl.load(mean_ptr + bh64 * D + d)
    base = src + b * s_b + h * s_h
    n = tl.minimum(ROWS, S_pad - t * ROWS)
    end = tl.minimum(S, t * ROWS + n)  # rows to read: this program's, below S
    if PREFETCH:
        x_next = _load_rows_pro(base, s_s, s_d, t * ROWS, end, d, BLOCK, w_ptr, cos_ptr, sin_ptr, text_rows, eps, D,
                                PRO, PRO_NORM, PRO_ROPE, PRO_R, PRO_G2, F32DOT, rs_ptr)
    for i in tl.range(0, n, BLOCK, num_stages=STAGES):
        rows = t * ROWS + i + tl.arange(0, BLOCK)
        r64 = rows.to(tl.int64)
        m = (rows < S)[:, None]
        if PREFETCH:
            x = x_next
            x_next = _load_rows_pro(base, s_s, s_d, t * ROWS + i + BLOCK, end, d, BLOCK, w_ptr, cos_ptr, sin_ptr,
                                    text_rows, eps, D, PRO, PRO_NORM, PRO_ROPE, PRO_R, PRO_G2, F32DOT, rs_ptr)
        else:
            x = _load_rows_pro(base, s_s, s_d, t * ROWS + i, end, d, BLOCK, w_ptr, cos_ptr, sin_ptr, text_rows, eps,
                               D, PRO, PRO_NORM, PRO_ROPE, PRO_R, PRO_G2, F32DOT, rs_ptr)
        xr = _rot_dot(x, rot, F32DOT)
        if IS_Q:
            xr = xr * (1.0 / D)  # a power of two: exact
            amax_bits = tl.max(_abs_bits(xr), axis=1)  # integer max: NaN sorts above Inf
            amax = amax_bits.to(tl.float32, bitcast=True)
            qs = tl.where(amax == 0.0, 1.0, tl.math.div_rn(amax, 127.0))
            y = _codes_q(xr, qs, FAST, RECIP)
            tl.store(qs_ptr + bh64 * S_pad + r64, qs, mask=rows < S_pad)
            bad = tl.max((amax_bits >= 0x7F800000).to(tl.int32), axis=0)
            tl.store(flags_ptr + 0, 1, mask=bad > 0)
            tl.store(scales_ptr + bh64 * 3 + 0, float("nan"), mask=bad > 0)
        else:
            y = _codes_k(xr, m, mu, ds, SUB_MEAN, FAST, RECIP)
        tl.store(dst + (bh64 * S_pad + r64)[:, None] * D + d[None, :], _to_int8(y),
                 mask=(rows < S_pad)[:, None])


@triton.jit(do_not_specialize=["text_rows"])  # as in _stats_kernel
def _quant_kernel(
    q_ptr, k_ptr, v_ptr,
    sqb, sqs, sqh, sqd,
    skb, sks, skh, skd,
    svb, svs, svh, svd,
    q8_ptr, k8_ptr, v8t_ptr, mean_ptr, scales_ptr, qs_ptr, rot_ptr, flags_ptr,
    H, Sq, Sk, Sq_pad, Sk_pad, NQ, NK,
    wq_ptr, wk_ptr, cos_ptr, sin_ptr, text_rows, eps, rsq_ptr, rsk_ptr,
    D: tl.constexpr, BLOCK: tl.constexpr, SMOOTH: tl.constexpr, MANUAL_RNE: tl.constexpr,
    FAST: tl.constexpr, QK_INT8: tl.constexpr, QK_ROWS: tl.constexpr, QK_BLOCK: tl.constexpr,
    F32DOT: tl.constexpr, QK_STAGES: tl.constexpr, PREFETCH: tl.constexpr, DO_QK: tl.constexpr,
    DO_V: tl.constexpr, RECIP: tl.constexpr,
    PRO: tl.constexpr, PRO_NORM: tl.constexpr, PRO_ROPE: tl.constexpr, PRO_R: tl.constexpr, PRO_G2: tl.constexpr,
):
    # DO_QK / DO_V: which operands this launch quantizes (``split_v`` gives V a launch of its own: NQ = NK = 0)
    t = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    bh64 = bh.to(tl.int64)
    if DO_QK:
        if t < NQ:
            if QK_INT8:
                if PRO_NORM == 2:  # as in _stats_kernel
                    wq_ptr = wq_ptr + h * D
                    rsq_ptr = rsq_ptr + b * Sq
                _quant_rows_int8(q_ptr, sqb, sqs, sqh, sqd, q8_ptr, b, h, bh64, t, Sq, Sq_pad, rot_ptr, mean_ptr,
                                 1.0, qs_ptr, scales_ptr, flags_ptr, wq_ptr, cos_ptr, sin_ptr, text_rows, eps, D,
                                 QK_ROWS, QK_BLOCK, True, False, FAST, F32DOT, QK_STAGES, PREFETCH, RECIP, PRO,
                                 PRO_NORM, PRO_ROPE, PRO_R, PRO_G2, rsq_ptr)
            else:
                _quant_rows(q_ptr, sqb, sqs, sqh, sqd, q8_ptr, b, h, bh64, t, Sq, Sq_pad, mean_ptr,
                            tl.load(scales_ptr + bh64 * 3 + 0), D, BLOCK, False, MANUAL_RNE, FAST)
        elif t < NQ + NK:
            if QK_INT8:
                if PRO_NORM == 2:  # as in _stats_kernel
                    wk_ptr = wk_ptr + h * D
                    rsk_ptr = rsk_ptr + b * Sk
                _quant_rows_int8(k_ptr, skb, sks, skh, skd, k8_ptr, b, h, bh64, t - NQ, Sk, Sk_pad, rot_ptr,
                                 mean_ptr, tl.load(scales_ptr + bh64 * 3 + 1), qs_ptr, scales_ptr, flags_ptr, wk_ptr,
                                 cos_ptr, sin_ptr, text_rows, eps, D, QK_ROWS, QK_BLOCK, False, SMOOTH, FAST, F32DOT,
                                 QK_STAGES, PREFETCH, RECIP, PRO, PRO_NORM, PRO_ROPE, PRO_R, PRO_G2, rsk_ptr)
            else:
                _quant_rows(k_ptr, skb, sks, skh, skd, k8_ptr, b, h, bh64, t - NQ, Sk, Sk_pad, mean_ptr,
                            tl.load(scales_ptr + bh64 * 3 + 1), D, BLOCK, SMOOTH, MANUAL_RNE, FAST)
        else:
            if DO_V:
                _quant_v(v_ptr, svb, svs, svh, svd, v8t_ptr, b, h, bh64, t - NQ - NK, Sk, Sk_pad,
                         tl.load(scales_ptr + bh64 * 3 + 2), D, BLOCK, MANUAL_RNE, FAST)
    else:
        _quant_v(v_ptr, svb, svs, svh, svd, v8t_ptr, b, h, bh64, t - NQ - NK, Sk, Sk_pad,
                 tl.load(scales_ptr + bh64 * 3 + 2), D, BLOCK, MANUAL_RNE, FAST)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def check_config(config: PrepConfig) -> None:
    """ValueError unless ``config`` is a launch configuration the kernels take."""
    if 128 % config.quant_block or config.quant_block % 16:
        raise ValueError(f"quant_block must divide 128 and be a multiple of 16, got {config.quant_block}")
    for name in ("stats_r", "stats_warps"):
        val = getattr(config, name)
        if val < 1 or val & (val - 1):
            raise ValueError(f"{name} must be a power of two, got {val}")
    if config.stats_chunk < 1:
        raise ValueError(f"stats_chunk must be positive, got {config.stats_chunk}")
    if config.stats_v_mult < 1:
        raise ValueError(f"stats_v_mult must be >= 1, got {config.stats_v_mult}")


def build_config(config: PrepConfig, prologue: "PrologueSpec | None") -> PrepConfig:
    """The launch configuration the kernels are built with: ``config``, with a fused prologue its
    ``prologue_qk_block`` / ``prologue_stats_rot_rows`` as ``qk_block`` / ``stats_rot_rows``."""
    if prologue is None:
        return config
    return dataclasses.replace(config, qk_block=config.prologue_qk_block,
                               stats_rot_rows=config.prologue_stats_rot_rows)


def stats_chunk_for(BH: int, Sk: int, qk_int8: bool, device, config: PrepConfig = PrepConfig()) -> int:
    """Rows per stats program: ``config.stats_chunk``, or in INT8 Q/K mode on a GPU the largest of it, /2, ... (at
    least 128) that gives the K and V stats grid ``config.stats_programs_per_sm`` programs per SM."""
    chunk = config.stats_chunk
    device = torch.device(device)
    if not (qk_int8 and config.stats_programs_per_sm and device.type == "cuda"):
        return chunk
    return chunk_for_grid(chunk, Sk, BH * 2, config.stats_programs_per_sm, device)


def chunk_for_grid(chunk: int, S: int, streams: int, programs_per_sm: int, device) -> int:
    """``chunk`` halved (down to 128 rows) while ``streams`` row streams (operands x B*H) of ceil(S / chunk)
    programs each give fewer than ``programs_per_sm`` programs per SM of ``device`` (a grid of a few waves is bound
    by each program's serial loop). Shared by the INT8 prep's stats pass and FA3's prologue prep."""
    target = programs_per_sm * sm_count(torch.device(device).index)
    while chunk > 128 and streams * _cdiv(S, chunk) < target:
        chunk //= 2
    return chunk


def stats_rot_rows_for(D: int, stats_programs: int, device, config: PrepConfig = PrepConfig()) -> int:
    """Rows per ``tl.dot`` of the INT8 stats pass's rotated K tiles: ``config.stats_rot_rows`` when set, else 16 at
    head_dim >= 128 on a GPU where the stats grid (``stats_programs``) has ``config.stats_rot16_programs_per_sm``
    programs per SM or more, else 32."""
    if config.stats_rot_rows:
        return config.stats_rot_rows
    device = torch.device(device)
    if device.type != "cuda" or D < 128:
        return 32
    return 16 if stats_programs >= config.stats_rot16_programs_per_sm * sm_count(device.index) else 32


def stats_rows_per_warp(D: int) -> int:
    """Rows of D elements one warp covers with 16-byte (8-element) loads."""
    return max(1, 256 // D)


def stats_constants(config: PrepConfig, *, D: int, chunk: int, rot_rows: int, smooth_k: bool, key_lens: bool,
                    qk_int8: bool, interpret: bool) -> dict:
    """The stats kernel's constexpr arguments for one build."""
    return dict(D=D, CHUNK=chunk, R=config.stats_r, W=config.stats_warps * stats_rows_per_warp(D),
                CB=config.finalize_cb, SMOOTH=smooth_k, KLENS=key_lens, QK_INT8=qk_int8, RT=rot_rows,
                F32DOT=interpret, QK_STAGES=config.qk_stages, PREFETCH=config.qk_prefetch,
                V_MULT=config.stats_v_mult if qk_int8 else 1, V_FIRST=bool(config.stats_v_first and qk_int8),
                TAIL=config.stats_rot_tail)


def quant_constants(config: PrepConfig, *, D: int, smooth_k: bool, qk_int8: bool, interpret: bool) -> dict:
    """The quantize kernel's constexpr arguments for one build, but for DO_QK / DO_V (``quant_launches``)."""
    return dict(D=D, BLOCK=config.quant_block, SMOOTH=smooth_k, MANUAL_RNE=interpret, FAST=bool(config.fast_div),
                QK_INT8=qk_int8, QK_ROWS=config.qk_rows, QK_BLOCK=config.qk_block, F32DOT=interpret,
                QK_STAGES=config.qk_stages, PREFETCH=config.qk_prefetch, RECIP=config.qk_recip)


# the prologue's per-call kernel arguments (``PrepPlan.launch(pro=...)``), after each launch's own ones; with
# ``rms_across`` also its row factors (``_PRO_RS_ARGS``, the prep's kernels only), else those are constexpr None
_PRO_ARGS = ("wq_ptr", "wk_ptr", "cos_ptr", "sin_ptr", "text_rows")
_PRO_RS_ARGS = ("rsq_ptr", "rsk_ptr")
_ROPE_CODES = {None: 0, "half": 1, "interleaved": 2}
_NORM_CODES = {None: 0, "rms": 1, "rms_across": 2}


def prologue_constants(spec: "PrologueSpec | None", D: int, groups: int = 1) -> dict:
    """The prologue's fixed kernel arguments for one build (both kernels). Without a prologue every prologue pointer
    and scalar is None, which Triton takes as a constexpr: the kernels then compile to exactly the code they had
    before the prologue existed (no parameter more, the same SASS)."""
    if spec is None:
        return dict(wq_ptr=None, wk_ptr=None, cos_ptr=None, sin_ptr=None, text_rows=None, eps=None, PRO=False,
                    PRO_NORM=False, PRO_ROPE=0, PRO_R=0, PRO_G2=False)
    return dict(eps=float(spec.eps), PRO=True, PRO_NORM=_NORM_CODES[spec.norm], PRO_ROPE=_ROPE_CODES[spec.rope],
                PRO_R=spec.rotated(D), PRO_G2=groups == 2)


def rs_constants(spec: "PrologueSpec | None") -> dict:
    """The prep kernels' row-factor pointers where they are fixed: None (constexpr) unless the spec's norm is
    ``rms_across`` (then they are per-call arguments, ``_PRO_RS_ARGS``)."""
    return {} if spec is not None and spec.across else dict(rsq_ptr=None, rsk_ptr=None)


def quant_launches(config: PrepConfig, qk_int8: bool) -> tuple[tuple[bool, bool], ...]:
    """(DO_QK, DO_V) of each quantize launch: one launch for all three operands, or with ``split_v`` in INT8 mode
    Q/K's and then V's."""
    if qk_int8 and config.split_v:
        return (True, False), (False, True)
    return ((True, True),)


def stream_of_handle(handle: int, device) -> "torch.cuda.Stream":
    """The torch Stream of a raw CUDA stream handle, for events to fork and join on. Handle 0 (the legacy default
    stream, where eager PyTorch runs) needs ``default_stream``: ``torch.cuda.ExternalStream(0)`` takes a zero
    pointer as "none given" and hands back a fresh pool stream, so events recorded on it order nothing."""
    if handle == 0:
        return torch.cuda.default_stream(device)
    return torch.cuda.ExternalStream(handle, device=device)


_ROTATIONS: dict = {}


def _device_rotation(D: int, dtype: torch.dtype, device) -> torch.Tensor:
    """The +-1 rotation matrix on ``device``, made once per (D, dtype, device) and shared (read-only): a copy
    from the host per workspace would break CUDA-graph capture, where workspaces are made per call."""
    device = torch.device(device)
    if device.type == "meta":
        return torch.empty((D, D), dtype=dtype, device=device)
    key = (D, dtype, device)
    rot = _ROTATIONS.get(key)
    if rot is None:
        rot = _ROTATIONS[key] = rotation_pm1(D, dtype, device)
    return rot


_STATS_ARGS = ("q_ptr", "k_ptr", "v_ptr", "qpart_ptr", "vpart_ptr", "ksum_ptr", "kmax_ptr", "kmin_ptr", "mean_ptr",
               "scales_ptr", "flags_ptr", "count_ptr", "klens_ptr", "rot_ptr", "kmr_ptr")
_QUANT_ARGS = ("q_ptr", "k_ptr", "v_ptr", "q8_ptr", "k8_ptr", "v8t_ptr", "mean_ptr", "scales_ptr", "qs_ptr",
               "rot_ptr", "flags_ptr")


class PrepPlan:
    """The prep's launches (two; three with INT8 Q/K) for one configuration (input shapes, strides, dtype,
    smoothing, launch configuration ``config``): grids, sizes and launch options computed once, so that a caller
    that keeps the plan (``kernels.launch_record``) pays only the launches per call. ``prepare_triton`` builds one per
    call."""

    def __init__(self, q, k, v, smooth_k: bool, *, key_lens: bool = False, qk_int8: bool = False,
                 skip_q: bool = False, config: PrepConfig = PrepConfig(), prologue: PrologueSpec | None = None,
                 pro_groups: int = 1):
        # skip_q (INT8 Q/K only): no Q programs, q8 and q_scales are not written -- for a kernel that rotates and
        # quantizes Q itself (fp8-sm90's q_rot build)
        # prologue (INT8 Q/K, with the prep's Q): q and k are the projections' raw rows, and both kernels apply the
        # processor's norm + RoPE to them as they load them (``_prologue_rows``); pro_groups: rows of the norm
        # weights (1, or 2 for a joint sequence's text / rest weights), fixed per plan like every constexpr
        check_config(config)
        check_prologue_plan(prologue, pro_groups, q, k, qk_int8, skip_q)
        config = build_config(config, prologue)
        self.prologue = prologue
        self.pro_groups = int(pro_groups)
        self.config = config
        B, Sq, H, D = q.shape
        Sk = k.shape[1]
        self.B, self.Sq, self.Sk, self.H, self.D = B, Sq, Sk, H, D
        self.Sq_pad, self.Sk_pad = padded_lengths(Sq, Sk)
        self.smooth_k = bool(smooth_k)
        self.qk_int8 = bool(qk_int8)
        self.dtype = q.dtype
        if self.qk_int8 and D < 16:
            raise ValueError(f"the INT8 Q/K prep needs head_dim >= 16 (tl.dot), got {D}")
        if self.qk_int8 and q.device.type == "cuda" and not torch.cuda.is_current_stream_capturing():
            _device_rotation(D, q.dtype, q.device)  # made now, outside any graph capture
        if skip_q and not self.qk_int8:
            raise ValueError("skip_q needs the INT8 Q/K format (qk_int8=True)")
        self.skip_q = bool(skip_q)
        self.key_lens = bool(key_lens)
        BH = B * H
        stats_chunk = stats_chunk_for(BH, Sk, self.qk_int8, q.device, config)
        # INT8 Q/K: Q has per-token scales, so it leaves the stats pass (no Q chunks)
        ncq, nck = (0 if self.qk_int8 else _cdiv(Sq, stats_chunk)), _cdiv(Sk, stats_chunk)
        # the chunk and rotated-rows rules count V's chunks at K's size (as they were calibrated), so stats_v_mult
        # changes only the V programs
        ncv = _cdiv(Sk, stats_chunk * (config.stats_v_mult if self.qk_int8 else 1))
        if self.qk_int8:
            nq, nk = (0 if skip_q else _cdiv(self.Sq_pad, config.qk_rows)), _cdiv(self.Sk_pad, config.qk_rows)
        else:
            nq, nk = self.Sq_pad // config.quant_block, _cdiv(self.Sk_pad, config.quant_block)
        nv = _cdiv(self.Sk_pad, config.quant_block)
        self.ncq, self.nck, self.ncv = ncq, nck, ncv
        # strides are (b, s, h, d) for each tensor: the kernels take them in that order
        strides = {}
        for pre, x in (("sq", q), ("sk", k), ("sv", v)):
            for axis, st in zip("bshd", x.stride()):
                strides[pre + axis] = st
        pro = dict(prologue_constants(prologue, D, pro_groups), **rs_constants(prologue))
        stats = dict(strides, H=H, Sq=Sq, Sk=Sk, NCQ=ncq, NCK=nck, NCV=ncv, **pro,
                     **stats_constants(config, D=D, chunk=stats_chunk, smooth_k=self.smooth_k,
                                       key_lens=self.key_lens, qk_int8=self.qk_int8, interpret=INTERPRET,
                                       rot_rows=stats_rot_rows_for(D, (ncq + 2 * nck) * BH, q.device, config)))
        quant = dict(strides, H=H, Sq=Sq, Sk=Sk, Sq_pad=self.Sq_pad, Sk_pad=self.Sk_pad, **pro,
                     **quant_constants(config, D=D, smooth_k=self.smooth_k, qk_int8=self.qk_int8,
                                       interpret=INTERPRET))
        pro_args = () if prologue is None else _PRO_ARGS + (_PRO_RS_ARGS if prologue.across else ())
        self.stats = FixedLaunch(_stats_kernel, (ncq + nck + ncv, BH), {"num_warps": config.stats_warps}, stats,
                                 _STATS_ARGS + pro_args)
        warps = {"num_warps": config.quant_warps}
        self.quants = tuple(
            FixedLaunch(_quant_kernel, ((nq + nk if do_qk else 0) + (nv if do_v else 0), BH), warps,
                        dict(quant, NQ=nq if do_qk else 0, NK=nk if do_qk else 0, DO_QK=do_qk, DO_V=do_v),
                        _QUANT_ARGS + pro_args)
            for do_qk, do_v in quant_launches(config, self.qk_int8))
        self.launches = (self.stats, *self.quants)

    def buffers(self, device, out=None) -> dict:
        """Every tensor the kernels write (and the read-only rotation matrix): the prep's outputs (q8, k8, v8t,
        scales, k_mean; with ``qk_int8`` q8 and k8 int8 and q_scales (B, H, Sq_pad) float32) and the partials;
        with ``qk_int8`` also the +-1 rotation matrix ``rot`` (D, D) in the inputs' dtype (read-only) and
        ``k_mean_rot`` (the smoothing mean in the rotated basis). ``out``: (q8, k8, v8t, scales[, q_scales]) to
        write into instead of new ones."""
        B, H, D, BH = self.B, self.H, self.D, self.B * self.H
        f8 = torch.float8_e4m3fn
        qk = torch.int8 if self.qk_int8 else f8
        q_scales = None
        if out is not None:
            q8, k8, v8t, scales = out[:4]
            if self.qk_int8:
                q_scales = out[4]
        else:
            # skip_q: nothing writes q8 or q_scales (1-element placeholders: at H3 q8 alone is 217 MB)
            q8 = torch.empty((1,) if self.skip_q else (B, H, self.Sq_pad, D), dtype=qk, device=device)
            k8 = torch.empty((B, H, self.Sk_pad, D), dtype=qk, device=device)
            v8t = torch.empty((B, H, D, self.Sk_pad), dtype=f8, device=device)
            # the scales, then the three flags, in one allocation: a kernel that quantizes Q itself (fp8-sm90's
            # q_rot) sets Q's flag right after the scales it is given
            scales_flags = torch.zeros((BH * 3 + 3,), dtype=torch.int32, device=device)
            scales = scales_flags[:BH * 3].view(torch.float32).view(B, H, 3)
            if self.qk_int8:
                q_scales = torch.empty((1,) if self.skip_q else (B, H, self.Sq_pad), dtype=torch.float32,
                                       device=device)
        extra = {}
        if self.qk_int8:
            extra = {
                "q_scales": q_scales,
                "rot": _device_rotation(D, self.dtype, device),
                "k_mean_rot": torch.empty((B, H, D) if self.smooth_k else (1,), dtype=torch.float32, device=device),
            }
        return dict(
            q8=q8, k8=k8, v8t=v8t, scales=scales, **extra,
            # written by the finalize kernel when smoothing; otherwise never touched (a 1-element placeholder)
            k_mean=torch.empty((B, H, D) if self.smooth_k else (1,), dtype=torch.float32, device=device),
            # amax as |x| bits (no Q chunks with qk_int8: a 1-element placeholder)
            qpart=torch.empty((BH, max(self.ncq, 1)), dtype=torch.int32, device=device),
            vpart=torch.empty((BH, self.ncv), dtype=torch.int32, device=device),
            ksum=torch.empty((BH, self.nck, D), dtype=torch.float64, device=device),
            kmax=torch.empty((BH, self.nck, D), dtype=torch.float32, device=device),
            kmin=torch.empty((BH, self.nck, D), dtype=torch.float32, device=device),
            # sticky non-finite flags of q, k, v (the finalize kernel sets them; whoever reads them zeroes them)
            flags=scales_flags[BH * 3:] if out is None else torch.zeros((3,), dtype=torch.int32, device=device),
            # programs of each (b, h) that finished their stats (the last one resets it to 0)
            count=torch.zeros((BH,), dtype=torch.int32, device=device),
        )

    def launch(self, q, k, v, bufs: dict, stream: int | None = None, key_lens=None, branch=None, *,
               pro=None) -> None:
        """The launches (two; three with ``split_v`` in INT8 mode) on ``stream`` (a raw CUDA stream handle; None:
        Triton's JIT path, which launches on the current stream). The current device must be the tensors'
        device. ``branch`` (a ``torch.cuda.Stream``, with ``stream`` given): V's own quantize launch runs on it,
        beside the Q/K one (a fork after the stats launch and a join at the end, by events): the quantize launches
        do not read each other's output, and side by side they fill the SMs their short grids leave idle.
        ``Fp8Launch._launch_all`` passes it when the launches are captured (the fork and join cost no
        host time in a replay) and for problems too large to reuse a workspace. ``pro``: the prologue's tensors
        (wq, wk, cos, sin, text_rows), required iff the plan has a prologue (``_arguments``)."""
        stats_args, quant_args = self._arguments(q, k, v, bufs, key_lens, pro=pro)
        self.stats(stats_args, stream)
        if branch is None or stream is None or len(self.quants) < 2:
            for launch in self.quants:
                launch(quant_args, stream)
            return
        main = stream_of_handle(stream, branch.device)
        branch.wait_stream(main)
        self.quants[0](quant_args, stream)
        for launch in self.quants[1:]:
            launch(quant_args, branch.cuda_stream)
        main.wait_stream(branch)

    def launch_stats(self, q, k, v, bufs: dict, stream: int | None = None, key_lens=None, *, pro=None) -> None:
        """The stats launch(es) alone (benchmarks time the two passes apart)."""
        self.stats(self._arguments(q, k, v, bufs, key_lens, pro=pro)[0], stream)

    def launch_quant(self, q, k, v, bufs: dict, stream: int | None = None, key_lens=None, *, pro=None) -> None:
        """The quantize launch(es) alone: read what an earlier stats launch on ``bufs`` wrote."""
        quant_args = self._arguments(q, k, v, bufs, key_lens, pro=pro)[1]
        for quant in self.quants:
            quant(quant_args, stream)

    def _arguments(self, q, k, v, bufs: dict, key_lens, pro=None) -> tuple[tuple, tuple]:
        b = bufs
        if self.key_lens and key_lens is None:
            raise ValueError("this plan reads per-batch key counts: pass key_lens")
        if (pro is None) != (self.prologue is None):
            raise ValueError("this plan has a prologue: pass pro=(wq, wk, cos, sin, text_rows[, rsq, rsk])"
                             if pro is None else
                             "this plan has no prologue: pro must be None")
        # without them the pointer is never read (any int32 tensor does)
        if self.qk_int8:
            rot, kmr, qs = b["rot"], b["k_mean_rot"], b["q_scales"]
        else:  # never read
            rot, kmr, qs = b["scales"], b["k_mean"], b["scales"]
        stats = (q, k, v, b["qpart"], b["vpart"], b["ksum"], b["kmax"], b["kmin"], b["k_mean"], b["scales"],
                 b["flags"], b["count"], key_lens if self.key_lens else b["count"], rot, kmr)
        # the quantize pass subtracts the mean of the basis it quantizes in
        quant = (q, k, v, b["q8"], b["k8"], b["v8t"], kmr if self.qk_int8 else b["k_mean"], b["scales"], qs, rot,
                 b["flags"])
        if pro is not None:
            extra = self._prologue_arguments(pro)
            stats, quant = stats + extra, quant + extra
        return stats, quant

    def _prologue_arguments(self, pro) -> tuple:
        # the per-call prologue tensors in _PRO_ARGS order (then rsq, rsk with rms_across); those the spec does not
        # use become None (the build's constexpr). Checked here because the compiled kernel is specialised on the
        # first call's dtypes and 16-byte alignment (as for q, k, v)
        spec, G = self.prologue, self.pro_groups
        n = 7 if spec.across else 5
        if not isinstance(pro, tuple) or len(pro) != n:
            raise ValueError("pro must be the tuple (wq, wk, cos, sin, text_rows" + (", rsq, rsk)" if n == 7 else ")"))
        wq, wk, cos, sin, text_rows = pro[:5]
        rs = pro[5:]
        if spec.norm is None:
            wq = wk = None
        rows = self.H if spec.across else G  # rms_across: one weight row per head
        for name, w in (("wq", wq), ("wk", wk)) if spec.norm is not None else ():
            if not (w.is_floating_point() and tuple(w.shape) == (rows, self.D) and w.is_contiguous()):
                raise ValueError(f"prologue {name} must be a contiguous float ({rows}, {self.D}) tensor (the plan's "
                                 f"{'heads' if spec.across else 'pro_groups'}), got {w.dtype} {tuple(w.shape)}")
        for name, t in zip(("rsq", "rsk"), rs):
            if t.dtype != torch.float32 or tuple(t.shape) != (self.B, self.Sq) or not t.is_contiguous():
                raise ValueError(f"prologue {name} must be a contiguous float32 ({self.B}, {self.Sq}) tensor, got "
                                 f"{t.dtype} {tuple(t.shape)}")
        R = spec.rotated(self.D)
        if not R:
            cos = sin = None
        for name, t in (("cos", cos), ("sin", sin)) if R else ():
            if t.dtype != torch.float32 or tuple(t.shape) != (self.Sq, R // 2) or not t.is_contiguous():
                raise ValueError(f"prologue {name} must be a contiguous float32 ({self.Sq}, {R // 2}) pair table "
                                 f"(prologue.pair_tables), got {t.dtype} {tuple(t.shape)}")
        for t in (wq, wk, cos, sin, *rs):
            if t is not None and t.data_ptr() % 16:
                raise ValueError("prologue tensors must be 16-byte aligned (the kernels are specialised on it)")
        return (wq, wk, cos, sin, int(text_rows), *rs)


def check_prologue_plan(spec: PrologueSpec | None, groups: int, q, k, qk_int8: bool, skip_q: bool) -> None:
    """ValueError (one line) unless a prep plan can take the prologue ``spec`` for these q and k."""
    if spec is None:
        return
    if not qk_int8:
        raise ValueError("the fused prologue needs the INT8 Q/K prep (qk_int8=True)")
    if skip_q:
        raise ValueError("the fused prologue needs the prep's Q (skip_q=False): the kernel's own Q rotation has none")
    if q.shape[1] != k.shape[1]:
        raise ValueError(f"the fused prologue needs q and k of one sequence length, got {q.shape[1]} and "
                         f"{k.shape[1]}")
    if groups not in (1, 2) or (spec.across and groups != 1):
        raise ValueError(f"pro_groups must be 1 or 2 (1 with rms_across), got {groups}")
    if spec.rotated(q.shape[3]) > q.shape[3]:
        raise ValueError(f"prologue rope_dim {spec.rope_dim} exceeds head_dim {q.shape[3]}")


def prepare_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, smooth_k: bool, *, out=None, key_lens=None,
                   qk_int8: bool = False, config: PrepConfig = PrepConfig(), prologue: PrologueSpec | None = None,
                   pro=None):
    """Run the kernels on (B, S, H, D)-indexed views (any strides) with the launch configuration ``config``. Returns
    (q8, k8, v8t, scales, k_mean, q_scales); q_scales is None unless ``qk_int8``.

    ``out``: optional (q8, k8, v8t, scales[, q_scales]) contiguous buffers to write into (checked by
    ``prep.fp8_prepare``). No input checks and no finiteness check here: ``prep.fp8_prepare`` does those.
    ``prologue``, ``pro``: the fused prologue's spec and tensors (wq, wk, cos, sin, text_rows; rms_across: then its row
    factors rsq, rsk), q and k raw.
    """
    groups = norm_groups(prologue, pro[0]) if prologue is not None else 1
    plan = PrepPlan(q, k, v, smooth_k, key_lens=key_lens is not None, qk_int8=qk_int8, config=config,
                    prologue=prologue, pro_groups=groups)
    bufs = plan.buffers(q.device, out)
    ctx = torch.cuda.device(q.device) if q.device.type == "cuda" else _NullCtx()
    with ctx:
        plan.launch(q, k, v, bufs, key_lens=key_lens, pro=pro)
    return (bufs["q8"], bufs["k8"], bufs["v8t"], bufs["scales"], (bufs["k_mean"] if smooth_k else None),
            bufs.get("q_scales"))


class _NullCtx:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def compile_offline(arch: int = 90, *, dtype: str = "bf16", head_dim: int = 128, smooth_k: bool = True,
                    qk_int8: bool = False, config: PrepConfig = PrepConfig(), prologue: PrologueSpec | None = None,
                    pro_groups: int = 1):
    """Compile the kernels for ``sm_<arch>`` without a GPU (triton.compile + the wheel's ptxas), with the
    specializations a real launch gets (16-divisible pointers, strides and padded lengths; unit feature stride) and
    the launch configuration ``config`` (its ``stats_chunk`` as the chunk; ``stats_rot_rows`` 0 builds 32-row
    rotated tiles). Returns {kernel name: CompiledKernel} (``.asm["ptx"]``, ``.asm["cubin"]``, ``.metadata``):
    "stats", "quant" and, with ``split_v`` in INT8 mode, "quant_v". For tests and inspection (vectorized
    loads/stores, IEEE division, e4m3 cvt); not used at run time. ``prologue``: the fused prologue's build (INT8
    Q/K; norm weights in the inputs' dtype).
    """
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    check_config(config)
    config = build_config(config, prologue)
    target = GPUTarget("cuda", arch, 32)
    elem = {"bf16": "*bf16", "fp16": "*fp16"}[dtype]
    div16 = {"sqb", "sqs", "sqh", "skb", "sks", "skh", "svb", "svs", "svh", "Sq_pad", "Sk_pad"}
    unit = {"sqd", "skd", "svd"}
    qk = "*i8" if qk_int8 else "*fp8e4nv"
    ptr_types = {
        "q_ptr": elem, "k_ptr": elem, "v_ptr": elem,
        "qpart_ptr": "*i32", "vpart_ptr": "*i32", "ksum_ptr": "*fp64", "kmax_ptr": "*fp32", "kmin_ptr": "*fp32",
        "mean_ptr": "*fp32", "scales_ptr": "*fp32", "flags_ptr": "*i32", "count_ptr": "*i32", "klens_ptr": "*i32",
        "q8_ptr": qk, "k8_ptr": qk, "v8t_ptr": "*fp8e4nv",
        "rot_ptr": elem, "kmr_ptr": "*fp32", "qs_ptr": "*fp32",
        "wq_ptr": elem, "wk_ptr": elem, "cos_ptr": "*fp32", "sin_ptr": "*fp32", "eps": "fp32",
        "rsq_ptr": "*fp32", "rsk_ptr": "*fp32",
    }
    pro = dict(prologue_constants(prologue, head_dim, pro_groups), **rs_constants(prologue))
    if prologue is not None:
        del pro["eps"]  # a runtime fp32 argument, as in the plan's launches

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
                if name.endswith("_ptr") or name in div16:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        src = ASTSource(fn, sig, constexprs=constexprs, attrs=attrs)
        return triton.compile(src, target=target, options={"num_warps": num_warps, "enable_fp_fusion": True})

    stats = stats_constants(config, D=head_dim, chunk=config.stats_chunk, rot_rows=config.stats_rot_rows or 32,
                            smooth_k=smooth_k, key_lens=False, qk_int8=qk_int8, interpret=False)
    quant = quant_constants(config, D=head_dim, smooth_k=smooth_k, qk_int8=qk_int8, interpret=False)
    kernels = {"stats": build(_stats_kernel, dict(stats, **pro), config.stats_warps)}
    for name, (do_qk, do_v) in zip(("quant", "quant_v"), quant_launches(config, qk_int8)):
        kernels[name] = build(_quant_kernel, dict(quant, DO_QK=do_qk, DO_V=do_v, **pro), config.quant_warps)
    return kernels
