"""FP8 (e4m3) FlashAttention forward, mma.sync m16n8k32, written in CuTe DSL.

Native on sm_89 / sm_120 / sm_121 (``QMMA.16832.F32.E4M3.E4M3``; P.V as the block-scaled ``QMMA.SF`` on sm_120a /
sm_121a, ``pv_mma``); on sm_90 the same PTX runs emulated (correct, not fast).  Design (see docs/ARCHITECTURE.md
"FP8 numerics" for the exact arithmetic):

* CTA = 128 query rows x 32-key strips, 4 warps, each warp owns 32 query rows (two m16 tiles:
  rows ``w*16 + i`` and ``64 + w*16 + i``).
* Q tile is loaded once; K and V strips go through a 2-stage cp.async pipeline.
* S = Q8 K8^T with fp32 accumulate, scaled by ``qk_scale = dq * dk * softmax_scale * log2(e)``
  (exp2 domain); online softmax per strip; P*256 rounded to e4m3 in registers and fed straight into
  the P.V mma as the A operand.  Each lane only holds keys ``8j + 2t + {0,1}`` of a strip, so its
  A-slot ``4t + e (+16)`` takes key ``2t + e%2 + 8*(e//2) (+16)``: V is stored by the prep
  feature-major with the keys of every 16-key group in exactly that order (``key_order``).
* Two-level accumulation of O: each P.V mma is issued with C = 0, so it sums one strip's 32 keys from
  zero, and its products are added to the FP32 O on the CUDA cores: O = O * alpha (the online-softmax rescale,
  FMUL) + O_strip (FADD), a fresh accumulator per strip (``PV_ACC_STRIPS`` = 1: a group of several strips would need
  a second O-sized register fragment, which does not fit at head_dim 128).  On sm_89 / sm_120 the FP8 mma keeps
  only ~13 mantissa bits of its f32 accumulator ("FP22", SageAttention2, DeepGEMM#37): O accumulated inside it
  across strips lost the small per-strip terms once |O| is large (biased V).  The P.V mmas go out in waves
  (``PV_WAVE_COLS``) so that ptxas cannot hoist them all (0 spills on sm_120a and sm_89).  This is
  ``fp8_emulation``'s ``acc_promote=True``; the sm_89 / sm_120 accuracy is modelled there (``acc_bits=13``), not
  run (no such GPU here).
* ``pv_mma`` (compile time): the P.V mma as ``"f32"`` (``mma.sync ... .f32.e4m3.e4m3.f32``, ``QMMA.16832.F32``,
  ``warp.MmaFP8Op``; half the FP8 rate on GeForce Blackwell) or ``"block_scaled"`` (``mma.sync ...
  .kind::mxf8f6f4.block_scale.scale_vec::1X.f32.e4m3.e4m3.f32.ue8m0``, ``QMMA.SF.16832.F32.E4M3.E4M3.E8``, the full
  rate), issued as inline PTX with every ue8m0 scale factor 2^0 (0x7F in all four bytes: whichever byte and lane the
  selectors pick) and C = 0: the same products and FP32 result, so the two-level accumulation and the numerics are
  unchanged.  Same A / B / C / D fragments and registers as the f32 mma.  Arch-specific: sm_120a / sm_121a only
  (``default_pv_mma`` picks it there; sm_89 and the sm_90 emulation keep ``"f32"``, whose SASS is the kernel's from
  before the option).
* O is scaled by ``dv / 256 / l`` at the end; LSE (natural log) = (m + log2 l) * ln 2.
* ``qk_int8`` (compile time): q8 and k8 are int8 and S = Q8 K8^T is an s8 x s8 -> s32 mma.sync m16n8k32
  (``IMMA.16832.S8.S8``, native on sm_80+; same fragment layouts, smem tiles and ldmatrix as e4m3), exact in int32.
  The accumulator starts at ``QK_I32_BIAS`` (0x4B400000) instead of 0, so its bits read as a float are 12582912 + S
  exactly (|S| <= 2^22): no conversion instruction.  Each query row has its own scale ``q_scales[b, h, row] *
  scales[b, h, 1] * softmax_scale * log2(e)`` (``scales[..., 0]`` unused), kept in 4 registers per thread.  The row
  max is taken over the raw floats (the scale is > 0), ``row_max`` = that max times the row's scale, P = exp2(s *
  scale - row_max) one FFMA per score (no separate scale FMUL: a strip costs fewer instructions than e4m3's), and the
  LSE takes the bias out with one rounding (``(row_max - 12582912 * scale) + log2 l``).  P V is unchanged (e4m3);
  its waves are per arch (``wave_cols_for``).  The scale is floored at FLT_MIN (an all-zero Q row with q_scale 0
  gets uniform weights, not 0 * -inf = NaN on its masked keys); q_scales of the padded rows (>= Sq) are read, never
  stored.  Without ``qk_int8`` neither the q_scales pointer nor the int8 mma reach the kernel (the e4m3 kernel's SASS
  is byte-identical to the one before the option).

Inputs are raw pointers (so float8 never has to cross DLPack) plus the lengths:
``q8 (B,H,Sq_pad,D)``, ``k8 (B,H,Sk_pad,D)``, ``v8t (B,H,D,Sk_pad)`` e4m3 (q8 and k8 int8 with ``qk_int8``),
``scales (B,H,3)`` fp32, ``q_scales (B,H,Sq_pad)`` fp32 (read only when compiled with ``qk_int8=True``),
``key_lens (B,)`` int32 (read only when compiled with ``key_lens=True``),
output ``o`` with row stride ``o_stride_s`` and batch/head strides (BSHD or BHSD), ``lse (B,H,Sq)`` fp32.

Key-padding masks (``key_lens=True``, compile time): each CTA reads ``n = key_lens[b]`` of its batch item on
the device (no host sync; CUDA-graph capturable) and attends to keys ``[0, min(max(n, 0), seqlen_k))`` only:
it loops over ``max(ceil(n / 32), 1)`` strips and gives the keys ``>= n`` of the last one -inf, exactly as the
keys ``>= seqlen_k`` are masked without it.  The keys ``[n, seqlen_k)`` of K and V are real data that is
ignored: their scores are replaced by -inf, their P is 0.  Those sharing the last strip with valid keys still
go through the P.V mma, so the prepared V must be finite there (0 * NaN = NaN; e4m3 has no Inf), K may hold
anything.  An item with ``n <= 0`` still runs one fully masked strip (no hang, no out-of-bounds read); its rows
come out NaN (output and LSE), like SDPA's fully masked rows.  With ``key_lens=False`` the pointer is not
passed to the kernel at all: the kernel is the one compiled without the option (same SASS).

Compiled function's positional arguments: ``q8, k8, v8t, o, lse, scales, q_scales, key_lens`` (pointers), ``batch,
heads, seqlen_q, seqlen_k`` (Int32), ``o_stride_b, o_stride_h`` (Int64), ``o_stride_s`` (Int32),
``softmax_scale`` (Float32), ``stream``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass._mlir.dialects.cute_nvgpu as _cute_nvgpu_ir
from cutlass import Float32, Int8, Int32, Int64, cute
from cutlass._mlir import ir
from cutlass._mlir.dialects import llvm
from cutlass.cute.atom import Trait, make_atom
from cutlass.cute.core import _pack_shape
from cutlass.cute.nvgpu import cpasync, warp
from cutlass.cutlass_dsl import T, dsl_user_op

from ditprof.errors import DitprofError

LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)

M_BLOCK = 128  # query rows per CTA
N_BLOCK = 32  # keys per strip
NUM_THREADS = 128  # 4 warps
NUM_STAGES = 2  # K/V cp.async stages
SUPPORTED_HEAD_DIMS = (64, 128)
# Two-level accumulation of O: P V is summed over PV_ACC_STRIPS strips in the mma's accumulator, then
# added to the FP32 O on the CUDA cores.  1: every P V mma starts from C = 0 (one m16n8k32 covers exactly one 32-key
# strip), so no mma accumulator outlives its instruction; the extra registers are only the products in flight.
# 2 or more would keep a second O-sized fragment live across strips (head_dim floats per thread: 128 more registers
# at head_dim 128, where the kernel already uses 244-250 of 255, and 64 more at head_dim 64) and rescale it by alpha
# too: it does not fit at head_dim 128.  1 is also the most accurate; fp8_emulation's acc_promote=True models it.
PV_ACC_STRIPS = 1
PV_CHUNK = 2  # n8 tiles of O per fresh accumulator (one ldmatrix.x4 of V): 16 registers of products per chunk
# ptxas issues independent mmas as early as it can: all 32 P V mmas of a strip at once would need 128 fresh
# registers.  So the P V mmas go out in waves of PV_WAVE_COLS output columns; the P operand of the next wave is
# made to depend on the last O update of the previous one (``_after``: x | (dep & 0), the 0 unknown to ptxas).
# Waves of 64 columns in the steady-state strips and of one chunk in the masked last strip are what compile with
# 0 spills on sm_120a and sm_89 for head_dim 64/128, bf16/fp16, LSE on/off, key_lens on/off (nvidia-cutlass-dsl
# 4.8.1; most other choices spill on one of them: the allocator is at its 255-register limit).  The sm_90 / sm_100
# emulation (early V off) goes without waves: fewest spills there (head_dim 128: 112-140 bytes, 140-240 before).
PV_WAVE_COLS = 64
PV_WAVE_COLS_LAST = 8 * PV_CHUNK
# qk_int8 (4 more live registers: one qk scale per query row) spills with the waves above on sm_120a at head_dim 128
# without LSE, and without waves on sm_89: no waves in the steady state on sm_120 / sm_121 and the e4m3 kernel's
# waves on sm_89 are what compile with 0 spills on both for head_dim 64/128, bf16/fp16, LSE on/off, key_lens on/off.
PV_WAVE_COLS_INT8 = 128
PV_WAVE_COLS_INT8_SM89 = 64
FP8 = cutlass.Float8E4M3FN
# qk_int8: the int32 Q K^T accumulator starts at this bit pattern, the float 1.5 * 2^23 = 12582912: the IMMA adds S
# as an integer and for |S| <= 2^22 (D * 128^2 at head_dim <= 256) the bits read as a float are 12582912 + S exactly
# (the mantissa field is 2^22 + S), so no conversion instruction per score at all.
QK_I32_BIAS = 0x4B400000
QK_F32_BIAS = 12582912.0
FLT_MIN = 1.1754943508222875e-38  # smallest normal float: floor of the per-row qk scale (q_scales 0: no NaN)
# P V mma forms (compile time, ``pv_mma``).  "f32": mma.sync e4m3 with FP32 accumulation (warp.MmaFP8Op,
# QMMA.16832.F32.E4M3.E4M3), half the FP8 rate on sm_120.  "block_scaled": the MX block-scaled form of the same m16n8k32
# (QMMA.SF.16832.F32.E4M3.E4M3.E8, the full rate on sm_120), with every ue8m0 scale factor 1 (2^0): the same products
# and FP32 result.  It is arch-specific: sm_120a / sm_121a only (PTX ISA 8.7+; sm_89 and sm_90 have no such mma).
PV_MMAS = ("f32", "block_scaled")
BLOCK_SCALED_ARCHS = ("sm_120a", "sm_121a")
# ue8m0 exponent byte 127 (= 2^0) in all four bytes of the scale register: whichever byte and lane the selectors pick,
# the scale is 1
UNIT_SCALE_UE8M0_X4 = 0x7F7F7F7F
# operands: {d0..d3}, {a0..a3}, {b0, b1}, {c0..c3} (all C = the zero register), scale-a, {byte-id-a, thread-id-a},
# scale-b, {byte-id-b, thread-id-b}; A, B, C and D fragments are those of the e4m3 m16n8k32 (MmaFP8Op)
_PV_MMA_BLOCK_SCALED_ASM = (
    "mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale.scale_vec::1X.f32.e4m3.e4m3.f32.ue8m0 "
    "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $10, $10, $10}, $11, {0, 0}, $11, {0, 0};"
)


class _MmaS8Trait(Trait):
    pass


@dataclass(frozen=True)
class MmaS8Op(warp.mma.WarpMmaOp):
    """Warp-level ``mma.sync.aligned.m16n8k32.row.col.satfinite.s32.s8.s8.s32`` (IMMA.16832.S8.S8): CuTe DSL 4.8.1
    has no int8 warp op, but its SM80 mma atom takes signed 8-bit operand types (signless ``Int8`` gives u8).  The
    A / B / C fragment layouts are those of the e4m3 m16n8k32 (``MmaFP8Op``)."""

    shape_mnk: tuple = (16, 8, 32)

    def _make_trait(self, *, loc=None, ip=None, **kwargs) -> _MmaS8Trait:
        shape_mnk = _pack_shape(self.shape_mnk, loc=loc, ip=ip)
        s8 = ir.IntegerType.get_signed(8)
        ty = _cute_nvgpu_ir.MmaAtomSM80Type.get(shape_mnk.type.attribute, s8, s8, Int32.mlir_type)
        return _MmaS8Trait(make_atom(ty, loc=loc, ip=ip))

    def _verify_fragment_A(self, input, *, loc=None, ip=None) -> bool:
        return True

    def _verify_fragment_B(self, input, *, loc=None, ip=None) -> bool:
        return True


def _pure_asm(ret, operands: list, asm: str, constraints: str):
    """One inline-PTX instruction without side effects (``operands``: MLIR values)."""
    return llvm.inline_asm(ret, operands, asm, constraints, has_side_effects=False, is_align_stack=False,
                           asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def _after(x: Int32, dep: Float32, zero: Int32, *, loc=None, ip=None) -> Int32:
    """``x`` again (``x | (dep & zero)``, ``zero`` a run-time 0 that ptxas cannot fold), made to wait for ``dep``:
    orders the P V mmas (PV_WAVE_COLS) at the cost of one LOP3 per register."""
    return Int32(_pure_asm(T.i32(), [Int32(x).ir_value(loc=loc, ip=ip), Float32(dep).ir_value(loc=loc, ip=ip),
                                     Int32(zero).ir_value(loc=loc, ip=ip)],
                           "lop3.b32 $0, $1, $2, $3, 0xF8;", "=r,r,f,r"))


@dsl_user_op
def _fadd(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """``a + b`` (add.rn.f32, inline PTX): not contracted with the alpha multiply into an FFMA, which ptxas for
    sm_120a places into the product's registers and copies back to O's (128 MOVs and spills per strip)."""
    return Float32(_pure_asm(T.f32(), [Float32(a).ir_value(loc=loc, ip=ip), Float32(b).ir_value(loc=loc, ip=ip)],
                             "add.rn.f32 $0, $1, $2;", "=f,f,f"))


@dsl_user_op
def _ffma(a: Float32, b: Float32, c: Float32, *, loc=None, ip=None) -> Float32:
    """``a * b + c`` with one rounding (fma.rn.f32): qk_int8's exp2 argument and LSE, whatever the contraction."""
    return Float32(_pure_asm(T.f32(), [Float32(a).ir_value(loc=loc, ip=ip), Float32(b).ir_value(loc=loc, ip=ip),
                                       Float32(c).ir_value(loc=loc, ip=ip)],
                             "fma.rn.f32 $0, $1, $2, $3;", "=f,f,f,f"))


@dsl_user_op
def _mma_pv_block_scaled(a: list, b: list, *, loc=None, ip=None) -> list:
    """One block-scaled e4m3 m16n8k32 from a zero accumulator with unit scales (``_PV_MMA_BLOCK_SCALED_ASM``):
    ``a`` the 4 A registers, ``b`` the 2 B registers (Int32, fragment order) -> the 4 D values (Float32, (c, r)
    order, as MmaFP8Op's C)."""
    operands = [Int32(x).ir_value(loc=loc, ip=ip) for x in (*a, *b)]
    operands += [Float32(0.0).ir_value(loc=loc, ip=ip), Int32(UNIT_SCALE_UE8M0_X4).ir_value(loc=loc, ip=ip)]
    res = llvm.inline_asm(ir.Type.parse("!llvm.struct<(f32,f32,f32,f32)>"), operands, _PV_MMA_BLOCK_SCALED_ASM,
                          "=f,=f,=f,=f,r,r,r,r,r,r,f,r", has_side_effects=False, is_align_stack=False,
                          asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)
    return [Float32(llvm.extractvalue(T.f32(), res, [i], loc=loc, ip=ip)) for i in range(4)]


def _smem_layout_fp8(rows: int, row_bytes: int, stages: int | None = None):
    """Swizzled smem layout for an fp8 tile with ``row_bytes`` contiguous bytes per row.

    The XOR source sits at the 128-byte bank period (shift 3 for 16-byte chunks), whatever the row
    length: Swizzle<3,4,3> for 128-byte rows, <2,4,3> for 64, <1,4,3> for 32 (V strips).
    """
    chunk = 16
    bits = min(int(math.log2(row_bytes // chunk)), 3)
    swizzle = cute.make_swizzle(bits, int(math.log2(chunk)), int(math.log2(128 // chunk)))
    atom = cute.make_composed_layout(
        swizzle, 0, cute.make_layout((8, row_bytes), stride=(row_bytes, 1))
    )
    shape = (rows, row_bytes) if stages is None else (rows, row_bytes, stages)
    order = (0, 1) if stages is None else (0, 1, 2)
    return cute.tile_to_shape(atom, shape, order)


class Fp8FlashAttentionSm120:
    """One configuration of the kernel (head_dim, output dtype, LSE on/off, early V, key_lens on/off, int8 Q K^T,
    the P V mma form); tiles are fixed."""

    def __init__(self, head_dim: int = 128, out_dtype: type[cutlass.Numeric] = cutlass.BFloat16,
                 write_lse: bool = True, early_v: bool = True, key_lens: bool = False, qk_int8: bool = False,
                 wave_cols: int = PV_WAVE_COLS, pv_mma: str = "f32"):
        if head_dim not in SUPPORTED_HEAD_DIMS:
            raise ValueError(f"head_dim {head_dim} not supported (use one of {SUPPORTED_HEAD_DIMS})")
        if pv_mma not in PV_MMAS:
            raise DitprofError(f"pv_mma must be one of {', '.join(PV_MMAS)}, got {pv_mma!r}")
        self.head_dim = head_dim
        self.out_dtype = out_dtype
        self.write_lse = write_lse
        # issue the V ldmatrix before the softmax (hides its latency; +32 live registers)
        self.early_v = early_v
        # per-batch key counts read on the device (key-padding masks); off: the pointer is not used at all
        self.key_lens = key_lens
        # int8 Q and K (s8 x s8 -> s32 mma), per query row descales q_scales; off: the pointer is not used at all
        self.qk_int8 = qk_int8
        self.qk_dtype = Int8 if qk_int8 else FP8
        # output columns per wave of P V mmas in the steady-state strips (PV_WAVE_COLS; early V only)
        self.wave_cols = wave_cols
        # the P V mma: "f32" (MmaFP8Op through cute.gemm) or "block_scaled" (inline PTX, unit scales; PV_MMAS)
        self.pv_mma = pv_mma

    # ------------------------------------------------------------------------------------------
    @cute.jit
    def __call__(
        self,
        q_ptr: cute.Pointer,
        k_ptr: cute.Pointer,
        v_ptr: cute.Pointer,
        o_ptr: cute.Pointer,
        lse_ptr: cute.Pointer,
        scales_ptr: cute.Pointer,
        q_scales_ptr: cute.Pointer,
        key_lens_ptr: cute.Pointer,
        batch: Int32,
        heads: Int32,
        seqlen_q: Int32,
        seqlen_k: Int32,
        o_stride_b: Int64,
        o_stride_h: Int64,
        o_stride_s: Int32,
        softmax_scale: Float32,
        stream: cuda.CUstream,
    ):
        D = self.head_dim
        QKT = self.qk_dtype
        sQ_layout = _smem_layout_fp8(M_BLOCK, D)
        sK_layout = _smem_layout_fp8(N_BLOCK, D, NUM_STAGES)
        sV_layout = _smem_layout_fp8(D, N_BLOCK, NUM_STAGES)

        @cute.struct
        class SharedStorage:
            sQ: cute.struct.Align[cute.struct.MemRange[QKT, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[QKT, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[FP8, cute.cosize(sV_layout)], 1024]

        # global -> shared: 16-byte cp.async, one chunk per thread per pass
        atom_g2s = cute.make_copy_atom(
            cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), FP8, num_bits_per_copy=128
        )
        atom_g2s_qk = atom_g2s
        if cutlass.const_expr(self.qk_int8):
            atom_g2s_qk = cute.make_copy_atom(
                cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), QKT, num_bits_per_copy=128
            )
        qk_cpr = D // 16  # chunks per Q/K row
        g2s_QK = cute.make_tiled_copy_tv(
            atom_g2s_qk,
            cute.make_layout((NUM_THREADS // qk_cpr, qk_cpr), stride=(qk_cpr, 1)),
            cute.make_layout((1, 16)),
        )
        v_cpr = N_BLOCK // 16  # chunks per V row (one feature, 32 keys)
        g2s_V = cute.make_tiled_copy_tv(
            atom_g2s,
            cute.make_layout((NUM_THREADS // v_cpr, v_cpr), stride=(v_cpr, 1)),
            cute.make_layout((1, 16)),
        )

        tiled_mma = cute.make_tiled_mma(
            warp.MmaFP8Op(FP8, Float32, (16, 8, 32)),
            (NUM_THREADS // 32, 1, 1),
            permutation_mnk=(NUM_THREADS // 32 * 16, 16, 32),
        )

        # key_lens off: the kernel gets no extra argument (same kernel symbol and SASS as without the option)
        key_lens_arg = None
        if cutlass.const_expr(self.key_lens):
            key_lens_arg = cute.make_tensor(key_lens_ptr, cute.make_layout((batch,)))
        # qk_int8 off: neither the q_scales pointer nor the int8 mma reach the kernel (the e4m3 kernel's SASS)
        int8_args = ()
        if cutlass.const_expr(self.qk_int8):
            tiled_mma_qk = cute.make_tiled_mma(
                MmaS8Op((16, 8, 32)),
                (NUM_THREADS // 32, 1, 1),
                permutation_mnk=(NUM_THREADS // 32 * 16, 16, 32),
            )
            int8_args = (key_lens_arg, q_scales_ptr, tiled_mma_qk)
        elif cutlass.const_expr(self.key_lens):
            int8_args = (key_lens_arg,)

        grid = (cute.ceil_div(seqlen_q, M_BLOCK), heads, batch)
        self.kernel(
            q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, scales_ptr,
            heads, seqlen_q, seqlen_k, o_stride_b, o_stride_h, o_stride_s,
            softmax_scale * LOG2_E,
            sQ_layout, sK_layout, sV_layout, g2s_QK, g2s_V, tiled_mma, SharedStorage,
            *int8_args,
        ).launch(grid=grid, block=[NUM_THREADS, 1, 1], stream=stream)

    # ------------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(
        self,
        q_ptr: cute.Pointer,
        k_ptr: cute.Pointer,
        v_ptr: cute.Pointer,
        o_ptr: cute.Pointer,
        lse_ptr: cute.Pointer,
        scales_ptr: cute.Pointer,
        heads: Int32,
        seqlen_q: Int32,
        seqlen_k: Int32,
        o_stride_b: Int64,
        o_stride_h: Int64,
        o_stride_s: Int32,
        softmax_scale_log2: Float32,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        g2s_QK: cute.TiledCopy,
        g2s_V: cute.TiledCopy,
        tiled_mma: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
        mKeyLens: cute.Tensor | None = None,  # (B,) int32, only with key_lens
        q_scales_ptr: cute.Pointer | None = None,  # (B, H, Sq_pad) fp32, only with qk_int8
        tiled_mma_qk: cute.TiledMma | None = None,  # s8 x s8 -> s32 m16n8k32, only with qk_int8
    ):
        D = self.head_dim
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, bidb = cute.arch.block_idx()
        lane = tidx % 32
        warp_idx = tidx // 32
        quad_row = lane // 4  # row inside an m16 tile (and +8)
        quad_col = lane % 4  # column pair inside an n8 tile

        sq_pad = cute.assume((seqlen_q + (M_BLOCK - 1)) // M_BLOCK * M_BLOCK, divby=M_BLOCK)
        sk_pad = cute.assume((seqlen_k + (N_BLOCK - 1)) // N_BLOCK * N_BLOCK, divby=N_BLOCK)
        n_tiles = sk_pad // N_BLOCK
        kv_len = seqlen_k  # keys of this batch item (those >= kv_len get -inf)
        if cutlass.const_expr(mKeyLens is not None):
            # the first key_lens[b] keys (at most seqlen_k); at least one strip is run, so a fully masked item
            # ends in NaN rows instead of reading strip -1
            kv_len = cutlass.max(cutlass.min(mKeyLens[bidb], seqlen_k), 0)
            n_tiles = cutlass.max((kv_len + (N_BLOCK - 1)) // N_BLOCK, 1)
        bh = Int64(bidb) * Int64(heads) + Int64(head)
        sched_zero = seqlen_q >> 31  # 0 (seqlen_q >= 0), but not to the compiler (PV_WAVE_COLS)

        # ---- per-(batch, head) views --------------------------------------------------------
        q_off = cute.assume(bh * Int64(sq_pad) * D, divby=16)
        kv_off = cute.assume(bh * Int64(sk_pad) * D, divby=16)
        mQ = cute.make_tensor(q_ptr + q_off, cute.make_layout((sq_pad, D), stride=(D, 1)))
        mK = cute.make_tensor(k_ptr + kv_off, cute.make_layout((sk_pad, D), stride=(D, 1)))
        mV = cute.make_tensor(v_ptr + kv_off, cute.make_layout((D, sk_pad), stride=(sk_pad, 1)))
        o_off = cute.assume(Int64(bidb) * o_stride_b + Int64(head) * o_stride_h, divby=8)
        mO = cute.make_tensor(
            o_ptr + o_off,
            cute.make_layout((seqlen_q, D), stride=(cute.assume(o_stride_s, divby=8), 1)),
        )
        mScale = cute.make_tensor(scales_ptr + bh * 3, cute.make_layout(3))

        if cutlass.const_expr(self.qk_int8):
            # one qk scale per query row of this thread (index mt*2 + r, like row_max): q_scales[row] * dk * scale
            # * log2(e), floored at FLT_MIN (> 0: the raw max commutes with it, -inf * it stays -inf)
            tiled_mma_s = tiled_mma_qk
            mQScale = cute.make_tensor(q_scales_ptr + bh * Int64(sq_pad), cute.make_layout((sq_pad,)))
            k_scale_log2 = mScale[1] * softmax_scale_log2
            qk_scale = cute.make_rmem_tensor((4,), Float32)
            for mt in cutlass.range_constexpr(2):
                for r in cutlass.range_constexpr(2):
                    row = m_block * M_BLOCK + mt * 64 + warp_idx * 16 + quad_row + r * 8
                    qk_scale[mt * 2 + r] = cute.arch.fmax(mQScale[row] * k_scale_log2, Float32(FLT_MIN))
        else:
            tiled_mma_s = tiled_mma
            qk_scale = mScale[0] * mScale[1] * softmax_scale_log2
        pv_scale = mScale[2] * (1.0 / 256.0)

        gQ = cute.local_tile(mQ, (M_BLOCK, D), (m_block, 0))  # (128, D)
        gK = cute.local_tile(mK, (N_BLOCK, D), (None, 0))  # (32, D, n_tiles)
        gV = cute.local_tile(mV, (D, N_BLOCK), (0, None))  # (D, 32, n_tiles)

        # ---- shared memory --------------------------------------------------------------------
        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout)
        sK = storage.sK.get_tensor(sK_layout)  # (32, D, 2)
        sV = storage.sV.get_tensor(sV_layout)  # (D, 32, 2)

        thr_g2s_QK = g2s_QK.get_slice(tidx)
        thr_g2s_V = g2s_V.get_slice(tidx)
        tQgQ = thr_g2s_QK.partition_S(gQ)
        tQsQ = thr_g2s_QK.partition_D(sQ)
        tKgK = thr_g2s_QK.partition_S(gK)
        tKsK = thr_g2s_QK.partition_D(sK)
        tVgV = thr_g2s_V.partition_S(gV)
        tVsV = thr_g2s_V.partition_D(sV)

        # ---- mma partitions -------------------------------------------------------------------
        thr_mma = tiled_mma.get_slice(tidx)
        thr_mma_s = tiled_mma_s.get_slice(tidx)  # the same fragment layouts, s8 or e4m3 operands
        tSrQ = thr_mma_s.make_fragment_A(thr_mma_s.partition_A(sQ))  # ((4,2,2), 2, D/32)
        tSrK = thr_mma_s.make_fragment_B(thr_mma_s.partition_B(sK[None, None, 0]))  # ((4,2), 4, D/32)
        tOrV = thr_mma.make_fragment_B(thr_mma.partition_B(sV[None, None, 0]))  # ((4,2), D/8, 1)
        acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C((M_BLOCK, D)), Float32)
        acc_O.fill(0.0)
        s_shape = thr_mma.partition_shape_C((M_BLOCK, N_BLOCK))  # ((2,2), 2, 4)
        p_shape = thr_mma.partition_shape_A((M_BLOCK, N_BLOCK))  # ((4,2,2), 2, 1)

        ldsm = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(False, 4), FP8)
        ldsm_qk = ldsm
        if cutlass.const_expr(self.qk_int8):
            ldsm_qk = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(False, 4), Int8)
        s2r_Q = cute.make_tiled_copy_A(ldsm_qk, tiled_mma_s)
        s2r_K = cute.make_tiled_copy_B(ldsm_qk, tiled_mma_s)
        s2r_V = cute.make_tiled_copy_B(ldsm, tiled_mma)
        thr_s2r_Q = s2r_Q.get_slice(tidx)
        thr_s2r_K = s2r_K.get_slice(tidx)
        thr_s2r_V = s2r_V.get_slice(tidx)
        tSsQ = thr_s2r_Q.partition_S(sQ)
        tSrQ_v = thr_s2r_Q.retile(tSrQ)
        tSsK = thr_s2r_K.partition_S(sK)  # (CPY, N, K, stage)
        tSrK_v = thr_s2r_K.retile(tSrK)
        tOsV = thr_s2r_V.partition_S(sV)  # (CPY, N, K, stage)
        tOrV_v = thr_s2r_V.retile(tOrV)

        row_max = cute.make_rmem_tensor((4,), Float32)  # index mt*2 + r
        row_sum = cute.make_rmem_tensor((4,), Float32)
        row_max.fill(-Float32.inf)
        row_sum.fill(0.0)

        # ---- prologue: Q and strip 0 ----------------------------------------------------------
        cute.copy(g2s_QK, tQgQ, tQsQ)
        cute.copy(g2s_QK, tKgK[None, None, None, 0], tKsK[None, None, None, 0])
        cute.copy(g2s_V, tVgV[None, None, None, 0], tVsV[None, None, None, 0])
        cute.arch.cp_async_commit_group()

        # ---- main loop: all strips but the last (no masking) ------------------------------------
        for n in range(n_tiles - 1):
            stage = n % NUM_STAGES
            cute.arch.cp_async_wait_group(0)
            cute.arch.sync_threads()
            nxt = 1 - stage
            cute.copy(g2s_QK, tKgK[None, None, None, n + 1], tKsK[None, None, None, nxt])
            cute.copy(g2s_V, tVgV[None, None, None, n + 1], tVsV[None, None, None, nxt])
            cute.arch.cp_async_commit_group()
            self.strip(
                n, stage, False, kv_len, qk_scale, tiled_mma, tiled_mma_s, s_shape, p_shape,
                s2r_Q, s2r_K, s2r_V, tSsQ, tSrQ_v, tSrQ, tSsK, tSrK_v, tSrK, tOsV, tOrV_v, tOrV,
                acc_O, row_max, row_sum, quad_col, sched_zero,
            )

        # ---- last strip (masks keys >= kv_len: seqlen_k, or this item's key_lens) -----------------
        last = n_tiles - 1
        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()
        self.strip(
            last, last % NUM_STAGES, True, kv_len, qk_scale, tiled_mma, tiled_mma_s, s_shape, p_shape,
            s2r_Q, s2r_K, s2r_V, tSsQ, tSrQ_v, tSrQ, tSsK, tSrK_v, tSrK, tOsV, tOrV_v, tOrV,
            acc_O, row_max, row_sum, quad_col, sched_zero,
        )

        # ---- epilogue ---------------------------------------------------------------------------
        gO = cute.local_tile(mO, (M_BLOCK, D), (m_block, 0))
        tOgO = thr_mma.partition_C(gO)  # ((2,2), 2, D/8)
        rO = cute.make_rmem_tensor(acc_O.shape, self.out_dtype)
        mLSE = cute.make_tensor(lse_ptr + bh * Int64(seqlen_q), cute.make_layout(seqlen_q))
        for mt in cutlass.range_constexpr(2):
            for r in cutlass.range_constexpr(2):
                st = mt * 2 + r
                total = row_sum[st]
                total = total + cute.arch.shuffle_sync_bfly(total, offset=1)
                total = total + cute.arch.shuffle_sync_bfly(total, offset=2)
                scale = pv_scale / total
                for j in cutlass.range_constexpr(D // 8):
                    for c in cutlass.range_constexpr(2):
                        rO[(c, r), mt, j] = (acc_O[(c, r), mt, j] * scale).to(self.out_dtype)
                row = m_block * M_BLOCK + mt * 64 + warp_idx * 16 + quad_row + r * 8
                if row < seqlen_q:
                    for j in cutlass.range_constexpr(D // 8):
                        cute.autovec_copy(rO[(None, r), mt, j], tOgO[(None, r), mt, j])
                    if cutlass.const_expr(self.write_lse):  # noqa: SIM102 -- a compile-time if around a run-time one
                        if quad_col == 0:
                            m_log2 = row_max[st]
                            if cutlass.const_expr(self.qk_int8):
                                # row_max is (12582912 + S_max) * qk_scale rounded: take the bias out with one
                                # rounding; the P and l of the strips were computed against that same row_max
                                m_log2 = _ffma(Float32(-QK_F32_BIAS), qk_scale[st], m_log2)
                            mLSE[row] = (m_log2 + cute.math.log2(total, fastmath=True)) * LN_2

    # ------------------------------------------------------------------------------------------
    @cute.jit
    def strip(
        self,
        n: Int32,
        stage: Int32,
        masked: cutlass.Constexpr,
        kv_len: Int32,
        qk_scale,  # Float32, or with qk_int8 a (4,) tensor of per-row scales
        tiled_mma: cute.TiledMma,
        tiled_mma_s: cute.TiledMma,
        s_shape: cutlass.Constexpr,
        p_shape: cutlass.Constexpr,
        s2r_Q: cute.TiledCopy,
        s2r_K: cute.TiledCopy,
        s2r_V: cute.TiledCopy,
        tSsQ: cute.Tensor,
        tSrQ_v: cute.Tensor,
        tSrQ: cute.Tensor,
        tSsK: cute.Tensor,
        tSrK_v: cute.Tensor,
        tSrK: cute.Tensor,
        tOsV: cute.Tensor,
        tOrV_v: cute.Tensor,
        tOrV: cute.Tensor,
        acc_O: cute.Tensor,
        row_max: cute.Tensor,
        row_sum: cute.Tensor,
        quad_col: Int32,
        sched_zero: Int32,
    ):
        D = self.head_dim
        pv_shape = tiled_mma.get_slice(0).partition_shape_C((M_BLOCK, 8 * PV_CHUNK))  # ((2,2), 2, PV_CHUNK)
        # ---- S = Q K^T (fp32; qk_int8: int32 from the bias 0x4B400000, read as the float 12582912 + S) ----------
        if cutlass.const_expr(self.qk_int8):
            acc_S = cute.make_rmem_tensor(s_shape, Int32)
            acc_S.fill(QK_I32_BIAS)
        else:
            acc_S = cute.make_rmem_tensor(s_shape, Float32)
            acc_S.fill(0.0)
        for k in cutlass.range_constexpr(D // 32):
            cute.copy(s2r_Q, tSsQ[None, None, k], tSrQ_v[None, None, k])
            cute.copy(s2r_K, tSsK[None, None, k, stage], tSrK_v[None, None, k])
            cute.gemm(tiled_mma_s, acc_S, tSrQ[None, None, k], tSrK[None, None, k], acc_S)
        if cutlass.const_expr(self.qk_int8):
            acc_S = cute.recast_tensor(acc_S, Float32)  # 12582912 + S, exact
        # V for this strip: issue the ldmatrix early, it is consumed after the softmax
        if cutlass.const_expr(self.early_v):
            cute.copy(s2r_V, tOsV[None, None, None, stage], tOrV_v)

        # ---- online softmax (exp2 domain) ----------------------------------------------------
        for mt in cutlass.range_constexpr(2):
            for r in cutlass.range_constexpr(2):
                st = mt * 2 + r
                if cutlass.const_expr(not self.qk_int8):
                    for j in cutlass.range_constexpr(4):
                        for c in cutlass.range_constexpr(2):
                            acc_S[(c, r), mt, j] = acc_S[(c, r), mt, j] * qk_scale
                if cutlass.const_expr(masked):
                    for j in cutlass.range_constexpr(4):
                        for c in cutlass.range_constexpr(2):
                            key = n * N_BLOCK + j * 8 + quad_col * 2 + c
                            if key >= kv_len:
                                acc_S[(c, r), mt, j] = -Float32.inf
                local = acc_S[(0, r), mt, 0]
                for j in cutlass.range_constexpr(4):
                    for c in cutlass.range_constexpr(2):
                        local = cute.arch.fmax(local, acc_S[(c, r), mt, j])
                local = cute.arch.fmax(local, cute.arch.shuffle_sync_bfly(local, offset=1))
                local = cute.arch.fmax(local, cute.arch.shuffle_sync_bfly(local, offset=2))
                if cutlass.const_expr(self.qk_int8):
                    # the max of the raw scores (12582912 + S) times the row's scale (> 0, so it commutes): row_max
                    # holds (12582912 + S_max) * qk_scale rounded, the exp2 below one FFMA per score
                    local = local * qk_scale[st]
                m_old = row_max[st]
                m_new = cute.arch.fmax(m_old, local)
                alpha = cute.math.exp2(m_old - m_new, fastmath=True)
                psum = Float32(0.0)
                for j in cutlass.range_constexpr(4):
                    for c in cutlass.range_constexpr(2):
                        if cutlass.const_expr(self.qk_int8):
                            x = _ffma(acc_S[(c, r), mt, j], qk_scale[st], -m_new)
                        else:
                            x = acc_S[(c, r), mt, j] - m_new
                        p = cute.math.exp2(x, fastmath=True)
                        acc_S[(c, r), mt, j] = p
                        psum = psum + p
                row_sum[st] = row_sum[st] * alpha + psum
                row_max[st] = m_new
                # O = O * alpha in FP32 here; this strip's P V is added after its own mma (two-level, below)
                for j in cutlass.range_constexpr(D // 8):
                    for c in cutlass.range_constexpr(2):
                        acc_O[(c, r), mt, j] = acc_O[(c, r), mt, j] * alpha

        # ---- P * 256 -> e4m3 in the A-operand order (keys permuted like V) ----------------------
        # A slot (e, r, h) of m-tile mt = key 2t + e%2 + 8*(e//2) + 16*h = S[(e%2, r), mt, e//2 + 2h]
        p_f32 = cute.make_rmem_tensor(p_shape, Float32)
        for mt in cutlass.range_constexpr(2):
            for r in cutlass.range_constexpr(2):
                for h in cutlass.range_constexpr(2):
                    for e in cutlass.range_constexpr(4):
                        p_f32[(e, r, h), mt, 0] = acc_S[(e % 2, r), mt, e // 2 + 2 * h] * 256.0
        tOrP = cute.make_rmem_tensor(p_shape, FP8)
        tOrP.store(p_f32.load().to(FP8))

        # ---- O = O * alpha + P V, two-level: every P V mma starts from C = 0 (a fresh accumulator: one m16n8k32
        # is one 32-key strip) and its products are added to the FP32 O (rescaled by alpha above) on the CUDA cores.
        # O never sits in the FP8 mma's accumulator across strips: on sm_89 / sm_120 that keeps ~13 mantissa bits.
        tOrP_w = cute.recast_tensor(tOrP, Int32)
        n_chunks = D // (8 * PV_CHUNK)
        # chunks per wave; the emulated path (V loaded chunk by chunk) spills least without waves
        wave_cols = (PV_WAVE_COLS_LAST if masked else self.wave_cols) if self.early_v else D
        wave = wave_cols // (8 * PV_CHUNK)
        for jj in cutlass.range_constexpr(n_chunks):
            if cutlass.const_expr(not self.early_v):
                # V in pairs of n8 tiles (one ldmatrix.x4), each loaded right before its chunk: fewer live registers
                for g in cutlass.range_constexpr((jj * PV_CHUNK + 1) // 2, ((jj + 1) * PV_CHUNK + 1) // 2):
                    cute.copy(s2r_V, tOsV[None, g, None, stage], tOrV_v[None, g, None])
            last_o = self.add_pv(acc_O, tiled_mma, tOrP, tOrV, pv_shape, jj)
            if cutlass.const_expr((jj + 1) % wave == 0 and jj + 1 < n_chunks):
                for w in cutlass.range_constexpr(cute.size(tOrP_w)):  # the next wave waits for this O update
                    tOrP_w[w] = _after(tOrP_w[w], last_o, sched_zero)

    @cute.jit
    def add_pv(self, acc_O: cute.Tensor, tiled_mma: cute.TiledMma, tOrP: cute.Tensor, tOrV: cute.Tensor,
               pv_shape: cutlass.Constexpr, jj: cutlass.Constexpr) -> Float32:
        """O[:, n8 tiles of chunk jj] += P V of those tiles, the mma accumulating from zero; returns one updated O
        element (the dependency for the next wave)."""
        acc_PV = cute.make_rmem_tensor(pv_shape, Float32)  # ((2,2), 2, PV_CHUNK)
        if cutlass.const_expr(self.pv_mma == "block_scaled"):
            self.pv_block_scaled(acc_PV, tOrP, tOrV, jj)
        else:
            acc_PV.fill(0.0)
            tOrV_d = cute.logical_divide(tOrV, (None, PV_CHUNK, None))
            cute.gemm(tiled_mma, acc_PV, tOrP[None, None, 0], tOrV_d[None, (None, jj), 0], acc_PV)
        for mt in cutlass.range_constexpr(2):
            for r in cutlass.range_constexpr(2):
                for i in cutlass.range_constexpr(PV_CHUNK):
                    for c in cutlass.range_constexpr(2):
                        j = jj * PV_CHUNK + i
                        acc_O[(c, r), mt, j] = _fadd(acc_O[(c, r), mt, j], acc_PV[(c, r), mt, i])
        return acc_O[(1, 1), 1, jj * PV_CHUNK + PV_CHUNK - 1]

    @cute.jit
    def pv_block_scaled(self, acc_PV: cute.Tensor, tOrP: cute.Tensor, tOrV: cute.Tensor, jj: cutlass.Constexpr):
        """acc_PV = P V of the n8 tiles of chunk jj through the block-scaled mma (unit scales, C = 0), in cute.gemm's
        order for MmaFP8Op (m-tile outer, n8 tile inner) and with its registers: A = the 4 words of P's m-tile
        (values (e, r, h), e fastest: a0..a3 = (r, h) = (0,0), (1,0), (0,1), (1,1)), B = the 2 words of V's n8 tile,
        D = the 4 values (c, r) of acc_PV's tile."""
        tOrP_w = cute.recast_tensor(tOrP, Int32)  # ((1,2,2), 2, 1)
        tOrV_w = cute.recast_tensor(tOrV, Int32)  # ((1,2), D/8, 1)
        for mt in cutlass.range_constexpr(2):
            a = [tOrP_w[(0, w % 2, w // 2), mt, 0] for w in range(4)]
            for i in cutlass.range_constexpr(PV_CHUNK):
                b = [tOrV_w[(0, w), jj * PV_CHUNK + i, 0] for w in range(2)]
                d = _mma_pv_block_scaled(a, b)
                for w in cutlass.range_constexpr(4):
                    acc_PV[(w % 2, w // 2), mt, i] = d[w]


# ---------------------------------------------------------------------------------------------
# compile helpers (shared by interface.py and inspect_sass.py)

# archs the kernel compiles for; QMMA is native on the sm_89 / sm_12x ones, emulated (HMMA) on sm_90 / sm_100
NATIVE_ARCHS = ("sm_89", "sm_120", "sm_120a", "sm_121", "sm_121a")
EMULATED_ARCHS = ("sm_90", "sm_90a", "sm_100a", "sm_103a")


def default_pv_mma(arch: str) -> str:
    """The P V mma the launcher compiles for ``arch``: "block_scaled" (QMMA.SF, the full FP8 rate) on sm_120a /
    sm_121a, "f32" elsewhere (sm_89 and sm_90 cannot run the block-scaled form; plain sm_120 lacks the arch-specific
    features)."""
    return "block_scaled" if arch in BLOCK_SCALED_ARCHS else "f32"


def default_early_v(arch: str) -> bool:
    """Early V ldmatrix: fits the register file without spills on sm_120a and sm_89 at head_dim 128.  The sm_90
    emulation (FP8 unpacked to F16 for HMMA) needs more registers: there the V chunks are loaded right before their
    mma."""
    return not arch.startswith(("sm_90", "sm_10"))


def wave_cols_for(arch: str, qk_int8: bool = False) -> int:
    """P V wave width of the steady-state strips (``PV_WAVE_COLS``): qk_int8 has its own per arch."""
    if not qk_int8:
        return PV_WAVE_COLS
    return PV_WAVE_COLS_INT8_SM89 if arch.startswith("sm_89") else PV_WAVE_COLS_INT8


def smem_bytes(head_dim: int = 128) -> int:
    """Dynamic shared memory of one CTA: Q tile + 2 stages of K and V strips (fp8)."""
    return M_BLOCK * head_dim + NUM_STAGES * 2 * N_BLOCK * head_dim


def tile_config() -> tuple:
    return (M_BLOCK, N_BLOCK, NUM_THREADS, NUM_STAGES)

_DTYPES = {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16}


def compile_fp8_fwd(arch: str, head_dim: int = 128, out_dtype: str = "bfloat16",
                    write_lse: bool = True, early_v: bool | None = None, extra_options: str = "",
                    key_lens: bool = False, qk_int8: bool = False, pv_mma: str = "f32"):
    """Compile the kernel for ``arch`` (e.g. ``sm_120a``, ``sm_89``, ``sm_90a``) with placeholder
    pointers; works on a machine without a GPU.  Returns the compiled callable, called with
    ``(q8, k8, v8t, o, lse, scales, q_scales, key_lens, batch, heads, seqlen_q, seqlen_k, o_stride_b, o_stride_h,
    o_stride_s, softmax_scale, stream)``.  ``key_lens``: read per-batch key counts from the ``key_lens``
    pointer (int32, B elements); without it that pointer is never read (pass any int32 pointer).  ``qk_int8``:
    q8 and k8 are int8 (Int8 pointers), Q K^T is an s8 x s8 -> s32 mma, and ``q_scales`` (float32, (B, H, Sq_pad))
    holds each query row's descale (``scales[..., 0]`` unused); without it q8/k8 are e4m3 and ``q_scales`` is
    never read (pass any float32 pointer).  ``pv_mma``: the P V mma, "f32" or "block_scaled" (sm_120a / sm_121a
    only; ``default_pv_mma``)."""
    from ditprof.kernels.cute_arch import cute_dsl_arch

    if out_dtype not in _DTYPES:
        raise ValueError(f"out_dtype {out_dtype!r} not supported")
    if pv_mma == "block_scaled" and arch not in BLOCK_SCALED_ARCHS:
        raise DitprofError(f"pv_mma 'block_scaled' needs {' or '.join(BLOCK_SCALED_ARCHS)}, not {arch}")
    if early_v is None:
        early_v = default_early_v(arch)
    op = Fp8FlashAttentionSm120(head_dim, _DTYPES[out_dtype], write_lse, early_v, key_lens, qk_int8,
                                wave_cols_for(arch, qk_int8), pv_mma)
    gm = cute.AddressSpace.gmem
    qk_dtype = Int8 if qk_int8 else FP8
    args = (
        cute.runtime.make_ptr(qk_dtype, 0, gm, assumed_align=16),
        cute.runtime.make_ptr(qk_dtype, 0, gm, assumed_align=16),
        cute.runtime.make_ptr(FP8, 0, gm, assumed_align=16),
        cute.runtime.make_ptr(_DTYPES[out_dtype], 0, gm, assumed_align=16),
        cute.runtime.make_ptr(Float32, 0, gm, assumed_align=4),  # lse
        cute.runtime.make_ptr(Float32, 0, gm, assumed_align=4),  # scales
        cute.runtime.make_ptr(Float32, 0, gm, assumed_align=4),  # q_scales (B, H, Sq_pad)
        cute.runtime.make_ptr(Int32, 0, gm, assumed_align=4),  # key_lens (B,) int32
        Int32(1), Int32(1), Int32(1), Int32(1),
        Int64(0), Int64(0), Int32(0),
        Float32(1.0),
        cute.runtime.make_fake_stream(),
    )
    options = f"--gpu-arch {arch} {extra_options}".strip()
    with cute_dsl_arch(arch):  # ops that check the arch read it at trace time
        return cute.compile(op, *args, options=options)
