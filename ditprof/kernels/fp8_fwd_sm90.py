"""Hopper-native FP8 FlashAttention forward (sm_90a): TMA + mbarrier pipelines + warpgroup MMA (QGMMA).

Design
------
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
* The shipped schedule (v6; benchmarks/NOTES.md has its measurements), with its four sizes in a frozen ``Sm90Config``
  picked by ``config_for(arch, head_dim)``: 3 consumer warpgroups (192 query rows per CTA, 160 registers each),
  160-key tiles, 3-deep K and V rings, P_{j-1} V_{j-1} finished before QK_j is issued (S and P never live
  together; the other warpgroups supply the overlap), each tile's P V promoted to FP32 in 2 head_dim slices, the row
  sums from the tensor cores, a clock fence after each merge. The schedules measured slower (intra-warpgroup
  overlap, ping-pong, exp turns, polynomial exps, lazy max, ...) live in
  ``benchmarks/experimental/fp8_fwd_sm90_variants.py`` with the sweep and timeline scripts.
* Promotion: each tile's P V goes into a fresh wgmma accumulator and is added on the FP32 cores,
  O = O * alpha + O_tile. Accumulating O across tiles inside the FP8 wgmma loses the low bits of every tile's
  term once |O| is large (short accumulator alignment): a large error on a long key range with a biased V. In two
  head_dim slices the fresh accumulator is small enough for 3 consumer warpgroups at 160 registers.
* The exps use the side-effecting inline-asm ``ex2.approx.ftz`` (``cute.arch.exp2``): with ``math.exp2`` LLVM
  cloned/sank them past the P V wait.
* Row sums from the tensor cores: an m64n8 wgmma of P (the same registers as P V's A operand) with a constant smem
  tile of e4m3 1.0, issued with the first P V slice: the softmax has no FADDs for l, and l sums exactly the e4m3
  values that P V multiplies.
* The clock fence: a clock read (an instruction ptxas does not move code across) in a branch that is never taken,
  right after the P V merge: without it ptxas interleaves the next QK's set-up with the merge and spills.

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

Q in the kernel (``q_rot``, INT8 only; the op's launch record uses it on the plain grid)
----------------------------------------------------------------------------------------
Q's INT8 scales are per row, so the CTA that reads Q can quantize it: the prep then skips Q (its largest read and
write). The producer loads the prep's +-1 matrix transposed (the 16-bit wgmma's K-major B operand, 32 KiB at
head_dim 128) by TMA on the Q pipeline instead of Q; each consumer warpgroup loads its 64 rows of the 16-bit q
straight into the A-operand registers of a 16-bit wgmma (column pairs in 32-bit loads; rows >= Sq zeros),
Q' = Q Rpm1 / D on the tensor cores (fp32), the row amax over the quad (a NaN-propagating max: a row with NaN or Inf
sets Q's sticky flag, which follows ``scales`` in memory), descale RN(amax / 127), codes rni(Q' * RN(1 / descale))
-- the prep's codes: on the GPU the output bits were the prep path's at every shape tried -- written byte by byte
through the accumulator's partition of the int8 Q tile (CuTe applies the swizzle), then a proxy fence and a named
barrier of the warpgroup. The key loop is unchanged. On the stream-K grid
it lost (a tail segment's Q is then quantized on the critical path instead of prefetched), so that grid keeps the
prep's Q.

Inputs (the shared prep's contract): q8 (B,H,Sq_pad,D) with Sq_pad % 128 == 0, k8 (B,H,Sk_pad,D),
v8t (B,H,D,Sk_pad) with Sk_pad % 32 == 0 (TMA zero-fills the box beyond Sk_pad), scales (B,H,3) fp32.
Outputs: out (B,Sq,H,D) bf16 (or fp16), lse (B,H,Sq) fp32. head_dim 128 (64 also compiles).
Every tensor must have < 2**31 elements (32-bit index arithmetic).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Float16, Float32, Float8E4M3FN, Float8E5M2, Int8, Int32, Uint8, const_expr
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

import cuda.bindings.driver as cuda
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from ditprof.kernels.key_order import key_order_for_positions

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)

TILE_M_WG = 64  # query rows per consumer warpgroup (wgmma M)
REGS_PRODUCER = 24
# setmaxnreg budgets per consumer count: 128 * (24 + n * R) must fit the 64K-register file
REGS_CONSUMER = {2: 240, 3: 160}
Q_BARRIER0 = 1  # q_rot: named barriers 1..3, one per consumer warpgroup (0 is the CTA barrier)
PIN_ZERO_SLOT = 16  # smem scratch slot holding 0.0 (slots 0..15: per-warp fence stores)
SUM_COLS = 8  # width of the ones tile of the row-sum wgmma (the narrowest wgmma N)
MAX_CHAINS = 4  # independent FMNMX chains per row in the softmax: shorter dependency latency
# INT8 Q K^T: the int32 accumulator starts from these bits (the float 2**23 + 2**22); adding an integer s with
# |s| < 2**22 gives the bits of the float S_BIAS + s exactly, so the softmax reads S as floats with no conversion
S_BIAS_BITS = 0x4B400000
S_BIAS = 12582912.0
# the preset as a wgmma (Sm90Config.mma_preset): A = e4m3 256 (64 x 32), B = e5m2 1536 (tile_n x 32), so every
# element of the zero-init product is 32 x 256 x 1536 = S_BIAS exactly (every partial sum a multiple of 2**17 below
# 2**24: exact under the FP8 wgmma's short accumulator alignment)
PRESET_A = 0x78  # e4m3 256.0
PRESET_B = 0x66  # e5m2 1536.0
PRESET_K = 32  # the FP8 wgmma's k


@dsl_user_op
def ld_shared_v4_volatile(ptr: cute.Pointer, *, loc=None, ip=None) -> tuple:
    """Four 32-bit words from 16-byte aligned shared memory in one LDS.128, as a volatile load: a constant
    reloaded per tile fills 4 registers per instruction (a register preset by moves costs one each), and volatile
    keeps LLVM/ptxas from merging the loads into one and copying the value around."""
    addr = llvm.ptrtoint(T.i32(), ptr.llvm_ptr, loc=loc, ip=ip)
    res = llvm.inline_asm(llvm.StructType.get_literal([T.i32()] * 4), [addr],
                          "ld.volatile.shared.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r",
                          has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
                          loc=loc, ip=ip)
    return tuple(Int32(llvm.extractvalue(T.i32(), res, [i], loc=loc, ip=ip)) for i in range(4))


@dsl_user_op
def pack2(lo: Float32, hi: Float32, half: bool, *, loc=None, ip=None) -> Int32:
    """Two fp32 values rounded to nearest even into one 32-bit word of two 16-bit floats, lo in the low half (the
    lower address): one ``cvt.rn.{bf16,f16}x2.f32``, the rounding of ``.to(BFloat16 / Float16)``."""
    ty = "f16x2" if half else "bf16x2"
    res = llvm.inline_asm(T.i32(), [Float32(hi).ir_value(loc=loc, ip=ip), Float32(lo).ir_value(loc=loc, ip=ip)],
                          f"cvt.rn.{ty}.f32 $0, $1, $2;", "=r,f,f", has_side_effects=False,
                          is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)
    return Int32(res)


@dsl_user_op
def st_global_v4_b32(ptr: cute.Pointer, w0: Int32, w1: Int32, w2: Int32, w3: Int32, *, loc=None, ip=None) -> None:
    """One 16-byte global store of four 32-bit words (``ptr`` 16-byte aligned)."""
    ops = [ptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip)] + [Int32(w).ir_value(loc=loc, ip=ip)
                                                                   for w in (w0, w1, w2, w3)]
    llvm.inline_asm(None, ops, "st.global.v4.b32 [$0], {$1, $2, $3, $4};", "l,r,r,r,r,~{memory}",
                    has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)


@dsl_user_op
def ld_global_b32(ptr: cute.Pointer, *, loc=None, ip=None) -> Int32:
    """One 32-bit global load (``ptr`` 4-byte aligned): LLVM splits a 32-bit load of a 16-bit pair it cannot prove
    aligned into two 16-bit loads."""
    res = llvm.inline_asm(T.i32(), [ptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip)], "ld.global.b32 $0, [$1];",
                          "=r,l", has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
                          loc=loc, ip=ip)
    return Int32(res)


@dsl_user_op
def cvt_rni_s32(x: Float32, *, loc=None, ip=None) -> Int32:
    """Round to the nearest integer, ties to even (``cvt.rni.s32.f32``)."""
    res = llvm.inline_asm(T.i32(), [Float32(x).ir_value(loc=loc, ip=ip)], "cvt.rni.s32.f32 $0, $1;", "=r,f",
                          has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
                          loc=loc, ip=ip)
    return Int32(res)


@dsl_user_op
def fmax_nan(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """max(a, b), NaN if either is NaN (``max.NaN.f32``; ``fmax`` drops a NaN)."""
    res = llvm.inline_asm(T.f32(), [Float32(a).ir_value(loc=loc, ip=ip), Float32(b).ir_value(loc=loc, ip=ip)],
                          "max.NaN.f32 $0, $1, $2;", "=f,f,f", has_side_effects=False, is_align_stack=False,
                          asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)
    return Float32(res)


def quad_transpose(x: list, quad) -> list:
    """x[p] (p = 0..3) of each lane q of a quad -> y[p] = the x[q] of lane p: two butterfly stages (lane bit 0,
    then bit 1), each exchanging the two words whose index bit differs from the lane's bit."""
    x = list(x)
    for bit in (1, 2):
        mine = (quad & bit) != 0
        for other in range(2):  # the index bit not exchanged in this stage
            lo = other if bit == 2 else 2 * other  # index with the stage's bit clear
            hi = lo + bit  # index with the stage's bit set
            send = cutlass.select_(mine, x[lo], x[hi])  # the word whose bit differs from the lane's
            recv = cute.arch.shuffle_sync_bfly(send, offset=bit)
            x[lo] = cutlass.select_(mine, recv, x[lo])
            x[hi] = cutlass.select_(mine, x[hi], recv)
    return x


@cute.jit
def store_o_row(mO: cute.Tensor, acc_O: cute.Tensor, r: cutlass.Constexpr, inv: Float32, row: Int32, sq: Int32,
                head: Int32, bat: Int32, quad: Int32, head_dim: cutlass.Constexpr, half: cutlass.Constexpr):
    """Accumulator row r (0 or 1) of a consumer thread, times ``inv``, into mO[row, :, head, bat] in 16-byte
    stores: the thread holds column pairs 8j + 2 quad, so per 32 columns the quad's words are transposed across its
    lanes (``quad_transpose``) until each lane holds 8 consecutive columns. Every lane runs the shuffles; only the
    stores are predicated on row < sq. mO must be 16-byte aligned."""
    words = [pack2(acc_O[2 * r + 4 * j] * inv, acc_O[1 + 2 * r + 4 * j] * inv, half) for j in range(head_dim // 8)]
    for g in cutlass.range_constexpr(head_dim // 32):
        y = quad_transpose(words[4 * g:4 * g + 4], quad)
        if row < sq:
            st_global_v4_b32(mO.iterator + cute.crd2idx((row, 32 * g + 8 * quad, head, bat), mO.layout),
                             y[0], y[1], y[2], y[3])


# the mma.sync kernel's permutation also fits wgmma's accumulator -> e4m3 A-operand registers (module docstring)
sm90_key_order_for_positions = key_order_for_positions


@dataclass(frozen=True)
class Sm90Config:
    """The sizes the compiled kernel is specialised for (part of the compile-cache key)."""

    tile_n: int = 160  # keys per K/V tile (multiple of 32)
    kv_stages: int = 3  # depth of the K and V smem rings
    consumer_wgs: int = 3  # consumer warpgroups per CTA (64 query rows each; 160 registers each at 3)
    pv_split: int = 2  # P V in this many head_dim slices, each into a fresh accumulator merged in FP32
    # INT8 Q/K only: each tile's Q K^T accumulator preset (S_BIAS_BITS) by one zero-init FP8 wgmma of two constant
    # smem tiles (True) or by volatile LDS.128 of a 16-byte smem constant (False)
    mma_preset: bool = False


def set_accumulate(zero_start: tuple, accumulating: tuple) -> None:
    """The wgmma atoms' ACCUMULATE field, pairwise: each tile's first MMA starts from zero, the rest add into the
    accumulator (the experimental variants take this too)."""
    for zero, acc in zip(zero_start, accumulating):
        zero.set(warpgroup.Field.ACCUMULATE, False)
        acc.set(warpgroup.Field.ACCUMULATE, True)


def tma_views(tma_q, mQ, tma_k, mK, tma_v, mV, sQ, sK, sV, head_dim: int, tile_n: int) -> tuple:
    """TMA descriptor prefetches and the (smem, gmem) partitions of Q (64-row boxes), K and V (``tile_n``-key
    tiles): (tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV). Shared with the experimental variants."""
    cpasync.prefetch_descriptor(tma_q)
    cpasync.prefetch_descriptor(tma_k)
    cpasync.prefetch_descriptor(tma_v)
    # (box, n_m_boxes, 1, H, B) etc.
    gQ = cute.flat_divide(mQ, (TILE_M_WG, head_dim))
    gK = cute.flat_divide(mK, (tile_n, head_dim))
    gV = cute.flat_divide(mV, (head_dim, tile_n))
    tQsQ, tQgQ = cpasync.tma_partition(
        tma_q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2), cute.group_modes(gQ, 0, 2))
    tKsK, tKgK = cpasync.tma_partition(
        tma_k, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2))
    tVsV, tVgV = cpasync.tma_partition(
        tma_v, 0, cute.make_layout(1), cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2))
    return tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV


def config_for(arch: str, head_dim: int) -> Sm90Config:
    """The one configuration we ship for (arch, head_dim): v6, the fastest schedule measured
    (benchmarks/NOTES.md). head_dim 64 takes 192-key tiles: its O accumulator is half as large, so they fit the
    consumers' 160 registers without spills (at head_dim 128 they spill), and the head_dim-64 shapes ran faster
    with them."""
    if not arch.startswith("sm_90"):
        raise ValueError(f"the wgmma kernel is sm_90a only, not {arch}")
    if head_dim not in (64, 128):
        raise ValueError(f"head_dim {head_dim} not supported (64 or 128)")
    # the INT8 accumulator preset as a wgmma: faster at head_dim 128, same output bits; not at head_dim 64, where
    # Q K^T has only two k-steps and the preset's extra tensor work per tile does not pay
    return Sm90Config(tile_n=192) if head_dim == 64 else Sm90Config(mma_preset=True)


class Sm90Fp8Attention:
    """Compile-time configuration + the jit entry point (``__call__``) and the kernel."""

    def __init__(self, head_dim: int = 128, dtype_out=BFloat16, config: Sm90Config | None = None,
                 key_lens: bool = False, qk_int8: bool = False, q_rot: bool = False):
        config = config or config_for("sm_90a", head_dim)
        if q_rot and not qk_int8:
            raise ValueError("q_rot (Q rotated and quantized in the kernel) needs the INT8 Q/K format")
        if head_dim not in (64, 128):
            raise ValueError(f"head_dim {head_dim} not supported (64 or 128)")
        if config.tile_n % 32 or not 32 <= config.tile_n <= 256:
            raise ValueError("tile_n must be a multiple of 32 in [32, 256]")
        if config.consumer_wgs not in REGS_CONSUMER:
            raise ValueError(f"consumer_wgs must be one of {sorted(REGS_CONSUMER)}")
        if config.pv_split not in (2, 4):
            raise ValueError("pv_split must be 2 or 4")
        self.head_dim = head_dim
        self.dtype_out = dtype_out
        self.config = config
        self.tile_n = config.tile_n
        self.kv_stages = config.kv_stages
        self.pv_split = config.pv_split
        self.num_wg = config.consumer_wgs
        self.tile_m = TILE_M_WG * self.num_wg
        self.regs_consumer = REGS_CONSUMER[self.num_wg]
        self.threads = 128 * (1 + self.num_wg)
        # per-batch key counts read on the device (key-padding masks); off: the pointer is not used at all
        self.key_lens = key_lens
        # Q and K as int8 (the prep's rotated INT8 mode): s8 x s8 -> s32 wgmma, per-row Q descales; off: the
        # q_scales pointer is not used at all and the kernel is the e4m3 one
        self.qk_int8 = qk_int8
        self.qk_dtype = Int8 if qk_int8 else Float8E4M3FN
        # INT8 with Q rotated and quantized here ("Q in the kernel" below): q is the 16-bit input, the q_scales
        # pointer is the prep's rotation matrix transposed; off: q8 and q_scales come from the prep
        self.q_rot = q_rot
        # INT8: the accumulator preset as a wgmma (``Sm90Config.mma_preset``, "the INT8 accumulator preset" below)
        self.mma_preset = qk_int8 and config.mma_preset

    # ------------------------------------------------------------------ host side (traced at compile)
    @cute.jit
    def __call__(
        self,
        pQ: cute.Pointer,
        pK: cute.Pointer,
        pV: cute.Pointer,
        pScales: cute.Pointer,
        pQScales: cute.Pointer,
        pKeyLens: cute.Pointer,
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
        args, layouts = self.kernel_args(pQ, pK, pV, pScales, pQScales, pKeyLens, pO, pLSE, batch, heads, sq, sk,
                                         sq_pad, sk_pad)
        self.launch_kernel(args, layouts, sq, sk, softmax_scale, (), (cute.ceil_div(sq, self.tile_m), heads, batch),
                           stream)

    def launch_kernel(self, args, layouts, sq, sk, softmax_scale, extra, grid, stream):
        """The launch every host entry shares (traced in ``__call__``; a subclass passes its ``extra`` kernel
        arguments and its grid)."""
        self.kernel(*args, sq, sk, softmax_scale * LOG2E, *layouts, extra).launch(
            grid=grid, block=[self.threads, 1, 1], stream=stream, min_blocks_per_mp=1, use_pdl=self.USE_PDL)

    Q_STAGES = 1  # Q buffers in shared memory (each one box of 64 rows per consumer warpgroup)
    # programmatic dependent launch (a launch attribute, host side only; a subclass that sets it must wait on
    # the previous grid before reading its outputs: benchmarks/experimental/fp8_fwd_sm90_pdl.py)
    USE_PDL = False

    def kernel_args(self, pQ, pK, pV, pScales, pQScales, pKeyLens, pO, pLSE, batch, heads, sq, sk, sq_pad, sk_pad):
        """The kernel's arguments before (sq, sk, scale_log2) and its smem layouts after them (traced in
        ``__call__``; sets ``shared_storage`` and ``smem_bytes``)."""
        D = self.head_dim
        f8 = Float8E4M3FN
        qk8 = self.qk_dtype
        # Views with the (row, col, head, batch) mode order the TMA boxes tile.
        mQ = cute.make_tensor(
            cute.recast_ptr(pQ, dtype=qk8),
            cute.make_layout((sq_pad, D, heads, batch), stride=(D, 1, sq_pad * D, heads * sq_pad * D)))
        mK = cute.make_tensor(
            cute.recast_ptr(pK, dtype=qk8),
            cute.make_layout((sk_pad, D, heads, batch), stride=(D, 1, sk_pad * D, heads * sk_pad * D)))
        mV = cute.make_tensor(
            cute.recast_ptr(pV, dtype=f8),
            cute.make_layout((D, sk_pad, heads, batch), stride=(sk_pad, 1, D * sk_pad, heads * D * sk_pad)))
        mScales = cute.make_tensor(pScales, cute.make_layout((3, heads, batch), stride=(1, 3, 3 * heads)))
        mO = cute.make_tensor(
            pO, cute.make_layout((sq, D, heads, batch), stride=(heads * D, 1, D, sq * heads * D)))
        mLSE = cute.make_tensor(pLSE, cute.make_layout((sq, heads, batch), stride=(1, sq, heads * sq)))
        mKeyLens = None
        if const_expr(self.key_lens):
            mKeyLens = cute.make_tensor(pKeyLens, cute.make_layout((batch,)))
        mQScales = None
        if const_expr(self.qk_int8 and not self.q_rot):
            mQScales = cute.make_tensor(
                pQScales, cute.make_layout((sq_pad, heads, batch), stride=(1, sq_pad, heads * sq_pad)))

        K_MAJOR = OperandMajorMode.K
        qk_acc = Int32 if const_expr(self.qk_int8) else Float32
        qk_mma = sm90_utils.make_trivial_tiled_mma(
            qk8, qk8, K_MAJOR, K_MAJOR, qk_acc, (1, 1, 1), (TILE_M_WG, self.tile_n))
        # a second instance for the first k-block (ACCUMULATE=False): the field is set once, outside loops
        qk_mma_zero = sm90_utils.make_trivial_tiled_mma(
            qk8, qk8, K_MAJOR, K_MAJOR, qk_acc, (1, 1, 1), (TILE_M_WG, self.tile_n))
        pv_mma = sm90_utils.make_trivial_tiled_mma(
            f8, f8, K_MAJOR, K_MAJOR, Float32, (1, 1, 1), (TILE_M_WG, D), warpgroup.OperandSource.RMEM)
        pv_mma_zero = sm90_utils.make_trivial_tiled_mma(
            f8, f8, K_MAJOR, K_MAJOR, Float32, (1, 1, 1), (TILE_M_WG, D), warpgroup.OperandSource.RMEM)
        # pv_split: P V in head_dim slices of D / pv_split columns (a smaller fresh accumulator to promote)
        pv_mma_h = sm90_utils.make_trivial_tiled_mma(
            f8, f8, K_MAJOR, K_MAJOR, Float32, (1, 1, 1), (TILE_M_WG, D // self.pv_split), warpgroup.OperandSource.RMEM)
        pv_mma_h_zero = sm90_utils.make_trivial_tiled_mma(
            f8, f8, K_MAJOR, K_MAJOR, Float32, (1, 1, 1), (TILE_M_WG, D // self.pv_split), warpgroup.OperandSource.RMEM)

        # row sums: l = P8 @ ones (8 identical columns, the narrowest wgmma) from a constant smem tile of e4m3 1.0
        sum_mma = sm90_utils.make_trivial_tiled_mma(
            f8, f8, K_MAJOR, K_MAJOR, Float32, (1, 1, 1), (TILE_M_WG, SUM_COLS), warpgroup.OperandSource.RMEM)
        sum_mma_zero = sm90_utils.make_trivial_tiled_mma(
            f8, f8, K_MAJOR, K_MAJOR, Float32, (1, 1, 1), (TILE_M_WG, SUM_COLS), warpgroup.OperandSource.RMEM)
        sOnes_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (TILE_M_WG, SUM_COLS, self.tile_n), f8, 1)

        qk_tiler = (TILE_M_WG, self.tile_n, D)
        pv_tiler = (TILE_M_WG, D, self.tile_n)
        sQ_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, qk_tiler, qk8, self.num_wg * self.Q_STAGES)
        sK_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, qk_tiler, qk8, self.kv_stages)
        sV_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, pv_tiler, f8, self.kv_stages)

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        if const_expr(self.q_rot):
            # the TMA slot carries the rotation matrix, the q_scales slot the 16-bit Q (read by the consumers)
            mQScales = self.q16_tensor(pQ, sq, heads, batch)
            tma_q, mQ_tma = self.rot_tma(pQScales)
        else:
            tma_q, mQ_tma = cpasync.make_tiled_tma_atom(
                g2s, mQ, cute.slice_(sQ_layout, (None, None, 0)), (TILE_M_WG, D))
        tma_k, mK_tma = cpasync.make_tiled_tma_atom(
            g2s, mK, cute.slice_(sK_layout, (None, None, 0)), (self.tile_n, D))
        tma_v, mV_tma = cpasync.make_tiled_tma_atom(
            g2s, mV, cute.slice_(sV_layout, (None, None, 0)), (D, self.tile_n))
        self.q_bytes = D * D * 2 if const_expr(self.q_rot) else TILE_M_WG * D * self.num_wg
        self.kv_bytes = self.tile_n * D

        SharedStorage = _shared_storage(self.kv_stages, cute.cosize(sQ_layout), cute.cosize(sK_layout),
                                        cute.cosize(sV_layout), cute.cosize(sOnes_layout), qk8, self.Q_STAGES,
                                        {**self.preset_smem_fields(), **self.extra_smem_fields()})
        self.shared_storage = SharedStorage
        self.smem_bytes = SharedStorage.size_in_bytes()
        return ((qk_mma, qk_mma_zero, pv_mma, pv_mma_zero, pv_mma_h, pv_mma_h_zero, sum_mma, sum_mma_zero,
                 tma_q, mQ_tma, tma_k, mK_tma, tma_v, mV_tma, mScales, mQScales, mO, mLSE, mKeyLens),
                (sQ_layout, sK_layout, sV_layout, sOnes_layout))

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
        mQScales: cute.Tensor | None,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        mKeyLens: cute.Tensor | None,
        sq: Int32,
        sk: Int32,
        scale_log2: Float32,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        sOnes_layout: cute.ComposedLayout,
        extra,
    ):
        """The typed entry: every argument into one namespace for the sections below (``extra``: a subclass's
        additional kernel arguments as one tuple, () here; a subclass overrides sections, not this entry)."""
        k = SimpleNamespace(**locals())
        self.kernel_body(k)

    @cute.jit
    def kernel_body(self, k: SimpleNamespace):
        """The CTA: its work tile, the shared set-up, then the producer warp and the consumer warpgroups. The
        sections (``work_tile``, ``smem_setup``, ``producer``, ``consumer``) take the namespaces k (arguments),
        w (work tile), s (smem, pipelines). An override with a dynamic ``if`` of its own reads what it needs out of
        them into plain locals (or arguments of a helper) first: a namespace's value used inside a staged branch
        and again elsewhere fails IR verification ("does not dominate this use")."""
        tidx, _, _ = cute.arch.thread_idx()
        w = self.work_tile(k)
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = cute.arch.make_warp_uniform(tidx // 128)
        s = self.smem_setup(k, w, tidx)
        if wg_idx == 0:
            # ======================= producer warpgroup =======================
            cute.arch.setmaxregister_decrease(REGS_PRODUCER)
            if warp_idx == 0:
                self.producer(k, w, s)
        else:
            # ======================= consumer warpgroups =======================
            cute.arch.setmaxregister_increase(self.regs_consumer)
            f = self.consumer_setup(k.qk_mma, k.qk_mma_zero, k.pv_mma, k.pv_mma_zero, k.pv_mma_h, k.pv_mma_h_zero,
                                    k.sum_mma, k.sum_mma_zero, s.sQ, s.sK, s.sV, s.storage, k.sOnes_layout, wg_idx,
                                    tidx)
            self.consumer(k, w, s, f, warp_idx)

    def work_tile(self, k: SimpleNamespace) -> SimpleNamespace:
        """The CTA's work tile: (query block, head, batch) = blockIdx."""
        m_block, head, bat = cute.arch.block_idx()
        return SimpleNamespace(m_block=m_block, head=head, bat=bat)

    def smem_setup(self, k: SimpleNamespace, w: SimpleNamespace, tidx) -> SimpleNamespace:
        """``shared_setup``, the work tile's key tiles and ``shared_constants`` (every thread, before the roles)."""
        storage, q_pipe, k_pipe, v_pipe, sQ, sK, sV, sPin = self.shared_setup(k.sQ_layout, k.sK_layout, k.sV_layout)
        n_tiles = self.key_tiles(k.mKeyLens, w.bat, k.sk)
        bias_ptr = self.shared_constants(storage, k.sOnes_layout, sPin, tidx)
        return SimpleNamespace(storage=storage, q_pipe=q_pipe, k_pipe=k_pipe, v_pipe=v_pipe, sQ=sQ, sK=sK, sV=sV,
                               sPin=sPin, n_tiles=n_tiles, bias_ptr=bias_ptr)

    def producer(self, k: SimpleNamespace, w: SimpleNamespace, s: SimpleNamespace):
        """The producer warp: Q of the work tile (``q_rot``: the rotation matrix), then its K/V tiles."""
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        if self.q_rot:
            tKsK, tKgK, tVsV, tVgV = self.producer_views_kv(k.tma_k, k.mK, k.tma_v, k.mV, s.sK, s.sV)
            self.load_rot(s.q_pipe, q_state, k.tma_q, k.mQ, s.storage)
        else:
            tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV = self.producer_views(k.tma_q, k.mQ, k.tma_k, k.mK, k.tma_v, k.mV,
                                                                     s.sQ, s.sK, s.sV)
            self.load_q(s.q_pipe, q_state, k.tma_q, tQgQ, tQsQ, w.m_block, w.head, w.bat)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.kv_stages)
        self.load_kv(s.k_pipe, s.v_pipe, kv_state, s.n_tiles, k.tma_k, tKgK, tKsK, k.tma_v, tVgV, tVsV, w.head, w.bat)

    def consumer(self, k: SimpleNamespace, w: SimpleNamespace, s: SimpleNamespace, f: SimpleNamespace, warp_idx):
        """A consumer warpgroup on the work tile: (``q_rot``: its Q rows quantized,) the key loop (``attend``), then
        the epilogue."""
        row0 = w.m_block * self.tile_m + f.wg * TILE_M_WG
        if self.q_rot:
            qk_scale = self.quantize_q(k.mQScales, k.mScales, k.scale_log2, self.rot_tensor(s.storage), s.sQ,
                                       s.q_pipe, row0, w.head, w.bat, k.sq, f.wg, f.wg_tidx)
        else:
            qk_scale = self.tile_qk_scale(k.mScales, k.mQScales, k.scale_log2, row0, w.head, w.bat, k.sq,
                                          f.wg_tidx)
        row_max = cute.make_rmem_tensor((2,), Float32)
        row_sum = cute.make_rmem_tensor((2,), Float32)
        row_max.fill(-Float32.inf)
        row_sum.fill(0.0)

        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        self.attend(f, s.q_pipe, q_state, s.k_pipe, s.v_pipe, kv_state, f.wg, s.n_tiles, qk_scale, row_max, row_sum,
                    k.mKeyLens, w.bat, k.sk, s.sPin, warp_idx, self.accumulator_preset(s, f))

        # read only now: one register less across the main loop
        self.epilogue(f.acc_O, row_max, row_sum, qk_scale, k.mScales[2, w.head, w.bat], k.mO, k.mLSE, k.sq,
                      row0, w.head, w.bat, f.wg_tidx)

    # ------------------------------------------------------------------ kernel sections (the persistent variant
    # in benchmarks/experimental/fp8_fwd_sm90_persistent.py runs them per work tile)
    def shared_setup(self, sQ_layout, sK_layout, sV_layout):
        """The smem struct, the Q / K / V TMA pipelines (mbarriers not yet fenced: ``shared_constants`` does it),
        the Q, K, V tiles and the scratch slots."""
        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)

        one = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, 4 * self.num_wg)  # one arrive per warp
        q_pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.q_mbar.data_ptr(), num_stages=self.Q_STAGES, producer_group=one,
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
        return storage, q_pipe, k_pipe, v_pipe, sQ, sK, sV, sPin

    def key_tiles(self, mKeyLens: cute.Tensor | None, bat: Int32, sk: Int32) -> Int32:
        """Key tiles of batch item ``bat``."""
        if const_expr(mKeyLens is not None):
            # this batch item's keys: the first key_lens[b] (at most sk); at least one tile is run, so a fully
            # masked item ends in NaN rows (as SDPA's do) instead of consumers waiting on a tile never loaded
            return cutlass.max(cute.ceil_div(self.item_keys(mKeyLens, bat, sk), self.tile_n), 1)
        return cute.ceil_div(sk, self.tile_n)

    @cute.jit
    def shared_constants(self, storage, sOnes_layout: cute.ComposedLayout, sPin: cute.Tensor, tidx: Int32):
        """The smem constants (the row-sum wgmma's ones, the INT8 accumulator preset), the proxy and mbarrier
        fences and the CTA barrier; returns the LDS preset's pointer (None for e4m3 and the wgmma preset)."""
        if tidx == 0:
            # a zeroed scratch slot no schedule of this kernel reads: dropping the store reorders the prologue's
            # SASS, and this is the instruction stream that was measured
            sPin[PIN_ZERO_SLOT] = Float32(0.0)
        # every byte is one element, so the swizzle does not matter: e4m3 1.0 = 0x38
        ones_raw = cute.recast_tensor(storage.sOnes.get_tensor(cute.make_layout(cute.cosize(sOnes_layout))), Uint8)
        for i in range(tidx, cute.size(ones_raw), self.threads):
            ones_raw[i] = Uint8(0x38)
        bias_ptr = None
        if const_expr(self.mma_preset):
            sA_layout, sB_layout = self.preset_layouts()
            a_raw = cute.recast_tensor(storage.sPresetA.get_tensor(cute.make_layout(cute.cosize(sA_layout))), Uint8)
            b_raw = cute.recast_tensor(storage.sPresetB.get_tensor(cute.make_layout(cute.cosize(sB_layout))), Uint8)
            for i in range(tidx, cute.size(a_raw), self.threads):
                a_raw[i] = Uint8(PRESET_A)
            for i in range(tidx, cute.size(b_raw), self.threads):
                b_raw[i] = Uint8(PRESET_B)
        elif const_expr(self.qk_int8):
            sBias = storage.sBias.get_tensor(cute.make_layout(4))
            if tidx < 4:
                sBias[tidx] = Int32(S_BIAS_BITS)
            bias_ptr = sBias.iterator
        cute.arch.fence_proxy("async.shared", space="cta")  # generic stores, read by wgmma (async proxy)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        return bias_ptr

    def producer_views_kv(self, tma_k, mK, tma_v, mV, sK, sV):
        """``producer_views`` without Q (``q_rot``): the K and V partitions."""
        cpasync.prefetch_descriptor(tma_k)
        cpasync.prefetch_descriptor(tma_v)
        gK = cute.flat_divide(mK, (self.tile_n, self.head_dim))
        gV = cute.flat_divide(mV, (self.head_dim, self.tile_n))
        tKsK, tKgK = cpasync.tma_partition(
            tma_k, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2))
        tVsV, tVgV = cpasync.tma_partition(
            tma_v, 0, cute.make_layout(1), cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2))
        return tKsK, tKgK, tVsV, tVgV

    def producer_views(self, tma_q, mQ, tma_k, mK, tma_v, mV, sQ, sK, sV):
        """The producer warp's TMA descriptor prefetches and the (smem, gmem) partitions of Q, K and V."""
        return tma_views(tma_q, mQ, tma_k, mK, tma_v, mV, sQ, sK, sV, self.head_dim, self.tile_n)

    @cute.jit
    def load_q(self, q_pipe, q_state, tma_q, tQgQ, tQsQ, m_block, head, bat, slot0=0):
        """Q of query block ``m_block``: one box per consumer warpgroup into Q boxes slot0.., on one mbarrier."""
        q_pipe.producer_acquire(q_state)
        for w in cutlass.range_constexpr(self.num_wg):
            # boxes past the padded length (3 consumer warpgroups) are zero-filled by the TMA unit
            cute.copy(tma_q, tQgQ[(None, m_block * self.num_wg + w, 0, head, bat)], tQsQ[(None, slot0 + w)],
                      tma_bar_ptr=q_pipe.producer_get_barrier(q_state))

    # ------------------------------------------------------------------ Q in the kernel (q_rot)
    def rot_smem_layout(self):
        """The rotation matrix's tile (Rpm1^T, the rotation wgmma's K-major B operand; static, so built again
        wherever it is used: a layout made in the host trace cannot be used inside the kernel)."""
        D = self.head_dim
        return sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (TILE_M_WG, D, D), self.dtype_out, 1)

    def q16_tensor(self, pQ16: cute.Pointer, sq: Int32, heads: Int32, batch: Int32) -> cute.Tensor:
        """The 16-bit q (B, Sq, H, D) contiguous as a (row, col, head, batch) view (traced on the host)."""
        D = self.head_dim
        return cute.make_tensor(cute.recast_ptr(pQ16, dtype=self.dtype_out),
                                cute.make_layout((sq, D, heads, batch), stride=(heads * D, 1, D, sq * heads * D)))

    def rot_tma(self, pRot: cute.Pointer):
        """(TMA atom, TMA tensor) of the rotation matrix Rpm1^T (D, D) into its tile (traced on the host)."""
        D = self.head_dim
        mRot = cute.make_tensor(cute.recast_ptr(pRot, dtype=self.dtype_out), cute.make_layout((D, D), stride=(D, 1)))
        return cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mRot,
                                           cute.slice_(self.rot_smem_layout(), (None, None, 0)), (D, D))

    def extra_smem_fields(self) -> dict:
        """The shared struct's fields after the shipped tiles: the rotation matrix's tile with ``q_rot`` (an
        experimental variant adds its own tiles to these)."""
        if not self.q_rot:
            return {}
        return {"sR": cute.struct.Align[cute.struct.MemRange[self.dtype_out, cute.cosize(self.rot_smem_layout())],
                                        1024]}

    # ------------------------------------------------------------------ the INT8 accumulator preset
    # Each key tile's int32 accumulator starts at S_BIAS_BITS so that its bits after the s8 wgmmas are the float
    # S_BIAS + S. mma_preset: one zero-init FP8 wgmma (m64 n<tile_n> k32) of constant tiles writes them; it has the
    # s8 wgmmas' shape, so they accumulate onto it in issue order with no wait (PTX: accumulator accesses across
    # wgmma.mma_async of one shape are ordered). It trades 20 LDS.128 per tile (tile_n 160: 80 registers) for one
    # more k-step on the tensor cores. Otherwise: volatile LDS.128 of a 16-byte constant, 4 registers each.
    def preset_layouts(self):
        """The preset wgmma's constant A (64 x 32 e4m3) and B (tile_n x 32 e5m2) tiles' smem layouts."""
        tiler = (TILE_M_WG, self.tile_n, PRESET_K)
        return (sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, tiler, Float8E4M3FN, 1),
                sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, tiler, Float8E5M2, 1))

    def preset_smem_fields(self) -> dict:
        """The preset's constants in the shared struct (after the ones tile): the wgmma's two tiles, or
        S_BIAS_BITS x 4 for LDS.128; none for e4m3."""
        if self.mma_preset:
            sA_layout, sB_layout = self.preset_layouts()
            return {"sPresetA": cute.struct.Align[cute.struct.MemRange[Float8E4M3FN, cute.cosize(sA_layout)], 1024],
                    "sPresetB": cute.struct.Align[cute.struct.MemRange[Float8E5M2, cute.cosize(sB_layout)], 1024]}
        if self.qk_int8:
            return {"sBias": cute.struct.Align[cute.struct.MemRange[Int32, 4], 16]}
        return {}

    def accumulator_preset(self, s: SimpleNamespace, f: SimpleNamespace):
        """What ``gemm_qk`` presets the INT8 accumulator from: the preset wgmma's (mma, A, B) fragments (built in
        ``consumer_setup``) or the LDS constant's pointer (from ``shared_constants``)."""
        return f.qk_preset if self.mma_preset else s.bias_ptr

    def rot_tensor(self, storage):
        layout = self.rot_smem_layout()
        return storage.sR.get_tensor(layout.outer, swizzle=layout.inner)

    @cute.jit
    def load_rot(self, q_pipe, q_state, tma_r: cute.CopyAtom, mRot: cute.Tensor, storage):
        """The rotation matrix into its tile, on the Q pipeline's mbarrier (once per CTA)."""
        cpasync.prefetch_descriptor(tma_r)
        gR = cute.flat_divide(mRot, (self.head_dim, self.head_dim))
        tRsR, tRgR = cpasync.tma_partition(tma_r, 0, cute.make_layout(1), cute.group_modes(self.rot_tensor(storage), 0, 2),
                                           cute.group_modes(gR, 0, 2))
        q_pipe.producer_acquire(q_state)
        cute.copy(tma_r, tRgR[(None, 0, 0)], tRsR[(None, 0)], tma_bar_ptr=q_pipe.producer_get_barrier(q_state))

    @cute.jit
    def quantize_q(self, mQ16: cute.Tensor, mScales: cute.Tensor, scale_log2: Float32, sR: cute.Tensor,
                   sQ: cute.Tensor, q_pipe, row0: Int32, head: Int32, bat: Int32, sq: Int32, wg: Int32,
                   wg_tidx: Int32):
        """The warpgroup's 64 rows of Q rotated and quantized into its Q tile (the INT8 prep's numerics for Q);
        returns qk_scale (the thread's two rows, as ``tile_qk_scale``). A non-finite row sets Q's sticky flag."""
        D = self.head_dim
        rot_mma = sm90_utils.make_trivial_tiled_mma(
            self.dtype_out, self.dtype_out, OperandMajorMode.K, OperandMajorMode.K, Float32, (1, 1, 1),
            (TILE_M_WG, D), warpgroup.OperandSource.RMEM)
        rot_mma_zero = sm90_utils.make_trivial_tiled_mma(
            self.dtype_out, self.dtype_out, OperandMajorMode.K, OperandMajorMode.K, Float32, (1, 1, 1),
            (TILE_M_WG, D), warpgroup.OperandSource.RMEM)
        set_accumulate((rot_mma_zero,), (rot_mma,))
        thr = rot_mma.get_slice(wg_tidx)
        gQ = cute.local_tile(mQ16[None, None, head, bat], (TILE_M_WG, D), (row0 // TILE_M_WG, 0))
        tAgQ = thr.partition_A(gQ)
        tAcQ = thr.partition_A(cute.make_identity_tensor((TILE_M_WG, D)))
        tArQ = cute.make_rmem_tensor(thr.partition_shape_A((TILE_M_WG, D)), self.dtype_out)
        # the A fragment holds column pairs: one 32-bit load per pair; rows >= sq are zeros (not read)
        tArQ32 = cute.recast_tensor(tArQ, Int32)
        for i in cutlass.range_constexpr(cute.size(tArQ32)):
            if row0 + tAcQ[2 * i][0] < sq:
                tArQ32[i] = ld_global_b32(tAgQ.iterator + cute.crd2idx(2 * i, tAgQ.layout))
            else:
                tArQ32[i] = Int32(0)
        tRrR = thr.make_fragment_B(thr.partition_B(sR))
        acc = cute.make_rmem_tensor(thr.partition_shape_C((TILE_M_WG, D)), Float32)
        q_pipe.consumer_wait(pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1))
        warpgroup.fence()
        for kb in cutlass.range_constexpr(cute.size(tArQ, mode=[2])):
            cute.gemm(rot_mma_zero if kb == 0 else rot_mma, acc, tArQ[None, None, kb], tRrR[None, None, kb, 0], acc)
        warpgroup.commit_group()
        warpgroup.wait_group(0)

        # acc value v = c + 2r + 4j: row r of the thread, column 8j + 2 quad + c. Q' = acc / D (exact); descale =
        # RN(amax|Q'| / 127) (1.0 for a zero row), codes = rni(Q' * RN(1 / descale)) = rni(acc * (RN(1 / descale) / D))
        # (a power of two: the same product), |codes| <= 127 by construction. The amax propagates NaN (max.NaN)
        qk_scale = cute.make_rmem_tensor((2,), Float32)
        mul = cute.make_rmem_tensor((2,), Float32)
        k_scale = mScales[1, head, bat] * scale_log2
        inv_d = Float32(1.0 / D)
        for r in cutlass.range_constexpr(2):
            m = Float32(0.0)
            for j in cutlass.range_constexpr(D // 8):
                for c in cutlass.range_constexpr(2):
                    m = fmax_nan(m, cute.arch.fmax(acc[c + 2 * r + 4 * j], -acc[c + 2 * r + 4 * j]))
            m = cute.arch.warp_reduction_max(m, threads_in_group=4) * inv_d
            ds = Float32(1.0)
            if m != Float32(0.0):
                ds = m / Float32(127.0)
            if ds - ds != Float32(0.0):  # NaN or Inf in the row (rows >= sq are zeros)
                flags = cute.make_tensor(cute.recast_ptr(mScales.iterator + cute.size(mScales), dtype=Int32),
                                         cute.make_layout(3))
                flags[0] = Int32(1)
            qk_scale[r] = ds * k_scale
            mul[r] = (Float32(1.0) / ds) * inv_d
        tCsQ = thr.partition_C(sQ[None, None, wg])  # byte stores: CuTe applies the tile's swizzle
        for j in cutlass.range_constexpr(D // 8):
            for r in cutlass.range_constexpr(2):
                for c in cutlass.range_constexpr(2):
                    v = c + 2 * r + 4 * j
                    tCsQ[v] = Int8(cvt_rni_s32(acc[v] * mul[r]))
        cute.arch.fence_proxy("async.shared", space="cta")  # generic stores, read by the Q K^T wgmma
        cute.arch.barrier(barrier_id=Q_BARRIER0 + wg, number_of_threads=128)
        return qk_scale

    @cute.jit
    def load_kv(self, k_pipe, v_pipe, kv_state, n_tiles: Int32, tma_k: cute.CopyAtom, tKgK: cute.Tensor,
                tKsK: cute.Tensor, tma_v: cute.CopyAtom, tVgV: cute.Tensor, tVsV: cute.Tensor, head: Int32,
                bat: Int32):
        """The K and V tiles 0 .. n_tiles-1 of (head, bat) into the rings; returns the state after the last."""
        for j in cutlass.range(n_tiles, unroll=1):
            k_pipe.producer_acquire(kv_state)
            cute.copy(tma_k, tKgK[(None, j, 0, head, bat)], tKsK[(None, kv_state.index)],
                      tma_bar_ptr=k_pipe.producer_get_barrier(kv_state))
            v_pipe.producer_acquire(kv_state)
            cute.copy(tma_v, tVgV[(None, 0, j, head, bat)], tVsV[(None, kv_state.index)],
                      tma_bar_ptr=v_pipe.producer_get_barrier(kv_state))
            kv_state.advance()
        return kv_state

    def consumer_setup(self, qk_mma, qk_mma_zero, pv_mma, pv_mma_zero, pv_mma_h, pv_mma_h_zero, sum_mma,
                       sum_mma_zero, sQ, sK, sV, storage, sOnes_layout, wg_idx, tidx) -> SimpleNamespace:
        """A consumer warpgroup's MMAs, register fragments and accumulators (as attributes of the result)."""
        tile_n = self.tile_n
        set_accumulate((qk_mma_zero, pv_mma_zero, pv_mma_h_zero, sum_mma_zero), (qk_mma, pv_mma, pv_mma_h, sum_mma))
        f = SimpleNamespace(qk_mma=qk_mma, qk_mma_zero=qk_mma_zero, pv_mma_h=pv_mma_h, pv_mma_h_zero=pv_mma_h_zero,
                            sum_mma=sum_mma, sum_mma_zero=sum_mma_zero)
        f.wg = wg_idx - 1
        f.wg_tidx = wg_tidx = tidx % 128
        qk_thr = qk_mma.get_slice(wg_tidx)
        pv_thr = pv_mma.get_slice(wg_tidx)

        f.tSrQ = qk_thr.make_fragment_A(qk_thr.partition_A(sQ))  # (MMA, 1, D/32, consumer_wgs * Q_STAGES)
        f.tSrK = qk_thr.make_fragment_B(qk_thr.partition_B(sK))  # (MMA, 1, D/32, stages)
        f.tOrV = pv_thr.make_fragment_B(pv_thr.partition_B(sV))  # (MMA, 1, tile_n/32, stages)

        f.acc_S = acc_S = cute.make_rmem_tensor(qk_thr.partition_shape_C((TILE_M_WG, tile_n)), Float32)
        f.acc_O = cute.make_rmem_tensor(pv_thr.partition_shape_C((TILE_M_WG, self.head_dim)), Float32)
        f.tOrP = tOrP = cute.make_rmem_tensor(pv_thr.partition_shape_A((TILE_M_WG, tile_n)), Float8E4M3FN)
        f.acc_O.fill(0.0)
        # pv_promote: each tile's P V goes into a fresh accumulator and is added to acc_O on the FP32 cores
        # (acc_O = acc_O * alpha + acc_Ot): the FP8 wgmma adds into its accumulator with a short alignment
        # (~14 bits, DeepSeek-V3 report), which loses the small per-tile terms once acc_O is large
        pvh_thr = pv_mma_h.get_slice(wg_tidx)
        # fresh accumulator for one slice of D / pv_split columns; tOrV_h: (MMA, pv_split, tile_n/32, stages)
        f.acc_Ot = cute.make_rmem_tensor(pvh_thr.partition_shape_C((TILE_M_WG, self.head_dim // self.pv_split)),
                                         Float32)
        f.tOrV_h = pvh_thr.make_fragment_B(pvh_thr.partition_B(sV))
        f.alpha_keep = cute.make_rmem_tensor((2,), Float32)  # alpha of the tile whose P V is in flight
        # the row sums of a tile's P8 (every column of acc_L holds its row's sum)
        sum_thr = sum_mma.get_slice(wg_tidx)
        f.acc_L = cute.make_rmem_tensor(sum_thr.partition_shape_C((TILE_M_WG, SUM_COLS)), Float32)
        sOnes = storage.sOnes.get_tensor(sOnes_layout.outer, swizzle=sOnes_layout.inner)
        f.tLrOnes = sum_thr.make_fragment_B(sum_thr.partition_B(sOnes))  # (MMA, 1, tile_n/32, 1)
        if const_expr(self.mma_preset):
            preset_mma = sm90_utils.make_trivial_tiled_mma(
                Float8E4M3FN, Float8E5M2, OperandMajorMode.K, OperandMajorMode.K, Float32, (1, 1, 1),
                (TILE_M_WG, tile_n))
            preset_mma.set(warpgroup.Field.ACCUMULATE, False)
            preset_thr = preset_mma.get_slice(wg_tidx)
            sA_layout, sB_layout = self.preset_layouts()
            sA = storage.sPresetA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
            sB = storage.sPresetB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
            f.qk_preset = (preset_mma, preset_thr.make_fragment_A(preset_thr.partition_A(sA)),
                           preset_thr.make_fragment_B(preset_thr.partition_B(sB)))

        # Register views for the P hand-over (see module docstring): coordinates (a, r, b, h, kb).
        n_kb = tile_n // 32
        pack_shape = (2, 2, 2, 2, n_kb)
        f.S_as_pack = cute.make_tensor(acc_S.iterator, cute.make_layout(pack_shape, stride=(1, 2, 4, 8, 16)))
        f.P_as_pack = cute.make_tensor(tOrP.iterator, cute.make_layout(pack_shape, stride=(1, 4, 2, 8, 16)))
        return f

    @cute.jit
    def tile_qk_scale(self, mScales, mQScales, scale_log2, row0, head, bat, sq, wg_tidx):
        """Raw S -> exp2 domain: a scalar for (head, bat), or with INT8 Q a 2-register tensor (the thread's rows)."""
        if const_expr(self.qk_int8):
            # per-row Q descales (rows past sq read the last row's: never written out)
            qk_scale = cute.make_rmem_tensor((2,), Float32)
            k_scale = mScales[1, head, bat] * scale_log2
            for r in cutlass.range_constexpr(2):
                row = cutlass.min(self.thread_row(row0, wg_tidx // 32, wg_tidx % 32, r), sq - 1)
                qk_scale[r] = mQScales[row, head, bat] * k_scale
            return qk_scale
        # per-(b, h) descales folded into two scalars
        return mScales[0, head, bat] * mScales[1, head, bat] * scale_log2

    def after_last_qk(self, q_pipe, q_state):
        """Hook: every Q K^T of the work tile has completed (the persistent variant frees its Q buffer here)."""

    @cute.jit
    def attend(self, f: SimpleNamespace, q_pipe, q_state, k_pipe, v_pipe, kv_state, q_slot: Int32,
               n_tiles: Int32, qk_scale, row_max: cute.Tensor, row_sum: cute.Tensor, mKeyLens: cute.Tensor | None,
               bat: Int32, sk: Int32, sPin: cute.Tensor, warp_idx: Int32, bias_ptr):
        """The online-softmax loop of one work tile over its n_tiles key tiles (Q in Q box ``q_slot``), K/V from
        ``kv_state`` on; acc_O, row_max and row_sum hold the result. Returns the state of its last K/V tile."""
        quad = f.wg_tidx % 4
        acc_S, tOrP, acc_O = f.acc_S, f.tOrP, f.acc_O
        q_pipe.consumer_wait(q_state)

        # prologue: S_0, softmax_0 (masked if it is also the last tile), P_0
        k_pipe.consumer_wait(kv_state)
        self.gemm_qk(f.qk_mma_zero, f.qk_mma, acc_S, f.tSrQ, f.tSrK, q_slot, kv_state.index, bias_ptr)
        warpgroup.wait_group(0)
        k_pipe.consumer_release(kv_state)
        if n_tiles == 1:
            self.mask_tile(acc_S, 0, self.item_keys(mKeyLens, bat, sk), quad)
        alpha0 = self.softmax_stats(acc_S, row_max, row_sum, qk_scale)
        f.alpha_keep[0] = alpha0[0]
        f.alpha_keep[1] = alpha0[1]
        self.pack_p(f.S_as_pack, f.P_as_pack)
        v_state = kv_state.clone()
        kv_state.advance()
        for j in cutlass.range(1, n_tiles, unroll=1):
            # O += P_{j-1} V_{j-1} done before S_j = Q K_j^T starts: P and S are never live together, so
            # 3 consumer warpgroups fit 160 registers; the overlap comes from the other warpgroups
            v_pipe.consumer_wait(v_state)
            self.pv_waited(f.pv_mma_h_zero, f.pv_mma_h, acc_O, f.acc_Ot, f.alpha_keep, tOrP, f.tOrV_h,
                           v_state.index, f.sum_mma_zero, f.sum_mma, f.acc_L, f.tLrOnes, row_sum)
            # sk < 0 never holds but ptxas cannot know: the basic-block boundary keeps the next QK's
            # set-up from being interleaved into the merge (interleaved, the consumers spill)
            c = cute.arch.clock()
            if sk < 0:
                if const_expr(self.qk_int8):
                    sPin[0] = Float32(c)  # a fixed slot: no address register kept live (it spilled)
                else:
                    sPin[warp_idx % 16] = Float32(c)
            v_pipe.consumer_release(v_state)
            # one pipeline state serves both rings here (K_j follows V_{j-1}): fewer live registers
            v_state.advance()
            k_pipe.consumer_wait(v_state)
            self.gemm_qk(f.qk_mma_zero, f.qk_mma, acc_S, f.tSrQ, f.tSrK, q_slot, v_state.index, bias_ptr)
            warpgroup.wait_group(0)
            k_pipe.consumer_release(v_state)
            if j == n_tiles - 1:
                self.mask_tile(acc_S, j, self.item_keys(mKeyLens, bat, sk), cute.arch.lane_idx() % 4)
            alpha = self.softmax_stats(acc_S, row_max, row_sum, qk_scale)
            # keep this tile's alpha for the merge after its P V
            f.alpha_keep[0] = alpha[0]
            f.alpha_keep[1] = alpha[1]
            self.pack_p(f.S_as_pack, f.P_as_pack)
        self.after_last_qk(q_pipe, q_state)
        # epilogue PV
        v_pipe.consumer_wait(v_state)
        self.pv_waited(f.pv_mma_h_zero, f.pv_mma_h, acc_O, f.acc_Ot, f.alpha_keep, tOrP, f.tOrV_h, v_state.index,
                       f.sum_mma_zero, f.sum_mma, f.acc_L, f.tLrOnes, row_sum)
        v_pipe.consumer_release(v_state)
        return v_state

    # ------------------------------------------------------------------ consumer helpers
    @cute.jit
    def gemm_qk(self, qk_mma_zero: cute.TiledMma, qk_mma: cute.TiledMma, acc_S: cute.Tensor, tSrQ: cute.Tensor, tSrK: cute.Tensor,
                wg: Int32, stage: Int32, bias_ptr):
        """S = Q K^T of K/V stage ``stage`` into acc_S (issued and committed, not waited). INT8: int32 S on top of
        S_BIAS_BITS, so the registers hold the floats S_BIAS + S and every k-block accumulates (``bias_ptr``: what
        ``accumulator_preset`` returned)."""
        acc = acc_S
        if const_expr(self.mma_preset):
            preset_mma, tPrA, tPrB = bias_ptr
            warpgroup.fence()
            cute.gemm(preset_mma, acc_S, tPrA[None, None, 0, 0], tPrB[None, None, 0, 0], acc_S)
            acc = cute.recast_tensor(acc_S, Int32)
        else:
            if const_expr(self.qk_int8):
                acc = cute.recast_tensor(acc_S, Int32)
                for i in cutlass.range_constexpr(cute.size(acc) // 4):
                    w = ld_shared_v4_volatile(bias_ptr)
                    for e in cutlass.range_constexpr(4):
                        acc[4 * i + e] = w[e]
            warpgroup.fence()
        for kb in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
            mma = qk_mma if self.qk_int8 or kb > 0 else qk_mma_zero
            cute.gemm(mma, acc, tSrQ[None, None, kb, wg], tSrK[None, None, kb, stage], acc)
        warpgroup.commit_group()

    @cute.jit
    def item_keys(self, mKeyLens: cute.Tensor | None, bat: Int32, sk: Int32) -> Int32:
        """Keys of batch item ``bat``: sk, or key_lens[bat] clamped to [0, sk]. Read again where it is used (the
        last tile) rather than kept in a register across the main loop: at 160 registers one more live value
        spills."""
        if const_expr(mKeyLens is None):
            return sk
        return cutlass.max(cutlass.min(mKeyLens[bat], sk), 0)

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
                      qk_scale) -> cute.Tensor:
        """Online-softmax update for one tile: acc_S <- P*256 (fp32); returns alpha per row (the row sums come
        from the tensor cores with P V)."""
        alpha = cute.make_rmem_tensor((2,), Float32)
        bias = cute.make_rmem_tensor((2,), Float32)
        part = cute.make_rmem_tensor((MAX_CHAINS,), Float32)  # independent chains: shorter dependency latency
        for r in cutlass.range_constexpr(2):
            self.row_max_update(acc_S, row_max, alpha, bias, part, qk_scale, r)
            self.row_exp_sum(acc_S, alpha, bias, qk_scale, r)
        return alpha

    @cute.jit
    def pack_p(self, S_as_pack: cute.Tensor, P_as_pack: cute.Tensor):
        """P8 <- e4m3(P*256) in the A-operand registers of the P V wgmma (coordinates (a, r, b, h, kb), see the
        module docstring): word (r, h, kb) holds the bytes (a, b) = (0,0), (1,0), (0,1), (1,1)."""
        P_as_pack.store(S_as_pack.load().to(Float8E4M3FN))

    @cute.jit
    def row_max_update(self, acc_S: cute.Tensor, row_max: cute.Tensor, alpha: cute.Tensor, bias: cute.Tensor,
                       part: cute.Tensor, qk_scale, r: cutlass.Constexpr):
        n8 = self.tile_n // 8
        for j in cutlass.range_constexpr(n8):
            for c in cutlass.range_constexpr(2):
                i, first = self.chain_of(j, c)
                v = acc_S[c + 2 * r + 4 * j]
                part[i] = v if const_expr(first) else cute.arch.fmax(part[i], v)
        m_tile = self.reduce_chains(part, cute.arch.fmax)
        m_tile = cute.arch.warp_reduction_max(m_tile, threads_in_group=4)
        m_new = cute.arch.fmax(row_max[r], m_tile)
        scale = self.row_scale(qk_scale, r)
        alpha[r] = cute.math.exp2((row_max[r] - m_new) * scale, fastmath=True)
        row_max[r] = m_new
        bias[r] = m_new * scale - 8.0  # exp2(+8) = the x256 of P

    @cute.jit
    def row_exp_sum(self, acc_S: cute.Tensor, alpha: cute.Tensor, bias: cute.Tensor, qk_scale,
                    r: cutlass.Constexpr):
        n8 = self.tile_n // 8
        qk_scale = self.row_scale(qk_scale, r)
        for j in cutlass.range_constexpr(n8):
            for c in cutlass.range_constexpr(2):
                v = c + 2 * r + 4 * j
                acc_S[v] = cute.arch.exp2(acc_S[v] * qk_scale - bias[r])  # side-effect asm: LLVM cannot sink it

    def thread_row(self, row0, warp, lane, r: int):
        """The query row of accumulator row r (0 or 1) of a consumer thread: warp w of the warpgroup holds rows
        16w .. 16w+15 of its 64, lane l rows l//4 and l//4 + 8."""
        return row0 + warp * 16 + lane // 4 + 8 * r

    def row_scale(self, qk_scale, r: int):
        """Row r's factor from raw S to the exp2 domain: per row with INT8 Q (a 2-register tensor), else one
        scalar for the tile (trace-time choice)."""
        return qk_scale[r] if const_expr(self.qk_int8) else qk_scale

    def chain_of(self, j: int, c: int):
        """(chain, is its first value) of column group j, column c in the MAX_CHAINS independent chains of a row
        (trace-time arithmetic): groups take the chains round-robin, two columns each."""
        half = MAX_CHAINS // 2
        return 2 * (j % half) + c, j < half

    @cute.jit
    def reduce_chains(self, part: cute.Tensor, op) -> Float32:
        """op over the MAX_CHAINS partials as a tree: (p0 op p1) op (p2 op p3)."""
        return op(op(part[0], part[1]), op(part[2], part[3]))

    @cute.jit
    def pv_sliced(self, pv_mma_h_zero: cute.TiledMma, pv_mma_h: cute.TiledMma, acc_O: cute.Tensor,
                  acc_Ot: cute.Tensor, alpha: cute.Tensor, tOrP: cute.Tensor, tOrV_h: cute.Tensor, stage: Int32,
                  sum_mma_zero: cute.TiledMma, sum_mma: cute.TiledMma, acc_L: cute.Tensor, tLrOnes: cute.Tensor,
                  row_sum: cute.Tensor):
        """P V one slice of D / pv_split columns at a time, each into a fresh accumulator merged in FP32; the row
        sums' wgmma rides with slice 0."""
        jw = self.head_dim // 8 // self.pv_split  # accumulator column groups per slice
        for h in cutlass.range_constexpr(self.pv_split):
            self.issue_pv_slice(pv_mma_h_zero, pv_mma_h, acc_Ot, tOrP, tOrV_h, stage, h, sum_mma_zero, sum_mma,
                                acc_L, tLrOnes)
            warpgroup.wait_group(0)
            self.merge_o(acc_O, acc_Ot, alpha, jw * h)
            if const_expr(h == 0):
                self.merge_l(row_sum, acc_L, alpha)

    @cute.jit
    def issue_pv_slice(self, pv_mma_h_zero: cute.TiledMma, pv_mma_h: cute.TiledMma, acc: cute.Tensor,
                       tOrP: cute.Tensor, tOrV_h: cute.Tensor, stage: Int32, h: cutlass.Constexpr,
                       sum_mma_zero: cute.TiledMma, sum_mma: cute.TiledMma, acc_L: cute.Tensor, tLrOnes: cute.Tensor):
        """Issue (and commit as one group) slice h of P V into the fresh ``acc``; with slice 0 also l's wgmma."""
        warpgroup.fence()
        for kb in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
            b = tOrV_h[None, h, kb, stage]  # rank 1 after fixing the slice: give it back its N mode
            b = cute.make_tensor(b.iterator, cute.append_ones(b.layout, up_to_rank=2))
            cute.gemm(pv_mma_h_zero if kb == 0 else pv_mma_h, acc, tOrP[None, None, kb], b, acc)
        if const_expr(h == 0):
            for kb in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
                cute.gemm(sum_mma_zero if kb == 0 else sum_mma, acc_L, tOrP[None, None, kb],
                          tLrOnes[None, None, kb, 0], acc_L)
        warpgroup.commit_group()

    @cute.jit
    def merge_l(self, row_sum: cute.Tensor, acc_L: cute.Tensor, alpha: cute.Tensor):
        """l = l * alpha + rowsum(P8); acc_L value c + 2r is column c of row r, every column the sum."""
        for r in cutlass.range_constexpr(2):
            row_sum[r] = row_sum[r] * alpha[r] + acc_L[2 * r]

    @cute.jit
    def merge_o(self, acc_O: cute.Tensor, acc_Ot: cute.Tensor, alpha: cute.Tensor, group0: cutlass.Constexpr = 0):
        """acc_O = acc_O * alpha + acc_Ot over acc_Ot's columns, which are acc_O's 8-column groups from group0 on."""
        for j in cutlass.range_constexpr(cute.size(acc_Ot) // 4):
            for r in cutlass.range_constexpr(2):
                for c in cutlass.range_constexpr(2):
                    v = c + 2 * r + 4 * j
                    acc_O[v + 4 * group0] = acc_O[v + 4 * group0] * alpha[r] + acc_Ot[v]

    @cute.jit
    def pv_waited(self, pv_mma_h_zero: cute.TiledMma, pv_mma_h: cute.TiledMma, acc_O: cute.Tensor,
                  acc_Ot: cute.Tensor, alpha: cute.Tensor, tOrP: cute.Tensor, tOrV_h: cute.Tensor, stage: Int32,
                  sum_mma_zero: cute.TiledMma, sum_mma: cute.TiledMma, acc_L: cute.Tensor, tLrOnes: cute.Tensor,
                  row_sum: cute.Tensor):
        """O = O * alpha + P V of the tile in ``stage`` (promoted in head_dim slices), and l = l * alpha +
        rowsum(P8) from the tensor cores; complete on return."""
        self.pv_sliced(pv_mma_h_zero, pv_mma_h, acc_O, acc_Ot, alpha, tOrP, tOrV_h, stage, sum_mma_zero, sum_mma,
                       acc_L, tLrOnes, row_sum)

    @cute.jit
    def epilogue(self, acc_O: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor, qk_scale,
                 o_scale: Float32, mO: cute.Tensor, mLSE: cute.Tensor, sq: Int32, row0: Int32,
                 head: Int32, bat: Int32, wg_tidx: Int32):
        """O = acc_O / l and the LSE. O leaves in 16-byte stores (``store_o_row``): one bf16 per store writes
        partial sectors, 8 rows per instruction, a large share of a short CTA's time."""
        warp = wg_tidx // 32
        lane = wg_tidx % 32
        quad = lane % 4
        half = const_expr(self.dtype_out != BFloat16)
        for r in cutlass.range_constexpr(2):
            lsum = row_sum[r]  # every thread of the quad already holds its row's whole sum (the tensor-core sums)
            row = self.thread_row(row0, warp, lane, r)
            inv = o_scale * cute.arch.rcp_approx(lsum)
            if row < sq:
                if quad == 0:
                    m = row_max[r]
                    if const_expr(self.qk_int8):
                        m = m - S_BIAS  # exact: both are integers below 2**24
                    mLSE[row, head, bat] = (m * self.row_scale(qk_scale, r) - 8.0
                                            + cute.math.log2(lsum, fastmath=True)) * LN2
            store_o_row(mO, acc_O, r, inv, row, sq, head, bat, quad, self.head_dim, half)


# ---------------------------------------------------------------------- compile / run API
def _shared_storage(kv_stages: int, q_elems: int, k_elems: int, v_elems: int, ones_elems: int,
                    qk_dtype=Float8E4M3FN, q_stages: int = 1, extra_fields: dict | None = None):
    """The kernel's shared-memory struct (built outside the jit function: the DSL rewrites its control flow),
    with the row-sum wgmma's constant tile of ones (``extra_fields``: the INT8 accumulator preset's constants, the
    rotation tile, an experimental variant's own tiles, last)."""
    f8 = Float8E4M3FN

    # annotations spelled out: this module's `from __future__ import annotations` would leave them as strings
    fields = {
        "q_mbar": cute.struct.MemRange[cutlass.Int64, 2 * q_stages],
        "k_mbar": cute.struct.MemRange[cutlass.Int64, kv_stages * 2],
        "v_mbar": cute.struct.MemRange[cutlass.Int64, kv_stages * 2],
        "pin": cute.struct.MemRange[Float32, 32],  # the clock fence's scratch (fits in the barriers' 1024-byte block)
        "sQ": cute.struct.Align[cute.struct.MemRange[qk_dtype, q_elems], 1024],
        "sK": cute.struct.Align[cute.struct.MemRange[qk_dtype, k_elems], 1024],
        "sV": cute.struct.Align[cute.struct.MemRange[f8, v_elems], 1024],
    }
    if ones_elems:
        fields["sOnes"] = cute.struct.Align[cute.struct.MemRange[f8, ones_elems], 1024]
    fields.update(extra_fields or {})
    SharedStorage = type("SharedStorage", (), {"__annotations__": fields})
    return cute.struct(SharedStorage)


def smem_bytes(head_dim: int = 128, config: Sm90Config | None = None, q_rot: bool = False,
               qk_int8: bool = False) -> int:
    """Dynamic shared memory per CTA: mbarriers (padded to the 1024-byte alignment of the tiles), Q (consumer_wgs x
    64 rows), K and V rings (kv_stages x tile_n x head_dim bytes each), the row-sum wgmma's ones tile (INT8 with
    ``config.mma_preset``: and the preset wgmma's two tiles; ``q_rot``: and the 16-bit rotation matrix)."""
    c = config or config_for("sm_90a", head_dim)
    barriers = (2 + 4 * c.kv_stages) * 8
    total = (-(-barriers // 1024) * 1024 + TILE_M_WG * c.consumer_wgs * head_dim
             + 2 * c.kv_stages * c.tile_n * head_dim + SUM_COLS * c.tile_n)
    if c.mma_preset and qk_int8:  # the preset wgmma's constant tiles, each 1024-aligned
        total = -(-total // 1024) * 1024 + TILE_M_WG * PRESET_K + -(-c.tile_n * PRESET_K // 1024) * 1024
    rot = 2 * head_dim * head_dim if q_rot else 0
    return -(-total // 1024) * 1024 + rot  # the struct's size is a multiple of its 1024-byte alignment


def _out_dtype(dtype_out):
    if dtype_out in (BFloat16, Float16):
        return dtype_out
    name = str(dtype_out)
    if "bfloat16" in name:
        return BFloat16
    if "float16" in name:
        return Float16
    raise ValueError(f"unsupported output dtype {dtype_out}")


def _compile_args(dtype_out, q_rot: bool = False):
    from cutlass.cute.runtime import make_ptr

    gm = cute.AddressSpace.gmem
    return (
        make_ptr(Uint8, 0, gm, assumed_align=16),
        make_ptr(Uint8, 0, gm, assumed_align=16),
        make_ptr(Uint8, 0, gm, assumed_align=16),
        make_ptr(Float32, 0, gm, assumed_align=4),
        # q_scales (unused unless compiled with qk_int8=True; with q_rot the rotation matrix, read by TMA)
        make_ptr(Float32, 0, gm, assumed_align=16 if q_rot else 4),
        make_ptr(Int32, 0, gm, assumed_align=4),  # key_lens (unused unless compiled with key_lens=True)
        make_ptr(dtype_out, 0, gm, assumed_align=4),
        make_ptr(Float32, 0, gm, assumed_align=4),
        Int32(1), Int32(1), Int32(1), Int32(1), Int32(128), Int32(32),
        Float32(1.0),
    )


def compile_sm90(head_dim: int, dtype_out, *, fake: bool, arch: str = "sm_90a", options_extra: str = "",
                 tvm_ffi: bool = False, config: Sm90Config | None = None, key_lens: bool = False,
                 qk_int8: bool = False, q_rot: bool = False):
    """Compile the kernel. Arguments are pointers + sizes, so the same compiled function serves any shape.

    ``config``: ``config_for(arch, head_dim)`` unless given. ``fake=True``: no GPU needed (stream faked); pass e.g.
    ``options_extra="--keep-cubin --dump-dir DIR"``. ``fake=False``: compile for launching on the current device.
    ``tvm_ffi``: compile with --enable-tvm-ffi (call with ints for the pointers; ``kernels.kernel_args`` does).
    ``key_lens``: the kernel reads per-batch key counts (Int32, the argument after the scales) on the device:
    batch item b attends to its first key_lens[b] keys (key-padding masks; CUDA-graph capturable).
    ``qk_int8``: q8 and k8 are int8 (the prep's rotated INT8 Q/K): S = Q8 K8^T on the s8 wgmma, each query row
    scaled by its own descale from ``q_scales`` (float32 (B, H, Sq_pad)) times the K descale (scales[..., 1]).
    ``q_rot`` (with ``qk_int8``): Q rotated and quantized in the kernel ("Q in the kernel" in the module docstring):
    the q argument is the 16-bit input (B, Sq, H, D) contiguous, q_scales the rotation matrix Rpm1^T (D, D) in the
    input dtype (16-byte aligned), and ``scales`` must be followed in memory by the prep's three int32 flags.
    Arguments: q8, k8, v8t, scales, q_scales, key_lens, out, lse, B, H, Sq, Sk, Sq_pad, Sk_pad, softmax_scale,
    stream.
    """
    dtype_out = _out_dtype(dtype_out)
    config = config or config_for(arch, head_dim)
    kern = Sm90Fp8Attention(head_dim, dtype_out, config, key_lens=key_lens, qk_int8=qk_int8, q_rot=q_rot)
    return compile_kernel(kern, _compile_args(dtype_out, q_rot), fake=fake, arch=arch, options_extra=options_extra,
                          tvm_ffi=tvm_ffi, smem=smem_bytes(head_dim, config, q_rot, qk_int8))


def compile_kernel(kern, args: tuple, *, fake: bool, arch: str = "sm_90a", options_extra: str = "",
                   tvm_ffi: bool = False, smem: int | None = None):
    """``cute.compile`` of a built kernel object (this class or a subclass) on ``args`` (everything before the
    stream) and a stream (faked with ``fake=True``, else the current one), with ``CUTE_DSL_ARCH`` set for the
    trace. ``smem``: the shared-memory bytes the caller's formula expects (checked after the trace)."""
    from ditprof.kernels.cute_arch import cute_dsl_arch

    if fake:
        stream = cute.runtime.make_fake_stream()
    else:
        import torch

        stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    compile_options = f"--gpu-arch {arch} {options_extra}".strip() + (" --enable-tvm-ffi" if tvm_ffi else "")
    with cute_dsl_arch(arch):  # ops that check the arch read it at trace time
        fn = cute.compile(kern, *args, stream, options=compile_options)
    if smem is not None and kern.smem_bytes != smem:  # keep the formula honest
        raise AssertionError(f"smem_bytes formula {smem} != {kern.smem_bytes}")
    return fn


__all__ = ["Sm90Config", "Sm90Fp8Attention", "compile_kernel", "compile_sm90", "config_for", "smem_bytes",
           "sm90_key_order_for_positions"]
