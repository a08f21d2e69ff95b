"""The shipped Hopper FP8 attention kernel's INT8 path with one K descale and one V descale per 160-key kernel tile
(issue 20 lever 1, kernel side), as an experiment: ``ditprof/kernels/fp8_fwd_sm90.py`` is unchanged, this module
subclasses it.

Why: a prep that reads Q, K and V once (no stats pass) cannot know a per-head K or V amax before it quantizes; it
gives one descale per kernel tile instead (``benchmarks/NOTES.md``, "Session 11 (CPU): issue 20 lever 1": as
accurate as the shipped numerics). The kernel then has to fold a different K descale and V descale into every tile.

Design (INT8 Q/K only; tiles of ``Sm90Config.tile_n`` = 160 keys; everything else is the shipped kernel's)
--------------------------------------------------------------------------------------------------------------
* K: raw S (int32 on top of S_BIAS, read as floats) is no longer comparable across tiles, so the running row max is
  kept in the exp2 domain. Per row and tile: c = q_scale_row * fp32(dk_j * softmax_scale * log2 e) (the shipped
  kernel's qk_scale with dk_j for the per-head dk: bit for bit the same c when every dk_j equals it);
  m_tile = (max raw S of the tile - S_BIAS) * c (the subtraction is exact: integers below 2**24);
  m_new = max(m_old, m_tile); alpha = exp2(m_old - m_new); bias = fma(S_BIAS, c, m_new - 8), so
  P*256 = exp2(S_raw * c - bias) stays one FFMA per score with a per-row constant (``row_max_update``; the shipped
  ``row_exp_sum`` is reused as is). dk_j is read from global memory once per tile, the load issued right after the
  tile's Q K^T wgmmas and before their wait, so its latency hides behind the MMA.
* V: acc_O is kept in units of the last merged tile's dv. Merging tile j: l = l * alpha + rowsum(P8) (l has no V
  units), then alpha_keep *= dv_{j-1} / dv_j in place (one MUFU.RCP and a few FMULs per thread and tile), then
  acc_O = acc_O * alpha_keep + acc_Ot slice by slice (``pv_sliced``). dv_{j-1} and dv_j are loaded at the top of the
  iteration (before the V wait), not kept across the loop. Epilogue: O = acc_O * dv_last / l.
* LSE = ln 2 * (m - 8 + log2 l): m is already in the exp2 domain (no S_BIAS, no scale).
* Key lengths (key_lens) are not supported (ValueError); neither is the e4m3 Q/K format.

Arguments: the shipped kernel's (q8, k8, v8t, scales, q_scales, key_lens, out, lse) then ``k_tile_scales`` and
``v_tile_scales`` (float32 (B, H, n_tiles), n_tiles = ceil(Sk_pad / 160)), then (B, H, Sq, Sk, Sq_pad, Sk_pad,
softmax_scale, stream). ``scales`` and ``key_lens`` are not read (any valid pointer will do).

The torch model of these numerics, and the prep's numerics in torch, are ``tile_scales_model`` and
``make_tile_scaled_inputs`` below (``test_fp8_sm90_tile_scales_sass.py`` checks them on the CPU).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import torch
from cutlass import BFloat16, Float32, Int32, const_expr, cute, pipeline
from cutlass.cute.nvgpu import warpgroup

from ditprof.kernels import fp8_fwd_sm90 as K
from ditprof.kernels.fp8_fwd_sm90 import (
    LN2,
    LOG2E,
    S_BIAS,
    TILE_M_WG,
    Sm90Config,
    Sm90Fp8Attention,
)

TILE_N = 160  # the kernel tile the descales belong to (Sm90Config.tile_n)


class Sm90Fp8TileScalesAttention(Sm90Fp8Attention):
    """The shipped INT8 kernel with per-key-tile K and V descales (module docstring)."""

    def __init__(self, head_dim: int = 128, dtype_out=BFloat16, config: Sm90Config | None = None,
                 key_lens: bool = False, qk_int8: bool = True):
        if not qk_int8:
            raise ValueError("the per-tile-descale fp8-sm90 variant is INT8 Q/K only (qk_int8=True)")
        if key_lens:
            raise ValueError("the per-tile-descale fp8-sm90 variant does not support key_lens")
        super().__init__(head_dim, dtype_out, config, key_lens=False, qk_int8=True)
        if self.tile_n != TILE_N:
            raise ValueError(f"the tile descales are per {TILE_N} keys: tile_n must be {TILE_N}")

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
        pKTileScales: cute.Pointer,
        pVTileScales: cute.Pointer,
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
        n_t = cute.ceil_div(sk_pad, self.tile_n)
        tile_layout = cute.make_layout((n_t, heads, batch), stride=(1, n_t, heads * n_t))
        mKT = cute.make_tensor(pKTileScales, tile_layout)
        mVT = cute.make_tensor(pVTileScales, tile_layout)
        self.launch_kernel(args, layouts, sq, sk, softmax_scale, (mKT, mVT),
                           (cute.ceil_div(sq, self.tile_m), heads, batch), stream)

    # ------------------------------------------------------------------ the shipped kernel's sections, overridden
    # (kernel arguments: the shipped ones, extra = (mKT, mVT)); the producer is the shipped one
    def consumer(self, k, w, s, f, warp_idx):
        mKT, mVT = k.extra
        row0 = w.m_block * self.tile_m + f.wg * TILE_M_WG
        q_rows = self.row_q_scales(k.mQScales, row0, w.head, w.bat, k.sq, f.wg_tidx)
        row_max = cute.make_rmem_tensor((2,), Float32)
        row_sum = cute.make_rmem_tensor((2,), Float32)
        row_max.fill(-Float32.inf)
        row_sum.fill(0.0)

        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        self.attend_tiles(f, s.q_pipe, q_state, s.k_pipe, s.v_pipe, kv_state, f.wg, s.n_tiles, q_rows, k.scale_log2,
                          row_max, row_sum, mKT, mVT, w.head, w.bat, k.sk, s.sPin, self.accumulator_preset(s, f))
        # the last tile's V descale: acc_O is in its units
        self.epilogue(f.acc_O, row_max, row_sum, None, mVT[s.n_tiles - 1, w.head, w.bat], k.mO, k.mLSE, k.sq,
                      row0, w.head, w.bat, f.wg_tidx)

    # ------------------------------------------------------------------ consumer sections
    @cute.jit
    def row_q_scales(self, mQScales: cute.Tensor, row0, head, bat, sq, wg_tidx) -> cute.Tensor:
        """The per-row Q descales of the thread's two rows (rows past sq read the last row's: never written out).
        Kept unscaled so that c = q * fp32(dk_j * scale_log2) rounds as the shipped kernel's qk_scale does."""
        q_rows = cute.make_rmem_tensor((2,), Float32)
        for r in cutlass.range_constexpr(2):
            row = cutlass.min(self.thread_row(row0, wg_tidx // 32, wg_tidx % 32, r), sq - 1)
            q_rows[r] = mQScales[row, head, bat]
        return q_rows

    @cute.jit
    def tile_c(self, q_rows: cute.Tensor, dk: Float32, scale_log2: Float32) -> cute.Tensor:
        """c per row for a tile with K descale dk: raw S -> exp2 domain (the shipped qk_scale's formula)."""
        k_scale = dk * scale_log2
        c = cute.make_rmem_tensor((2,), Float32)
        for r in cutlass.range_constexpr(2):
            c[r] = q_rows[r] * k_scale
        return c

    @cute.jit
    def qk_tile(self, f, k_pipe, state, q_slot: Int32, bias_ptr, mKT: cute.Tensor, tile: Int32, head: Int32,
                bat: Int32) -> Float32:
        """S_tile = Q K_tile^T into f.acc_S (complete on return); returns the tile's K descale, whose load is
        issued between the wgmma issue and its wait so that the MMA hides its latency."""
        k_pipe.consumer_wait(state)
        self.gemm_qk(f.qk_mma_zero, f.qk_mma, f.acc_S, f.tSrQ, f.tSrK, q_slot, state.index, bias_ptr)
        dk = mKT[tile, head, bat]
        warpgroup.wait_group(0)
        k_pipe.consumer_release(state)
        return dk

    @cute.jit
    def attend_tiles(self, f, q_pipe, q_state, k_pipe, v_pipe, kv_state, q_slot: Int32, n_tiles: Int32,
                     q_rows: cute.Tensor, scale_log2: Float32, row_max: cute.Tensor, row_sum: cute.Tensor,
                     mKT: cute.Tensor, mVT: cute.Tensor, head: Int32, bat: Int32, sk: Int32, sPin: cute.Tensor,
                     bias_ptr):
        """The shipped ``attend`` (serial schedule, P_{j-1} V_{j-1} merged in iteration j, the clock fence) with
        the tile descales: dk_j enters the softmax of tile j, dv_{j-2} / dv_{j-1} the merge of tile j-1."""
        quad = f.wg_tidx % 4
        q_pipe.consumer_wait(q_state)

        # prologue: S_0, softmax_0 (masked if it is also the last tile), P_0
        dk = self.qk_tile(f, k_pipe, kv_state, q_slot, bias_ptr, mKT, 0, head, bat)
        if n_tiles == 1:
            self.mask_tile(f.acc_S, 0, sk, quad)
        alpha0 = self.softmax_stats(f.acc_S, row_max, row_sum, self.tile_c(q_rows, dk, scale_log2))
        f.alpha_keep[0] = alpha0[0]
        f.alpha_keep[1] = alpha0[1]
        self.pack_p(f.S_as_pack, f.P_as_pack)
        v_state = kv_state.clone()
        kv_state.advance()
        # acc_O's V units: tile 0's before the first merge (alpha_keep is 0 then anyway), then the last merged
        # tile's, carried in one register (re-loading dv_{j-2} costs more address arithmetic than it saves)
        dv_prev = mVT[0, head, bat]
        for j in cutlass.range(1, n_tiles, unroll=1):
            dv_cur = mVT[j - 1, head, bat]
            v_pipe.consumer_wait(v_state)
            self.pv_tile(f, v_state.index, row_sum, dv_prev, dv_cur)
            dv_prev = dv_cur
            # the shipped clock fence (never taken): keeps the next QK's set-up out of the merge
            c = cute.arch.clock()
            if sk < 0:
                sPin[0] = Float32(c)
            v_pipe.consumer_release(v_state)
            v_state.advance()
            dk = self.qk_tile(f, k_pipe, v_state, q_slot, bias_ptr, mKT, j, head, bat)
            if j == n_tiles - 1:
                self.mask_tile(f.acc_S, j, sk, cute.arch.lane_idx() % 4)
            alpha = self.softmax_stats(f.acc_S, row_max, row_sum, self.tile_c(q_rows, dk, scale_log2))
            f.alpha_keep[0] = alpha[0]
            f.alpha_keep[1] = alpha[1]
            self.pack_p(f.S_as_pack, f.P_as_pack)
        # the last tile's P V
        dv_cur = mVT[n_tiles - 1, head, bat]
        v_pipe.consumer_wait(v_state)
        self.pv_tile(f, v_state.index, row_sum, dv_prev, dv_cur)
        v_pipe.consumer_release(v_state)
        return v_state

    @cute.jit
    def pv_tile(self, f, stage: Int32, row_sum: cute.Tensor, dv_prev: Float32, dv_cur: Float32):
        """O = O * alpha * dv_prev / dv_cur + P V of the tile in ``stage``, l = l * alpha + rowsum(P8)."""
        self.pv_sliced_dv(f.pv_mma_h_zero, f.pv_mma_h, f.acc_O, f.acc_Ot, f.alpha_keep, f.tOrP, f.tOrV_h, stage,
                          f.sum_mma_zero, f.sum_mma, f.acc_L, f.tLrOnes, row_sum, dv_prev, dv_cur)

    @cute.jit
    def pv_sliced_dv(self, pv_mma_h_zero: cute.TiledMma, pv_mma_h: cute.TiledMma, acc_O: cute.Tensor,
                     acc_Ot: cute.Tensor, alpha: cute.Tensor, tOrP: cute.Tensor, tOrV_h: cute.Tensor, stage: Int32,
                     sum_mma_zero: cute.TiledMma, sum_mma: cute.TiledMma, acc_L: cute.Tensor, tLrOnes: cute.Tensor,
                     row_sum: cute.Tensor, dv_prev: Float32, dv_cur: Float32):
        """The shipped ``pv_sliced`` with acc_O's change of V units: after slice 0's wait, l is merged with the
        plain alpha first, then alpha is scaled in place by dv_prev / dv_cur (no extra live registers) and every
        O slice is merged with it."""
        jw = self.head_dim // 8 // self.pv_split  # accumulator column groups per slice
        for h in cutlass.range_constexpr(self.pv_split):
            self.issue_pv_slice(pv_mma_h_zero, pv_mma_h, acc_Ot, tOrP, tOrV_h, stage, h, sum_mma_zero, sum_mma,
                                acc_L, tLrOnes)
            warpgroup.wait_group(0)
            if const_expr(h == 0):
                self.merge_l(row_sum, acc_L, alpha)
                ratio = dv_prev * cute.arch.rcp_approx(dv_cur)
                for r in cutlass.range_constexpr(2):
                    alpha[r] = alpha[r] * ratio
            self.merge_o(acc_O, acc_Ot, alpha, jw * h)

    @cute.jit
    def row_max_update(self, acc_S: cute.Tensor, row_max: cute.Tensor, alpha: cute.Tensor, bias: cute.Tensor,
                       part: cute.Tensor, qk_scale, r: cutlass.Constexpr):
        """The running max in the exp2 domain (``qk_scale`` is the tile's c, a 2-register tensor): tiles with
        different K descales are compared after scaling; bias folds S_BIAS back in so that the shipped
        ``row_exp_sum`` (one FFMA per score on the raw S) is unchanged."""
        n8 = self.tile_n // 8
        for j in cutlass.range_constexpr(n8):
            for c in cutlass.range_constexpr(2):
                i, first = self.chain_of(j, c)
                v = acc_S[c + 2 * r + 4 * j]
                part[i] = v if const_expr(first) else cute.arch.fmax(part[i], v)
        m_raw = self.reduce_chains(part, cute.arch.fmax)
        m_raw = cute.arch.warp_reduction_max(m_raw, threads_in_group=4)
        scale = qk_scale[r]
        m_tile = (m_raw - S_BIAS) * scale  # the subtraction is exact (integers below 2**24)
        m_new = cute.arch.fmax(row_max[r], m_tile)
        alpha[r] = cute.math.exp2(row_max[r] - m_new, fastmath=True)
        row_max[r] = m_new
        # exp2(S_raw * c - bias) = exp2((S_raw - S_BIAS) * c - m_new + 8): the x256 of P
        bias[r] = S_BIAS * scale + (m_new - 8.0)

    @cute.jit
    def epilogue(self, acc_O: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor, qk_scale,
                 o_scale: Float32, mO: cute.Tensor, mLSE: cute.Tensor, sq: Int32, row0: Int32,
                 head: Int32, bat: Int32, wg_tidx: Int32):
        """O = acc_O * dv_last / l; LSE from m in the exp2 domain (``qk_scale`` unused)."""
        warp = wg_tidx // 32
        lane = wg_tidx % 32
        quad = lane % 4
        for r in cutlass.range_constexpr(2):
            lsum = row_sum[r]
            row = self.thread_row(row0, warp, lane, r)
            inv = o_scale * cute.arch.rcp_approx(lsum)
            if row < sq:
                if quad == 0:
                    mLSE[row, head, bat] = (row_max[r] - 8.0 + cute.math.log2(lsum, fastmath=True)) * LN2
                for j in cutlass.range_constexpr(self.head_dim // 8):
                    col = 8 * j + 2 * quad
                    mO[row, col, head, bat] = (acc_O[2 * r + 4 * j] * inv).to(self.dtype_out)
                    mO[row, col + 1, head, bat] = (acc_O[1 + 2 * r + 4 * j] * inv).to(self.dtype_out)


# ---------------------------------------------------------------------- compile / run API
def n_key_tiles(sk_pad: int) -> int:
    """Descales per (batch, head): one per 160-key kernel tile of the padded key axis."""
    return -(-sk_pad // TILE_N)


def _compile_args(dtype_out):
    from cutlass.cute.runtime import make_ptr

    gm = cute.AddressSpace.gmem
    args = list(K._compile_args(dtype_out))
    tile_ptrs = [make_ptr(Float32, 0, gm, assumed_align=4), make_ptr(Float32, 0, gm, assumed_align=4)]
    return tuple(args[:8] + tile_ptrs + args[8:])


def compile_tile_scales(head_dim: int, dtype_out, *, fake: bool, arch: str = "sm_90a", options_extra: str = "",
                        tvm_ffi: bool = False, config: Sm90Config | None = None, key_lens: bool = False,
                        qk_int8: bool = True):
    """``K.compile_sm90``'s contract (INT8 only) with ``k_tile_scales`` and ``v_tile_scales`` pointers after
    ``lse`` (module docstring)."""
    dtype_out = K._out_dtype(dtype_out)
    config = config or K.config_for(arch, head_dim)
    kern = Sm90Fp8TileScalesAttention(head_dim, dtype_out, config, key_lens=key_lens, qk_int8=qk_int8)
    return K.compile_kernel(kern, _compile_args(dtype_out), fake=fake, arch=arch, options_extra=options_extra,
                            tvm_ffi=tvm_ffi, smem=K.smem_bytes(head_dim, config, qk_int8=True))  # the shipped smem


_CACHE: dict = {}


def compiled(head_dim: int, out_dtype: str, tvm_ffi: bool):
    """The compiled variant for the current device (cached per process: cute.compile never caches)."""
    key = (head_dim, out_dtype, tvm_ffi)
    fn = _CACHE.get(key)
    if fn is None:
        fn = _CACHE[key] = compile_tile_scales(head_dim, out_dtype, fake=False, tvm_ffi=tvm_ffi)
    return fn


def check_run_args(q8, k8, v8t, q_scales, k_tile_scales, v_tile_scales, sq: int, out, lse) -> None:
    """Shapes and dtypes of ``run_tile_scales``' tensors (ValueError otherwise)."""
    B, H, sq_pad, D = q8.shape
    sk_pad = k8.shape[2]
    n_t = n_key_tiles(sk_pad)
    if q8.dtype != torch.int8 or k8.dtype != torch.int8:
        raise ValueError("q8 and k8 must be int8 (the INT8 Q/K format)")
    if tuple(v8t.shape) != (B, H, D, sk_pad):
        raise ValueError(f"v8t must be (B, H, D, Sk_pad) = {(B, H, D, sk_pad)}, got {tuple(v8t.shape)}")
    for name, t, shape in (("q_scales", q_scales, (B, H, sq_pad)), ("k_tile_scales", k_tile_scales, (B, H, n_t)),
                           ("v_tile_scales", v_tile_scales, (B, H, n_t))):
        if tuple(t.shape) != shape or t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous float32 {shape}, got {t.dtype} {tuple(t.shape)}")
    if tuple(out.shape) != (B, sq, H, D) or tuple(lse.shape) != (B, H, sq) or not out.is_contiguous():
        raise ValueError("out (B,Sq,H,D) and lse (B,H,Sq) contiguous expected")


def run_tile_scales(q8, k8, v8t, q_scales, k_tile_scales, v_tile_scales, sq: int, sk: int, softmax_scale: float,
                    out, lse, tvm_ffi: bool | None = None) -> None:
    """Launch on the current stream: q8 / k8 int8 (B,H,Sq_pad,D) / (B,H,Sk_pad,D), v8t e4m3 (or uint8 view)
    (B,H,D,Sk_pad) in the shipped key order, q_scales (B,H,Sq_pad), k_tile_scales and v_tile_scales (B,H,n_tiles)
    float32, out (B,Sq,H,D) bf16/fp16, lse (B,H,Sq) fp32. ``tvm_ffi``: as the shipped launcher (a failing TVM-FFI
    call falls back to cute's JIT path)."""
    from ditprof.kernels.launch import DTYPE_NAMES, LAUNCH_INFO, tvm_ffi_launch_enabled

    check_run_args(q8, k8, v8t, q_scales, k_tile_scales, v_tile_scales, sq, out, lse)
    if torch.cuda.get_device_capability(q8.device) != (9, 0):
        raise ValueError("the fp8-sm90 variant needs an sm_90 GPU (H100/H200)")
    B, H, sq_pad, D = q8.shape
    sk_pad = k8.shape[2]
    if tvm_ffi is None:
        tvm_ffi = tvm_ffi_launch_enabled()
    stream = torch.cuda.current_stream(q8.device).cuda_stream
    sizes = (B, H, sq, sk, sq_pad, sk_pad)
    dummy = q_scales  # scales / key_lens: not read by this variant
    if tvm_ffi:
        try:
            compiled(D, DTYPE_NAMES[out.dtype], True)(
                q8.data_ptr(), k8.data_ptr(), v8t.data_ptr(), dummy.data_ptr(), q_scales.data_ptr(),
                dummy.data_ptr(), out.data_ptr(), lse.data_ptr(), k_tile_scales.data_ptr(),
                v_tile_scales.data_ptr(), *sizes, float(softmax_scale), stream)
            LAUNCH_INFO["last_launch"] = "tvm_ffi"
            return
        except Exception as exc:  # noqa: BLE001 -- argument conversion fails before anything is launched
            LAUNCH_INFO["tvm_ffi_error"] = f"{type(exc).__name__}: {exc}"[:500]
    fn = compiled(D, DTYPE_NAMES[out.dtype], False)
    from cutlass.cute.runtime import make_ptr

    gm = cute.AddressSpace.gmem

    def ptr(ty, t, align):
        return make_ptr(ty, t.data_ptr(), gm, assumed_align=align)

    i8, f8 = cutlass.Int8, cutlass.Float8E4M3FN
    fn(ptr(i8, q8, 16), ptr(i8, k8, 16), ptr(f8, v8t, 16), ptr(Float32, dummy, 4), ptr(Float32, q_scales, 4),
       ptr(Int32, dummy, 4), ptr(K._out_dtype(DTYPE_NAMES[out.dtype]), out, 16), ptr(Float32, lse, 4),
       ptr(Float32, k_tile_scales, 4), ptr(Float32, v_tile_scales, 4),
       *(Int32(x) for x in sizes), Float32(softmax_scale), cuda.CUstream(stream))
    LAUNCH_INFO["last_launch"] = "jit"



# ---------------------------------------------------------------------- torch: the prep's numerics and the model
K_MEAN_KEYS = 64  # sampled keys of the single-pass prep's K mean (key i * Sk // n, n = min(64, Sk))


def sampled_k_mean_rotated(kh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, H, Sk, D) 16-bit K -> (mu, mu') fp32 (B, H, D): mu = fp32(float64 mean of the keys i * Sk // n,
    n = min(64, Sk)) in the original basis, mu' = fp32(float64 mu @ Rpm1) (a prep program can compute both for
    itself: no stats pass)."""
    from ditprof.kernels.rotation import rotation_pm1

    Sk, D = kh.shape[2], kh.shape[3]
    n = min(K_MEAN_KEYS, Sk)
    idx = torch.arange(n, device=kh.device) * Sk // n
    mu = (kh[:, :, idx].double().sum(dim=2) / torch.tensor(float(n), dtype=torch.float64, device=kh.device)).float()
    mu_rot = torch.matmul(mu.double(), rotation_pm1(D, torch.float64, kh.device)).float()
    return mu, mu_rot


def make_tile_scaled_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> dict:
    """The single-pass prep's outputs in torch (q (B, Sq, H, D), k and v (B, Sk, H, D), 16-bit):
    q8 int8 / q_scales (B, H, Sq_pad) as ``fp8_prepare_torch(qk_int8=True)``; k8 int8 of K' = fp32(K Rpm1) - mu'
    (``sampled_k_mean_rotated``) with one descale amax/127 per 160-key tile (``k_tile_scales`` (B, H, n_t));
    v8t e4m3 (B, H, D, Sk_pad) in the shipped key order with one descale amax/448 per 160-key tile
    (``v_tile_scales``); ``k_mean`` = mu (original basis: the LSE correction softmax_scale * q . mu); sq, sk."""
    from prep_single_pass import _per_key, _tile_amax  # the single-pass prep's per-tile amax / per-key broadcast

    from ditprof.kernels.key_order import key_order_for_positions
    from ditprof.kernels.prep import FP8_MAX, int8_descale, padded_lengths, quantize_int8, rotate_qk

    B, Sq, H, D = q.shape
    Sk = k.shape[1]
    Sq_pad, Sk_pad = padded_lengths(Sq, Sk)
    n_t = n_key_tiles(Sk_pad)
    dev = q.device
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
    qr, kr = rotate_qk(qh, kh)
    mu, mu_rot = sampled_k_mean_rotated(kh)
    kr = kr - mu_rot[:, :, None, :]
    q_rows = int8_descale(qr.abs().amax(dim=3))
    dk = int8_descale(_tile_amax(kr, n_t))
    v_amax = _tile_amax(vh.float(), n_t)
    dv = torch.where(v_amax == 0, torch.ones_like(v_amax),
                     v_amax / torch.tensor(FP8_MAX, dtype=torch.float32, device=dev))
    q8 = torch.zeros((B, H, Sq_pad, D), dtype=torch.int8, device=dev)
    q8[:, :, :Sq] = quantize_int8(qr, q_rows[..., None])
    q_scales = torch.ones((B, H, Sq_pad), dtype=torch.float32, device=dev)
    q_scales[:, :, :Sq] = q_rows
    k8 = torch.zeros((B, H, Sk_pad, D), dtype=torch.int8, device=dev)
    k8[:, :, :Sk] = quantize_int8(kr, _per_key(dk, Sk))
    v8 = torch.zeros((B, H, Sk_pad, D), dtype=torch.uint8, device=dev)
    y = vh.float() / _per_key(dv, Sk)
    v8[:, :, :Sk] = y.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    perm = key_order_for_positions(torch.arange(Sk_pad, device=dev))
    v8t = v8[:, :, perm].transpose(2, 3).contiguous().view(torch.float8_e4m3fn)
    return {"q8": q8, "q_scales": q_scales, "k8": k8, "k_tile_scales": dk.contiguous(), "v8t": v8t,
            "v_tile_scales": dv.contiguous(), "k_mean": mu, "sq": Sq, "sk": Sk}


def _f32(x: torch.Tensor) -> torch.Tensor:
    """One rounding to fp32 of a float64 value computed exactly (models an FFMA: a * b + c rounded once)."""
    return x.to(torch.float32)


def _natural_v(v8t: torch.Tensor) -> torch.Tensor:
    """v8t (B, H, D, Sk_pad) e4m3 in the kernel's key order -> (B, H, Sk_pad, D) float64 in natural key order."""
    from ditprof.kernels.key_order import unpermute_keys

    return unpermute_keys(v8t.float().transpose(2, 3), dim=2).double()


def _raw_scores(q8: torch.Tensor, k8: torch.Tensor, sk: int) -> torch.Tensor:
    """S = q8 k8^T (exact integers, float64), keys >= sk at -inf (the kernel's mask), padded to whole tiles."""
    s = torch.matmul(q8.double(), k8.double().transpose(-1, -2))
    n_t = n_key_tiles(k8.shape[2])
    s = torch.nn.functional.pad(s, (0, n_t * TILE_N - s.shape[-1]))
    s[..., sk:] = float("-inf")
    return s


def _model_setup(q8, k8, v8t, softmax_scale: float, sq: int | None, sk: int | None):
    """What both models start from: (sq (default the padded length), n_t key tiles of the true sk (default the
    padded one), fp32(fp32(softmax_scale) * fp32(log2 e)) on the inputs' device, the raw scores
    (``_raw_scores``), V (B, H, whole tiles, D) float64 in natural key order, zero past the padding)."""
    sq = q8.shape[2] if sq is None else sq
    sk = k8.shape[2] if sk is None else sk
    n_t = -(-sk // TILE_N)
    scale_log2 = torch.tensor(softmax_scale, dtype=torch.float32) * torch.tensor(LOG2E, dtype=torch.float32)
    scale_log2 = scale_log2.to(q8.device)
    s = _raw_scores(q8, k8, sk)
    v = torch.nn.functional.pad(_natural_v(v8t), (0, 0, 0, n_key_tiles(k8.shape[2]) * TILE_N - k8.shape[2]))
    return sq, n_t, scale_log2, s, v


def _p8_tile(s_tile: torch.Tensor, c: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """P8 = e4m3(exp2(FFMA(S_BIAS + S, c, -bias))) for one tile (float64 out, values exact)."""
    arg = _f32((s_tile + S_BIAS) * c.double()[..., None] - bias.double()[..., None])
    return torch.exp2(arg).to(torch.float8_e4m3fn).double()


def _merge(o, lsum, alpha_o, alpha_l, p8, v_tile):
    """l = FFMA(l, alpha, rowsum P8), O = FFMA(O, alpha', P8 V) in fp32 (the tensor-core sums as float64)."""
    lsum = _f32(lsum.double() * alpha_l.double() + p8.sum(dim=-1))
    o = _f32(o.double() * alpha_o.double()[..., None] + _f32(torch.matmul(p8, v_tile)).double())
    return o, lsum


def _finish(o, m_exp2, lsum, dv_last, sq: int):
    """O = acc_O * fp32(dv_last / l) as (B, Sq, H, D) float32, LSE = (m - 8 + log2 l) ln 2 (B, H, Sq)."""
    inv = (dv_last[..., None] / lsum).float()
    out = (o * inv[..., None])[:, :, :sq].transpose(1, 2).contiguous()
    lse = ((m_exp2 - 8.0 + torch.log2(lsum)) * LN2)[:, :, :sq]
    return out, lse


def tile_scales_model(q8, q_scales, k8, k_tile_scales, v8t, v_tile_scales, softmax_scale: float,
                      sq: int | None = None, sk: int | None = None):
    """The variant's numerics in torch on dequantizable inputs (``make_tile_scaled_inputs``' tensors; ``sq`` /
    ``sk``: the true lengths, default the padded ones): 160-key tiles in key order; per row and tile
    c = fp32(q_scale * fp32(dk_j * scale_log2)), m_tile = (max S) c, m = max(m, m_tile), alpha = exp2(m_old - m),
    bias = FFMA(S_BIAS, c, m - 8), P8 = e4m3(exp2(FFMA(S_BIAS + S, c, -bias))), l = l alpha + sum P8,
    O = O alpha dv_{j-1} / dv_j + P8 V8_j (O in the last tile's V units); epilogue O dv_last / l, LSE.
    Returns (O float32 (B, Sq, H, D) before the output cast, LSE float32 (B, H, Sq) of the centred scores)."""
    B, H, sq_pad, D = q8.shape
    sq, n_t, scale_log2, s, v = _model_setup(q8, k8, v8t, softmax_scale, sq, sk)
    dev = q8.device
    m = torch.full((B, H, sq_pad), float("-inf"), device=dev)
    lsum = torch.zeros((B, H, sq_pad), device=dev)
    o = torch.zeros((B, H, sq_pad, D), device=dev)
    dv_prev = v_tile_scales[:, :, 0]
    for j in range(n_t):
        keys = slice(j * TILE_N, (j + 1) * TILE_N)
        c = q_scales * (k_tile_scales[:, :, j] * scale_log2)[..., None]
        m_tile = (s[..., keys].amax(dim=-1).float() * c)
        m_new = torch.maximum(m, m_tile)
        alpha = torch.exp2(m - m_new)
        bias = _f32(S_BIAS * c.double() + (m_new - 8.0).double())
        p8 = _p8_tile(s[..., keys], c, bias)
        dv = v_tile_scales[:, :, j]
        ratio = (dv_prev / dv)[..., None]
        o, lsum = _merge(o, lsum, alpha * ratio, alpha, p8, v[:, :, keys])
        m, dv_prev = m_new, dv
    return _finish(o, m, lsum, dv_prev, sq)


def shipped_int8_model(q8, q_scales, k8, dk: torch.Tensor, v8t, dv: torch.Tensor, softmax_scale: float,
                       sq: int | None = None, sk: int | None = None):
    """The shipped INT8 kernel's numerics on the same kind of inputs with per-head descales dk, dv (B, H): the
    running max in raw (S_BIAS-biased) units, alpha = exp2(fp32(m_old - m) * qk_scale), bias = FFMA(m, qk_scale, -8),
    O = O alpha + P8 V8, epilogue O dv / l, LSE = (fp32((m - S_BIAS) qk_scale) - 8 + log2 l) ln 2. Same returns as
    ``tile_scales_model``."""
    B, H, sq_pad, D = q8.shape
    sq, n_t, scale_log2, s, v = _model_setup(q8, k8, v8t, softmax_scale, sq, sk)
    dev = q8.device
    qk_scale = q_scales * (dk * scale_log2)[..., None]
    m = torch.full((B, H, sq_pad), float("-inf"), dtype=torch.float64, device=dev)  # raw biased units: exact
    lsum = torch.zeros((B, H, sq_pad), device=dev)
    o = torch.zeros((B, H, sq_pad, D), device=dev)
    for j in range(n_t):
        keys = slice(j * TILE_N, (j + 1) * TILE_N)
        m_new = torch.maximum(m, s[..., keys].amax(dim=-1) + S_BIAS)
        alpha = torch.exp2((m - m_new).float() * qk_scale)
        bias = _f32(m_new * qk_scale.double() - 8.0)
        p8 = _p8_tile(s[..., keys], qk_scale, bias)
        o, lsum = _merge(o, lsum, alpha, alpha, p8, v[:, :, keys])
        m = m_new
    m_exp2 = ((m - S_BIAS).float() * qk_scale)
    return _finish(o, m_exp2, lsum, dv, sq)

__all__ = ["Sm90Fp8TileScalesAttention", "compile_tile_scales", "compiled", "make_tile_scaled_inputs", "n_key_tiles",
           "run_tile_scales", "shipped_int8_model", "tile_scales_model"]
