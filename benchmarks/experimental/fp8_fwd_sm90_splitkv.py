"""A split-KV "tail" version of the shipped Hopper FP8 attention kernel (issue 17's short shapes, issue 20), as an
experiment: ``ditprof/kernels/fp8_fwd_sm90.py`` is unchanged, this module subclasses it.

Why: the shipped grid has one CTA per 192-row work tile, and the last wave of CTAs leaves most SMs idle: flux
(1,24,4608,128) has 576 tiles = 4 rounds of 132 SMs + 48 (the 5th round runs 48 SMs: ~9-13 % of the kernel idle),
ltx (1,32,7392,64) 1248 = 9 rounds + 60, h3 (1,56,30272,128) 8848 = 67 rounds + 4 (a ~0.4 ms round on 4 SMs).

Design
------
* ``splits_for(n_tiles, n_sms, key_tiles)``: n_tail = n_tiles % n_sms tail tiles, each split into
  ``splits = min(n_sms // n_tail, key_tiles, MAX_SPLITS)`` parts along the keys (no split when that is < 2).
* 1-D grid of ``n_full + n_tail * splits`` CTAs. CTA t < n_full runs work tile t exactly as the shipped kernel does
  (tiles in its order: m_block fastest, then head, then batch; the same key tiles, the same arithmetic, so its rows
  are bit-identical to the shipped kernel's). CTA t >= n_full runs part ``(t - n_full) % splits`` of work tile
  ``n_full + (t - n_full) // splits``: the tail tiles are the last ones in launch order (the hardware launches
  blockIdx.x in order), so they fill the last round.
* Part p of a tile with n_kt key tiles runs key tiles [p * n_kt // splits, (p + 1) * n_kt // splits): boundaries on
  multiples of tile_n, at least one key tile each when n_kt >= splits (always without key_lens: splits <=
  key_tiles). With key_lens an item may have fewer key tiles than parts: the empty parts load nothing and write
  LSE = -inf and O = 0, which the merge weighs with 0.
* The producer starts its K/V tile index at ``begin``; the consumers run the shipped ``attend`` over ``end - begin``
  tiles (no new state in the key loop: 0 spills at 160 registers). Masking: only the part holding the item's last key
  tile masks, at global tile n_kt - 1 (the ``mask_tile`` override recomputes that from blockIdx.x and the key count;
  it runs once, on the part's last tile).
* Tail parts write their normalised O (output dtype) and fp32 LSE into a workspace, O_part (splits, n_tail, 192, D)
  and LSE_part (splits, n_tail, 192) (row = local row of the work tile; rows past Sq are not written), through the
  shipped ``epilogue`` with workspace views. ``splitkv_merge`` (one Triton launch, a program per (tail tile, 64
  rows)) then writes LSE = logsumexp_p LSE_p and O = sum_p exp(LSE_p - LSE) O_p into the real output and LSE.
* e4m3 and INT8 Q/K, with or without key_lens.

Arguments: the shipped kernel's (q8, k8, v8t, scales, q_scales, key_lens, out, lse), then o_part, lse_part, then
(B, H, Sq, Sk, Sq_pad, Sk_pad, softmax_scale), then ``n_full`` and ``splits`` (Int32; splits = 1 and n_full = the
work tile count: the plain grid, the workspace is not touched), then the stream.
"""

from __future__ import annotations

import dataclasses

from types import SimpleNamespace

import cuda.bindings.driver as cuda
import cutlass
from cutlass import Float32, Int32, const_expr, cute, pipeline

from ditprof.kernels import fp8_fwd_sm90 as K
from ditprof.kernels.fp8_fwd_sm90 import (
    TILE_M_WG,
    Sm90Config,
    Sm90Fp8Attention,
)

MAX_SPLITS = 32  # parts per tail tile at most: more parts than this buy nothing (each keeps a Q load and epilogue)


# ---------------------------------------------------------------------- the schedule (host and device share it)
def splits_for(n_tiles: int, n_sms: int, key_tiles: int, cap: int = MAX_SPLITS) -> tuple[int, int, int]:
    """(n_full, n_tail, splits) for ``n_tiles`` work tiles of ``key_tiles`` key tiles on ``n_sms`` SMs: the tiles of
    the last, partial round split into ``splits`` key ranges so that n_tail * splits CTAs fill it. No split
    (n_full = n_tiles, n_tail = 0, splits = 1) when the rounds are whole or fewer than 2 parts would fit."""
    if n_tiles < 1 or n_sms < 1:
        raise ValueError(f"n_tiles and n_sms must be >= 1, got {n_tiles}, {n_sms}")
    n_tail = n_tiles % n_sms
    if n_tail == 0:
        return n_tiles, 0, 1
    splits = min(n_sms // n_tail, key_tiles, cap)
    if splits < 2:
        return n_tiles, 0, 1
    return n_tiles - n_tail, n_tail, splits


def cta_work(cta, n_full, splits, mn=min, mx=max):
    """(work tile, part, parts of that tile) of CTA ``cta``: full CTAs are part 0 of 1 of tile ``cta``, tail CTAs
    part (cta - n_full) % splits of tile n_full + (cta - n_full) // splits. Branch-free; ``mn`` / ``mx`` are
    ``cutlass.min`` / ``cutlass.max`` in the kernel and the builtins in the host model (the tests)."""
    rel = mx(cta - n_full, 0)  # 0 for every full CTA
    is_tail = mn(mx(cta + 1 - n_full, 0), 1)  # 1 from the first tail CTA on
    parts = 1 + is_tail * (splits - 1)
    return cta - rel + rel // splits, rel % splits, parts


def part_range(part, parts, n_kt):
    """Key tiles [begin, end) of part ``part`` of ``parts`` over ``n_kt`` key tiles (multiples of tile_n; each part
    gets at least one when n_kt >= parts, the last part always ends at n_kt)."""
    return part * n_kt // parts, (part + 1) * n_kt // parts


def work_coords(t, n_m, heads):
    """(m_block, head, batch) of work tile t in the shipped grid's order: m_block fastest, then head, then batch."""
    rest = t // n_m
    return t - rest * n_m, rest % heads, rest // heads


class Sm90Fp8SplitKVAttention(Sm90Fp8Attention):
    """The shipped kernel's sections on a 1-D grid whose tail work tiles are split along the keys."""

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
        splits: Int32,
        stream: cuda.CUstream,
    ):
        args, layouts = self.kernel_args(pQ, pK, pV, pScales, pQScales, pKeyLens, pO, pLSE, batch, heads, sq, sk,
                                         sq_pad, sk_pad)
        n_m = cute.ceil_div(sq, self.tile_m)
        n_tail = n_m * heads * batch - n_full
        D = self.head_dim
        # workspace rows are the work tile's local rows: (row, col, tail tile, part) as the epilogue indexes mO
        mOPart = cute.make_tensor(pOPart, cute.make_layout(
            (self.tile_m, D, n_tail, splits), stride=(D, 1, self.tile_m * D, n_tail * self.tile_m * D)))
        mLSEPart = cute.make_tensor(pLSEPart, cute.make_layout(
            (self.tile_m, n_tail, splits), stride=(1, self.tile_m, n_tail * self.tile_m)))
        self.launch_kernel(args, layouts, sq, sk, softmax_scale, (mOPart, mLSEPart, n_m, heads, n_full, splits),
                           (n_full + n_tail * splits, 1, 1), stream)

    # ------------------------------------------------------------------ the shipped kernel's sections, overridden
    # (kernel arguments: the shipped ones, extra = (mOPart, mLSEPart, n_m, heads, n_full, splits))
    def work_tile(self, k):
        cta, _, _ = cute.arch.block_idx()
        return SimpleNamespace(cta=cta)

    def smem_setup(self, k, w, tidx):
        """The CTA's (work tile, part) and its key tiles [begin, end), then the shipped set-up."""
        mOPart, mLSEPart, n_m, heads, n_full, splits = k.extra
        # kernel parameters (constant bank): ``mask_tile`` reads them on the last key tile, no register kept
        self.split_params = (n_full, splits)
        w.t, w.part, w.parts = cta_work(w.cta, n_full, splits, cutlass.min, cutlass.max)
        w.m_block, w.head, w.bat = work_coords(w.t, n_m, heads)
        storage, q_pipe, k_pipe, v_pipe, sQ, sK, sV, sPin = self.shared_setup(k.sQ_layout, k.sK_layout, k.sV_layout)
        w.begin, w.end = part_range(w.part, w.parts, self.key_tiles(k.mKeyLens, w.bat, k.sk))
        bias_ptr = self.shared_constants(storage, k.sOnes_layout, sPin, tidx)
        return SimpleNamespace(storage=storage, q_pipe=q_pipe, k_pipe=k_pipe, v_pipe=v_pipe, sQ=sQ, sK=sK, sV=sV,
                               sPin=sPin, bias_ptr=bias_ptr)

    def producer(self, k, w, s):
        self.produce(k.tma_q, k.mQ, k.tma_k, k.mK, k.tma_v, k.mV, s.sQ, s.sK, s.sV, s.q_pipe, s.k_pipe, s.v_pipe,
                     w.m_block, w.head, w.bat, w.begin, w.end)

    @cute.jit
    def produce(self, tma_q, mQ, tma_k, mK, tma_v, mV, sQ, sK, sV, q_pipe, k_pipe, v_pipe, m_block, head, bat,
                begin, end):
        """The producer warp: Q, then K/V tiles begin .. end-1 (nothing for an empty part: no consumer waits)."""
        if end > begin:
            tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV = self.producer_views(tma_q, mQ, tma_k, mK, tma_v, mV, sQ, sK, sV)
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
            self.load_q(q_pipe, q_state, tma_q, tQgQ, tQsQ, m_block, head, bat)
            kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.kv_stages)
            for j in cutlass.range(begin, end, unroll=1):
                # the shipped ``load_kv`` from key tile ``begin`` on instead of 0
                k_pipe.producer_acquire(kv_state)
                cute.copy(tma_k, tKgK[(None, j, 0, head, bat)], tKsK[(None, kv_state.index)],
                          tma_bar_ptr=k_pipe.producer_get_barrier(kv_state))
                v_pipe.producer_acquire(kv_state)
                cute.copy(tma_v, tVgV[(None, 0, j, head, bat)], tVsV[(None, kv_state.index)],
                          tma_bar_ptr=v_pipe.producer_get_barrier(kv_state))
                kv_state.advance()

    @cute.jit
    def consumer(self, k, w, s, f, warp_idx):
        mOPart, mLSEPart, n_m, heads, n_full, splits = k.extra
        row0 = w.m_block * self.tile_m + f.wg * TILE_M_WG
        qk_scale = self.tile_qk_scale(k.mScales, k.mQScales, k.scale_log2, row0, w.head, w.bat, k.sq, f.wg_tidx)
        row_max = cute.make_rmem_tensor((2,), Float32)
        row_sum = cute.make_rmem_tensor((2,), Float32)
        row_max.fill(-Float32.inf)
        row_sum.fill(0.0)
        preset = self.accumulator_preset(s, f)
        if const_expr(self.key_lens):
            # only with key_lens can a part get no key tile (an item with fewer key tiles than parts)
            if w.end > w.begin:
                self.consume(f, s.q_pipe, s.k_pipe, s.v_pipe, w.end - w.begin, qk_scale, row_max, row_sum,
                             k.mKeyLens, w.bat, k.sk, s.sPin, warp_idx, preset, k.mScales, k.mO, k.mLSE, mOPart,
                             mLSEPart, k.sq, row0, w.m_block, w.head, w.t - n_full, w.part, w.parts)
            else:
                self.empty_part(mOPart, mLSEPart, k.sq - w.m_block * self.tile_m, f.wg * TILE_M_WG, w.t - n_full,
                                w.part, f.wg_tidx)
        else:
            self.consume(f, s.q_pipe, s.k_pipe, s.v_pipe, w.end - w.begin, qk_scale, row_max, row_sum, k.mKeyLens,
                         w.bat, k.sk, s.sPin, warp_idx, preset, k.mScales, k.mO, k.mLSE, mOPart, mLSEPart, k.sq,
                         row0, w.m_block, w.head, w.t - n_full, w.part, w.parts)

    @cute.jit
    def consume(self, f, q_pipe, k_pipe, v_pipe, n_tiles, qk_scale, row_max, row_sum, mKeyLens, bat, sk, sPin,
                warp_idx, bias_ptr, mScales, mO, mLSE, mOPart, mLSEPart, sq, row0, m_block, head, tail, part,
                parts):
        """The shipped consumer over ``n_tiles`` key tiles; the epilogue into the output (a full work tile) or into
        the workspace at (local rows, tail tile ``tail``, part) (a part of a tail tile)."""
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        self.attend(f, q_pipe, q_state, k_pipe, v_pipe, kv_state, f.wg, n_tiles, qk_scale, row_max, row_sum,
                    mKeyLens, bat, sk, sPin, warp_idx, bias_ptr)
        o_scale = mScales[2, head, bat]  # read only now: one register less across the main loop (as shipped)
        if parts == 1:
            self.epilogue(f.acc_O, row_max, row_sum, qk_scale, o_scale, mO, mLSE, sq, row0, head, bat, f.wg_tidx)
        else:
            self.epilogue(f.acc_O, row_max, row_sum, qk_scale, o_scale, mOPart, mLSEPart,
                          sq - m_block * self.tile_m, f.wg * TILE_M_WG, tail, part, f.wg_tidx)

    @cute.jit
    def empty_part(self, mOPart, mLSEPart, sq_local, row0, tail, part, wg_tidx):
        """A part with no key (key_lens): LSE = -inf and O = 0, which the merge weighs with exp(-inf) = 0."""
        warp = wg_tidx // 32
        lane = wg_tidx % 32
        quad = lane % 4
        for r in cutlass.range_constexpr(2):
            row = self.thread_row(row0, warp, lane, r)
            if row < sq_local:
                if quad == 0:
                    mLSEPart[row, tail, part] = -Float32.inf
                for j in cutlass.range_constexpr(self.head_dim // 8):
                    col = 8 * j + 2 * quad
                    mOPart[row, col, tail, part] = Float32(0.0).to(self.dtype_out)
                    mOPart[row, col + 1, tail, part] = Float32(0.0).to(self.dtype_out)

    @cute.jit
    def mask_tile(self, acc_S: cute.Tensor, tile: Int32, sk: Int32, quad: Int32):
        """``attend`` calls this on its last tile with the local index; ``sk`` is the item's key count. Only the part
        that holds the item's last key tile masks, at the global index of that tile (n_kt - 1; every full CTA
        holds its last tile and its local index is that one). Recomputed here from blockIdx.x and the kernel
        parameters rather than kept in a register across the key loop."""
        n_full, splits = self.split_params
        cta, _, _ = cute.arch.block_idx()
        _, part, parts = cta_work(cta, n_full, splits, cutlass.min, cutlass.max)
        if part == parts - 1:
            n_kt = cutlass.max(cute.ceil_div(sk, self.tile_n), 1)  # ``key_tiles`` from the clamped key count
            Sm90Fp8Attention.mask_tile(self, acc_S, n_kt - 1, sk, quad)


# ---------------------------------------------------------------------- compile / run API
def work_tiles(B: int, H: int, sq: int, config: Sm90Config | None = None) -> int:
    """Number of (m_block, head, batch) work tiles of the shipped grid."""
    c = config or Sm90Config()
    return -(-sq // (TILE_M_WG * c.consumer_wgs)) * H * B


def key_tiles(sk: int, config: Sm90Config | None = None) -> int:
    c = config or Sm90Config()
    return -(-sk // c.tile_n)


def _compile_args(dtype_out):
    from cutlass.cute.runtime import make_ptr

    gm = cute.AddressSpace.gmem
    shipped = K._compile_args(dtype_out)
    # the shipped pointers, then o_part / lse_part, then the sizes and scale, then n_full / splits
    return (shipped[:8] + (make_ptr(dtype_out, 0, gm, assumed_align=4), make_ptr(Float32, 0, gm, assumed_align=4))
            + shipped[8:] + (Int32(1), Int32(1)))


def compile_splitkv(head_dim: int, dtype_out, *, fake: bool, arch: str = "sm_90a", options_extra: str = "",
                    tvm_ffi: bool = False, config: Sm90Config | None = None, key_lens: bool = False,
                    qk_int8: bool = False):
    """``K.compile_sm90``'s contract with o_part, lse_part after the shipped pointers and n_full, splits before the
    stream (see the module docstring)."""
    dtype_out = K._out_dtype(dtype_out)
    # the build that was measured: the LDS accumulator preset (with the wgmma preset ptxas spills 8 bytes here)
    config = config or dataclasses.replace(K.config_for(arch, head_dim), mma_preset=False)
    kern = Sm90Fp8SplitKVAttention(head_dim, dtype_out, config, key_lens=key_lens, qk_int8=qk_int8)
    return K.compile_kernel(kern, _compile_args(dtype_out), fake=fake, arch=arch, options_extra=options_extra,
                            tvm_ffi=tvm_ffi, smem=K.smem_bytes(head_dim, config, qk_int8=qk_int8))  # the shipped smem


_CACHE: dict = {}


def compiled(head_dim: int, out_dtype: str, key_lens: bool, qk_int8: bool, tvm_ffi: bool, cache: dict | None = None):
    """The compiled split-KV kernel for the current device (cached per process, or in ``cache``)."""
    cache = _CACHE if cache is None else cache
    key = (head_dim, out_dtype, key_lens, qk_int8, tvm_ffi)
    fn = cache.get(key)
    if fn is None:
        fn = cache[key] = compile_splitkv(head_dim, out_dtype, fake=False, tvm_ffi=tvm_ffi, key_lens=key_lens,
                                          qk_int8=qk_int8)
    return fn


def plan_for(device, B: int, H: int, sq: int, sk: int, n_sms: int | None = None) -> tuple[int, int, int]:
    """``splits_for`` on the device's SM count (or ``n_sms``)."""
    import torch

    if n_sms is None:
        n_sms = torch.cuda.get_device_properties(device).multi_processor_count
    return splits_for(work_tiles(B, H, sq), n_sms, key_tiles(sk))


def run_splitkv(q8, k8, v8t, scales, sq: int, sk: int, softmax_scale: float, out, lse, key_lens=None,
                q_scales=None, n_sms: int | None = None, plan: tuple[int, int, int] | None = None,
                tvm_ffi: bool | None = None, cache: dict | None = None, merge: bool = True) -> tuple[int, int, int]:
    """Kernel + merge on the current stream, on the shared prep's tensors (q8/k8 float8_e4m3fn, or int8 with
    ``q_scales`` (B,H,Sq_pad) fp32; v8t float8_e4m3fn; scales (B,H,3) fp32; out (B,Sq,H,D) bf16/fp16 contiguous;
    lse (B,H,Sq) fp32; key_lens (B,) int32 or None). ``plan``: (n_full, n_tail, splits) (default ``plan_for`` on
    ``n_sms`` or the device's SM count). ``cache``: a dict for the compiled kernels (default: this module's).
    ``merge=False``: the kernel only (the tail rows are left unwritten; for timing the two launches apart).
    Returns the plan used."""
    import torch

    from ditprof.kernels.launch import DTYPE_NAMES, LAUNCH_INFO, tvm_ffi_launch_enabled
    from splitkv_merge import splitkv_merge

    B, H, sq_pad, D = q8.shape
    sk_pad = k8.shape[2]
    if tuple(out.shape) != (B, sq, H, D) or tuple(lse.shape) != (B, H, sq) or not out.is_contiguous():
        raise ValueError("out (B,Sq,H,D) and lse (B,H,Sq) contiguous expected")
    if torch.cuda.get_device_capability(q8.device) != (9, 0):
        raise ValueError("the split-KV fp8-sm90 kernel needs an sm_90 GPU (H100/H200)")
    qk_int8 = q8.dtype == torch.int8
    if qk_int8 != (q_scales is not None):
        raise ValueError("int8 Q/K takes per-row Q descales (q_scales), e4m3 does not")
    n_full, n_tail, splits = plan if plan is not None else plan_for(q8.device, B, H, sq, sk, n_sms)
    if n_full + n_tail != work_tiles(B, H, sq) or (n_tail > 0) != (splits > 1) or splits < 1:
        raise ValueError(f"bad plan {(n_full, n_tail, splits)} for {work_tiles(B, H, sq)} work tiles")
    tile_m = TILE_M_WG * Sm90Config().consumer_wgs
    if n_tail:
        o_part = torch.empty((splits, n_tail, tile_m, D), dtype=out.dtype, device=out.device)
        lse_part = torch.empty((splits, n_tail, tile_m), dtype=torch.float32, device=out.device)
    else:  # never read or written: the plain grid
        o_part, lse_part = out, lse
    if tvm_ffi is None:
        tvm_ffi = tvm_ffi_launch_enabled()
    lens = key_lens if key_lens is not None else scales  # not read unless compiled with key_lens
    qs = q_scales if q_scales is not None else scales  # not read unless compiled with qk_int8
    stream = torch.cuda.current_stream(q8.device).cuda_stream
    sizes = (B, H, sq, sk, sq_pad, sk_pad)
    launched = False
    if tvm_ffi:
        try:
            compiled(D, DTYPE_NAMES[out.dtype], key_lens is not None, qk_int8, True, cache)(
                q8.data_ptr(), k8.data_ptr(), v8t.data_ptr(), scales.data_ptr(), qs.data_ptr(), lens.data_ptr(),
                out.data_ptr(), lse.data_ptr(), o_part.data_ptr(), lse_part.data_ptr(), *sizes,
                float(softmax_scale), int(n_full), int(splits), stream)
            LAUNCH_INFO["last_launch"] = "tvm_ffi"
            launched = True
        except Exception as exc:  # noqa: BLE001 -- argument conversion fails before anything is launched
            LAUNCH_INFO["tvm_ffi_error"] = f"{type(exc).__name__}: {exc}"[:500]
    if not launched:
        launch_jit_with_workspace(compiled(D, DTYPE_NAMES[out.dtype], key_lens is not None, qk_int8, False, cache),
                                  (q8, k8, v8t, scales, qs, lens, out, lse, o_part, lse_part), sizes, softmax_scale,
                                  (n_full, splits), DTYPE_NAMES[out.dtype], stream)
        LAUNCH_INFO["last_launch"] = "jit"
    if n_tail and merge:
        splitkv_merge(o_part, lse_part, out, lse, n_full, sq)
    return n_full, n_tail, splits


def launch_jit_with_workspace(fn, tensors, sizes, softmax_scale, trailing: tuple, out_dtype: str, stream) -> None:
    """cute's JIT path of a build with the shipped kernel's 8 tensors, then a workspace's O and LSE, the sizes and
    the softmax scale, then the Int32s ``trailing`` (split-KV: n_full, splits; stream-K: n_full, n_tail, T)."""
    from cutlass.cute.runtime import make_ptr

    gm = cute.AddressSpace.gmem
    u8 = cutlass.Uint8
    out_t = K._out_dtype(out_dtype)
    types = ((u8, 16), (u8, 16), (u8, 16), (Float32, 4), (Float32, 4), (Int32, 4), (out_t, 16), (Float32, 4),
             (out_t, 16), (Float32, 4))
    ptrs = [make_ptr(ty, t.data_ptr(), gm, assumed_align=a) for (ty, a), t in zip(types, tensors)]
    fn(*ptrs, *(Int32(x) for x in sizes), Float32(softmax_scale), *(Int32(x) for x in trailing), cuda.CUstream(stream))


__all__ = ["MAX_SPLITS", "Sm90Fp8SplitKVAttention", "compile_splitkv", "compiled", "cta_work", "key_tiles",
           "launch_jit_with_workspace", "part_range", "plan_for", "run_splitkv", "splits_for", "work_coords",
           "work_tiles"]
