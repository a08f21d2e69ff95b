"""A persistent version of the shipped Hopper FP8 attention kernel (issue 20 lever 2, issue 17's short shapes), as an
experiment: ``ditprof/kernels/fp8_fwd_sm90.py`` is unchanged, this module subclasses it.

Why: at short shapes the shipped kernel runs few waves of CTAs (flux (1,24,4608,128): 576 CTAs of 192 query rows on
132 SMs, 4.4 waves of ~29 key tiles each) and every CTA pays its own launch, barrier set-up, Q load and first K/V
latency before its first wgmma, and runs its epilogue (the last P V, the O / LSE stores) with the tensor cores of its
SM idle except for the other warpgroups' tails.

Design
------
* Grid = ``num_ctas`` CTAs (default: the device's SM count x ``ctas_per_sm``, at most the number of work tiles; one CTA
  per SM fits: ~175 KiB of shared memory and the whole register file). Each CTA runs the work tiles
  t = blockIdx.x, blockIdx.x + gridDim.x, ... of the static schedule over (m_block, head, batch), m_block fastest:
  the CTAs running at one time work on a few heads (flux: 132 CTAs over 24 query blocks per head = ~6 heads), so
  the K/V each of them streams is shared in L2.
* The same warp specialisation, pipelines and consumer code as the shipped kernel (``attend``, ``epilogue`` and every
  helper are the shipped class's methods): one producer warp, 3 consumer warpgroups of 64 rows, 160-key K/V tiles
  in 3-deep TMA rings. The pipeline states (K/V ring and Q) continue across work tiles, so the producer runs ahead
  into the next work tile as soon as ring slots free up: while the consumers finish the current tile (last P V,
  epilogue stores) it has already loaded the next tile's Q and its first K/V tiles.
* Q has two buffers (``Q_STAGES = 2``, a 2-stage TMA pipeline): the producer loads work tile i+1's Q into the other
  buffer right after issuing tile i's last V; each consumer warp frees its Q buffer (an arrive on the Q pipeline's
  empty barrier, ``after_last_qk``) once the last Q K^T of its tile has completed.
* Numerics: identical arithmetic to the shipped kernel (the same per-tile promotion, softmax, row sums, LSE, key_lens),
  so outputs are bit-identical to it (the GPU test checks ``torch.equal``). INT8 Q/K is not supported here.

Arguments: the shipped kernel's (q8, k8, v8t, scales, q_scales, key_lens, out, lse, B, H, Sq, Sk, Sq_pad, Sk_pad,
softmax_scale), then ``num_ctas`` (Int32, the grid size: any value >= 1 is correct), then the stream.
"""

from __future__ import annotations

from types import SimpleNamespace

import cuda.bindings.driver as cuda
import cutlass
from cutlass import BFloat16, Float32, Int32, cute, pipeline

from ditprof.kernels import fp8_fwd_sm90 as K
from ditprof.kernels.fp8_fwd_sm90 import (
    TILE_M_WG,
    Sm90Config,
    Sm90Fp8Attention,
)


class Sm90Fp8PersistentAttention(Sm90Fp8Attention):
    """The shipped kernel's sections in a persistent loop over (m_block, head, batch) work tiles."""

    Q_STAGES = 2

    def __init__(self, head_dim: int = 128, dtype_out=BFloat16, config: Sm90Config | None = None,
                 key_lens: bool = False, qk_int8: bool = False):
        if qk_int8:
            raise ValueError("the persistent fp8-sm90 variant has no INT8 Q/K mode (qk_int8=True): use the shipped "
                             "kernel (ditprof.kernels.fp8_fwd_sm90)")
        super().__init__(head_dim, dtype_out, config, key_lens=key_lens, qk_int8=False)

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
        num_ctas: Int32,
        stream: cuda.CUstream,
    ):
        args, layouts = self.kernel_args(pQ, pK, pV, pScales, pQScales, pKeyLens, pO, pLSE, batch, heads, sq, sk,
                                         sq_pad, sk_pad)
        n_m = cute.ceil_div(sq, self.tile_m)
        self.launch_kernel(args, layouts, sq, sk, softmax_scale, (n_m, heads, n_m * heads * batch),
                           (num_ctas, 1, 1), stream)

    # ------------------------------------------------------------------ the shipped kernel's sections, overridden
    # (kernel arguments: the shipped ones, extra = (n_m, heads, n_work))
    def work_tile(self, k):
        """This CTA's first work tile and the stride: (blockIdx.x, gridDim.x); the tiles come in the roles' loops."""
        cta, _, _ = cute.arch.block_idx()
        n_ctas, _, _ = cute.arch.grid_dim()
        return SimpleNamespace(cta=cta, n_ctas=n_ctas)

    def smem_setup(self, k, w, tidx):
        """The shipped one without the key tiles (per work tile here)."""
        storage, q_pipe, k_pipe, v_pipe, sQ, sK, sV, sPin = self.shared_setup(k.sQ_layout, k.sK_layout, k.sV_layout)
        bias_ptr = self.shared_constants(storage, k.sOnes_layout, sPin, tidx)
        return SimpleNamespace(storage=storage, q_pipe=q_pipe, k_pipe=k_pipe, v_pipe=v_pipe, sQ=sQ, sK=sK, sV=sV,
                               sPin=sPin, bias_ptr=bias_ptr)

    @cute.jit
    def producer(self, k, w, s):
        n_m, heads, n_work = k.extra[:3]  # a subclass may add arguments after them
        tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV = self.producer_views(k.tma_q, k.mQ, k.tma_k, k.mK, k.tma_v, k.mV, s.sQ,
                                                                 s.sK, s.sV)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.Q_STAGES)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.kv_stages)
        for t in cutlass.range(w.cta, n_work, w.n_ctas, unroll=1):
            m_block, head, bat = self.work_coords(t, n_m, heads)
            # Q of work tile t into its buffer: issued right after the previous tile's last V, long before
            # the consumers get to it
            self.load_q(s.q_pipe, q_state, k.tma_q, tQgQ, tQsQ, m_block, head, bat, q_state.index * self.num_wg)
            q_state.advance()
            kv_state = self.load_kv(s.k_pipe, s.v_pipe, kv_state, self.key_tiles(k.mKeyLens, bat, k.sk), k.tma_k,
                                    tKgK, tKsK, k.tma_v, tVgV, tVsV, head, bat)

    @cute.jit
    def consumer(self, k, w, s, f, warp_idx):
        n_m, heads, n_work = k.extra[:3]  # a subclass may add arguments after them
        row_max = cute.make_rmem_tensor((2,), Float32)
        row_sum = cute.make_rmem_tensor((2,), Float32)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.Q_STAGES)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        for t in cutlass.range(w.cta, n_work, w.n_ctas, unroll=1):
            self.tile_start(k, w, t)
            m_block, head, bat = self.work_coords(t, n_m, heads)
            row0 = m_block * self.tile_m + f.wg * TILE_M_WG
            qk_scale = self.tile_qk_scale(k.mScales, k.mQScales, k.scale_log2, row0, head, bat, k.sq, f.wg_tidx)
            row_max.fill(-Float32.inf)
            row_sum.fill(0.0)
            f.acc_O.fill(0.0)
            v_state = self.attend(f, s.q_pipe, q_state, s.k_pipe, s.v_pipe, kv_state,
                                  f.wg + q_state.index * self.num_wg, self.key_tiles(k.mKeyLens, bat, k.sk), qk_scale,
                                  row_max, row_sum, k.mKeyLens, bat, k.sk, s.sPin, warp_idx, s.bias_ptr)
            q_state.advance()
            v_state.advance()  # the next work tile's first K/V slot
            kv_state = v_state
            self.epilogue(f.acc_O, row_max, row_sum, qk_scale, k.mScales[2, head, bat], k.mO, k.mLSE, k.sq,
                          row0, head, bat, f.wg_tidx)

    def tile_start(self, k, w, t):
        """A consumer's start of work tile t, before anything of it (nothing here; the timeline's stamps)."""

    def work_coords(self, t, n_m, heads):
        """(m_block, head, batch) of work tile t: m_block fastest, then head (CTAs running together share K/V)."""
        rest = t // n_m
        return t - rest * n_m, rest % heads, rest // heads

    def after_last_qk(self, q_pipe, q_state):
        # every Q K^T of this warp's work tile has completed (waited): the producer may refill the buffer
        q_pipe.consumer_release(q_state)


# ---------------------------------------------------------------------- compile / run API
def smem_bytes(head_dim: int = 128, config: Sm90Config | None = None) -> int:
    """The shipped kernel's shared memory plus the second Q buffer (its 2 mbarriers fit the barriers' block)."""
    c = config or K.config_for("sm_90a", head_dim)
    return K.smem_bytes(head_dim, c) + TILE_M_WG * c.consumer_wgs * head_dim


def work_tiles(B: int, H: int, sq: int, config: Sm90Config | None = None) -> int:
    """Number of (m_block, head, batch) work tiles."""
    c = config or Sm90Config()
    return -(-sq // (TILE_M_WG * c.consumer_wgs)) * H * B


def compile_persistent(head_dim: int, dtype_out, *, fake: bool, arch: str = "sm_90a", options_extra: str = "",
                       tvm_ffi: bool = False, config: Sm90Config | None = None, key_lens: bool = False,
                       qk_int8: bool = False):
    """``K.compile_sm90``'s contract with one more argument before the stream: ``num_ctas`` (Int32, the grid)."""
    dtype_out = K._out_dtype(dtype_out)
    config = config or K.config_for(arch, head_dim)
    kern = Sm90Fp8PersistentAttention(head_dim, dtype_out, config, key_lens=key_lens, qk_int8=qk_int8)
    return K.compile_kernel(kern, (*K._compile_args(dtype_out), Int32(1)), fake=fake, arch=arch,
                            options_extra=options_extra, tvm_ffi=tvm_ffi, smem=smem_bytes(head_dim, config))


_CACHE: dict = {}


def compiled(head_dim: int, out_dtype: str, key_lens: bool, tvm_ffi: bool):
    """The compiled persistent kernel for the current device (cached per process)."""
    key = (head_dim, out_dtype, key_lens, tvm_ffi)
    fn = _CACHE.get(key)
    if fn is None:
        fn = _CACHE[key] = compile_persistent(head_dim, out_dtype, fake=False, tvm_ffi=tvm_ffi, key_lens=key_lens)
    return fn


def default_num_ctas(device, n_work: int, ctas_per_sm: int = 1) -> int:
    """SM count x ctas_per_sm, at most n_work (only one CTA per SM is resident: more just queue)."""
    import torch

    return max(1, min(torch.cuda.get_device_properties(device).multi_processor_count * ctas_per_sm, n_work))


def run_persistent(q8, k8, v8t, scales, sq: int, sk: int, softmax_scale: float, out, lse, key_lens=None,
                   num_ctas: int | None = None, ctas_per_sm: int = 1, tvm_ffi: bool | None = None) -> int:
    """Launch on the current stream on the shared prep's tensors (q8/k8/v8t float8_e4m3fn or uint8 views, scales
    (B,H,3) fp32, out (B,Sq,H,D) bf16/fp16, lse (B,H,Sq) fp32, key_lens (B,) int32 or None). ``num_ctas``: the
    grid (default ``default_num_ctas``; an explicit value is not clamped, idle CTAs exit at once). ``tvm_ffi``:
    launch path (default: the shipped launcher's choice; a TVM-FFI call that fails records the reason in the shared
    ``LAUNCH_INFO`` and this call and later ones take cute's JIT path). Returns the grid size used."""
    import torch

    from ditprof.kernels.launch import DTYPE_NAMES, LAUNCH_INFO, tvm_ffi_launch_enabled

    B, H, sq_pad, D = q8.shape
    sk_pad = k8.shape[2]
    if tuple(out.shape) != (B, sq, H, D) or tuple(lse.shape) != (B, H, sq) or not out.is_contiguous():
        raise ValueError("out (B,Sq,H,D) and lse (B,H,Sq) contiguous expected")
    if torch.cuda.get_device_capability(q8.device) != (9, 0):
        raise ValueError("the persistent fp8-sm90 kernel needs an sm_90 GPU (H100/H200)")
    if num_ctas is None:
        num_ctas = default_num_ctas(q8.device, work_tiles(B, H, sq), ctas_per_sm)
    if tvm_ffi is None:
        tvm_ffi = tvm_ffi_launch_enabled()
    lens = key_lens if key_lens is not None else scales  # not read unless compiled with key_lens
    stream = torch.cuda.current_stream(q8.device).cuda_stream
    sizes = (B, H, sq, sk, sq_pad, sk_pad)
    if tvm_ffi:
        try:
            compiled(D, DTYPE_NAMES[out.dtype], key_lens is not None, True)(
                q8.data_ptr(), k8.data_ptr(), v8t.data_ptr(), scales.data_ptr(), scales.data_ptr(), lens.data_ptr(),
                out.data_ptr(), lse.data_ptr(), *sizes, float(softmax_scale), int(num_ctas), stream)
            LAUNCH_INFO["last_launch"] = "tvm_ffi"
            return num_ctas
        except Exception as exc:  # noqa: BLE001 -- argument conversion fails before anything is launched
            LAUNCH_INFO["tvm_ffi_error"] = f"{type(exc).__name__}: {exc}"[:500]  # the JIT path from now on
    fn = compiled(D, DTYPE_NAMES[out.dtype], key_lens is not None, False)
    from cutlass.cute.runtime import make_ptr

    gm = cute.AddressSpace.gmem
    u8 = cutlass.Uint8

    def ptr(ty, t, align):
        return make_ptr(ty, t.data_ptr(), gm, assumed_align=align)

    fn(ptr(u8, q8, 16), ptr(u8, k8, 16), ptr(u8, v8t, 16), ptr(Float32, scales, 4), ptr(Float32, scales, 4),
       ptr(Int32, lens, 4), ptr(K._out_dtype(DTYPE_NAMES[out.dtype]), out, 16), ptr(Float32, lse, 4),
       *(Int32(x) for x in sizes), Float32(softmax_scale), Int32(num_ctas), cuda.CUstream(stream))
    LAUNCH_INFO["last_launch"] = "jit"
    return num_ctas


__all__ = ["Sm90Fp8PersistentAttention", "compile_persistent", "compiled", "default_num_ctas", "run_persistent",
           "smem_bytes", "work_tiles"]
