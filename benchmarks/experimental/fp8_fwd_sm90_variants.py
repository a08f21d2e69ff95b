"""Hopper-native FP8 FlashAttention forward (sm_90a): TMA + mbarrier pipelines + warpgroup MMA (QGMMA).

Design (issue 5, part 1)
------------------------
CTA = 1 producer + ``consumer_wgs`` consumer warpgroups (4 x 128 threads by default), one CTA per
(64 * consumer_wgs query rows, head, batch):

* warpgroup 0 — producer. ``setmaxnreg`` down to ``REGS_PRODUCER``; its first warp issues every TMA load:
  Q once (one 64-row box per consumer warpgroup, on one mbarrier), then K and V tiles of ``tile_n``
  (160 by default) keys into ``kv_stages``-deep smem rings (separate K and V ``PipelineTmaAsync`` pipelines so the
  consumers can ask for K[j+1] before V[j]).
* warpgroups 1 .. consumer_wgs — consumers, ``setmaxnreg`` up to ``REGS_CONSUMER``. Each owns 64 query rows and runs
  the whole online-softmax loop for them with ``warpgroup.MmaF8Op`` (e4m3 x e4m3 -> fp32, m64nNk32):
  S = Q K^T with both operands read from swizzled smem (K-major: Q and K rows are D-contiguous), then
  O += P V with P from registers (A operand, K-major by construction) and V^T from smem (the prep stores V
  feature-major, so the key axis — the K axis of this GEMM — is contiguous: K-major as FP8 wgmma requires).
* Options (compile-cache key, ``DEFAULT_OPTIONS``): ``tile_n`` (keys per tile, 160), ``kv_stages`` (3),
  ``overlap`` (True; used when serial_pv is off), ``pingpong`` (False; FA3's warp-scheduler barriers: named
  barriers 1 and 2 make two consumer warpgroups take turns issuing their GEMMs), ``pin_wait`` ("sts"),
  ``skip_rescale`` (True), ``poly_every`` (0), ``consumer_wgs`` (3), ``serial_pv`` (True), ``exp_turns`` (False),
  ``pv_promote`` (True), ``pv_split`` (2), ``sum_mma`` (True), ``pv_fence`` (True), ``pv_pipe`` (False),
  ``max_chains`` (4), ``rows_first`` (False), ``lazy_max`` (False), ``trace`` (False: diagnostic, see TRACE_* below).
  Options other than tile_n, poly_every, poly_degree, sum_mma, max_chains and lazy_max only schedule the same arithmetic and give
  bit-identical results (test_fp8_sm90_variants_gpu.py checks it); benchmarks/NOTES.md has what each one measured.
* ``pv_promote`` (default): each tile's P V goes into a fresh wgmma accumulator and is added on the FP32 cores,
  O = O * alpha + O_tile. Accumulating O across tiles inside the FP8 wgmma loses the low bits of every tile's
  term once |O| is large (short accumulator alignment): 53 % error on a long key range with a biased V. Costs 64
  registers: tile 192 with overlap spills with it; ``pv_split`` (with ``serial_pv``) computes P V in head_dim slices
  into a smaller fresh accumulator, which is what lets 3 consumer warpgroups (160 registers) promote.
* Intra-warpgroup overlap (FA3 style, ``overlap=True``): iteration j issues S_j = Q K_j^T and
  O += P_{j-1} V_{j-1} back to back, waits only for S_j, does the softmax of S_j while the PV wgmma runs,
  then waits for it and rescales O. ``overlap=False`` keeps the same code but waits for both wgmma groups
  before the softmax (a debugging fallback with identical numerics).
* ``pin_wait="sts"``: ptxas treats the PV wait (WARPGROUP.DEPBAR) as free to hoist and, left alone, puts it
  at the top of the softmax (so the softmax never overlapped its own PV). A shared-memory store of
  l_row0 + l_row1 (needs every exp of the tile) just before the wait keeps the wait after the softmax.
  The exps use the side-effecting inline-asm ``ex2.approx.ftz`` (``cute.arch.exp2``): with ``math.exp2`` LLVM
  cloned/sank them past the wait into the rescale branch.
* ``skip_rescale`` (without pv_promote): a warp vote skips O *= alpha when alpha == 1 for all of the warp's rows
  (max unchanged); multiplying by 1.0 is the identity, so this is exact.
* ``consumer_wgs=3`` (default; 192 query rows per CTA, 160 registers each) with ``serial_pv`` (PV_{j-1} finished
  before QK_j is issued, so S and P are never live together; the other warpgroups supply the overlap).
  ``exp_turns`` (the consumer warpgroups take turns for their exps on named barriers 3..5, pinned in SASS by a
  shared store before each arrive and a shared load after each sync): measured slower, kept as an option.
* ``sum_mma`` (default): the row sums l come from the tensor cores, an m64n8 wgmma of P (the same registers as
  P V's A operand) with a constant smem tile of e4m3 1.0, issued with the first P V slice: the softmax loses its
  80 FADDs (and their dependency chains) per thread and tile, and l sums exactly the e4m3 values that P V
  multiplies. Timeline (benchmarks/sm90_timeline.py): softmax 2153 -> 1646 SM cycles per warpgroup-tile.
* ``pv_fence`` (default): a clock read (an instruction ptxas does not move code across) in a branch that is never
  taken, right after the P V merge: without it ptxas interleaves the next QK's set-up with the merge and keeps 3-5
  values in local memory.
* ``pv_pipe``: the P V slices two in flight (a second fresh accumulator, which reuses the dead S registers), so a
  slice's merge runs under the next slice's wgmma. Shorter P V phase, longer softmax (more warpgroups in it at
  once): no gain in SM cycles per tile, kept as an option.
* ``lazy_max``: the exps start against the running max as soon as S is ready; the tile's row maxima (taken over the
  exps) only decide by a warp vote whether the warp rescales (a row rose more than LAZY_MAX_SLACK) or recomputes
  its scores from shared memory (an exp may have overflowed). Correct (tests), measured slower: packing P has to
  wait for the vote (benchmarks/NOTES.md, "Session 4").
* ``poly_every=k``: every k-th 8-column group of S uses ``exp2_poly`` (FMA pipe) instead of MUFU.EX2 (FA4's
  trick). Correct, but measured slower here: the kernel is latency-bound, not MUFU-bound (benchmarks/NOTES.md).
* ``linexp_every=k``: every k-th 8-column group's P*256 is a linear-exp e4m3 value (``exp2_linbyte``: the byte's
  exponent field from floor(y), its mantissa linear in frac(y); 5 FMA/ALU instructions, no MUFU) -- a different
  rounding of P (+0.1-0.3 pp rel-RMS, benchmarks/NOTES.md "issue 20 lever 3"). Not yet run on a GPU.

P in registers, no shuffles
---------------------------
The wgmma fp32 accumulator gives lane (quad q = lane%4, group g = lane//4) of each warp the columns
8j + 2q + {0,1} of rows g and g+8 (value index c + 2r + 4j). The e4m3 register A fragment of m64nNk32 wants
lane q to hold k-slots 4q..4q+3 and 16+4q..16+4q+3 of each 32-wide k-block (value index e + 4r + 8h). These
are exactly the mma.sync m16n8k32 layouts, so the seed kernel's key permutation works unchanged: inside
every 16-key group, storage position p of V holds key

    sm90_key_order_for_positions(p) = g + 8*(e//2) + 2*quad + e%2,   g = p//16*16, quad = (p%16)//4, e = p%4

(identical to ``key_order.key_order_for_positions``; it only permutes inside 16-key groups, so any key tile
that is a multiple of 16 — ours is 160 by default — works). With it, A value (a, b, r, h) of k-block kb (slot 4q+a+2b+16h)
is accumulator value a + 2r + 4b + 8h + 16kb: a register-only re-indexing (bits b and r swap), no shuffles.

Numerics (ARCHITECTURE.md, "FP8 numerics") with the tiling's differences
----------------------------------------------------------------------------
* qk_scale = descale_q * descale_k * softmax_scale * log2(e) (exp2 domain); descales read in-kernel.
* The running max is per ``tile_n``-key tile (160 by default), not per 32-key strip: keys in natural order, tiles
  processed in increasing key order, keys >= Sk masked to -inf (only the last tile is masked).
  m is kept in the raw (unscaled) accumulator domain: max commutes with the positive qk_scale.
* P*256 is produced directly: p256 = exp2(S*qk_scale - (m*qk_scale - 8)) (one FFMA + ex2.approx per score),
  P8 = e4m3(p256) (cvt.rn.satfinite), O += P8 @ V8 in fp32; l accumulates the e4m3 P8 (sum_mma, default) or the
  fp32 p256 (sum_mma=False, the seed design's choice).
* Epilogue: O = O * descale_v / l  (l already carries the x256), LSE = ln2 * (m*qk_scale - 8 + log2 l).
  Rows >= Sq are not written.

Inputs (the shared prep's contract): q8 (B,H,Sq_pad,D) with Sq_pad % 128 == 0, k8 (B,H,Sk_pad,D),
v8t (B,H,D,Sk_pad) with Sk_pad % 32 == 0 (TMA zero-fills the box beyond Sk_pad), scales (B,H,3) fp32.
Outputs: out (B,Sq,H,D) bf16 (or fp16), lse (B,H,Sq) fp32. head_dim 128 (64 also compiles).
Every tensor must have < 2**31 elements (32-bit index arithmetic).
"""

from __future__ import annotations

import math
import struct
from typing import Any, Dict, Tuple

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Float16, Float32, Float8E4M3FN, Int32, Uint8, Uint32, const_expr
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

import cuda.bindings.driver as cuda
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from ditprof.kernels.cute_arch import cute_dsl_arch
from ditprof.kernels.fp8_fwd_sm90 import set_accumulate, store_o_row, tma_views
from ditprof.kernels.key_order import key_order_for_positions
# the shipped launcher's TVM-FFI switch and record: a TVM-FFI failure here turns it off for the shipped launches of
# this process too (LAUNCH_INFO["tvm_ffi_error"] keeps the reason)
from ditprof.kernels.kernel_args import LAUNCH_INFO, tvm_ffi_launch_enabled

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)

TILE_M_WG = 64  # query rows per consumer warpgroup (wgmma M)
NUM_MMA_WG = 2  # default number of consumer warpgroups (option ``consumer_wgs``)
TILE_M = TILE_M_WG * NUM_MMA_WG  # 128 query rows per CTA by default (== the prep's Sq padding)
REGS_PRODUCER = 24
# setmaxnreg budgets per consumer count: 128 * (24 + n * R) must fit the 64K-register file
REGS_CONSUMER = {2: 240, 3: 160}
PIN_ZERO_SLOT = 16  # smem scratch slot holding 0.0 (slots 0..15: per-warp pin stores)
EXP_BARRIER0 = 3  # named barriers 3..5: exp turns of the consumer warpgroups (option exp_turns)
SCHED_BARRIER0 = 1  # named barriers 1, 2: warp-scheduler ping-pong between the consumer warpgroups (0 = syncthreads)
# option trace (serial_pv only): the CTAs of query block 0 write, instead of their LSE, SM-clock offsets from the
# kernel start into their head's LSE row: per consumer warp w and key tile j < TRACE_TILES the 4 events
# TRACE_EVENTS at ((w * TRACE_TILES + j) * 4 + e); the producer's K and V issue times after them at
# TRACE_PRODUCER + 2 * j + (0 | 1). benchmarks/sm90_timeline.py turns them into a Chrome trace.
SUM_COLS = 8  # sum_mma: width of the ones tile (the narrowest wgmma N)
# lazy_max: a tile keeps the running max as its reference while no row's tile max exceeds it by more than
# LAZY_MAX_SLACK (exp2 units): P*256 <= 2^(8 + 0.75) = 431 < 448, the largest e4m3 value, so P8 never saturates.
LAZY_MAX_SLACK = 0.75
# ... and when a row's max jumps by more than this, the speculative exps (relative to the old max) may have
# overflowed to inf (ex2 of >= 128): that warp recomputes its scores exactly from shared memory instead of rescaling
LAZY_MAX_OVERFLOW = 100.0
TRACE_TILES = 192
TRACE_EVENTS = ("start", "pv_done", "s_ready", "p_ready")
TRACE_PRODUCER = 12 * TRACE_TILES * 4
TRACE_FLOATS = TRACE_PRODUCER + 2 * TRACE_TILES

# exp2 on the FMA pipe (``poly_every``): 2^x = 2^j * 2^f, j = round(x) by the 1.5*2^23 trick, f in [-0.5, 0.5],
# 2^f by a degree-3 polynomial (relative minimax fit, max rel. error 7.5e-5 after fp32 rounding of the
# coefficients), 2^j added to the exponent bits. x is clamped at -126 so that 2^j never wraps the exponent
# (-127 would: p(0) = 0.99993 has exponent 126, and 126 - 127 < 0 gives a NaN pattern). x = -inf (the mask)
# gives a denormal ~1e-38: P*256 in e4m3 is 0 and l changes by 1e-38.
EXP2_POLY = (0.9999280571937561, 0.6932609677314758, 0.2426111400127411, 0.0551716685295105)
# Degree 2 (``poly_degree=2``): one FFMA less, max. relative error 1.72e-3 (relative minimax fit on [-0.5, 0.5],
# after fp32 rounding of the coefficients). P is rounded to e4m3 next (3 mantissa bits, spacing 2^-3), so this
# moves ~3 % of those roundings to the neighbouring value; the clamp argument above holds (p(-0.5) = 0.7069).
EXP2_POLY2 = (1.0004432201385498, 0.7034482359886169, 0.23842886090278625)


def _exp2_poly_asm(coeffs) -> str:
    """The PTX of exp2_poly for polynomial coefficients (c0, c1, ...) of 2^f, evaluated by Horner's rule."""
    c = ["0f%08X" % struct.unpack("<I", struct.pack("<f", x))[0] for x in coeffs]
    horner = [f"fma.rn.f32 p, f, {c[-1]}, {c[-2]};\n\t"] + [f"fma.rn.f32 p, p, f, {x};\n\t" for x in reversed(c[:-2])]
    return (
        "{\n\t.reg .f32 x, t, j, f, p;\n\t.reg .b32 ti, pi;\n\t"
        "max.f32 x, $1, 0fC2FC0000;\n\t"  # -126
        "add.rn.f32 t, x, 0f4B400000;\n\t"  # 1.5 * 2^23: t's low mantissa bits = round(x)
        "sub.rn.f32 j, t, 0f4B400000;\n\t"
        "sub.rn.f32 f, x, j;\n\t"
        + "".join(horner)
        + "mov.b32 ti, t;\n\tmov.b32 pi, p;\n\t"
        "shl.b32 ti, ti, 23;\n\t"  # round(x) << 23 (the magic number's own bits shift out)
        "add.s32 pi, pi, ti;\n\t"
        "mov.b32 $0, pi;\n\t}"
    )


_EXP2_POLY_ASM = {3: _exp2_poly_asm(EXP2_POLY), 2: _exp2_poly_asm(EXP2_POLY2)}

# P*256 = 2^y (y = S*scale - bias <= 8) as the e4m3 value of a linear-exp byte (``linexp_every``; issue 20 lever 3,
# accuracy in benchmarks/NOTES.md "issue 20 lever 3"): n = rne(8 (y + 7) + LINEXP_C) clamped at 0 is the byte (the
# exponent field floor(y + 7), three mantissa bits linear in frac(y)); the fp32 with the same value has the bits
# (n << 20) + (120 << 23). The caller forms u = 8 y + 56 + LINEXP_C = S * (8 scale) + (56 + LINEXP_C - 8 bias) in
# one FFMA (a per-row constant); then FMNMX, FADD (1.5 * 2^23 rounds to an integer), SHL + IADD (one LEA): four
# FMA/ALU-pipe instructions per P instead of FFMA + MUFU.EX2. The e4m3 conversion in pack_p then gives exactly
# byte n (n < 8: 2^-7 (1 + n/8) rounds to a subnormal; P < 2^-14 of the running max).
LINEXP_C = -0.45
_LINEXP_ASM = (
    "{\n\t.reg .f32 u, t;\n\t.reg .b32 ti;\n\t"
    "max.f32 u, $1, 0f00000000;\n\t"
    "add.rn.f32 t, u, 0f4B400000;\n\t"  # the low mantissa bits of t = rne(u)
    "mov.b32 ti, t;\n\t"
    "shl.b32 ti, ti, 20;\n\t"  # n << 20 (the magic number's bits shift out)
    "add.u32 ti, ti, 1006632960;\n\t"  # + 120 << 23: the fp32 exponent of e4m3's bias
    "mov.b32 $0, ti;\n\t}"
)


@dsl_user_op
def exp2_linbyte(u, *, loc=None, ip=None) -> Float32:
    """The linear-exp e4m3 value of P*256 from u = 8 y + 56 + LINEXP_C (y = log2(P*256) <= 8): FMNMX, FADD, LEA."""
    return Float32(llvm.inline_asm(T.f32(), [Float32(u).ir_value(loc=loc, ip=ip)], _LINEXP_ASM, "=f,f",
                                   has_side_effects=True, is_align_stack=False,
                                   asm_dialect=llvm.AsmDialect.AD_ATT))


@dsl_user_op
def exp2_poly(x, degree: int = 3, *, loc=None, ip=None) -> Float32:
    """2^x (x <= 128) without MUFU: ~8-9 FMA/ALU-pipe instructions, relative error <= 8e-5 (degree 3) or
    1.8e-3 (degree 2)."""
    return Float32(llvm.inline_asm(T.f32(), [Float32(x).ir_value(loc=loc, ip=ip)], _EXP2_POLY_ASM[degree], "=f,f",
                                   has_side_effects=True, is_align_stack=False,
                                   asm_dialect=llvm.AsmDialect.AD_ATT))


# One P register (4 e4m3 bytes) from 4 fp32 exps: two satfinite e4m3x2 conversions, the second merged into the
# upper half. The generic vector conversion (``.to(Float8E4M3FN)`` + store through the P layout) converts the pairs
# in another grouping and lets ptxas reassemble some words with ~20 PRMT/LOP3 per tile; this is the same rounding.
_PACK_E4M3_WORD_ASM = (
    "{\n\t.reg .b16 lo, hi;\n\t"
    "cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1;\n\t"  # upper byte <- $2, lower byte <- $1
    "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;\n\t"
    "mov.b32 $0, {lo, hi};\n\t}"
)


@dsl_user_op
def pack_e4m3_word(b0, b1, b2, b3, *, loc=None, ip=None) -> Uint32:
    """Bytes (b0, b1, b2, b3) = e4m3(satfinite) of four fp32 values, b0 the least significant."""
    args = [Float32(x).ir_value(loc=loc, ip=ip) for x in (b0, b1, b2, b3)]
    return Uint32(llvm.inline_asm(T.i32(), args, _PACK_E4M3_WORD_ASM, "=r,f,f,f,f", has_side_effects=False,
                                  is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


# the mma.sync kernel's permutation also fits wgmma's accumulator -> e4m3 A-operand registers (module docstring)
sm90_key_order_for_positions = key_order_for_positions


# Compile-time options (the compile-cache key); the defaults (v6, benchmarks/NOTES.md "Session 3"): 3 consumer
# warpgroups, 160-key tiles, PV_{j-1} finished before QK_j, each tile's P V promoted to FP32 in two head_dim
# halves, the row sums l from the tensor cores (sum_mma) and the clock fence after the merge (pv_fence: no spills).
# H3 shape on the H200 (kernel, medians): v6 27.89 / 28.17 / 27.29 ms vs v5 29.41 / 28.27 / 29.41 ms in the same
# three sweeps (v5 spilled 12 bytes).
DEFAULT_OPTIONS: Dict[str, Any] = dict(
    tile_n=160,  # keys per K/V tile (multiple of 32)
    kv_stages=3,  # depth of the K and V smem rings
    overlap=True,  # intra-warpgroup overlap: the softmax of S_j runs under the PV wgmma of tile j-1
    pingpong=False,  # FA3 warp-scheduler barriers between the two consumer warpgroups
    pin_wait="sts",  # "sts": keep the PV wait after the softmax in SASS (see kernel); "none": ptxas hoists it
    skip_rescale=True,  # skip O *= alpha when no row of the warp changed its max (warp vote; exact)
    poly_every=0,  # k > 0: every k-th 8-column group of S uses exp2_poly (FMA pipe) instead of MUFU.EX2
    poly_degree=3,  # exp2_poly's polynomial: 3 (rel. error 8e-5) or 2 (1.8e-3, one FFMA less; P is e4m3 anyway)
    linexp_every=0,  # k > 0: every k-th 8-column group's P*256 from exp2_linbyte (a linear-exp e4m3 value, no MUFU)
    consumer_wgs=3,  # consumer warpgroups per CTA (64 query rows each); 3: more warps per scheduler, 160 regs
    serial_pv=True,  # finish PV_{j-1} before issuing QK_j (no intra-warpgroup overlap; S and P never both live)
    exp_turns=False,  # consumer warpgroups take turns for their exps (named barriers): MUFU not shared in phase
    pv_promote=True,  # P V of each tile into a fresh accumulator, added to O in FP32 on the CUDA cores
    pv_split=2,  # promoted P V in 2 (or 4) head_dim slices: a 32- (16-) register fresh accumulator; needs serial_pv
    max_chains=4,  # independent FMNMX / FADD chains per row in the softmax (4 or 8): shorter dependency latency
    rows_first=False,  # both rows' maxima (and their shuffles) before any exp, instead of row by row
    sum_mma=True,  # row sums l from the tensor cores (P8 @ ones, an m64n8 wgmma beside P V): no FADDs in the softmax
    pv_pipe=False,  # pv_split slices two in flight (double-buffered fresh accumulator): merge h under slice h+1's wgmma
    pv_fence=True,  # a clock read (in a never-taken branch) after each P V merge: ptxas stops interleaving there; no spills
    pack_asm=False,  # P registers built by explicit e4m3x2 conversions (pack_e4m3_word) instead of a vector convert
    lazy_max=False,  # exps start at once against the running max; the tile max only decides (warp vote) whether to rescale
    trace=False,  # diagnostic: CTAs of query block 0 write SM-clock timestamps into the LSE buffer (see TRACE_*)
)


def options(**opts) -> Dict[str, Any]:
    """DEFAULT_OPTIONS updated with ``opts`` (unknown names raise)."""
    bad = set(opts) - set(DEFAULT_OPTIONS)
    if bad:
        raise TypeError(f"unknown sm90 kernel options: {sorted(bad)}")
    out = dict(DEFAULT_OPTIONS)
    out.update(opts)
    return out


class Sm90Fp8Attention:
    """Compile-time configuration + the jit entry point (``__call__``) and the kernel."""

    def __init__(self, head_dim: int = 128, dtype_out=BFloat16, **opts):
        opts = options(**opts)
        if head_dim not in (64, 128):
            raise ValueError(f"head_dim {head_dim} not supported (64 or 128)")
        if opts["tile_n"] % 32 or not 32 <= opts["tile_n"] <= 256:
            raise ValueError("tile_n must be a multiple of 32 in [32, 256]")
        if opts["pin_wait"] not in ("none", "sts"):
            raise ValueError(f"pin_wait must be 'none' or 'sts', not {opts['pin_wait']!r}")
        if not 0 <= opts["poly_every"] <= opts["tile_n"] // 8:
            raise ValueError("poly_every must be in [0, tile_n / 8]")
        if not 0 <= opts["linexp_every"] <= opts["tile_n"] // 8:
            raise ValueError("linexp_every must be in [0, tile_n / 8]")
        if opts["linexp_every"] and (opts["poly_every"] or opts["lazy_max"]):
            raise ValueError("linexp_every replaces MUFU exps on the eager path: not with poly_every or lazy_max")
        if opts["poly_degree"] not in (2, 3):
            raise ValueError("poly_degree must be 2 or 3")
        if opts["consumer_wgs"] not in REGS_CONSUMER:
            raise ValueError(f"consumer_wgs must be one of {sorted(REGS_CONSUMER)}")
        if opts["pv_split"] not in (1, 2, 4) or (opts["pv_split"] > 1 and not (opts["pv_promote"] and opts["serial_pv"])):
            raise ValueError("pv_split must be 1, or 2 or 4 with pv_promote and serial_pv")
        if opts["pv_pipe"] and opts["pv_split"] == 1:
            raise ValueError("pv_pipe needs pv_split 2 or 4")
        if opts["max_chains"] not in (4, 8):
            raise ValueError("max_chains must be 4 or 8")
        if opts["sum_mma"] and not opts["serial_pv"]:
            raise ValueError("sum_mma needs serial_pv")
        if opts["trace"] and not opts["serial_pv"]:
            raise ValueError("trace needs serial_pv")
        if opts["lazy_max"] and not (opts["serial_pv"] and opts["sum_mma"]) or opts["lazy_max"] and opts["exp_turns"]:
            raise ValueError("lazy_max needs serial_pv and sum_mma, and not exp_turns")
        if opts["pingpong"] and opts["consumer_wgs"] != 2:
            raise ValueError("pingpong needs exactly 2 consumer warpgroups")
        self.head_dim = head_dim
        self.dtype_out = dtype_out
        self.opts = opts
        self.tile_n = opts["tile_n"]
        self.kv_stages = opts["kv_stages"]
        self.overlap = opts["overlap"]
        self.pingpong = opts["pingpong"]
        self.pin_wait = opts["pin_wait"]
        self.skip_rescale = opts["skip_rescale"]
        self.poly_every = opts["poly_every"]
        self.poly_degree = opts["poly_degree"]
        self.linexp_every = opts["linexp_every"]
        self.serial_pv = opts["serial_pv"]
        self.exp_turns = opts["exp_turns"]
        self.pv_promote = opts["pv_promote"]
        self.pv_split = opts["pv_split"]
        self.num_wg = opts["consumer_wgs"]
        self.trace = opts["trace"]
        self.max_chains = opts["max_chains"]
        self.rows_first = opts["rows_first"]
        self.sum_mma = opts["sum_mma"]
        self.pv_fence = opts["pv_fence"]
        self.pv_pipe = opts["pv_pipe"]
        self.lazy_max = opts["lazy_max"]
        self.pack_asm = opts["pack_asm"]
        # P V through pv_sliced (fresh accumulator per slice, merged in FP32; sum_mma's wgmma rides with slice 0)
        self.sliced_pv = self.pv_split > 1 or self.sum_mma
        self.tile_m = TILE_M_WG * self.num_wg
        self.regs_consumer = REGS_CONSUMER[self.num_wg]
        self.threads = 128 * (1 + self.num_wg)

    # ------------------------------------------------------------------ host side (traced at compile)
    @cute.jit
    def __call__(
        self,
        pQ: cute.Pointer,
        pK: cute.Pointer,
        pV: cute.Pointer,
        pScales: cute.Pointer,
        pO: cute.Pointer,
        pLSE: cute.Pointer,
        batch: Int32,
        heads: Int32,
        sq: Int32,
        sk: Int32,
        sq_pad: Int32,
        sk_pad: Int32,
        softmax_scale: Float32,
        stream: cuda.CUstream,
    ):
        D = self.head_dim
        f8 = Float8E4M3FN
        # Views with the (row, col, head, batch) mode order the TMA boxes tile.
        mQ = cute.make_tensor(
            cute.recast_ptr(pQ, dtype=f8),
            cute.make_layout((sq_pad, D, heads, batch), stride=(D, 1, sq_pad * D, heads * sq_pad * D)))
        mK = cute.make_tensor(
            cute.recast_ptr(pK, dtype=f8),
            cute.make_layout((sk_pad, D, heads, batch), stride=(D, 1, sk_pad * D, heads * sk_pad * D)))
        mV = cute.make_tensor(
            cute.recast_ptr(pV, dtype=f8),
            cute.make_layout((D, sk_pad, heads, batch), stride=(sk_pad, 1, D * sk_pad, heads * D * sk_pad)))
        mScales = cute.make_tensor(pScales, cute.make_layout((3, heads, batch), stride=(1, 3, 3 * heads)))
        mO = cute.make_tensor(
            pO, cute.make_layout((sq, D, heads, batch), stride=(heads * D, 1, D, sq * heads * D)))
        mLSE = cute.make_tensor(pLSE, cute.make_layout((sq, heads, batch), stride=(1, sq, heads * sq)))

        K_MAJOR = OperandMajorMode.K
        qk_mma = sm90_utils.make_trivial_tiled_mma(
            f8, f8, K_MAJOR, K_MAJOR, Float32, (1, 1, 1), (TILE_M_WG, self.tile_n))
        # a second instance for the first k-block (ACCUMULATE=False): the field is set once, outside loops
        qk_mma_zero = sm90_utils.make_trivial_tiled_mma(
            f8, f8, K_MAJOR, K_MAJOR, Float32, (1, 1, 1), (TILE_M_WG, self.tile_n))
        pv_mma = sm90_utils.make_trivial_tiled_mma(
            f8, f8, K_MAJOR, K_MAJOR, Float32, (1, 1, 1), (TILE_M_WG, D), warpgroup.OperandSource.RMEM)
        pv_mma_zero = sm90_utils.make_trivial_tiled_mma(
            f8, f8, K_MAJOR, K_MAJOR, Float32, (1, 1, 1), (TILE_M_WG, D), warpgroup.OperandSource.RMEM)
        # pv_split: P V in head_dim slices of D / pv_split columns (a smaller fresh accumulator to promote)
        pv_mma_h = sm90_utils.make_trivial_tiled_mma(
            f8, f8, K_MAJOR, K_MAJOR, Float32, (1, 1, 1), (TILE_M_WG, D // self.pv_split), warpgroup.OperandSource.RMEM)
        pv_mma_h_zero = sm90_utils.make_trivial_tiled_mma(
            f8, f8, K_MAJOR, K_MAJOR, Float32, (1, 1, 1), (TILE_M_WG, D // self.pv_split), warpgroup.OperandSource.RMEM)

        # sum_mma: l = P8 @ ones (8 identical columns, the narrowest wgmma) from a constant smem tile of e4m3 1.0
        sum_mma = sm90_utils.make_trivial_tiled_mma(
            f8, f8, K_MAJOR, K_MAJOR, Float32, (1, 1, 1), (TILE_M_WG, SUM_COLS), warpgroup.OperandSource.RMEM)
        sum_mma_zero = sm90_utils.make_trivial_tiled_mma(
            f8, f8, K_MAJOR, K_MAJOR, Float32, (1, 1, 1), (TILE_M_WG, SUM_COLS), warpgroup.OperandSource.RMEM)
        sOnes_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (TILE_M_WG, SUM_COLS, self.tile_n), f8, 1)

        qk_tiler = (TILE_M_WG, self.tile_n, D)
        pv_tiler = (TILE_M_WG, D, self.tile_n)
        sQ_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, qk_tiler, f8, self.num_wg)
        sK_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, qk_tiler, f8, self.kv_stages)
        sV_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, pv_tiler, f8, self.kv_stages)

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, mQ_tma = cpasync.make_tiled_tma_atom(
            g2s, mQ, cute.slice_(sQ_layout, (None, None, 0)), (TILE_M_WG, D))
        tma_k, mK_tma = cpasync.make_tiled_tma_atom(
            g2s, mK, cute.slice_(sK_layout, (None, None, 0)), (self.tile_n, D))
        tma_v, mV_tma = cpasync.make_tiled_tma_atom(
            g2s, mV, cute.slice_(sV_layout, (None, None, 0)), (D, self.tile_n))
        self.q_bytes = TILE_M_WG * D * self.num_wg
        self.kv_bytes = self.tile_n * D

        SharedStorage = _shared_storage(self.kv_stages, cute.cosize(sQ_layout), cute.cosize(sK_layout),
                                        cute.cosize(sV_layout), cute.cosize(sOnes_layout) if self.sum_mma else 0)
        self.shared_storage = SharedStorage
        self.smem_bytes = SharedStorage.size_in_bytes()

        grid = (cute.ceil_div(sq, self.tile_m), heads, batch)
        self.kernel(
            qk_mma, qk_mma_zero, pv_mma, pv_mma_zero, pv_mma_h, pv_mma_h_zero, sum_mma, sum_mma_zero,
            tma_q, mQ_tma, tma_k, mK_tma, tma_v, mV_tma,
            mScales, mO, mLSE, sq, sk, softmax_scale * LOG2E,
            sQ_layout, sK_layout, sV_layout, sOnes_layout,
        ).launch(grid=grid, block=[self.threads, 1, 1], stream=stream, min_blocks_per_mp=1)

    # ------------------------------------------------------------------ device side
    @cute.kernel
    def kernel(
        self,
        qk_mma: cute.TiledMma,
        qk_mma_zero: cute.TiledMma,
        pv_mma: cute.TiledMma,
        pv_mma_zero: cute.TiledMma,
        pv_mma_h: cute.TiledMma,
        pv_mma_h_zero: cute.TiledMma,
        sum_mma: cute.TiledMma,
        sum_mma_zero: cute.TiledMma,
        tma_q: cute.CopyAtom,
        mQ: cute.Tensor,
        tma_k: cute.CopyAtom,
        mK: cute.Tensor,
        tma_v: cute.CopyAtom,
        mV: cute.Tensor,
        mScales: cute.Tensor,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        sq: Int32,
        sk: Int32,
        scale_log2: Float32,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        sOnes_layout: cute.ComposedLayout,
    ):
        D = self.head_dim
        tile_n = self.tile_n
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, bat = cute.arch.block_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = cute.arch.make_warp_uniform(tidx // 128)

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)

        one = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, 4 * self.num_wg)  # one arrive per warp
        q_pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.q_mbar.data_ptr(), num_stages=1, producer_group=one,
            consumer_group=consumers, tx_count=self.q_bytes, defer_sync=True)
        k_pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.k_mbar.data_ptr(), num_stages=self.kv_stages, producer_group=one,
            consumer_group=consumers, tx_count=self.kv_bytes, defer_sync=True)
        v_pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.v_mbar.data_ptr(), num_stages=self.kv_stages, producer_group=one,
            consumer_group=consumers, tx_count=self.kv_bytes, defer_sync=True)

        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        sPin = storage.pin.get_tensor(cute.make_layout(32))

        n_tiles = cute.ceil_div(sk, tile_n)

        if tidx == 0:
            sPin[PIN_ZERO_SLOT] = Float32(0.0)
        if const_expr(self.sum_mma):
            # every byte is one element, so the swizzle does not matter: e4m3 1.0 = 0x38
            ones_raw = cute.recast_tensor(storage.sOnes.get_tensor(cute.make_layout(cute.cosize(sOnes_layout))), Uint8)
            for i in range(tidx, cute.size(ones_raw), self.threads):
                ones_raw[i] = Uint8(0x38)
            cute.arch.fence_proxy("async.shared", space="cta")  # generic stores, read by wgmma (async proxy)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        t0 = cute.arch.clock() if const_expr(self.trace) else Int32(0)  # every warp leaves the barrier together
        tracing = const_expr(self.trace) and m_block == 0 and cute.arch.lane_idx() == 0

        if wg_idx == 0:
            # ======================= producer warpgroup =======================
            cute.arch.setmaxregister_decrease(REGS_PRODUCER)
            if warp_idx == 0:
                tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV = tma_views(tma_q, mQ, tma_k, mK, tma_v, mV, sQ, sK, sV, D,
                                                               tile_n)

                q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
                q_pipe.producer_acquire(q_state)
                for w in cutlass.range_constexpr(self.num_wg):
                    # boxes past the padded length (3 consumer warpgroups) are zero-filled by the TMA unit
                    cute.copy(tma_q, tQgQ[(None, m_block * self.num_wg + w, 0, head, bat)], tQsQ[(None, w)],
                              tma_bar_ptr=q_pipe.producer_get_barrier(q_state))

                kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.kv_stages)
                for j in cutlass.range(n_tiles, unroll=1):
                    k_pipe.producer_acquire(kv_state)
                    if const_expr(self.trace):
                        self.trace_event(mLSE, tracing, t0, TRACE_PRODUCER + 2 * j, j, head, bat)
                    cute.copy(tma_k, tKgK[(None, j, 0, head, bat)], tKsK[(None, kv_state.index)],
                              tma_bar_ptr=k_pipe.producer_get_barrier(kv_state))
                    v_pipe.producer_acquire(kv_state)
                    if const_expr(self.trace):
                        self.trace_event(mLSE, tracing, t0, TRACE_PRODUCER + 2 * j + 1, j, head, bat)
                    cute.copy(tma_v, tVgV[(None, 0, j, head, bat)], tVsV[(None, kv_state.index)],
                              tma_bar_ptr=v_pipe.producer_get_barrier(kv_state))
                    kv_state.advance()
        else:
            # ======================= consumer warpgroups =======================
            cute.arch.setmaxregister_increase(self.regs_consumer)
            set_accumulate((qk_mma_zero, pv_mma_zero, pv_mma_h_zero, sum_mma_zero),
                           (qk_mma, pv_mma, pv_mma_h, sum_mma))
            wg = wg_idx - 1
            wg_tidx = tidx % 128
            qk_thr = qk_mma.get_slice(wg_tidx)
            pv_thr = pv_mma.get_slice(wg_tidx)

            tSrQ = qk_thr.make_fragment_A(qk_thr.partition_A(sQ))  # (MMA, 1, D/32, consumer_wgs)
            tSrK = qk_thr.make_fragment_B(qk_thr.partition_B(sK))  # (MMA, 1, D/32, stages)
            tOrV = pv_thr.make_fragment_B(pv_thr.partition_B(sV))  # (MMA, 1, tile_n/32, stages)

            acc_S = cute.make_rmem_tensor(qk_thr.partition_shape_C((TILE_M_WG, tile_n)), Float32)
            acc_O = cute.make_rmem_tensor(pv_thr.partition_shape_C((TILE_M_WG, D)), Float32)
            tOrP = cute.make_rmem_tensor(pv_thr.partition_shape_A((TILE_M_WG, tile_n)), Float8E4M3FN)
            acc_O.fill(0.0)
            # pv_promote: each tile's P V goes into a fresh accumulator and is added to acc_O on the FP32 cores
            # (acc_O = acc_O * alpha + acc_Ot): the FP8 wgmma adds into its accumulator with a short alignment
            # (~14 bits, DeepSeek-V3 report), which loses the small per-tile terms once acc_O is large
            if const_expr(self.sliced_pv):
                pvh_thr = pv_mma_h.get_slice(wg_tidx)
                # fresh accumulator for one slice of D / pv_split columns; tOrV_h: (MMA, pv_split, tile_n/32, stages)
                acc_Ot = cute.make_rmem_tensor(pvh_thr.partition_shape_C((TILE_M_WG, D // self.pv_split)), Float32)
                # pv_pipe: the second buffer; live only in the P V phase, when acc_S is dead
                acc_Ot2 = cute.make_rmem_tensor(pvh_thr.partition_shape_C((TILE_M_WG, D // self.pv_split)), Float32)
                tOrV_h = pvh_thr.make_fragment_B(pvh_thr.partition_B(sV))
            else:
                acc_Ot = cute.make_rmem_tensor(pv_thr.partition_shape_C((TILE_M_WG, D)), Float32)
                acc_Ot2 = acc_Ot  # not read without pv_split
                tOrV_h = tOrV  # not read without pv_split
            alpha_keep = cute.make_rmem_tensor((2,), Float32)  # alpha of the tile whose P V is in flight
            # sum_mma: the row sums of a tile's P8 (every column of acc_L holds its row's sum)
            sum_thr = sum_mma.get_slice(wg_tidx)
            acc_L = cute.make_rmem_tensor(sum_thr.partition_shape_C((TILE_M_WG, SUM_COLS)), Float32)
            if const_expr(self.sum_mma):
                sOnes = storage.sOnes.get_tensor(sOnes_layout.outer, swizzle=sOnes_layout.inner)
                tLrOnes = sum_thr.make_fragment_B(sum_thr.partition_B(sOnes))  # (MMA, 1, tile_n/32, 1)
            else:
                tLrOnes = acc_L  # not read

            # Register views for the P hand-over (see module docstring): coordinates (a, r, b, h, kb).
            n_kb = tile_n // 32
            pack_shape = (2, 2, 2, 2, n_kb)
            S_as_pack = cute.make_tensor(acc_S.iterator, cute.make_layout(pack_shape, stride=(1, 2, 4, 8, 16)))
            P_as_pack = cute.make_tensor(tOrP.iterator, cute.make_layout(pack_shape, stride=(1, 4, 2, 8, 16)))

            # per-(b, h) descales folded into two scalars
            qk_scale = mScales[0, head, bat] * mScales[1, head, bat] * scale_log2

            row_max = cute.make_rmem_tensor((2,), Float32)
            row_sum = cute.make_rmem_tensor((2,), Float32)
            row_max.fill(-Float32.inf)
            row_sum.fill(0.0)

            quad = wg_tidx % 4
            kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
            q_pipe.consumer_wait(q_state)

            if const_expr(self.pingpong):
                # the first consumer warpgroup pre-arrives on its own scheduler barrier: its first turn is free
                if wg == 0:
                    cute.arch.barrier_arrive(barrier_id=SCHED_BARRIER0, number_of_threads=2 * 128)
            if const_expr(self.exp_turns):
                # the last consumer warpgroup hands the first exp turn to warpgroup 0
                if wg == self.num_wg - 1:
                    cute.arch.barrier_arrive(barrier_id=EXP_BARRIER0, number_of_threads=2 * 128)

            # prologue: S_0, softmax_0 (masked if it is also the last tile), P_0
            k_pipe.consumer_wait(kv_state)
            self.gemm_qk(qk_mma_zero, qk_mma, acc_S, tSrQ, tSrK, wg, kv_state.index)
            warpgroup.wait_group(0)
            k_pipe.consumer_release(kv_state)
            if n_tiles == 1:
                self.mask_tile(acc_S, 0, sk, quad)
            alpha0 = self.softmax_stats(acc_S, row_max, row_sum, qk_scale, wg, n_tiles == 1, sPin, warp_idx)
            alpha_keep[0] = alpha0[0]
            alpha_keep[1] = alpha0[1]
            self.pack_p(S_as_pack, P_as_pack)
            if const_expr(self.exp_turns and self.sum_mma):
                self.pass_turn(self.p_words_pin(acc_S), sPin, warp_idx, wg, n_tiles == 1)
            v_state = kv_state.clone()
            kv_state.advance()
            for j in cutlass.range(1, n_tiles, unroll=1):
                if const_expr(self.serial_pv):
                    # O += P_{j-1} V_{j-1} done before S_j = Q K_j^T starts: P and S are never live together, so
                    # 3 consumer warpgroups fit 160 registers at tile 128; the overlap comes from the other warpgroups
                    if const_expr(self.trace):
                        trace_at = (warp_idx - 4) * TRACE_TILES * 4 + 4 * j
                        self.trace_event(mLSE, tracing, t0, trace_at, j, head, bat)
                    v_pipe.consumer_wait(v_state)
                    self.pv_waited(pv_mma_zero, pv_mma, pv_mma_h_zero, pv_mma_h, acc_O, acc_Ot, alpha_keep, tOrP,
                                   tOrV, tOrV_h, v_state.index, sum_mma_zero, sum_mma, acc_L, tLrOnes, row_sum,
                                   acc_Ot2)
                    if const_expr(self.trace):
                        self.trace_event(mLSE, tracing, t0, trace_at + 1, j, head, bat)
                    elif const_expr(self.pv_fence):
                        # sk < 0 never holds but ptxas cannot know: the basic-block boundary keeps the next QK's
                        # set-up from being interleaved into the merge, which is what made v5 spill
                        c = cute.arch.clock()
                        if sk < 0:
                            sPin[warp_idx % 16] = Float32(c)
                    v_pipe.consumer_release(v_state)
                    # one pipeline state serves both rings here (K_j follows V_{j-1}): fewer live registers
                    v_state.advance()
                    k_pipe.consumer_wait(v_state)
                    self.gemm_qk(qk_mma_zero, qk_mma, acc_S, tSrQ, tSrK, wg, v_state.index)
                    warpgroup.wait_group(0)
                    if const_expr(not self.lazy_max):
                        k_pipe.consumer_release(v_state)
                    if const_expr(self.trace):
                        self.trace_event(mLSE, tracing, t0, trace_at + 2, j, head, bat)
                    if j == n_tiles - 1:
                        self.mask_tile(acc_S, j, sk, cute.arch.lane_idx() % 4)
                    if const_expr(self.lazy_max):
                        # K_j stays resident until here: a warp whose max jumped too far recomputes S from it
                        alpha = self.softmax_lazy(acc_S, row_max, qk_scale, sQ, sK, wg, v_state.index, j,
                                                  j == n_tiles - 1, sk, wg_tidx, S_as_pack, P_as_pack, row_sum,
                                                  sPin, warp_idx)
                        k_pipe.consumer_release(v_state)
                    else:
                        alpha = self.softmax_stats(acc_S, row_max, row_sum, qk_scale, wg, j == n_tiles - 1, sPin,
                                                   warp_idx)
                    self.apply_alpha(acc_O, alpha, alpha_keep)
                    if const_expr(not self.lazy_max):  # lazy_max packs P itself (before its vote)
                        self.pack_p(S_as_pack, P_as_pack)
                    if const_expr(self.exp_turns and self.sum_mma):
                        self.pass_turn(self.p_words_pin(acc_S), sPin, warp_idx, wg, j == n_tiles - 1)
                    if const_expr(self.trace):
                        # a value that needs every exp of the tile: the clock read cannot be scheduled before them
                        self.trace_event(mLSE, tracing, t0, trace_at + 3, j, head, bat,
                                         after=acc_S[0] + acc_S[cute.size(acc_S) - 1])
                else:
                    # S_j = Q K_j^T and O += P_{j-1} V_{j-1}, both in flight
                    k_pipe.consumer_wait(kv_state)
                    if const_expr(self.pingpong):  # wait for our turn on the tensor cores
                        cute.arch.barrier(barrier_id=SCHED_BARRIER0 + wg, number_of_threads=2 * 128)
                    self.gemm_qk(qk_mma_zero, qk_mma, acc_S, tSrQ, tSrK, wg, kv_state.index)
                    v_pipe.consumer_wait(v_state)
                    if const_expr(self.pv_promote):
                        self.gemm_pv(pv_mma_zero, pv_mma, acc_Ot, tOrP, tOrV, v_state.index)
                    else:
                        self.gemm_pv(pv_mma, pv_mma, acc_O, tOrP, tOrV, v_state.index)
                    if const_expr(self.pingpong):  # our GEMMs are issued: the other warpgroup's turn
                        cute.arch.barrier_arrive(barrier_id=SCHED_BARRIER0 + 1 - wg, number_of_threads=2 * 128)
                    # overlap: only S_j must be done, PV_{j-1} keeps running under the softmax below
                    warpgroup.wait_group(1 if self.overlap else 0)
                    k_pipe.consumer_release(kv_state)
                    if j == n_tiles - 1:
                        self.mask_tile(acc_S, j, sk, cute.arch.lane_idx() % 4)
                    alpha = self.softmax_stats(acc_S, row_max, row_sum, qk_scale, wg, j == n_tiles - 1, sPin, warp_idx)
                    if const_expr(self.pin_wait == "sts"):
                        # a shared store of a value that needs every exp of this tile: ptxas keeps the PV wait after it
                        sPin[warp_idx % 16] = row_sum[0] + row_sum[1]
                    warpgroup.wait_group(0)
                    v_pipe.consumer_release(v_state)
                    self.pack_p(S_as_pack, P_as_pack)
                    if const_expr(self.pv_promote):
                        self.merge_o(acc_O, acc_Ot, alpha_keep)  # alpha of tile j-1, whose P V just finished
                    self.apply_alpha(acc_O, alpha, alpha_keep)
                    v_state.advance()
                    kv_state.advance()
            # epilogue PV
            v_pipe.consumer_wait(v_state)
            self.pv_waited(pv_mma_zero, pv_mma, pv_mma_h_zero, pv_mma_h, acc_O, acc_Ot, alpha_keep, tOrP, tOrV,
                           tOrV_h, v_state.index, sum_mma_zero, sum_mma, acc_L, tLrOnes, row_sum, acc_Ot2)
            v_pipe.consumer_release(v_state)

            # read only now: one register less across the main loop
            self.epilogue(acc_O, row_max, row_sum, qk_scale, mScales[2, head, bat], mO, mLSE, sq,
                          m_block * self.tile_m + wg * TILE_M_WG, head, bat, wg_tidx, write_lse=not self.trace)

    # ------------------------------------------------------------------ consumer helpers
    @cute.jit
    def trace_event(self, mLSE: cute.Tensor, tracing, t0: Int32, index, j: Int32, head: Int32, bat: Int32,
                    after: Float32 = Float32(0.0)):
        if tracing and j < TRACE_TILES:
            # "after" * 0 ties the stored value to a result the event must follow (a NaN there is visible)
            mLSE[index, head, bat] = Float32(cute.arch.clock() - t0) + after * Float32(0.0)

    @cute.jit
    def gemm_qk(self, qk_mma_zero: cute.TiledMma, qk_mma: cute.TiledMma, acc_S: cute.Tensor, tSrQ: cute.Tensor, tSrK: cute.Tensor,
                wg: Int32, stage: Int32):
        warpgroup.fence()
        for kb in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
            cute.gemm(qk_mma_zero if kb == 0 else qk_mma, acc_S, tSrQ[None, None, kb, wg], tSrK[None, None, kb, stage], acc_S)
        warpgroup.commit_group()

    @cute.jit
    def gemm_pv(self, pv_mma_first: cute.TiledMma, pv_mma: cute.TiledMma, acc_O: cute.Tensor, tOrP: cute.Tensor,
                tOrV: cute.Tensor, stage: Int32):
        warpgroup.fence()
        for kb in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
            cute.gemm(pv_mma_first if kb == 0 else pv_mma, acc_O, tOrP[None, None, kb], tOrV[None, None, kb, stage],
                      acc_O)
        warpgroup.commit_group()

    @cute.jit
    def mask_tile(self, acc_S: cute.Tensor, tile: Int32, sk: Int32, quad: Int32):
        # accumulator value v = c + 2r + 4j sits at column 8j + 2*quad + c of the tile
        limit = sk - tile * self.tile_n - 2 * quad
        for j in cutlass.range_constexpr(self.tile_n // 8):
            for c in cutlass.range_constexpr(2):
                if 8 * j + c >= limit:
                    for r in cutlass.range_constexpr(2):
                        acc_S[c + 2 * r + 4 * j] = -Float32.inf

    @cute.jit
    def softmax_stats(self, acc_S: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor,
                      qk_scale: Float32, wg: Int32, last_tile, sPin: cute.Tensor, warp_idx: Int32) -> cute.Tensor:
        """Online-softmax update for one tile: acc_S <- P*256 (fp32); returns alpha per row.

        ``exp_turns``: both rows' maxima first, then the exps inside this warpgroup's turn (named barrier
        EXP_BARRIER0 + wg, released to the next warpgroup afterwards), so that the consumer warpgroups take turns
        on the MUFU pipe instead of all exponentiating at the same time."""
        alpha = cute.make_rmem_tensor((2,), Float32)
        bias = cute.make_rmem_tensor((2,), Float32)
        part = cute.make_rmem_tensor((self.max_chains,), Float32)  # independent chains: shorter dependency latency
        if const_expr(not self.exp_turns and not self.rows_first):
            for r in cutlass.range_constexpr(2):
                self.row_max_update(acc_S, row_max, alpha, bias, part, qk_scale, r)
                self.row_exp_sum(acc_S, row_sum, alpha, bias, part, qk_scale, r)
        elif const_expr(not self.exp_turns):
            part1 = cute.make_rmem_tensor((self.max_chains,), Float32)
            self.row_max_update(acc_S, row_max, alpha, bias, part, qk_scale, 0)
            self.row_max_update(acc_S, row_max, alpha, bias, part1, qk_scale, 1)
            self.row_exp_sum(acc_S, row_sum, alpha, bias, part, qk_scale, 0)
            self.row_exp_sum(acc_S, row_sum, alpha, bias, part1, qk_scale, 1)
        else:
            for r in cutlass.range_constexpr(2):
                self.row_max_update(acc_S, row_max, alpha, bias, part, qk_scale, r)
            # ptxas moves pure arithmetic across BAR freely; a shared store of values that need the maxima
            # (stores cannot sink below a barrier) keeps the max phase before our turn starts
            sPin[warp_idx % 16] = bias[0] + bias[1]
            cute.arch.barrier(barrier_id=EXP_BARRIER0 + wg, number_of_threads=2 * 128)
            # ... and MUFU is free to move up across BAR too: make every exp depend on a shared load
            # (loads cannot rise above a barrier) of a slot that holds 0.0
            zero = sPin[PIN_ZERO_SLOT]
            bias[0] = bias[0] + zero
            bias[1] = bias[1] + zero
            for r in cutlass.range_constexpr(2):
                self.row_exp_sum(acc_S, row_sum, alpha, bias, part, qk_scale, r)
            if const_expr(not self.sum_mma):  # with sum_mma the caller passes the turn after packing P
                # likewise a store of the row sums (needs every exp) keeps the hand-over after the last MUFU
                self.pass_turn(row_sum[0] + row_sum[1], sPin, warp_idx, wg, last_tile)
        return alpha

    @cute.jit
    def softmax_lazy(self, acc_S: cute.Tensor, row_max: cute.Tensor, qk_scale: Float32, sQ: cute.Tensor,
                     sK: cute.Tensor, wg: Int32, stage: Int32, tile: Int32, last_tile, sk: Int32,
                     wg_tidx: Int32, S_as_pack: cute.Tensor, P_as_pack: cute.Tensor, row_sum: cute.Tensor,
                     sPin: cute.Tensor, warp_idx: Int32) -> cute.Tensor:
        """Online-softmax update with a speculative reference (option lazy_max, with sum_mma): P8 <- e4m3(P*256).

        The exps start as soon as S is ready, against the running max (no max -> shuffles -> exps chain); the
        maximum of each row's exps is taken beside them (on the ALU pipe) and only decides, by a warp vote, what
        happens next. While no row of the warp rose by more than LAZY_MAX_SLACK (most tiles once the max has
        settled) that is all: alpha = 1, and P*256 <= 431 still fits e4m3. Otherwise the warp moves its reference
        to the true max, rescales its exps by alpha (one FMUL each) — or, when a max jumped by more than
        LAZY_MAX_OVERFLOW and an exp may have overflowed, recomputes the scores exactly from shared memory and
        takes the exact update (softmax_stats). P is packed after the vote either way."""
        alpha = cute.make_rmem_tensor((2,), Float32)
        bias = cute.make_rmem_tensor((2,), Float32)
        part0 = cute.make_rmem_tensor((self.max_chains,), Float32)
        part1 = cute.make_rmem_tensor((self.max_chains,), Float32)
        n8 = self.tile_n // 8
        for r in cutlass.range_constexpr(2):
            bias[r] = row_max[r] * qk_scale - 8.0
        for r in cutlass.range_constexpr(2):
            part = part0 if const_expr(r == 0) else part1
            for j in cutlass.range_constexpr(n8):
                for c in cutlass.range_constexpr(2):
                    i, first = self.chain_of(j, c)
                    p = cute.arch.exp2(acc_S[c + 2 * r + 4 * j] * qk_scale - bias[r])
                    acc_S[c + 2 * r + 4 * j] = p
                    # the max is taken over the exps (exp2 is monotone): it trails the MUFUs instead of holding
                    # them back, and needs no register beyond P's own
                    part[i] = p if const_expr(first) else cute.arch.fmax(part[i], p)
        p_max0 = self.reduce_chains(part0, cute.arch.fmax)
        p_max1 = self.reduce_chains(part1, cute.arch.fmax)
        alpha.fill(1.0)
        # P*256 above 2^(8 + slack) = the score rose more than the slack above the reference (the vote: in the warp)
        if cute.arch.vote_any_sync(cute.arch.fmax(p_max0, p_max1) > Float32(2.0 ** (8.0 + LAZY_MAX_SLACK))):
            jump = cute.make_rmem_tensor((2,), Float32)
            for r in cutlass.range_constexpr(2):
                p_max = cute.arch.warp_reduction_max(p_max0 if const_expr(r == 0) else p_max1, threads_in_group=4)
                # how far the row's max rose (exp2 units; +inf if an exp overflowed, -inf if every exp was 0)
                jump[r] = cute.arch.fmax(cute.math.log2(p_max, fastmath=True) - 8.0, Float32(0.0))
            if cute.arch.vote_any_sync(cute.arch.fmax(jump[0], jump[1]) > LAZY_MAX_OVERFLOW):
                # an exp may have overflowed: exact scores from shared memory, then the exact (non-lazy) update
                self.scores_from_smem(acc_S, sQ, sK, wg, stage, wg_tidx)
                if last_tile:
                    self.mask_tile(acc_S, tile, sk, wg_tidx % 4)
                exact = self.softmax_stats(acc_S, row_max, row_sum, qk_scale, wg, last_tile, sPin, warp_idx)
                for r in cutlass.range_constexpr(2):
                    alpha[r] = exact[r]
            else:
                for r in cutlass.range_constexpr(2):
                    row_max[r] = row_max[r] + jump[r] / qk_scale
                    bias_new = row_max[r] * qk_scale - 8.0
                    alpha[r] = cute.math.exp2(bias[r] - bias_new, fastmath=True)
                    for j in cutlass.range_constexpr(n8):
                        for c in cutlass.range_constexpr(2):
                            acc_S[c + 2 * r + 4 * j] = acc_S[c + 2 * r + 4 * j] * alpha[r]
        # after the vote: P8 must hold the rescaled exps (a packed P has already saturated at 448)
        self.pack_p(S_as_pack, P_as_pack)
        return alpha

    @cute.jit
    def scores_from_smem(self, acc_S: cute.Tensor, sQ: cute.Tensor, sK: cute.Tensor, wg: Int32, stage: Int32,
                         wg_tidx: Int32):
        """This thread's raw scores of the tile (fp32 dot products of the e4m3 Q and K rows in shared memory), in
        the wgmma accumulator's places. Slow (scalar) and only for lazy_max's rare overflow case."""
        row0 = wg_tidx // 32 * 16 + wg_tidx % 32 // 4
        col0 = 2 * (wg_tidx % 4)
        for r in cutlass.range_constexpr(2):
            for j in cutlass.range_constexpr(self.tile_n // 8):
                for c in cutlass.range_constexpr(2):
                    acc = Float32(0.0)
                    for d in cutlass.range(self.head_dim, unroll=4):
                        acc += Float32(sQ[row0 + 8 * r, d, wg]) * Float32(sK[col0 + 8 * j + c, d, stage])
                    acc_S[c + 2 * r + 4 * j] = acc

    @cute.jit
    def pass_turn(self, pin: Float32, sPin: cute.Tensor, warp_idx: Int32, wg: Int32, last_tile):
        """exp_turns: hand the MUFU turn to the next consumer warpgroup. ``pin`` must depend on every exp of the
        tile: its shared store keeps the arrive after them in SASS. The last warpgroup's last turn has no
        successor: an unmatched arrive would be left pending."""
        nxt = wg + 1
        if nxt == self.num_wg:
            nxt = 0
        sPin[warp_idx % 16] = pin
        if not (last_tile and wg == self.num_wg - 1):
            cute.arch.barrier_arrive(barrier_id=EXP_BARRIER0 + nxt, number_of_threads=2 * 128)

    @cute.jit
    def p_words_pin(self, acc_S: cute.Tensor) -> Float32:
        """A value that depends on every exp of the tile (OR of the fp32 bit patterns, 3-input LOP3s): pins
        exp_turns' hand-over after the exps when sum_mma leaves no row sum to pin with."""
        bits = cute.recast_tensor(acc_S, Uint32)
        acc = bits[0]
        for i in cutlass.range_constexpr(1, cute.size(bits)):
            acc = acc | bits[i]
        return Float32(acc)

    @cute.jit
    def pack_p(self, S_as_pack: cute.Tensor, P_as_pack: cute.Tensor):
        """P8 <- e4m3(P*256) in the A-operand registers of the P V wgmma (coordinates (a, r, b, h, kb), see the
        module docstring): word (r, h, kb) holds the bytes (a, b) = (0,0), (1,0), (0,1), (1,1)."""
        if const_expr(self.pack_asm):
            n_kb = self.tile_n // 32
            words = cute.recast_tensor(cute.make_tensor(P_as_pack.iterator, cute.make_layout(16 * n_kb)), Uint32)
            for kb in cutlass.range_constexpr(n_kb):
                for h in cutlass.range_constexpr(2):
                    for r in cutlass.range_constexpr(2):
                        words[r + 2 * h + 4 * kb] = pack_e4m3_word(
                            S_as_pack[0, r, 0, h, kb], S_as_pack[1, r, 0, h, kb],
                            S_as_pack[0, r, 1, h, kb], S_as_pack[1, r, 1, h, kb])
        else:
            P_as_pack.store(S_as_pack.load().to(Float8E4M3FN))

    @cute.jit
    def row_max_update(self, acc_S: cute.Tensor, row_max: cute.Tensor, alpha: cute.Tensor, bias: cute.Tensor,
                       part: cute.Tensor, qk_scale: Float32, r: cutlass.Constexpr):
        n8 = self.tile_n // 8
        for j in cutlass.range_constexpr(n8):
            for c in cutlass.range_constexpr(2):
                i, first = self.chain_of(j, c)
                v = acc_S[c + 2 * r + 4 * j]
                part[i] = v if const_expr(first) else cute.arch.fmax(part[i], v)
        m_tile = self.reduce_chains(part, cute.arch.fmax)
        m_tile = cute.arch.warp_reduction_max(m_tile, threads_in_group=4)
        m_new = cute.arch.fmax(row_max[r], m_tile)
        alpha[r] = cute.math.exp2((row_max[r] - m_new) * qk_scale, fastmath=True)
        row_max[r] = m_new
        bias[r] = m_new * qk_scale - 8.0  # exp2(+8) = the x256 of P

    @cute.jit
    def row_exp_sum(self, acc_S: cute.Tensor, row_sum: cute.Tensor, alpha: cute.Tensor, bias: cute.Tensor,
                    part: cute.Tensor, qk_scale: Float32, r: cutlass.Constexpr):
        n8 = self.tile_n // 8
        if const_expr(self.linexp_every > 0):
            lin_scale = qk_scale * 8.0
            lin_bias = (56.0 + LINEXP_C) - 8.0 * bias[r]
        for j in cutlass.range_constexpr(n8):
            for c in cutlass.range_constexpr(2):
                v = c + 2 * r + 4 * j
                if const_expr(self.poly_every > 0 and j % self.poly_every == self.poly_every - 1):
                    p = exp2_poly(acc_S[v] * qk_scale - bias[r], self.poly_degree)  # FMA pipe: unloads MUFU
                elif const_expr(self.linexp_every > 0 and j % self.linexp_every == self.linexp_every - 1):
                    p = exp2_linbyte(acc_S[v] * lin_scale + lin_bias)  # FMA/ALU pipes, e4m3-exact value
                else:
                    p = cute.arch.exp2(acc_S[v] * qk_scale - bias[r])  # side-effect asm: LLVM cannot sink or clone it
                acc_S[v] = p
                if const_expr(not self.sum_mma):  # sum_mma: l comes from the tensor cores with P V
                    i, first = self.chain_of(j, c)
                    part[i] = p if const_expr(first) else part[i] + p
        if const_expr(not self.sum_mma):
            row_sum[r] = row_sum[r] * alpha[r] + self.reduce_chains(part, lambda a, b: a + b)

    def chain_of(self, j: int, c: int):
        """(chain, is its first value) of column group j, column c in the max_chains independent chains of a row
        (trace-time arithmetic): groups take the chains round-robin, two columns each."""
        half = self.max_chains // 2
        return 2 * (j % half) + c, j < half

    @cute.jit
    def reduce_chains(self, part: cute.Tensor, op) -> Float32:
        """op over the max_chains partials as a tree: ((p0 op p1) op (p2 op p3)), upper four folded in first."""
        if const_expr(self.max_chains == 8):
            for i in cutlass.range_constexpr(4):
                part[i] = op(part[i], part[i + 4])
        return op(op(part[0], part[1]), op(part[2], part[3]))

    @cute.jit
    def pv_sliced(self, pv_mma_h_zero: cute.TiledMma, pv_mma_h: cute.TiledMma, acc_O: cute.Tensor,
                  acc_Ot: cute.Tensor, acc_Ot2: cute.Tensor, alpha: cute.Tensor, tOrP: cute.Tensor,
                  tOrV_h: cute.Tensor, stage: Int32, sum_mma_zero: cute.TiledMma, sum_mma: cute.TiledMma,
                  acc_L: cute.Tensor, tLrOnes: cute.Tensor, row_sum: cute.Tensor):
        """P V one slice of D / pv_split columns at a time, each into a fresh accumulator merged in FP32.
        pv_pipe: two slices in flight — slice h+1 is issued (into the other buffer, whose slice h-1 is already
        merged) before slice h is waited for and merged, so the tensor cores never wait for a merge."""
        jw = self.head_dim // 8 // self.pv_split  # accumulator column groups per slice
        if const_expr(not self.pv_promote):
            # issue 20 lever 4 (needs V mean-centred by the caller): O accumulates inside the wgmma (rescaled by
            # apply_alpha before this tile's term), only l's 8-column sum is fresh and merged in FP32
            self.issue_pv_slice(pv_mma_h_zero, pv_mma_h, acc_O, tOrP, tOrV_h, stage, 0, sum_mma_zero, sum_mma,
                                acc_L, tLrOnes)
            warpgroup.wait_group(0)
            self.merge_l(row_sum, acc_L, alpha)
        else:
            if const_expr(self.pv_pipe):
                self.issue_pv_slice(pv_mma_h_zero, pv_mma_h, acc_Ot, tOrP, tOrV_h, stage, 0, sum_mma_zero, sum_mma,
                                    acc_L, tLrOnes)
            for h in cutlass.range_constexpr(self.pv_split):
                buf = acc_Ot2 if const_expr(self.pv_pipe and h % 2 == 1) else acc_Ot
                if const_expr(not self.pv_pipe):
                    self.issue_pv_slice(pv_mma_h_zero, pv_mma_h, acc_Ot, tOrP, tOrV_h, stage, h, sum_mma_zero,
                                        sum_mma, acc_L, tLrOnes)
                    warpgroup.wait_group(0)
                elif const_expr(h + 1 < self.pv_split):
                    self.issue_pv_slice(pv_mma_h_zero, pv_mma_h, acc_Ot if h % 2 == 1 else acc_Ot2, tOrP, tOrV_h,
                                        stage, h + 1, sum_mma_zero, sum_mma, acc_L, tLrOnes)
                    warpgroup.wait_group(1)
                else:
                    warpgroup.wait_group(0)
                self.merge_o(acc_O, buf, alpha, jw * h)
                if const_expr(self.sum_mma and h == 0):
                    self.merge_l(row_sum, acc_L, alpha)

    @cute.jit
    def issue_pv_slice(self, pv_mma_h_zero: cute.TiledMma, pv_mma_h: cute.TiledMma, acc: cute.Tensor,
                       tOrP: cute.Tensor, tOrV_h: cute.Tensor, stage: Int32, h: cutlass.Constexpr,
                       sum_mma_zero: cute.TiledMma, sum_mma: cute.TiledMma, acc_L: cute.Tensor, tLrOnes: cute.Tensor):
        """Issue (and commit as one group) slice h of P V into the fresh ``acc``; sum_mma: l's wgmma with slice 0."""
        warpgroup.fence()
        for kb in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
            b = tOrV_h[None, h, kb, stage]  # rank 1 after fixing the slice: give it back its N mode
            b = cute.make_tensor(b.iterator, cute.append_ones(b.layout, up_to_rank=2))
            zero_first = kb == 0 and self.pv_promote  # without pv_promote ``acc`` is O itself: accumulate
            cute.gemm(pv_mma_h_zero if zero_first else pv_mma_h, acc, tOrP[None, None, kb], b, acc)
        if const_expr(self.sum_mma and h == 0):
            for kb in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
                cute.gemm(sum_mma_zero if kb == 0 else sum_mma, acc_L, tOrP[None, None, kb],
                          tLrOnes[None, None, kb, 0], acc_L)
        warpgroup.commit_group()

    @cute.jit
    def merge_l(self, row_sum: cute.Tensor, acc_L: cute.Tensor, alpha: cute.Tensor):
        """sum_mma: l = l * alpha + rowsum(P8); acc_L value c + 2r is column c of row r, every column the sum."""
        for r in cutlass.range_constexpr(2):
            row_sum[r] = row_sum[r] * alpha[r] + acc_L[2 * r]

    @cute.jit
    def apply_alpha(self, acc_O: cute.Tensor, alpha: cute.Tensor, alpha_keep: cute.Tensor):
        """pv_promote: keep this tile's alpha for the merge after its P V; otherwise rescale O now (and keep alpha
        for l's merge with sum_mma)."""
        if const_expr(self.pv_promote or self.sum_mma):
            alpha_keep[0] = alpha[0]
            alpha_keep[1] = alpha[1]
        if const_expr(not self.pv_promote):
            if const_expr(self.skip_rescale):
                # alpha <= 1, and == 1 exactly where the row max did not move: skipping O *= 1 is exact
                if cute.arch.vote_any_sync(cute.arch.fmin(alpha[0], alpha[1]) < 1.0):
                    self.rescale_o(acc_O, alpha)
            else:
                self.rescale_o(acc_O, alpha)

    @cute.jit
    def merge_o(self, acc_O: cute.Tensor, acc_Ot: cute.Tensor, alpha: cute.Tensor, group0: cutlass.Constexpr = 0):
        """acc_O = acc_O * alpha + acc_Ot over acc_Ot's columns, which are acc_O's 8-column groups from group0 on."""
        for j in cutlass.range_constexpr(cute.size(acc_Ot) // 4):
            for r in cutlass.range_constexpr(2):
                for c in cutlass.range_constexpr(2):
                    v = c + 2 * r + 4 * j
                    acc_O[v + 4 * group0] = acc_O[v + 4 * group0] * alpha[r] + acc_Ot[v]

    @cute.jit
    def pv_waited(self, pv_mma_zero: cute.TiledMma, pv_mma: cute.TiledMma, pv_mma_h_zero: cute.TiledMma,
                  pv_mma_h: cute.TiledMma, acc_O: cute.Tensor, acc_Ot: cute.Tensor, alpha: cute.Tensor,
                  tOrP: cute.Tensor, tOrV: cute.Tensor, tOrV_h: cute.Tensor, stage: Int32,
                  sum_mma_zero: cute.TiledMma, sum_mma: cute.TiledMma, acc_L: cute.Tensor, tLrOnes: cute.Tensor,
                  row_sum: cute.Tensor, acc_Ot2: cute.Tensor):
        """O (+)= P V of the tile in ``stage``, complete on return: in head_dim slices (pv_split), into a fresh
        accumulator merged in FP32 (pv_promote), or accumulated inside the wgmma. sum_mma: also l = l * alpha +
        rowsum(P8), the row sums from the tensor cores."""
        if const_expr(self.sliced_pv):
            self.pv_sliced(pv_mma_h_zero, pv_mma_h, acc_O, acc_Ot, acc_Ot2, alpha, tOrP, tOrV_h, stage,
                           sum_mma_zero, sum_mma, acc_L, tLrOnes, row_sum)
        elif const_expr(self.pv_promote):
            self.gemm_pv(pv_mma_zero, pv_mma, acc_Ot, tOrP, tOrV, stage)
            warpgroup.wait_group(0)
            self.merge_o(acc_O, acc_Ot, alpha)
        else:
            self.gemm_pv(pv_mma, pv_mma, acc_O, tOrP, tOrV, stage)
            warpgroup.wait_group(0)

    @cute.jit
    def rescale_o(self, acc_O: cute.Tensor, alpha: cute.Tensor):
        for j in cutlass.range_constexpr(self.head_dim // 8):
            for r in cutlass.range_constexpr(2):
                for c in cutlass.range_constexpr(2):
                    acc_O[c + 2 * r + 4 * j] = acc_O[c + 2 * r + 4 * j] * alpha[r]

    @cute.jit
    def epilogue(self, acc_O: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor, qk_scale: Float32,
                 o_scale: Float32, mO: cute.Tensor, mLSE: cute.Tensor, sq: Int32, row0: Int32,
                 head: Int32, bat: Int32, wg_tidx: Int32, write_lse: cutlass.Constexpr = True):
        warp = wg_tidx // 32
        lane = wg_tidx % 32
        quad = lane % 4
        for r in cutlass.range_constexpr(2):
            # sum_mma: every thread of the quad already holds its row's whole sum
            l = row_sum[r] if const_expr(self.sum_mma) else cute.arch.warp_reduction_sum(row_sum[r], threads_in_group=4)
            row = row0 + warp * 16 + lane // 4 + 8 * r
            inv = o_scale * cute.arch.rcp_approx(l)
            if row < sq:
                if quad == 0 and const_expr(write_lse):
                    mLSE[row, head, bat] = (row_max[r] * qk_scale - 8.0 + cute.math.log2(l, fastmath=True)) * LN2
            store_o_row(mO, acc_O, r, inv, row, sq, head, bat, quad, self.head_dim,
                        const_expr(self.dtype_out != BFloat16))  # the shipped epilogue's 16-byte stores


# ---------------------------------------------------------------------- compile / run API
def _shared_storage(kv_stages: int, q_elems: int, k_elems: int, v_elems: int, ones_elems: int):
    """The kernel's shared-memory struct (built outside the jit function: the DSL rewrites its control flow).
    ones_elems > 0 adds sum_mma's constant tile."""
    f8 = Float8E4M3FN

    # annotations spelled out: this module's `from __future__ import annotations` would leave them as strings
    fields = {
        "q_mbar": cute.struct.MemRange[cutlass.Int64, 2],
        "k_mbar": cute.struct.MemRange[cutlass.Int64, kv_stages * 2],
        "v_mbar": cute.struct.MemRange[cutlass.Int64, kv_stages * 2],
        "pin": cute.struct.MemRange[Float32, 32],  # pin_wait scratch (fits in the barriers' 1024-byte block)
        "sQ": cute.struct.Align[cute.struct.MemRange[f8, q_elems], 1024],
        "sK": cute.struct.Align[cute.struct.MemRange[f8, k_elems], 1024],
        "sV": cute.struct.Align[cute.struct.MemRange[f8, v_elems], 1024],
    }
    if ones_elems:
        fields["sOnes"] = cute.struct.Align[cute.struct.MemRange[f8, ones_elems], 1024]
    SharedStorage = type("SharedStorage", (), {"__annotations__": fields})
    return cute.struct(SharedStorage)


_CACHE: Dict[Tuple[Any, ...], Any] = {}


def smem_bytes(head_dim: int = 128, tile_n: int | None = None, kv_stages: int | None = None,
               consumer_wgs: int | None = None, sum_mma: bool | None = None) -> int:
    """Dynamic shared memory per CTA: mbarriers (padded to the 1024-byte alignment of the tiles),
    Q (consumer_wgs x 64 rows), K and V rings (kv_stages x tile_n x head_dim bytes each). None: the default option."""
    tile_n = DEFAULT_OPTIONS["tile_n"] if tile_n is None else tile_n
    kv_stages = DEFAULT_OPTIONS["kv_stages"] if kv_stages is None else kv_stages
    consumer_wgs = DEFAULT_OPTIONS["consumer_wgs"] if consumer_wgs is None else consumer_wgs
    sum_mma = DEFAULT_OPTIONS["sum_mma"] if sum_mma is None else sum_mma
    ones = SUM_COLS * tile_n if sum_mma else 0  # the constant ones tile of sum_mma
    barriers = (2 + 4 * kv_stages) * 8
    total = -(-barriers // 1024) * 1024 + TILE_M_WG * consumer_wgs * head_dim + 2 * kv_stages * tile_n * head_dim + ones
    return -(-total // 1024) * 1024  # the struct's size is a multiple of its 1024-byte alignment


def _out_dtype(dtype_out):
    if dtype_out in (BFloat16, Float16):
        return dtype_out
    name = str(dtype_out)
    if "bfloat16" in name:
        return BFloat16
    if "float16" in name:
        return Float16
    raise ValueError(f"unsupported output dtype {dtype_out}")


def _compile_args(dtype_out):
    from cutlass.cute.runtime import make_ptr

    gm = cute.AddressSpace.gmem
    return (
        make_ptr(Uint8, 0, gm, assumed_align=16),
        make_ptr(Uint8, 0, gm, assumed_align=16),
        make_ptr(Uint8, 0, gm, assumed_align=16),
        make_ptr(Float32, 0, gm, assumed_align=4),
        make_ptr(dtype_out, 0, gm, assumed_align=4),
        make_ptr(Float32, 0, gm, assumed_align=4),
        Int32(1), Int32(1), Int32(1), Int32(1), Int32(128), Int32(32),
        Float32(1.0),
    )


def compile_sm90(head_dim: int, dtype_out, *, fake: bool, arch: str = "sm_90a", options_extra: str = "",
                 tvm_ffi: bool = False, **opts):
    """Compile the kernel. Arguments are pointers + sizes, so the same compiled function serves any shape.

    ``opts``: see ``DEFAULT_OPTIONS``. ``fake=True``: no GPU needed (stream faked); pass e.g.
    ``options_extra="--keep-cubin --dump-dir DIR"``. ``fake=False``: compile for launching on the current device.
    ``tvm_ffi``: compile with --enable-tvm-ffi (call with ints for the pointers, see ``run_sm90``).
    """
    dtype_out = _out_dtype(dtype_out)
    if not arch.startswith("sm_90"):
        raise ValueError(f"the wgmma kernel is sm_90a only, not {arch}")
    opts = options(**opts)
    tile_n, kv_stages, n_wg, smma = opts["tile_n"], opts["kv_stages"], opts["consumer_wgs"], opts["sum_mma"]
    kern = Sm90Fp8Attention(head_dim, dtype_out, **opts)
    if fake:
        stream = cute.runtime.make_fake_stream()
    else:
        import torch

        stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    compile_options = f"--gpu-arch {arch} {options_extra}".strip() + (" --enable-tvm-ffi" if tvm_ffi else "")
    with cute_dsl_arch(arch):  # ops that check the arch read it at trace time
        fn = cute.compile(kern, *_compile_args(dtype_out), stream, options=compile_options)
    if kern.smem_bytes != smem_bytes(head_dim, tile_n, kv_stages, n_wg, smma):  # keep the formula honest
        raise AssertionError(f"smem_bytes formula {smem_bytes(head_dim, tile_n, kv_stages, n_wg, smma)} != {kern.smem_bytes}")
    return fn


def run_sm90(q8, k8, v8t, scales, sq: int, sk: int, softmax_scale: float, out, lse, *, tvm_ffi: bool = True,
             **opts) -> None:
    """Launch on the current CUDA stream. q8/k8/v8t: float8_e4m3fn or uint8 views (the prep's layouts).
    ``tvm_ffi``: launch through TVM-FFI where it is usable (``tvm_ffi_launch_enabled``), else cute's JIT executor.
    ``opts``: compile-time options, see ``DEFAULT_OPTIONS``."""
    import torch
    from cutlass.cute.runtime import make_ptr

    B, H, sq_pad, D = q8.shape
    sk_pad = k8.shape[2]
    if sq_pad % TILE_M_WG or sk_pad % 32 or sq > sq_pad or sk > sk_pad or sk < 1 or sq < 1:
        raise ValueError(f"bad padded lengths: sq={sq} sq_pad={sq_pad} sk={sk} sk_pad={sk_pad}")
    if tuple(v8t.shape) != (B, H, D, sk_pad) or tuple(k8.shape) != (B, H, sk_pad, D):
        raise ValueError("k8/v8t shapes do not match q8")
    if tuple(out.shape) != (B, sq, H, D) or tuple(lse.shape) != (B, H, sq):
        raise ValueError("out/lse shapes do not match")
    for t in (q8, k8, v8t, scales, out, lse):
        if not t.is_cuda or not t.is_contiguous():
            raise ValueError("all tensors must be contiguous CUDA tensors")
    if scales.dtype != torch.float32 or lse.dtype != torch.float32:
        raise ValueError("scales and lse must be float32")
    dtype_out = {torch.bfloat16: BFloat16, torch.float16: Float16}[out.dtype]
    dev = q8.device
    major, minor = torch.cuda.get_device_capability(dev)
    if (major, minor) != (9, 0):
        raise ValueError(f"run_sm90 needs an sm_90 GPU (H100/H200), got sm_{major}{minor}")
    arch = "sm_90a"
    opts = options(**opts)
    key = (arch, D, out.dtype) + tuple(sorted(opts.items()))

    def compiled(tvm_ffi: bool):
        fn = _CACHE.get((tvm_ffi,) + key)
        if fn is None:
            fn = compile_sm90(D, dtype_out, fake=False, arch=arch, tvm_ffi=tvm_ffi, **opts)
            _CACHE[(tvm_ffi,) + key] = fn
        return fn

    if tvm_ffi_launch_enabled(tvm_ffi):
        try:
            compiled(True)(q8.data_ptr(), k8.data_ptr(), v8t.data_ptr(), scales.data_ptr(), out.data_ptr(), lse.data_ptr(),
               B, H, sq, sk, sq_pad, sk_pad, float(softmax_scale), torch.cuda.current_stream(dev).cuda_stream)
            LAUNCH_INFO["last_launch"] = "tvm_ffi"
            return
        except Exception as exc:  # noqa: BLE001 - argument conversion fails before anything is launched
            LAUNCH_INFO["tvm_ffi_error"] = f"{type(exc).__name__}: {exc}"[:500]
    LAUNCH_INFO["last_launch"] = "jit"
    gm = cute.AddressSpace.gmem
    stream = cuda.CUstream(torch.cuda.current_stream(dev).cuda_stream)
    compiled(False)(
        make_ptr(Uint8, q8.data_ptr(), gm, assumed_align=16),
        make_ptr(Uint8, k8.data_ptr(), gm, assumed_align=16),
        make_ptr(Uint8, v8t.data_ptr(), gm, assumed_align=16),
        make_ptr(Float32, scales.data_ptr(), gm, assumed_align=4),
        make_ptr(dtype_out, out.data_ptr(), gm, assumed_align=4),
        make_ptr(Float32, lse.data_ptr(), gm, assumed_align=4),
        Int32(B), Int32(H), Int32(sq), Int32(sk), Int32(sq_pad), Int32(sk_pad),
        Float32(softmax_scale),
        stream,
    )


__all__ = ["DEFAULT_OPTIONS", "LAUNCH_INFO", "tvm_ffi_launch_enabled", "options", "exp2_poly", "Sm90Fp8Attention", "compile_sm90", "run_sm90", "smem_bytes", "sm90_key_order_for_positions"]
