"""The shipped Hopper FP8 attention kernel's INT8 path with Q rotated and quantized inside the kernel (issue 20
lever 1, "Q quantized in the consumer warpgroup"; session 13's plan for issue 17's short shapes), as an experiment:
``ditprof/kernels/fp8_fwd_sm90.py`` is unchanged but for an optional field list of its smem struct; this module
subclasses it.

Why: the INT8 prep's Q/K launch rotates and quantizes Q and K (flux: 41.6 us of a 398 us call, Q half of its
programs); Q's scales are per row, so nothing about Q needs a pass over other rows and the CTA that reads Q can
quantize it itself. The prep then skips Q (``PrepPlan(skip_q=True)``): at H3 434 MB read and 108 MB written less.

Design (INT8 Q/K, plain grid, no key_lens; everything after Q's codes is the shipped kernel's)
-------------------------------------------------------------------------------------------------
* The producer warp loads Rpm1^T (the prep's +-1 matrix, transposed: the B operand K-major) by TMA into smem on the
  Q pipeline's mbarrier (32 KiB at head_dim 128), then the K/V tiles as shipped. No Q TMA.
* Each consumer warpgroup loads its 64 rows of the 16-bit Q from global memory straight into the A-operand
  registers of a 16-bit wgmma (rows >= Sq read as zeros), then Q' = Q Rpm1 (m64 n=D, fp32 accumulation, the prep's
  ``tl.dot`` product up to summation order), X' = Q' / D (exact), per row amax over the quad, descale =
  RN(amax / 127) (1.0 for a zero row), codes = int8(rni(X' * RN(1 / descale))) -- the prep's ``QK_RECIP`` codes --
  written into the shipped int8 Q tile in shared memory through the accumulator's own partition (CuTe applies the
  swizzle), then a proxy fence and a named barrier of the warpgroup before its first Q K^T.
* qk_scale per row = descale * (K descale * softmax_scale * log2 e), the shipped formula with the kernel's own
  descale instead of ``q_scales``.
* Not done here (an experiment): Q's non-finite flag (a NaN row gives NaN output rows but no error), key_lens,
  the stream-K grid, fp8-sm120.

Arguments: the shipped kernel's (q, k8, v8t, scales, q_scales, key_lens, out, lse) with ``q`` the 16-bit
(B, Sq, H, D) contiguous input (not q8) and q_scales / key_lens not read, then ``rot_t`` (Rpm1^T, (D, D) contiguous
in q's dtype), then (B, H, Sq, Sk, Sq_pad, Sk_pad, softmax_scale, stream).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.utils.hopper_helpers as sm90_utils
import torch
from cutlass import BFloat16, Float16, Float32, Int8, Int32, const_expr, cute, pipeline
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.cutlass_dsl import T, dsl_user_op
from cutlass.tensor_utils import LayoutEnum

from ditprof.kernels import fp8_fwd_sm90 as K
from ditprof.kernels.fp8_fwd_sm90 import TILE_M_WG, Sm90Config, Sm90Fp8Attention

Q_BARRIER0 = 1  # named barriers 1..3: one per consumer warpgroup (0 is sync_threads)


@dsl_user_op
def cvt_rni_s32(x: Float32, *, loc=None, ip=None) -> Int32:
    """Round to nearest even to an integer (``cvt.rni.s32.f32``)."""
    res = llvm.inline_asm(T.i32(), [Float32(x).ir_value(loc=loc, ip=ip)], "cvt.rni.s32.f32 $0, $1;", "=r,f",
                          has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
                          loc=loc, ip=ip)
    return Int32(res)


@dsl_user_op
def ld_global_b32(ptr: cute.Pointer, *, loc=None, ip=None) -> Int32:
    """One 32-bit global load (``ptr`` 4-byte aligned): LLVM splits a 32-bit load of a bf16 pair it cannot prove
    aligned into two 16-bit loads."""
    res = llvm.inline_asm(T.i32(), [ptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip)], "ld.global.b32 $0, [$1];",
                          "=r,l", has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
                          loc=loc, ip=ip)
    return Int32(res)


class Sm90Fp8QRotAttention(Sm90Fp8Attention):
    """The shipped INT8 kernel, Q rotated and quantized per consumer warpgroup (module docstring)."""

    def __init__(self, head_dim: int = 128, dtype_out=BFloat16, config: Sm90Config | None = None,
                 key_lens: bool = False, qk_int8: bool = True):
        if not qk_int8:
            raise ValueError("the Q-rotating fp8-sm90 variant is INT8 Q/K only (qk_int8=True)")
        if key_lens:
            raise ValueError("the Q-rotating fp8-sm90 variant does not support key_lens")
        super().__init__(head_dim, dtype_out, config, key_lens=False, qk_int8=True)
        self.q_dtype = dtype_out  # q's dtype: the rotation wgmma's operands (bf16 or fp16, as the output)

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
        pRot: cute.Pointer,
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
        args, layouts = self.kernel_args(pQ, pK, pV, pScales, pQScales, pKeyLens, pO, pLSE, batch, heads, sq, sk,
                                         sq_pad, sk_pad)
        mQb = cute.make_tensor(
            cute.recast_ptr(pQ, dtype=self.q_dtype),
            cute.make_layout((sq, D, heads, batch), stride=(heads * D, 1, D, sq * heads * D)))
        mRot = cute.make_tensor(cute.recast_ptr(pRot, dtype=self.q_dtype), cute.make_layout((D, D), stride=(D, 1)))
        tma_r, mRot_tma = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), mRot, cute.slice_(self.sR_layout(), (None, None, 0)), (D, D))
        rot_mma, rot_mma_zero = (sm90_utils.make_trivial_tiled_mma(
            self.q_dtype, self.q_dtype, OperandMajorMode.K, OperandMajorMode.K, Float32, (1, 1, 1),
            (TILE_M_WG, D), warpgroup.OperandSource.RMEM) for _ in range(2))
        self.launch_kernel(args, layouts, sq, sk, softmax_scale, (mQb, tma_r, mRot_tma, rot_mma, rot_mma_zero),
                           (cute.ceil_div(sq, self.tile_m), heads, batch), stream)

    def kernel_args(self, pQ, pK, pV, pScales, pQScales, pKeyLens, pO, pLSE, batch, heads, sq, sk, sq_pad, sk_pad):
        """The shipped arguments (its int8 Q view and TMA atom are built but never used) and a struct with the
        rotation matrix's tile; the Q pipeline's transaction is that tile."""
        args, layouts = super().kernel_args(pQ, pK, pV, pScales, pQScales, pKeyLens, pO, pLSE, batch, heads, sq,
                                            sk, sq_pad, sk_pad)
        D = self.head_dim
        sQ_layout, sK_layout, sV_layout, sOnes_layout = layouts
        storage = K._shared_storage(
            self.kv_stages, cute.cosize(sQ_layout), cute.cosize(sK_layout), cute.cosize(sV_layout),
            cute.cosize(sOnes_layout), self.qk_dtype, self.Q_STAGES,
            extra_fields={"sR": cute.struct.Align[cute.struct.MemRange[self.q_dtype, cute.cosize(self.sR_layout())],
                                                  1024]})
        self.shared_storage = storage
        self.smem_bytes = storage.size_in_bytes()
        self.q_bytes = D * D * 2
        return args, layouts

    def sR_layout(self):
        """The rotation matrix's smem layout (static: built again wherever it is used, host or device, since a
        layout made in the host trace cannot be used inside the kernel)."""
        D = self.head_dim
        return sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (TILE_M_WG, D, D), self.q_dtype, 1)

    def sR_tensor(self, storage):
        layout = self.sR_layout()
        return storage.sR.get_tensor(layout.outer, swizzle=layout.inner)

    # ------------------------------------------------------------------ device side
    def producer(self, k, w, s):
        """Rpm1^T on the Q pipeline, then the work tile's K/V tiles (shipped)."""
        _, tma_r, mRot, _, _ = k.extra
        tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV = self.producer_views(k.tma_q, k.mQ, k.tma_k, k.mK, k.tma_v, k.mV, s.sQ,
                                                                 s.sK, s.sV)
        cpasync.prefetch_descriptor(tma_r)
        sR = self.sR_tensor(s.storage)
        gR = cute.flat_divide(mRot, (self.head_dim, self.head_dim))
        tRsR, tRgR = cpasync.tma_partition(tma_r, 0, cute.make_layout(1), cute.group_modes(sR, 0, 2),
                                           cute.group_modes(gR, 0, 2))
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        s.q_pipe.producer_acquire(q_state)
        cute.copy(tma_r, tRgR[(None, 0, 0)], tRsR[(None, 0)], tma_bar_ptr=s.q_pipe.producer_get_barrier(q_state))
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.kv_stages)
        self.load_kv(s.k_pipe, s.v_pipe, kv_state, s.n_tiles, k.tma_k, tKgK, tKsK, k.tma_v, tVgV, tVsV, w.head,
                     w.bat)

    def consumer(self, k, w, s, f, warp_idx):
        mQb, _, _, rot_mma, rot_mma_zero = k.extra
        row0 = w.m_block * self.tile_m + f.wg * TILE_M_WG
        sR = self.sR_tensor(s.storage)
        q_rows = self.quantize_q(rot_mma, rot_mma_zero, mQb, sR, s.sQ, s.q_pipe, row0, w.head, w.bat, k.sq, f.wg, f.wg_tidx)
        k_scale = k.mScales[1, w.head, w.bat] * k.scale_log2
        qk_scale = cute.make_rmem_tensor((2,), Float32)
        for r in range(2):  # a plain method (not traced by the preprocessor): Python loops only
            qk_scale[r] = q_rows[r] * k_scale
        row_max = cute.make_rmem_tensor((2,), Float32)
        row_sum = cute.make_rmem_tensor((2,), Float32)
        row_max.fill(-Float32.inf)
        row_sum.fill(0.0)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        self.attend(f, s.q_pipe, q_state, s.k_pipe, s.v_pipe, kv_state, f.wg, s.n_tiles, qk_scale, row_max, row_sum,
                    k.mKeyLens, w.bat, k.sk, s.sPin, warp_idx, s.bias_ptr)
        self.epilogue(f.acc_O, row_max, row_sum, qk_scale, k.mScales[2, w.head, w.bat], k.mO, k.mLSE, k.sq,
                      row0, w.head, w.bat, f.wg_tidx)

    @cute.jit
    def quantize_q(self, rot_mma: cute.TiledMma, rot_mma_zero: cute.TiledMma, mQb: cute.Tensor, sR: cute.Tensor, sQ: cute.Tensor, q_pipe,
                   row0: Int32, head: Int32, bat: Int32, sq: Int32, wg: Int32, wg_tidx: Int32) -> cute.Tensor:
        """This warpgroup's 64 rows of Q: rotated on the tensor cores, INT8 codes into its Q tile in smem; returns
        the descales of the thread's two rows."""
        D = self.head_dim
        thr = rot_mma.get_slice(wg_tidx)
        gQ = cute.local_tile(mQb[None, None, head, bat], (TILE_M_WG, D), (row0 // TILE_M_WG, 0))
        cQ = cute.make_identity_tensor((TILE_M_WG, D))
        tAcQ = thr.partition_A(cQ)
        tArQ = cute.make_rmem_tensor(thr.partition_shape_A((TILE_M_WG, D)), self.q_dtype)
        # the A fragment holds column pairs: one 32-bit load per pair (rows >= Sq: zeros, never read out of bounds)
        tAgQ = thr.partition_A(gQ)
        tArQ32 = cute.recast_tensor(tArQ, Int32)
        for i in cutlass.range_constexpr(cute.size(tArQ32)):
            if row0 + tAcQ[2 * i][0] < sq:
                tArQ32[i] = ld_global_b32(tAgQ.iterator + cute.crd2idx(2 * i, tAgQ.layout))
            else:
                tArQ32[i] = Int32(0)
        tRrR = thr.make_fragment_B(thr.partition_B(sR))  # (MMA, 1, D/16, 1)
        acc = cute.make_rmem_tensor(thr.partition_shape_C((TILE_M_WG, D)), Float32)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        q_pipe.consumer_wait(q_state)
        K.set_accumulate((rot_mma_zero,), (rot_mma,))
        warpgroup.fence()
        for kb in cutlass.range_constexpr(cute.size(tArQ, mode=[2])):
            cute.gemm(rot_mma_zero if kb == 0 else rot_mma, acc, tArQ[None, None, kb], tRrR[None, None, kb, 0], acc)
        warpgroup.commit_group()
        warpgroup.wait_group(0)

        # accumulator value v = c + 2r + 4j: row 16 warp + lane // 4 + 8r of the warpgroup's 64, column
        # 8j + 2 quad + c. X' = acc / D; codes X' * RN(1 / descale) = acc * (RN(1 / descale) / D) exactly (/ D is
        # a power of two), the prep's QK_RECIP codes; |codes| <= 127 by construction (no clamp)
        q_rows = cute.make_rmem_tensor((2,), Float32)
        mul_rows = cute.make_rmem_tensor((2,), Float32)
        inv_d = Float32(1.0 / D)
        for r in cutlass.range_constexpr(2):
            m = Float32(0.0)
            for j in cutlass.range_constexpr(D // 8):
                for c in cutlass.range_constexpr(2):
                    m = cute.arch.fmax(m, cute.arch.fmax(acc[c + 2 * r + 4 * j], -acc[c + 2 * r + 4 * j]))
            m = cute.arch.warp_reduction_max(m, threads_in_group=4) * inv_d
            ds = Float32(1.0)
            if m > Float32(0.0):
                ds = m / Float32(127.0)
            q_rows[r] = ds
            mul_rows[r] = (Float32(1.0) / ds) * inv_d
        # byte stores through the accumulator's own partition of the int8 tile (CuTe applies the swizzle; a 16-bit
        # recast of the swizzled tile wrote elsewhere: session 18's second GPU round)
        tCsQ = thr.partition_C(sQ[None, None, wg])
        for r in cutlass.range_constexpr(2):
            for j in cutlass.range_constexpr(D // 8):
                for c in cutlass.range_constexpr(2):
                    v = c + 2 * r + 4 * j
                    tCsQ[v] = Int8(cvt_rni_s32(acc[v] * mul_rows[r]))
        cute.arch.fence_proxy("async.shared", space="cta")  # generic stores, read by the Q K^T wgmma
        cute.arch.barrier(barrier_id=Q_BARRIER0 + wg, number_of_threads=128)
        return q_rows


# ---------------------------------------------------------------------- compile / run API
def _compile_args(dtype_out):
    from cutlass.cute.runtime import make_ptr

    gm = cute.AddressSpace.gmem
    args = list(K._compile_args(dtype_out))
    return tuple(args[:8] + [make_ptr(dtype_out, 0, gm, assumed_align=16)] + args[8:])


def smem_bytes(head_dim: int = 128, config: Sm90Config | None = None) -> int:
    """The shipped kernel's shared memory plus the rotation matrix's 16-bit (D, D) tile."""
    return K.smem_bytes(head_dim, config) + head_dim * head_dim * 2


def compile_qrot(head_dim: int, dtype_out, *, fake: bool, arch: str = "sm_90a", options_extra: str = "",
                 tvm_ffi: bool = False, config: Sm90Config | None = None, key_lens: bool = False,
                 qk_int8: bool = True):
    """``K.compile_sm90``'s contract (INT8 only) with q 16-bit and ``rot_t`` after ``lse`` (module docstring)."""
    dtype_out = K._out_dtype(dtype_out)
    config = config or K.config_for(arch, head_dim)
    kern = Sm90Fp8QRotAttention(head_dim, dtype_out, config, key_lens=key_lens, qk_int8=qk_int8)
    return K.compile_kernel(kern, _compile_args(dtype_out), fake=fake, arch=arch, options_extra=options_extra,
                            tvm_ffi=tvm_ffi, smem=smem_bytes(head_dim, config))


_CACHE: dict = {}


def compiled(head_dim: int, out_dtype: str, tvm_ffi: bool):
    key = (head_dim, out_dtype, tvm_ffi)
    fn = _CACHE.get(key)
    if fn is None:
        fn = _CACHE[key] = compile_qrot(head_dim, out_dtype, fake=False, tvm_ffi=tvm_ffi)
    return fn


_ROT_T: dict = {}


def rotation_t(D: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Rpm1^T (D, D) contiguous in ``dtype`` on ``device``: the rotation wgmma's B operand (K-major)."""
    from ditprof.kernels.rotation import rotation_pm1

    key = (D, dtype, str(device))
    r = _ROT_T.get(key)
    if r is None:
        r = _ROT_T[key] = rotation_pm1(D, torch.float64, "cpu").t().contiguous().to(dtype=dtype, device=device)
    return r


def run_qrot(q, k8, v8t, scales, sq: int, sk: int, softmax_scale: float, out, lse,
             tvm_ffi: bool | None = None) -> None:
    """Launch on the current stream: q 16-bit (B, Sq, H, D) contiguous, k8 int8 (B,H,Sk_pad,D), v8t e4m3 (or a
    uint8 view) (B,H,D,Sk_pad) in the shipped key order, scales (B,H,3) float32 (the K and V descales are read),
    out (B,Sq,H,D) in q's dtype, lse (B,H,Sq) fp32."""
    from ditprof.kernels.launch import DTYPE_NAMES, LAUNCH_INFO, tvm_ffi_launch_enabled

    B, Sq, H, D = q.shape
    if q.dtype not in DTYPE_NAMES or not q.is_contiguous():
        raise ValueError("q must be a contiguous bf16/fp16 (B, Sq, H, D) tensor")
    if k8.dtype != torch.int8 or tuple(k8.shape[:2]) != (B, H) or k8.shape[3] != D:
        raise ValueError("k8 must be int8 (B, H, Sk_pad, D)")
    if out.dtype != q.dtype or tuple(out.shape) != (B, Sq, H, D) or tuple(lse.shape) != (B, H, Sq):
        raise ValueError("out (B,Sq,H,D) in q's dtype and lse (B,H,Sq) expected")
    sq_pad = -(-Sq // 128) * 128
    sk_pad = k8.shape[2]
    rot = rotation_t(D, q.dtype, q.device)
    if tvm_ffi is None:
        tvm_ffi = tvm_ffi_launch_enabled()
    stream = torch.cuda.current_stream(q.device).cuda_stream
    sizes = (B, H, sq, sk, sq_pad, sk_pad)
    if tvm_ffi:
        try:
            compiled(D, DTYPE_NAMES[out.dtype], True)(
                q.data_ptr(), k8.data_ptr(), v8t.data_ptr(), scales.data_ptr(), scales.data_ptr(),
                scales.data_ptr(), out.data_ptr(), lse.data_ptr(), rot.data_ptr(), *sizes, float(softmax_scale),
                stream)
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
    qt = K._out_dtype(DTYPE_NAMES[q.dtype])
    fn(ptr(qt, q, 16), ptr(i8, k8, 16), ptr(f8, v8t, 16), ptr(Float32, scales, 4), ptr(Float32, scales, 4),
       ptr(Int32, scales, 4), ptr(qt, out, 16), ptr(Float32, lse, 4), ptr(qt, rot, 16),
       *(Int32(x) for x in sizes), Float32(softmax_scale), cuda.CUstream(stream))
    LAUNCH_INFO["last_launch"] = "jit"


__all__ = ["Sm90Fp8QRotAttention", "compile_qrot", "run_qrot", "rotation_t", "smem_bytes", "cvt_rni_s32",
           "Float16"]
