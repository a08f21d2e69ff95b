"""The kernels of ``cta_timeline.py`` (see its docstring for the stamp slots and why they sit where they do): the
shipped fp8-sm90 kernel and the persistent variant with ``%globaltimer`` stamps per CTA / work tile in an extra
int64 table. A module of its own because the DSL resolves the kernels' annotations in their module's globals, and
the analysis in ``cta_timeline.py`` must import without cutlass (the CPU analysis tests, the plots)."""

from __future__ import annotations

import cuda.bindings.driver as cuda
from cutlass import Float32, Int32, Int64, cute
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

import fp8_fwd_sm90_persistent as P
from cta_timeline import EPI_DONE, FIRST_K, FIRST_S, LAST_MERGE, SLOTS, SMID, START
from ditprof.kernels import fp8_fwd_sm90 as K
from ditprof.kernels.fp8_fwd_sm90 import Sm90Fp8Attention


def _asm(ty, text, constraint, loc, ip):
    # side effects: LLVM neither hoists, sinks, merges nor drops it, so the read happens where it is written
    return llvm.inline_asm(ty, [], text, constraint, has_side_effects=True, is_align_stack=False,
                           asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)


@dsl_user_op
def globaltimer(*, loc=None, ip=None) -> Int64:
    """%globaltimer: the GPU's ns clock, one clock for every SM (unlike %clock64)."""
    return Int64(_asm(T.i64(), "mov.u64 $0, %globaltimer;", "=l", loc, ip))


@dsl_user_op
def smid(*, loc=None, ip=None) -> Int32:
    return Int32(_asm(T.i32(), "mov.u32 $0, %smid;", "=r", loc, ip))


@dsl_user_op
def cta_linear(*, loc=None, ip=None) -> Int32:
    """blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z), read at the point of use (a fresh asm:
    nothing is kept live across the consumers' loop for it)."""
    text = ("{ .reg .u32 x, y, z, nx, ny, t; mov.u32 x, %ctaid.x; mov.u32 y, %ctaid.y; mov.u32 z, %ctaid.z; "
            "mov.u32 nx, %nctaid.x; mov.u32 ny, %nctaid.y; mad.lo.u32 t, z, ny, y; mad.lo.u32 $0, t, nx, x; }")
    return Int32(_asm(T.i32(), text, "=r", loc, ip))


@dsl_user_op
def tid_x(*, loc=None, ip=None) -> Int32:
    """threadIdx.x read again at the point of use (same reason as ``cta_linear``)."""
    return Int32(_asm(T.i32(), "mov.u32 $0, %tid.x;", "=r", loc, ip))


class StampMixin:
    """The stamp sites shared by both kernels. ``self._row`` (set while tracing the kernel) gives the stamp
    table's row at the point of use; ``self._first_s`` is the trace-time flag of the FIRST_S site."""

    @cute.jit
    def _stamp(self, mStamps: cute.Tensor, row: Int32, slot, pred):
        if pred:
            mStamps[row, slot] = globaltimer()

    def stamp_first_k(self):
        # FIRST_K, stamped right before the shipped load_kv: its first K slot is free (a fresh ring, or in the
        # persistent loop the producer runs ahead), so this is the first K TMA's issue time up to one mbarrier
        # try_wait. A stamp inside load_kv's loop (if j == 0) moved the uniform-register allocation of the whole
        # kernel: 7 more UMOVs in the consumers' e4m3 key loop (640 vs 633 instructions)
        self._stamp(self._mStamps, self._row(), FIRST_K, cute.arch.lane_idx() == 0)

    def load_kv(self, *args):
        self.stamp_first_k()
        return super().load_kv(*args)

    def softmax_stats(self, acc_S, row_max, row_sum, qk_scale):
        # the first call traced is attend's prologue (S_0 waited and K_0 released just before); the loop
        # body's call is traced later and gets no stamp
        if self._first_s:
            self._first_s = False
            self._stamp(self._mStamps, self._row(), FIRST_S, tid_x() == 128)
        return super().softmax_stats(acc_S, row_max, row_sum, qk_scale)

    def epilogue(self, acc_O, row_max, row_sum, qk_scale, o_scale, mO, mLSE, sq, row0, head, bat, wg_tidx):
        # attend has returned: every P V of the tile is merged into O
        self._stamp(self._mStamps, self._row(), LAST_MERGE, tid_x() == 128)
        super().epilogue(acc_O, row_max, row_sum, qk_scale, o_scale, mO, mLSE, sq, row0, head, bat, wg_tidx)
        self._epi_done()

    def _set_row(self, t):
        self._row = lambda: t

    def _epi_done(self):
        # each consumer warpgroup's first thread: slot EPI_DONE + (its index among the consumers)
        t = tid_x()
        self._stamp(self._mStamps, self._row(), EPI_DONE - 1 + t // 128, t % 128 == 0)


class TimelineAttention(StampMixin, Sm90Fp8Attention):
    """The shipped kernel with the stamps: arguments are the shipped ones, then the int64 stamp table's pointer
    ((grid CTAs, SLOTS), zeroed by the caller), then the stream."""

    @cute.jit
    def __call__(self, pQ: cute.Pointer, pK: cute.Pointer, pV: cute.Pointer, pScales: cute.Pointer,
                 pQScales: cute.Pointer, pKeyLens: cute.Pointer, pO: cute.Pointer, pLSE: cute.Pointer,
                 batch: Int32, heads: Int32, sq: Int32, sk: Int32, sq_pad: Int32, sk_pad: Int32,
                 softmax_scale: Float32, pStamps: cute.Pointer, stream: cuda.CUstream):
        args, layouts = self.kernel_args(pQ, pK, pV, pScales, pQScales, pKeyLens, pO, pLSE, batch, heads, sq, sk,
                                         sq_pad, sk_pad)
        n_m = cute.ceil_div(sq, self.tile_m)
        mStamps = cute.make_tensor(pStamps, cute.make_layout((n_m * heads * batch, SLOTS), stride=(SLOTS, 1)))
        self.launch_kernel(args, layouts, sq, sk, softmax_scale, (mStamps,), (n_m, heads, batch), stream)

    @cute.jit
    def kernel_body(self, k):
        # START first, before anything else of the CTA (thread 0 is the producer warp's lane 0)
        (mStamps,) = k.extra
        t_start = globaltimer()
        tidx, _, _ = cute.arch.thread_idx()
        if tidx == 0:
            mStamps[cta_linear(), START] = t_start
            mStamps[cta_linear(), SMID] = Int64(smid())
        self._mStamps, self._row, self._first_s = mStamps, cta_linear, True
        # from here on: the shipped kernel's body, the stamp sites are the overrides
        Sm90Fp8Attention.kernel_body(self, k)


class PersistentTimelineAttention(StampMixin, P.Sm90Fp8PersistentAttention):
    """The persistent variant with the stamps, one row per work tile: arguments are the persistent ones
    (num_ctas last), then the stamp table's pointer ((work tiles, SLOTS), zeroed), then the stream."""

    @cute.jit
    def __call__(self, pQ: cute.Pointer, pK: cute.Pointer, pV: cute.Pointer, pScales: cute.Pointer,
                 pQScales: cute.Pointer, pKeyLens: cute.Pointer, pO: cute.Pointer, pLSE: cute.Pointer,
                 batch: Int32, heads: Int32, sq: Int32, sk: Int32, sq_pad: Int32, sk_pad: Int32,
                 softmax_scale: Float32, num_ctas: Int32, pStamps: cute.Pointer, stream: cuda.CUstream):
        args, layouts = self.kernel_args(pQ, pK, pV, pScales, pQScales, pKeyLens, pO, pLSE, batch, heads, sq, sk,
                                         sq_pad, sk_pad)
        n_m = cute.ceil_div(sq, self.tile_m)
        n_work = n_m * heads * batch
        mStamps = cute.make_tensor(pStamps, cute.make_layout((n_work, SLOTS), stride=(SLOTS, 1)))
        self.launch_kernel(args, layouts, sq, sk, softmax_scale, (n_m, heads, n_work, mStamps), (num_ctas, 1, 1),
                           stream)

    def kernel_body(self, k):
        # the persistent variant's body with a per-work-tile row: the work tile index t, which both roles keep
        # live anyway (their loop variable)
        self._mStamps, self._first_s = k.extra[3], True
        super().kernel_body(k)

    def work_coords(self, t, n_m, heads):
        self._set_row(t)  # a call, not an assignment: the DSL would carry self through the loop
        return super().work_coords(t, n_m, heads)

    def tile_start(self, k, w, t):
        self._tile_stamps(self._mStamps, t, w.cta)

    @cute.jit
    def _tile_stamps(self, mStamps: cute.Tensor, t: Int32, cta: Int32):
        if tid_x() == 128:  # START of this work tile: consumer warpgroup 0 about to wait for its Q
            mStamps[t, START] = globaltimer()
            mStamps[t, SMID] = Int64(smid()) | (Int64(cta) << 32)


def compile_timeline(head_dim: int = 128, dtype_out="bfloat16", *, fake: bool, persistent: bool = False,
                     qk_int8: bool = False, arch: str = "sm_90a", options_extra: str = ""):
    """Compile the traced kernel (JIT launch path: call with cute pointers). Arguments: the shipped kernel's up to
    softmax_scale, [num_ctas (Int32) if persistent], the stamp table's pointer (Int64), the stream."""
    from cutlass.cute.runtime import make_ptr

    dtype_out = K._out_dtype(dtype_out)
    config = K.config_for(arch, head_dim)
    kern = (PersistentTimelineAttention if persistent else TimelineAttention)(head_dim, dtype_out, config,
                                                                              qk_int8=qk_int8)
    extra = (Int32(1),) if persistent else ()
    stamps = make_ptr(Int64, 0, cute.AddressSpace.gmem, assumed_align=8)
    return K.compile_kernel(kern, (*K._compile_args(dtype_out), *extra, stamps), fake=fake, arch=arch,
                            options_extra=options_extra)
