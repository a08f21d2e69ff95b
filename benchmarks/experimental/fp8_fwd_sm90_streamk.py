"""A stream-K tail for the shipped Hopper FP8 attention kernel (issue 17's short shapes), as an experiment:
``ditprof/kernels/fp8_fwd_sm90.py`` is unchanged, this module subclasses it.

Why: after the 16-byte O stores the per-CTA timeline at flux (1,24,4608,128) is 81 % key loop, 5 % fixed cost and
14 % idle: 576 work tiles on 132 SMs are 4 full rounds (~250 µs) and a fifth of 48 tiles (~60 µs) while 84 SMs
wait. Split-KV (``fp8_fwd_sm90_splitkv.py``) cuts each tail tile into equal key ranges, one per CTA, but 132 / 48 =
2.75 parts per tile cannot be equal: with 2 parts the last round is still 14.5 key tiles long (measured −3 to −4 %
with its merge, of the −13 % an even spread would give). Here the tail's key tiles are spread evenly: the
n_tail x n_kt (tile, key tile) units of the tail, in order, are cut into ``T`` = (SM count) contiguous ranges, one
per tail CTA; a range crosses at most one tile boundary (T > n_tail), so a tail CTA runs one or two *segments*
(a tile and a key range of it), one after the other. Flux: 1392 units, 10-11 per CTA instead of 29 or 14.5.

Design (a subclass; every key-loop instruction is the shipped ``attend``'s)
---------------------------------------------------------------------------
* Grid: n_full + T CTAs, 1-D. CTA c < n_full runs work tile c whole (the shipped grid's order: m_block fastest,
  then head, then batch) and writes O and the LSE as shipped. Tail CTA c' = c - n_full covers the global units
  [n_full n_kt + c' U // T, n_full n_kt + (c' + 1) U // T), U = n_tail n_kt; ``segments`` gives (tile, begin, end)
  of its first segment and the end of its second (0: none) with one branch-free formula, shared by the kernel and
  the host model (tests). A full CTA is the formula's c < n_full case: one segment [0, n_kt).
* Producer: per segment, Q of its tile into Q box ``segment`` (``Q_STAGES = 2``: the second segment's Q loads
  while the first segment's keys stream), then its K/V tiles; the K/V ring's state continues across segments.
* Consumers: per segment, the shipped ``attend`` over its end - begin key tiles (Q box ``segment``), fresh row max /
  sum / O, then the shipped ``epilogue``: into O for a whole tile, else into the workspace slot 2 c' + segment
  (normalised O in the output dtype and the LSE, the split-KV variant's convention). Masking: ``attend`` masks its
  last tile at a key count; a segment that holds the tile's last key tile gets sk - begin tile_n, any other a count
  that masks nothing ((end - begin) tile_n), so no override of ``mask_tile`` is needed.
* Merge (``streamk_merge``, one Triton launch): per tail tile, its pieces' slots from a small table (``piece_table``,
  host-built once per plan): LSE = m + ln sum exp(LSE_p - m), O = sum exp(LSE_p - LSE) O_p, in fp32. A tail tile
  that one CTA ran whole (possible when U / T is close to n_kt) has no pieces and is not touched.
* Not supported: key_lens (every item must have the same key tiles; ValueError), head_dim other than 64 / 128.
  INT8 and e4m3 Q/K both.

Numerics: full CTAs are the shipped kernel bit for bit. Tail rows differ as split-KV's do: each piece's P is
quantized against its own running max and its O rounded to the output dtype before the merge.

Arguments: the shipped kernel's (q8, k8, v8t, scales, q_scales, key_lens, out, lse), then ``o_part`` (2 T, 192, D)
and ``lse_part`` (2 T, 192), then (B, H, Sq, Sk, Sq_pad, Sk_pad, softmax_scale, n_full, n_tail, T, stream).
"""

from __future__ import annotations

from types import SimpleNamespace

import cuda.bindings.driver as cuda
import cutlass
import triton
import triton.language as tl
from cutlass import BFloat16, Float32, Int32, cute, pipeline

from ditprof.kernels import fp8_fwd_sm90 as K
from ditprof.kernels.fp8_fwd_sm90 import TILE_M_WG, Sm90Config, Sm90Fp8Attention

TILE_M = 192  # query rows per work tile (3 consumer warpgroups x 64)


# ---------------------------------------------------------------------- the schedule (kernel and host model)
def plan(n_tiles: int, n_sms: int, n_kt: int) -> tuple[int, int, int]:
    """(n_full, n_tail, T) for ``n_tiles`` work tiles of ``n_kt`` key tiles on ``n_sms`` SMs: the last, partial
    round's n_tail tiles spread over T = n_sms tail CTAs (at most one unit each: T <= n_tail n_kt). Whole rounds,
    or one tile per SM at most: no tail (n_full = n_tiles, n_tail = 0, T = 0)."""
    if n_tiles < 1 or n_sms < 1 or n_kt < 1:
        raise ValueError(f"n_tiles, n_sms and n_kt must be >= 1, got {n_tiles}, {n_sms}, {n_kt}")
    n_tail = n_tiles % n_sms
    if n_tail == 0 or n_kt == 1:
        return n_tiles, 0, 0
    return n_tiles - n_tail, n_tail, min(n_sms, n_tail * n_kt)


def segments(cta, n_full, n_tail, n_ctas_tail, n_kt, mn=min, mx=max):
    """(tile, begin0, end0, end1) of CTA ``cta``: the first segment is key tiles [begin0, end0) of work tile
    ``tile``; the second (when end1 > 0) key tiles [0, end1) of tile + 1. Branch-free; ``mn`` / ``mx`` are
    ``cutlass.min`` / ``cutlass.max`` in the kernel and the builtins in the host model."""
    rel = mx(cta - n_full, 0)  # the tail index (0 for every full CTA)
    is_tail = mn(mx(cta + 1 - n_full, 0), 1)
    units = n_tail * n_kt
    t_div = mx(n_ctas_tail, 1)
    lo_tail = n_full * n_kt + rel * units // t_div
    hi_tail = n_full * n_kt + (rel + 1) * units // t_div
    lo = cta * n_kt + is_tail * (lo_tail - cta * n_kt)
    hi = lo + n_kt + is_tail * (hi_tail - lo_tail - n_kt)
    tile = lo // n_kt
    begin0 = lo - tile * n_kt
    end0 = mn(hi - tile * n_kt, n_kt)
    end1 = mx(hi - (tile + 1) * n_kt, 0)
    return tile, begin0, end0, end1


def host_segments(cta: int, n_full: int, n_tail: int, n_ctas_tail: int, n_kt: int) -> list[tuple[int, int, int]]:
    """The (tile, begin, end) segments of CTA ``cta`` (host model of the kernel's schedule)."""
    tile, b0, e0, e1 = segments(cta, n_full, n_tail, n_ctas_tail, n_kt)
    return [(tile, b0, e0)] + ([(tile + 1, 0, e1)] if e1 > 0 else [])


def piece_table(n_full: int, n_tail: int, n_ctas_tail: int, n_kt: int) -> list[list[int]]:
    """For each tail tile u (work tile n_full + u): the workspace slots 2 c' + segment of its pieces, in key order."""
    table: list[list[int]] = [[] for _ in range(n_tail)]
    for c in range(n_ctas_tail):
        for s, (tile, b, e) in enumerate(host_segments(n_full + c, n_full, n_tail, n_ctas_tail, n_kt)):
            if not (b == 0 and e == n_kt):  # a whole tile is written to O directly (never in a tail: T > n_tail)
                table[tile - n_full].append(2 * c + s)
    return table


def work_coords(t, n_m, heads):
    """(m_block, head, batch) of work tile t in the shipped grid's order: m_block fastest, then head, then batch."""
    rest = t // n_m
    return t - rest * n_m, rest % heads, rest // heads


# ---------------------------------------------------------------------- the kernel
class Sm90Fp8StreamKAttention(Sm90Fp8Attention):
    """The shipped kernel's sections on a 1-D grid whose last round is spread evenly over the SMs."""

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
                     mLSEPart, k.sq, k.sk, s.sPin, warp_idx, s.bias_ptr, n_m, heads, n_full, w.cta, w.n_kt, w.tile,
                     w.begin0, w.end0, w.end1)

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


# ---------------------------------------------------------------------- the merge
@triton.jit
def _streamk_merge_kernel(o_part, lse_part, table, out, lse_out, n_full, n_m, H, sq, P_MAX: tl.constexpr,
                          D: tl.constexpr, TILE: tl.constexpr, BLOCK: tl.constexpr, WRITE_LSE: tl.constexpr):
    u = tl.program_id(0)  # tail tile
    t = n_full + u
    m_block = t % n_m
    head = (t // n_m) % H
    bat = t // (n_m * H)
    r = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    row = m_block * TILE + r
    valid = row < sq
    cols = tl.arange(0, D)
    m = tl.full((BLOCK,), float("-inf"), tl.float32)
    for p in range(P_MAX):
        slot = tl.load(table + u * P_MAX + p) + 0 * r  # as a row vector: the masks below are per row
        lp = tl.load(lse_part + slot * TILE + r, mask=valid & (slot >= 0), other=float("-inf"))
        m = tl.maximum(m, lp)
    acc = tl.zeros((BLOCK, D), tl.float32)
    total = tl.zeros((BLOCK,), tl.float32)
    for p in range(P_MAX):
        slot = tl.load(table + u * P_MAX + p) + 0 * r
        has = valid & (slot >= 0)
        lp = tl.load(lse_part + slot * TILE + r, mask=has, other=float("-inf"))
        w = tl.where(has, tl.exp(lp - m), 0.0)
        o = tl.load(o_part + (slot * TILE + r)[:, None].to(tl.int64) * D + cols[None, :], mask=has[:, None],
                    other=0.0)
        acc += w[:, None] * o.to(tl.float32)
        total += w
    o = acc / total[:, None]
    # a tail tile one CTA ran whole has no pieces (its O is already written): nothing to store
    write = valid & ((tl.load(table + u * P_MAX) + 0 * r) >= 0)
    dst = ((bat * sq + row).to(tl.int64) * H + head) * D
    tl.store(out + dst[:, None] + cols[None, :], o.to(out.dtype.element_ty), mask=write[:, None])
    if WRITE_LSE:
        tl.store(lse_out + (bat * H + head).to(tl.int64) * sq + row, m + tl.log(total), mask=write)


def streamk_merge(o_part, lse_part, table, out, lse, n_full: int, sq: int) -> None:
    """Merge the pieces of each tail tile (``table`` int32 (n_tail, P_MAX), workspace slots, -1 padded) from
    ``o_part`` (slots, 192, D) / ``lse_part`` (slots, 192) into ``out`` (B, Sq, H, D) and ``lse`` (B, H, Sq) (None:
    not written)."""
    n_tail, p_max = table.shape
    B, sq_, H, D = out.shape
    n_m = -(-sq // TILE_M)
    _streamk_merge_kernel[(n_tail, TILE_M // 64)](
        o_part, lse_part, table, out, lse if lse is not None else lse_part, n_full, n_m, H, sq, P_MAX=p_max, D=D,
        TILE=TILE_M, BLOCK=64, WRITE_LSE=lse is not None)


# ---------------------------------------------------------------------- compile / run
def _compile_args(dtype_out):
    from cutlass.cute.runtime import make_ptr

    gm = cute.AddressSpace.gmem
    args = list(K._compile_args(dtype_out))
    ws = [make_ptr(dtype_out, 0, gm, assumed_align=16), make_ptr(Float32, 0, gm, assumed_align=4)]
    return tuple(args[:8] + ws + args[8:] + [Int32(0), Int32(0), Int32(0)])


def compile_streamk(head_dim: int, dtype_out, *, fake: bool, arch: str = "sm_90a", options_extra: str = "",
                    config: Sm90Config | None = None, qk_int8: bool = False):
    """``K.compile_sm90``'s contract (no key_lens, no TVM-FFI) with the workspace pointers after ``lse`` and
    (n_full, n_tail, T) before the stream."""
    dtype_out = K._out_dtype(dtype_out)
    config = config or K.config_for(arch, head_dim)
    kern = Sm90Fp8StreamKAttention(head_dim, dtype_out, config, qk_int8=qk_int8)
    smem = K.smem_bytes(head_dim, config) + TILE_M_WG * config.consumer_wgs * head_dim  # the second Q box
    return K.compile_kernel(kern, _compile_args(dtype_out), fake=fake, arch=arch, options_extra=options_extra,
                            smem=smem)


_FNS: dict = {}
_TABLES: dict = {}


def plan_for(device, B: int, H: int, sq: int, sk: int, n_sms: int | None = None) -> tuple[int, int, int]:
    import torch

    if n_sms is None:
        n_sms = torch.cuda.get_device_properties(device).multi_processor_count
    n_tiles = -(-sq // TILE_M) * H * B
    return plan(n_tiles, n_sms, -(-sk // Sm90Config().tile_n))


def run_streamk(prep, softmax_scale: float, out, lse, n_sms: int | None = None, merge: bool = True):
    """Kernel (+ merge) on the current stream on a shipped prep (``fp8_prepare``; INT8 when it has Q scales):
    out (B, Sq, H, D) bf16/fp16 contiguous and 16-byte aligned, lse (B, H, Sq) fp32. Returns the plan."""
    import torch
    from fp8_fwd_sm90_splitkv import launch_jit_with_workspace

    from ditprof.kernels.launch import DTYPE_NAMES

    B, H, sq_pad, D = prep.q8.shape
    sq, sk = int(prep.sq), int(prep.sk)
    if tuple(out.shape) != (B, sq, H, D) or not out.is_contiguous() or out.data_ptr() % 16:
        raise ValueError("out must be a contiguous, 16-byte aligned (B, Sq, H, D) tensor")
    qk_int8 = prep.q_scales is not None
    n_full, n_tail, n_ctas_tail = plan_for(out.device, B, H, sq, sk, n_sms)
    n_kt = -(-sk // Sm90Config().tile_n)
    slots = max(2 * n_ctas_tail, 1)
    o_part = torch.empty((slots, TILE_M, D), dtype=out.dtype, device=out.device)
    lse_part = torch.empty((slots, TILE_M), dtype=torch.float32, device=out.device)
    key = (D, out.dtype, qk_int8)
    if key not in _FNS:
        _FNS[key] = compile_streamk(D, str(out.dtype), fake=False, qk_int8=qk_int8)
    qs = prep.q_scales if qk_int8 else prep.scales  # key_lens: not read (any valid pointer)
    launch_jit_with_workspace(_FNS[key], (prep.q8, prep.k8, prep.v8t, prep.scales, qs, prep.scales, out, lse, o_part,
                                          lse_part), (B, H, sq, sk, sq_pad, prep.k8.shape[2]), softmax_scale,
                              (n_full, n_tail, n_ctas_tail), DTYPE_NAMES[out.dtype],
                              torch.cuda.current_stream().cuda_stream)
    if n_tail and merge:
        tkey = (n_full, n_tail, n_ctas_tail, n_kt, out.device)
        if tkey not in _TABLES:
            rows = piece_table(n_full, n_tail, n_ctas_tail, n_kt)
            p_max = max(1, max(len(r) for r in rows))
            _TABLES[tkey] = torch.tensor([r + [-1] * (p_max - len(r)) for r in rows], dtype=torch.int32,
                                         device=out.device)
        streamk_merge(o_part, lse_part, _TABLES[tkey], out, lse, n_full, sq)
    return n_full, n_tail, n_ctas_tail


__all__ = ["Sm90Fp8StreamKAttention", "compile_streamk", "host_segments", "piece_table", "plan", "plan_for",
           "run_streamk", "segments", "streamk_merge"]
