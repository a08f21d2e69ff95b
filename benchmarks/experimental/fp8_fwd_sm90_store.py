"""The O store of the Hopper FP8 attention kernel's epilogue, three widths (this module subclasses the shipped
kernel and overrides ``epilogue`` only). ``b128`` won (session 12, H200: flux -12 %, h3 -2.7 %, ltx -3.3 %, kernel
only, bit for bit the same output) and is now the shipped epilogue; ``u16`` (the epilogue before it) and ``b32``
stay here for the record and for re-measuring.

Why: the per-CTA timeline (``cta_timeline.py``, H200, session 12) puts consumer warpgroup 0's epilogue at a median
4.0 µs (flux int8, 3.2 µs at p10) of a 70 µs CTA, and the three warpgroups' ends 6 µs apart; at flux (4.36 waves of
CTAs) that fixed cost is 14 % of the SM-time. The shipped epilogue stores O one bf16 at a time: 64 ``STG.E.U16``
per thread at head_dim 128, each warp instruction writing 2 bytes into each of 4 places of 8 rows (8 partial
sectors), the column pair (col, col + 1) twice into the same sector.

``store``:
* ``"u16"``: the epilogue shipped before session 12: one ``.to(dtype)`` and one 16-bit store per value.
* ``"b32"``: the pair packed by one ``cvt.rn.bf16x2.f32`` (round to nearest even, as the shipped ``.to``) and stored
  as one 32-bit word: 32 ``STG.E`` per thread, half the instructions and sector writes.
* ``"b128"``: in each group of 4 column blocks (32 columns) the quad's 4 x 4 words are transposed across the quad's
  lanes with 4 butterfly shuffles (two stages: lane bit 0, then bit 1), so each lane holds 8 consecutive columns
  and stores them as one 16-byte word: 8 ``STG.E.128`` per thread (head_dim 128), every sector written whole,
  at the price of 32 ``SHFL.BFLY`` and their selects. Needs O 16-byte aligned (checked by ``run_store``). This
  is the shipped kernel's epilogue (``Sm90Fp8Attention.epilogue``).

The values stored are the shipped kernel's bit for bit (same products, same rounding); only the store width
changes. The LSE store is the shipped one. All lanes run the shuffles; only the stores are predicated on row < sq.

``compile_store(head_dim, dtype_out, store=..., fake=..., ...)`` has ``K.compile_sm90``'s contract;
``run_store(prep, scale, out, lse, store)`` launches it (JIT path) on a shipped prep.
"""

from __future__ import annotations

import cutlass
from cutlass import BFloat16, Float32, Int32, const_expr, cute
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op

from ditprof.kernels import fp8_fwd_sm90 as K
from ditprof.kernels.fp8_fwd_sm90 import LN2, S_BIAS, Sm90Config, Sm90Fp8Attention, pack2

STORES = ("u16", "b32", "b128")  # "b128": the shipped epilogue (this class then adds nothing)


@dsl_user_op
def st_global_b32(ptr: cute.Pointer, w: Int32, *, loc=None, ip=None) -> None:
    llvm.inline_asm(None, [ptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip), Int32(w).ir_value(loc=loc, ip=ip)],
                    "st.global.b32 [$0], $1;", "l,r,~{memory}", has_side_effects=True, is_align_stack=False,
                    asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)


class Sm90Fp8StoreAttention(Sm90Fp8Attention):
    """The shipped kernel with the ``store`` epilogue (module docstring)."""

    def __init__(self, head_dim: int = 128, dtype_out=BFloat16, config: Sm90Config | None = None,
                 key_lens: bool = False, qk_int8: bool = False, store: str = "b128"):
        if store not in STORES:
            raise ValueError(f"store must be one of {STORES}, got {store!r}")
        super().__init__(head_dim, dtype_out, config, key_lens=key_lens, qk_int8=qk_int8)
        self.store = store

    @cute.jit
    def epilogue(self, acc_O: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor, qk_scale,
                 o_scale: Float32, mO: cute.Tensor, mLSE: cute.Tensor, sq: Int32, row0: Int32,
                 head: Int32, bat: Int32, wg_tidx: Int32):
        if const_expr(self.store == "b128"):
            super().epilogue(acc_O, row_max, row_sum, qk_scale, o_scale, mO, mLSE, sq, row0, head, bat, wg_tidx)
        else:
            self.epilogue_narrow(acc_O, row_max, row_sum, qk_scale, o_scale, mO, mLSE, sq, row0, head, bat,
                                 wg_tidx)

    @cute.jit
    def epilogue_narrow(self, acc_O: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor, qk_scale,
                        o_scale: Float32, mO: cute.Tensor, mLSE: cute.Tensor, sq: Int32, row0: Int32,
                        head: Int32, bat: Int32, wg_tidx: Int32):
        warp = wg_tidx // 32
        lane = wg_tidx % 32
        quad = lane % 4
        half = const_expr(self.dtype_out != BFloat16)
        for r in cutlass.range_constexpr(2):
            lsum = row_sum[r]
            row = self.thread_row(row0, warp, lane, r)
            inv = o_scale * cute.arch.rcp_approx(lsum)
            if row < sq:
                if quad == 0:
                    m = row_max[r]
                    if const_expr(self.qk_int8):
                        m = m - S_BIAS
                    mLSE[row, head, bat] = (m * self.row_scale(qk_scale, r) - 8.0
                                            + cute.math.log2(lsum, fastmath=True)) * LN2
                for j in cutlass.range_constexpr(self.head_dim // 8):
                    col = 8 * j + 2 * quad
                    if const_expr(self.store == "u16"):
                        mO[row, col, head, bat] = (acc_O[2 * r + 4 * j] * inv).to(self.dtype_out)
                        mO[row, col + 1, head, bat] = (acc_O[1 + 2 * r + 4 * j] * inv).to(self.dtype_out)
                    else:
                        st_global_b32(mO.iterator + cute.crd2idx((row, col, head, bat), mO.layout),
                                      pack2(acc_O[2 * r + 4 * j] * inv, acc_O[1 + 2 * r + 4 * j] * inv, half))


def compile_store(head_dim: int, dtype_out, *, store: str, fake: bool, arch: str = "sm_90a",
                  options_extra: str = "", config: Sm90Config | None = None, key_lens: bool = False,
                  qk_int8: bool = False):
    """``K.compile_sm90``'s contract (no TVM-FFI) for the ``store`` epilogue."""
    dtype_out = K._out_dtype(dtype_out)
    config = config or K.config_for(arch, head_dim)
    kern = Sm90Fp8StoreAttention(head_dim, dtype_out, config, key_lens=key_lens, qk_int8=qk_int8, store=store)
    return K.compile_kernel(kern, K._compile_args(dtype_out), fake=fake, arch=arch, options_extra=options_extra,
                            smem=K.smem_bytes(head_dim, config, qk_int8=qk_int8))


_CACHE: dict = {}


def run_store(prep, scale: float, out, lse, store: str, key_lens=None, sk: int | None = None) -> None:
    """The variant on a shipped prep (``fp8_prepare``; INT8 Q/K when it has Q scales), JIT launch on the current
    stream: out (B, Sq, H, D) bf16/fp16 contiguous, 16-byte aligned; lse (B, H, Sq) fp32."""
    from bench_helpers import launch_build

    B, H, sq_pad, D = prep.q8.shape
    if tuple(out.shape) != (B, prep.sq, H, D) or not out.is_contiguous() or out.data_ptr() % 16:
        raise ValueError("out must be a contiguous, 16-byte aligned (B, Sq, H, D) tensor")
    qk_int8 = prep.q_scales is not None
    key = (D, out.dtype, store, key_lens is not None, qk_int8)
    fn = _CACHE.get(key)
    if fn is None:
        fn = _CACHE[key] = compile_store(D, str(out.dtype), store=store, fake=False, key_lens=key_lens is not None,
                                         qk_int8=qk_int8)
    launch_build(fn, prep, scale, out, lse, key_lens=key_lens, sk=sk)
