"""fp8-sm90 with a stream-K tail: the shipped Hopper FP8 attention kernel (``fp8_fwd_sm90.py``, subclassed: every
key-loop instruction is its ``attend``'s) on a grid whose last, partial round is spread evenly over the SMs.

Why: a grid of work tiles (192 query rows each) fills the SMs in rounds; at the short shapes (Flux 1024^2: 576 tiles
on 132 SMs = 4 rounds and 48 tiles) the partial last round kept most SMs idle for a large part of the kernel (the
per-CTA timeline, benchmarks/NOTES.md). Here the tail's n_tail x n_kt (tile, key tile) units, in order, are cut
into ``T`` = (SM count) contiguous ranges, one per tail CTA; a range crosses at most one tile boundary (T > n_tail),
so a tail CTA runs one or two *segments* (a tile and a key range of it). It pays at the short shapes (a few
rounds), merge included; a grid of many rounds gains nothing (benchmarks/NOTES.md has the timings).

Design
------
* Grid: n_full + T CTAs, 1-D. CTA c < n_full runs work tile c whole (m_block fastest, then head, then batch: the
  shipped grid's order) and writes O and the LSE as shipped. Tail CTA c' = c - n_full covers the global units
  [n_full n_kt + c' U // T, n_full n_kt + (c' + 1) U // T), U = n_tail n_kt; ``streamk_schedule.segments``
  gives (tile, begin, end) of its first segment and the end of its second (0: none) with one branch-free formula,
  shared by the kernel and the host (tests). A full CTA is the formula's c < n_full case: one segment [0, n_kt).
* Producer: per segment, Q of its tile into Q box ``segment`` (``Q_STAGES = 2``: the second segment's Q loads
  while the first segment's keys stream), then its K/V tiles; the K/V ring's state continues across segments.
* Consumers: per segment, the shipped ``attend`` over its end - begin key tiles, fresh row max / sum / O, then the
  shipped ``epilogue``: into O for a whole tile, else into workspace slot 2 c' + segment (O normalised, in the
  output dtype, and the LSE). Masking: ``attend`` masks its last tile at a key count; a segment that holds the
  tile's last key tile gets sk - begin tile_n, any other a count that masks nothing.
* Merge: ``streamk_merge`` (one Triton launch) combines each tail tile's pieces, listed by
  ``streamk_schedule.piece_table``.
* ``streamk_schedule.streamk_plan`` decides where the tail is worth it (a partial round after
  ``MIN_ROUNDS`` to ``MAX_ROUNDS`` full rounds); no key_lens mode (per-item key counts would give items different
  unit counts).

Numerics: full CTAs are the shipped kernel bit for bit. Tail rows differ from it as any split of the keys does: each
piece's P is quantized against its own running max and its O rounded to the output dtype before the merge (the
GPU tests bound the tail rows against the one-pass kernel; both stay within the float64 goals).

Arguments: the shipped kernel's (q8, k8, v8t, scales, q_scales, key_lens, out, lse), then ``o_part`` (2 T, 192, D)
and ``lse_part`` (2 T, 192), then (B, H, Sq, Sk, Sq_pad, Sk_pad, softmax_scale, n_full, n_tail, T, stream).
"""

from __future__ import annotations

from types import SimpleNamespace

import cuda.bindings.driver as cuda
import cutlass
from cutlass import BFloat16, Float32, Int32, cute, pipeline

from ditprof.kernels import fp8_fwd_sm90 as K
from ditprof.kernels.fp8_fwd_sm90 import TILE_M_WG, Sm90Config, Sm90Fp8Attention
from ditprof.kernels.streamk_schedule import TILE_M, segments, work_coords



# ---------------------------------------------------------------------- the kernel
class Sm90Fp8StreamKAttention(Sm90Fp8Attention):
    """The plain kernel's sections on a 1-D grid whose last round is spread evenly over the SMs."""

    Q_STAGES = 2

    def __init__(self, head_dim: int = 128, dtype_out=BFloat16, config: Sm90Config | None = None,
                 key_lens: bool = False, qk_int8: bool = False):
        if key_lens:
            raise ValueError("the stream-K fp8-sm90 variant has no key_lens mode")
        super().__init__(head_dim, dtype_out, config, key_lens=False, qk_int8=qk_int8)

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
        pOPart: cute.Pointer,
        pLSEPart: cute.Pointer,
        batch: Int32,
        heads: Int32,
        sq: Int32,
        sk: Int32,
        sq_pad: Int32,
        sk_pad: Int32,
        softmax_scale: Float32,
        n_full: Int32,
        n_tail: Int32,
        n_ctas_tail: Int32,
        stream: cuda.CUstream,
    ):
        args, layouts = self.kernel_args(pQ, pK, pV, pScales, pQScales, pKeyLens, pO, pLSE, batch, heads, sq, sk,
                                         sq_pad, sk_pad)
        n_m = cute.ceil_div(sq, self.tile_m)
        D = self.head_dim
        # workspace slot 2 c' + segment, indexed as the epilogue indexes mO: (local row, col, slot, 0)
        slots = cutlass.max(2 * n_ctas_tail, 1)
        mOPart = cute.make_tensor(pOPart, cute.make_layout(
            (self.tile_m, D, slots, 1), stride=(D, 1, self.tile_m * D, slots * self.tile_m * D)))
        mLSEPart = cute.make_tensor(pLSEPart, cute.make_layout(
            (self.tile_m, slots, 1), stride=(1, self.tile_m, slots * self.tile_m)))
        self.launch_kernel(args, layouts, sq, sk, softmax_scale,
                           (mOPart, mLSEPart, n_m, heads, n_full, n_tail, n_ctas_tail), (n_full + n_ctas_tail, 1, 1),
                           stream)

    # ------------------------------------------------------------------ the shipped kernel's sections, overridden
    # (kernel arguments: the shipped ones, extra = (mOPart, mLSEPart, n_m, heads, n_full, n_tail, n_ctas_tail))
    def work_tile(self, k):
        cta, _, _ = cute.arch.block_idx()
        return SimpleNamespace(cta=cta)

    def smem_setup(self, k, w, tidx):
        """The CTA's segments, then the shipped set-up (without the per-tile key count: per segment here)."""
        _, _, _, _, n_full, n_tail, n_ctas_tail = k.extra
        w.n_kt = self.key_tiles(None, 0, k.sk)
        w.tile, w.begin0, w.end0, w.end1 = segments(w.cta, n_full, n_tail, n_ctas_tail, w.n_kt, cutlass.min,
                                                    cutlass.max)
        storage, q_pipe, k_pipe, v_pipe, sQ, sK, sV, sPin = self.shared_setup(k.sQ_layout, k.sK_layout, k.sV_layout)
        bias_ptr = self.shared_constants(storage, k.sOnes_layout, sPin, tidx)
        return SimpleNamespace(storage=storage, q_pipe=q_pipe, k_pipe=k_pipe, v_pipe=v_pipe, sQ=sQ, sK=sK, sV=sV,
                               sPin=sPin, bias_ptr=bias_ptr)

    @staticmethod
    def segment(w_tile, begin0, end0, end1, seg):
        """(tile, begin, end) of segment ``seg`` (a dynamic 0 / 1) from the CTA's schedule."""
        return w_tile + seg, begin0 * (1 - seg), end0 + seg * (end1 - end0)

    def producer(self, k, w, s):
        _, _, n_m, heads, _, _, _ = k.extra
        self.produce(k.tma_q, k.mQ, k.tma_k, k.mK, k.tma_v, k.mV, s.sQ, s.sK, s.sV, s.q_pipe, s.k_pipe, s.v_pipe,
                     n_m, heads, w.tile, w.begin0, w.end0, w.end1)

    @cute.jit
    def produce(self, tma_q, mQ, tma_k, mK, tma_v, mV, sQ, sK, sV, q_pipe, k_pipe, v_pipe, n_m, heads, w_tile,
                begin0, end0, end1):
        """The producer warp: per segment, Q into Q box ``seg``, then the segment's K/V tiles (one ring state)."""
        tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV = self.producer_views(tma_q, mQ, tma_k, mK, tma_v, mV, sQ, sK, sV)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.Q_STAGES)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.kv_stages)
        n_seg = 1 + cutlass.min(end1, 1)
        for seg in cutlass.range(n_seg, unroll=1):
            tile, begin, end = self.segment(w_tile, begin0, end0, end1, seg)
            m_block, head, bat = work_coords(tile, n_m, heads)
            self.load_q(q_pipe, q_state, tma_q, tQgQ, tQsQ, m_block, head, bat, q_state.index * self.num_wg)
            q_state.advance()
            for j in cutlass.range(begin, end, unroll=1):
                k_pipe.producer_acquire(kv_state)
                cute.copy(tma_k, tKgK[(None, j, 0, head, bat)], tKsK[(None, kv_state.index)],
                          tma_bar_ptr=k_pipe.producer_get_barrier(kv_state))
                v_pipe.producer_acquire(kv_state)
                cute.copy(tma_v, tVgV[(None, 0, j, head, bat)], tVsV[(None, kv_state.index)],
                          tma_bar_ptr=v_pipe.producer_get_barrier(kv_state))
                kv_state.advance()

    def consumer(self, k, w, s, f, warp_idx):
        mOPart, mLSEPart, n_m, heads, n_full, _, _ = k.extra
        self.consume(f, s.q_pipe, s.k_pipe, s.v_pipe, k.mScales, k.mQScales, k.scale_log2, k.mO, k.mLSE, mOPart,
                     mLSEPart, k.sq, k.sk, s.sPin, warp_idx, self.accumulator_preset(s, f), n_m, heads, n_full, w.cta,
                     w.n_kt, w.tile, w.begin0, w.end0, w.end1)

    @cute.jit
    def consume(self, f, q_pipe, k_pipe, v_pipe, mScales, mQScales, scale_log2, mO, mLSE, mOPart, mLSEPart, sq, sk,
                sPin, warp_idx, bias_ptr, n_m, heads, n_full, cta, n_kt, w_tile, begin0, end0, end1):
        """Per segment: the shipped ``attend`` over its key tiles (Q box ``seg``), then the shipped ``epilogue``
        into O (a whole tile) or into workspace slot 2 (cta - n_full) + seg."""
        row_max = cute.make_rmem_tensor((2,), Float32)
        row_sum = cute.make_rmem_tensor((2,), Float32)
        row_max.fill(-Float32.inf)
        row_sum.fill(0.0)
        # the pipeline states are made inside each branch: ``attend`` advances them through attributes, which a
        # staged branch cannot carry out
        if cta < n_full:
            # a whole work tile: the shipped consumer (constant Q box, the kernel's key count: the shipped loop)
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.Q_STAGES)
            kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
            m_block, head, bat = work_coords(w_tile, n_m, heads)
            row0 = m_block * self.tile_m + f.wg * TILE_M_WG
            qk_scale = self.tile_qk_scale(mScales, mQScales, scale_log2, row0, head, bat, sq, f.wg_tidx)
            self.attend(f, q_pipe, q_state, k_pipe, v_pipe, kv_state, f.wg, n_kt, qk_scale, row_max, row_sum,
                        None, bat, sk, sPin, warp_idx, bias_ptr)
            self.epilogue(f.acc_O, row_max, row_sum, qk_scale, mScales[2, head, bat], mO, mLSE, sq, row0, head, bat,
                          f.wg_tidx)
        else:
            self.consume_tail(f, q_pipe, k_pipe, v_pipe, row_max, row_sum, mScales, mQScales,
                              scale_log2, mO, mLSE, mOPart, mLSEPart, sq, sk, sPin, warp_idx, bias_ptr, n_m, heads,
                              n_full, cta, n_kt, w_tile, begin0, end0, end1)

    @cute.jit
    def consume_tail(self, f, q_pipe, k_pipe, v_pipe, row_max, row_sum, mScales, mQScales,
                     scale_log2, mO, mLSE, mOPart, mLSEPart, sq, sk, sPin, warp_idx, bias_ptr, n_m, heads, n_full,
                     cta, n_kt, w_tile, begin0, end0, end1):
        """A tail CTA's one or two segments."""
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.Q_STAGES)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        n_seg = 1 + cutlass.min(end1, 1)
        for seg in cutlass.range(n_seg, unroll=1):
            tile, begin, end = self.segment(w_tile, begin0, end0, end1, seg)
            m_block, head, bat = work_coords(tile, n_m, heads)
            row0 = m_block * self.tile_m + f.wg * TILE_M_WG
            qk_scale = self.tile_qk_scale(mScales, mQScales, scale_log2, row0, head, bat, sq, f.wg_tidx)
            row_max.fill(-Float32.inf)
            row_sum.fill(0.0)
            f.acc_O.fill(0.0)
            # attend masks its last tile at this key count (local to the segment): the real one where the
            # segment holds the tile's last key tile, else one that masks nothing
            holds_last = cutlass.min(cutlass.max(end - n_kt + 1, 0), 1)
            keys = (end - begin) * self.tile_n + holds_last * (sk - end * self.tile_n)
            v_state = self.attend(f, q_pipe, q_state, k_pipe, v_pipe, kv_state, f.wg + q_state.index * self.num_wg,
                                  end - begin, qk_scale, row_max, row_sum, None, bat, keys, sPin, warp_idx, bias_ptr)
            q_state.advance()
            v_state.advance()
            kv_state = v_state
            o_scale = mScales[2, head, bat]
            whole = cutlass.min(cutlass.max(begin + end - n_kt + 1, 0), 1) * (1 - cutlass.min(begin, 1))
            if whole == 1:
                self.epilogue(f.acc_O, row_max, row_sum, qk_scale, o_scale, mO, mLSE, sq, row0, head, bat,
                              f.wg_tidx)
            else:
                self.epilogue(f.acc_O, row_max, row_sum, qk_scale, o_scale, mOPart, mLSEPart,
                              sq - m_block * self.tile_m, f.wg * TILE_M_WG, 2 * (cta - n_full) + seg, 0, f.wg_tidx)


# ---------------------------------------------------------------------- compile / run
def _compile_args(dtype_out):
    from cutlass.cute.runtime import make_ptr

    gm = cute.AddressSpace.gmem
    args = list(K._compile_args(dtype_out))
    ws = [make_ptr(dtype_out, 0, gm, assumed_align=16), make_ptr(Float32, 0, gm, assumed_align=4)]
    return tuple(args[:8] + ws + args[8:] + [Int32(0), Int32(0), Int32(0)])


def compile_streamk(head_dim: int, dtype_out, *, fake: bool, arch: str = "sm_90a", options_extra: str = "",
                    tvm_ffi: bool = False, config: Sm90Config | None = None, key_lens: bool = False,
                    qk_int8: bool = False):
    """``K.compile_sm90``'s contract (key_lens refused) with the workspace pointers after ``lse`` and
    (n_full, n_tail, T) before the stream."""
    dtype_out = K._out_dtype(dtype_out)
    config = config or K.config_for(arch, head_dim)
    if config.consumer_wgs * TILE_M_WG != TILE_M:
        raise ValueError(f"the stream-K schedule takes {TILE_M}-row work tiles, the config has "
                         f"{config.consumer_wgs * TILE_M_WG}")
    kern = Sm90Fp8StreamKAttention(head_dim, dtype_out, config, key_lens=key_lens, qk_int8=qk_int8)
    return K.compile_kernel(kern, _compile_args(dtype_out), fake=fake, arch=arch, options_extra=options_extra,
                            tvm_ffi=tvm_ffi, smem=streamk_smem_bytes(head_dim, config, qk_int8))


def streamk_smem_bytes(head_dim: int = 128, config: Sm90Config | None = None, qk_int8: bool = False) -> int:
    """The plain kernel's shared memory (``fp8_fwd_sm90.smem_bytes``) plus the second Q box (a tail CTA's second
    segment loads its Q while the first one's keys stream)."""
    config = config or K.config_for("sm_90a", head_dim)
    return K.smem_bytes(head_dim, config, qk_int8=qk_int8) + TILE_M_WG * config.consumer_wgs * head_dim


__all__ = ["Sm90Fp8StreamKAttention", "compile_streamk", "streamk_smem_bytes"]
