"""fp8-sm90 INT8 with the Q K^T accumulator preset by one wgmma instead of 20 LDS.128 (issue 20, kernel side) --
an experiment; the shipped kernel is unchanged.

The INT8 kernel starts each key tile's int32 accumulator at S_BIAS_BITS (0x4B400000, the float 12582912.0) so that
its bits after the s8 wgmmas are the float 12582912 + S. The shipped kernel writes that preset with 20 volatile
LDS.128 of a 16-byte smem constant per tile (80 registers at tile_n 160; 24 at 192): the key-tile loop is 651
instructions against e4m3's 633, and session 9 measured the preset at +2.0 % of the kernel (benchmarks/NOTES.md).

Here the preset is a zero-init FP8 wgmma of two constant smem tiles: A = e4m3 256 (64 x 32), B = e5m2 1536
(tile_n x 32), so every accumulator element is 32 x 256 x 1536 = 12582912.0 (every product and partial sum a
multiple of 2^17 below 2^24: exact under the FP8 wgmma's short accumulator alignment). It has the shape of the s8
wgmmas that follow (m64 n<tile_n> k32), so the s8 wgmmas accumulate onto it in issue order with no fence (PTX:
accumulator accesses across wgmma.mma_async of the same shape are ordered). S's bits -- and so the output's --
are the shipped kernel's. The cost moves from 20 issue slots per tile to one more k-step on the tensor cores (a
fifth k-step beside Q K^T's four at head_dim 128: +12 % of the tile's wgmma work counting P V and the row sums;
+24 % at head_dim 64, where Q K^T has two) and 7 KB of smem (8 KB at tile_n 192). SASS (CPU): the key-tile loop
651 -> 638 instructions at head_dim 128, 703 -> 688 at 64 (the LDS go, the preset's descriptors add 8 uniform-datapath
instructions), 128 registers, no new local memory. Prediction: up to the LDS preset's measured +2.0 % back at h3 if
the tensor pipe has the slack (the kernel runs at ~half of the dense FP8 rate), less or a loss where the extra
tensor work meets the power cap (680-700 W at h3); at head_dim 64 more likely a loss.

    compile_mma_preset(128, "bfloat16", fake=True, q_rot=True)   # CPU compile (SASS: test_fp8_sm90_mma_preset_sass)
"""

from __future__ import annotations

from types import SimpleNamespace

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, Uint8
from cutlass.cute.nvgpu import OperandMajorMode, warpgroup
from cutlass.cutlass_dsl import BFloat16, Float8E4M3FN, Float8E5M2
from cutlass.tensor_utils import LayoutEnum

from ditprof.kernels import fp8_fwd_sm90 as K
from ditprof.kernels.fp8_fwd_sm90 import TILE_M_WG, Sm90Config, Sm90Fp8Attention

PRESET_A = 0x78  # e4m3 256.0
PRESET_B = 0x66  # e5m2 1536.0
PRESET_K = 32  # the FP8 wgmma's k: 32 x 256 x 1536 = 12582912.0 = K.S_BIAS


class Sm90Fp8MmaPresetAttention(Sm90Fp8Attention):
    """The shipped INT8 kernel (plain grid, ``q_rot`` as shipped) with ``gemm_qk``'s preset as a wgmma."""

    def __init__(self, head_dim: int = 128, dtype_out=BFloat16, config: Sm90Config | None = None,
                 q_rot: bool = False):
        super().__init__(head_dim, dtype_out, config, key_lens=False, qk_int8=True, q_rot=q_rot)

    def preset_layouts(self):
        """The constant A (64 x 32 e4m3) and B (tile_n x 32 e5m2) tiles' smem layouts (host and device)."""
        tiler = (TILE_M_WG, self.tile_n, PRESET_K)
        return (sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, tiler, Float8E4M3FN, 1),
                sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, tiler, Float8E5M2, 1))

    def extra_smem_fields(self) -> dict:
        sA_layout, sB_layout = self.preset_layouts()
        return {**super().extra_smem_fields(),
                "sPresetA": cute.struct.Align[cute.struct.MemRange[Float8E4M3FN, cute.cosize(sA_layout)], 1024],
                "sPresetB": cute.struct.Align[cute.struct.MemRange[Float8E5M2, cute.cosize(sB_layout)], 1024]}

    @cute.jit
    def shared_constants(self, storage, sOnes_layout: cute.ComposedLayout, sPin: cute.Tensor, tidx: Int32):
        # every byte of a tile is the same value, so the swizzle does not matter; the shipped constants' proxy
        # fence and CTA barrier (after these stores) publish them to the wgmma
        sA_layout, sB_layout = self.preset_layouts()
        a_raw = cute.recast_tensor(storage.sPresetA.get_tensor(cute.make_layout(cute.cosize(sA_layout))), Uint8)
        b_raw = cute.recast_tensor(storage.sPresetB.get_tensor(cute.make_layout(cute.cosize(sB_layout))), Uint8)
        for i in range(tidx, cute.size(a_raw), self.threads):
            a_raw[i] = Uint8(PRESET_A)
        for i in range(tidx, cute.size(b_raw), self.threads):
            b_raw[i] = Uint8(PRESET_B)
        return super().shared_constants(storage, sOnes_layout, sPin, tidx)

    def consumer(self, k: SimpleNamespace, w: SimpleNamespace, s: SimpleNamespace, f: SimpleNamespace, warp_idx):
        # the preset wgmma's fragments travel to gemm_qk in the slot of the shipped preset's pointer
        preset_mma = sm90_utils.make_trivial_tiled_mma(
            Float8E4M3FN, Float8E5M2, OperandMajorMode.K, OperandMajorMode.K, Float32, (1, 1, 1),
            (TILE_M_WG, self.tile_n))
        preset_mma.set(warpgroup.Field.ACCUMULATE, False)
        thr = preset_mma.get_slice(f.wg_tidx)
        sA_layout, sB_layout = self.preset_layouts()
        sA = s.storage.sPresetA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = s.storage.sPresetB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        preset = (preset_mma, thr.make_fragment_A(thr.partition_A(sA)), thr.make_fragment_B(thr.partition_B(sB)))
        super().consumer(k, w, SimpleNamespace(**{**vars(s), "bias_ptr": preset}), f, warp_idx)

    @cute.jit
    def gemm_qk(self, qk_mma_zero: cute.TiledMma, qk_mma: cute.TiledMma, acc_S: cute.Tensor, tSrQ: cute.Tensor,
                tSrK: cute.Tensor, wg: Int32, stage: Int32, bias_ptr):
        preset_mma, tPrA, tPrB = bias_ptr
        warpgroup.fence()
        cute.gemm(preset_mma, acc_S, tPrA[None, None, 0, 0], tPrB[None, None, 0, 0], acc_S)
        acc = cute.recast_tensor(acc_S, Int32)
        for kb in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
            cute.gemm(qk_mma, acc, tSrQ[None, None, kb, wg], tSrK[None, None, kb, stage], acc)
        warpgroup.commit_group()


def smem_bytes(head_dim: int, config: Sm90Config | None = None, q_rot: bool = False) -> int:
    """The shipped kernel's shared memory plus the two constant tiles (each 1024-aligned)."""
    c = config or K.config_for("sm_90a", head_dim)
    return K.smem_bytes(head_dim, c, q_rot) + TILE_M_WG * PRESET_K + -(-c.tile_n * PRESET_K // 1024) * 1024


def compile_mma_preset(head_dim: int, dtype_out, *, fake: bool, arch: str = "sm_90a", options_extra: str = "",
                       tvm_ffi: bool = False, q_rot: bool = False):
    """Compile the variant; the same arguments as ``fp8_fwd_sm90.compile_sm90(..., qk_int8=True, q_rot=q_rot)``
    (so a launch record's ``fn`` can be swapped for it)."""
    dtype_out = K._out_dtype(dtype_out)
    config = K.config_for(arch, head_dim)
    kern = Sm90Fp8MmaPresetAttention(head_dim, dtype_out, config, q_rot=q_rot)
    return K.compile_kernel(kern, K._compile_args(dtype_out, q_rot), fake=fake, arch=arch,
                            options_extra=options_extra, tvm_ffi=tvm_ffi, smem=smem_bytes(head_dim, config, q_rot))


__all__ = ["Sm90Fp8MmaPresetAttention", "compile_mma_preset", "smem_bytes"]
