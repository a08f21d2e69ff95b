"""Can Hopper run MUFU.EX2 (or FFMA) and warpgroup MMA at the same time? (issue 5; benchmarks/NOTES.md)

The FP8 attention kernel gives the tensor cores and the MUFU (exp) unit equal work at head_dim 128, and ncu read
XU% + tensor% ~= 100 % in every schedule tried, as if the two never ran together. This micro-benchmark asks the
hardware directly. One CTA per SM, two warpgroups:

* warpgroup 0 issues rounds of ``wgmma m64n256`` over K = 128 (fp32 accumulate, one round in flight behind the
  one waited for), with one of three operand kinds: ``fp8-ss`` (e4m3, both operands in shared memory, like QK),
  ``fp8-rs`` (e4m3, A in registers, like P V) and ``bf16-ss`` (the BF16 kernels' case, e.g. FA4);
* warpgroup 1 runs rounds of 16 independent chains of ``mufu`` (``ex2.approx.f32``), ``mufu-f16x2``
  (``ex2.approx.f16x2``, two exps per instruction: is the packed half-precision exp faster per exp?) or ``ffma``
  (the FMA pipe, where an off-MUFU exp would run).

For each pair: the MMA alone, the side unit alone, both. Besides wall time, each warpgroup's first thread reads
``clock64`` around its loop, so the result is in SM cycles too (the card lowers its clock when both units run;
cycles do not). overlap = (t_mma + t_side - t_both) / min(t_mma, t_side): 1 = full overlap, 0 = none.

    python benchmarks/mufu_wgmma_overlap.py [--ms 20] [--json PATH]     # needs an sm_90 GPU
    python benchmarks/mufu_wgmma_overlap.py --compile-only              # any machine: compile all six for sm_90a
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Float8E4M3FN, Float32, Int32, Uint8
from cutlass.cute.nvgpu import OperandMajorMode, warpgroup
from cutlass.tensor_utils import LayoutEnum
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

import cuda.bindings.driver as cuda

sys.path.insert(0, str(Path(__file__).resolve().parent))

M, N, K = 64, 256, 128  # one warpgroup's wgmma tile per round
CHAINS = 16
MMA_KINDS = ("fp8-ss", "fp8-rs", "bf16-ss")
SIDE_KINDS = ("mufu", "ffma", "mufu-f16x2")
# exps per chain step and lane: ex2.approx.f16x2 does two (packed halves)
EXPS_PER_STEP = {"mufu": 1, "ffma": 0, "mufu-f16x2": 2}
OUT_COLS = 256 + 4  # 256 thread results, then (mma cycles, side cycles) per CTA


@dsl_user_op
def ex2_f16x2_step(x, *, loc=None, ip=None) -> Int32:
    """x (two packed fp16) -> ex2.approx.f16x2(x) - 1.5 per half: one chain step of the f16x2 side kind."""
    asm = ("{\n\t.reg .b32 t, c;\n\tmov.b32 c, 0x3E003E00;\n\tex2.approx.f16x2 t, $1;\n\t"
           "sub.rn.f16x2 $0, t, c;\n\t}")
    return Int32(llvm.inline_asm(T.i32(), [Int32(x).ir_value(loc=loc, ip=ip)], asm, "=r,r",
                                 has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


class OverlapProbe:
    def __init__(self, mma_kind: str, side_kind: str):
        assert mma_kind in MMA_KINDS and side_kind in SIDE_KINDS
        self.mma_kind, self.side_kind = mma_kind, side_kind
        self.dtype = BFloat16 if mma_kind.startswith("bf16") else Float8E4M3FN
        self.k_block = 16 if self.dtype is BFloat16 else 32
        self.rs = mma_kind.endswith("-rs")

    @cute.jit
    def __call__(self, pOut: cute.Pointer, n_mma: Int32, n_side: Int32, ctas: Int32, stream: cuda.CUstream):
        dt = self.dtype
        mOut = cute.make_tensor(pOut, cute.make_layout((OUT_COLS, ctas), stride=(1, OUT_COLS)))
        source = warpgroup.OperandSource.RMEM if cutlass.const_expr(self.rs) else warpgroup.OperandSource.SMEM
        mma = sm90_utils.make_trivial_tiled_mma(dt, dt, OperandMajorMode.K, OperandMajorMode.K, Float32,
                                                (1, 1, 1), (M, N), source)
        tiler = (M, N, K)
        sA_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, tiler, dt, 1)
        sB_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, tiler, dt, 1)

        @cute.struct
        class Smem:
            sA: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sA_layout)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sB_layout)], 1024]

        self.smem = Smem
        self.kernel(mma, mOut, n_mma, n_side, sA_layout, sB_layout).launch(
            grid=(ctas, 1, 1), block=[256, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mma: cute.TiledMma, mOut: cute.Tensor, n_mma: Int32, n_side: Int32,
               sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        wg = cute.arch.make_warp_uniform(tidx // 128)
        storage = cutlass.memory.SmemAllocator().allocate(self.smem)
        sA = storage.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = storage.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        # zero operands: the values do not change the timing, zeros keep the accumulators finite
        raw_a = cute.recast_tensor(storage.sA.get_tensor(cute.make_layout(cute.cosize(sA_layout))), Uint8)
        raw_b = cute.recast_tensor(storage.sB.get_tensor(cute.make_layout(cute.cosize(sB_layout))), Uint8)
        for i in range(tidx, cute.size(raw_a), 256):
            raw_a[i] = Uint8(0)
        for i in range(tidx, cute.size(raw_b), 256):
            raw_b[i] = Uint8(0)
        cute.arch.fence_proxy("async.shared", space="cta")  # generic-proxy stores, then wgmma (async proxy) reads
        cute.arch.sync_threads()

        t0 = cute.arch.clock64()
        if wg == 0:
            mma.set(warpgroup.Field.ACCUMULATE, True)
            thr = mma.get_slice(tidx)
            if cutlass.const_expr(self.rs):
                tA = cute.make_rmem_tensor(thr.partition_shape_A((M, K)), self.dtype)
                tA.fill(0.0)
            else:
                tA = thr.make_fragment_A(thr.partition_A(sA))
            tB = thr.make_fragment_B(thr.partition_B(sB))
            acc = cute.make_rmem_tensor(thr.partition_shape_C((M, N)), Float32)
            acc.fill(0.0)
            for _ in cutlass.range(n_mma, unroll=1):
                warpgroup.fence()
                for kb in cutlass.range_constexpr(K // self.k_block):
                    if cutlass.const_expr(self.rs):
                        cute.gemm(mma, acc, tA[None, None, kb], tB[None, None, kb, 0], acc)
                    else:
                        cute.gemm(mma, acc, tA[None, None, kb, 0], tB[None, None, kb, 0], acc)
                warpgroup.commit_group()
                warpgroup.wait_group(1)  # one round in flight behind the one waited for
            warpgroup.wait_group(0)
            mOut[tidx, cta] = acc[0] + acc[cute.size(acc) - 1]
        elif cutlass.const_expr(self.side_kind == "mufu-f16x2"):
            h = cute.make_rmem_tensor((CHAINS,), Int32)
            for c in cutlass.range_constexpr(CHAINS):
                h[c] = Int32(0x38003800 + c)  # (0.5, 0.5 + c ulp) as two fp16
            for _ in cutlass.range(n_side, unroll=1):
                for c in cutlass.range_constexpr(CHAINS):
                    h[c] = ex2_f16x2_step(h[c])  # stays in [-1, 0.5] per half
            acc = h[0]
            for c in cutlass.range_constexpr(1, CHAINS):
                acc = acc ^ h[c]
            mOut[tidx, cta] = Float32(acc)
        else:
            x = cute.make_rmem_tensor((CHAINS,), Float32)
            for c in cutlass.range_constexpr(CHAINS):
                x[c] = Float32(c) * Float32(0.0625) - Float32(0.5)
            for _ in cutlass.range(n_side, unroll=1):
                for c in cutlass.range_constexpr(CHAINS):
                    if cutlass.const_expr(self.side_kind == "mufu"):
                        x[c] = cute.arch.exp2(x[c]) - Float32(1.5)  # stays in [-1, 0.5]: no overflow, no denormals
                    else:
                        x[c] = x[c] * Float32(0.9990234375) + Float32(0.0009765625)  # one FFMA, stays bounded
            s = Float32(0.0)
            for c in cutlass.range_constexpr(CHAINS):
                s = s + x[c]
            mOut[tidx, cta] = s
        t1 = cute.arch.clock64()
        if tidx % 128 == 0:
            mOut[256 + wg, cta] = Float32(t1 - t0)


def compile_probe(mma_kind: str, side_kind: str, *, fake: bool, options_extra: str = ""):
    from cutlass.cute.runtime import make_ptr

    old = os.environ.get("CUTE_DSL_ARCH")
    os.environ["CUTE_DSL_ARCH"] = "sm_90a"
    try:
        if fake:
            stream = cute.runtime.make_fake_stream()
        else:
            import torch

            stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
        return cute.compile(OverlapProbe(mma_kind, side_kind),
                            make_ptr(Float32, 0, cute.AddressSpace.gmem, assumed_align=4),
                            Int32(1), Int32(1), Int32(1), stream,
                            options=f"--gpu-arch sm_90a {options_extra}".strip())
    finally:
        if old is None:
            os.environ.pop("CUTE_DSL_ARCH", None)
        else:
            os.environ["CUTE_DSL_ARCH"] = old


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", type=float, default=20.0, help="target time of each unit alone (default 20 ms)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--compile-only", action="store_true", help="compile for sm_90a with a fake stream (no GPU)")
    args = ap.parse_args()
    if args.compile_only:
        for mk in MMA_KINDS:
            for sk in SIDE_KINDS:
                compile_probe(mk, sk, fake=True)
                print(f"compiled {mk} + {sk} for sm_90a")
        return 0
    import torch
    from cutlass.cute.runtime import make_ptr

    from common import environment, print_table, results_path, write_json

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("needs an sm_90 GPU", file=sys.stderr)
        return 1
    ctas = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.empty((ctas, OUT_COLS), dtype=torch.float32, device="cuda")
    stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    ptr = make_ptr(Float32, out.data_ptr(), cute.AddressSpace.gmem, assumed_align=4)

    rows, results = [], []
    for mk in MMA_KINDS:
        for sk in SIDE_KINDS:
            fn = compile_probe(mk, sk, fake=False)

            def timed(n_mma: int, n_side: int, reps: int = 5):
                ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
                fn(ptr, Int32(n_mma), Int32(n_side), Int32(ctas), stream)
                ms, cyc = [], []
                for _ in range(reps):
                    out.fill_(float("nan"))
                    ev[0].record()
                    fn(ptr, Int32(n_mma), Int32(n_side), Int32(ctas), stream)
                    ev[1].record()
                    torch.cuda.synchronize()
                    ms.append(ev[0].elapsed_time(ev[1]))
                    cyc.append(out[:, 256:258].max().item())  # slowest warpgroup of the slowest CTA
                order = sorted(range(reps), key=lambda i: ms[i])
                mid = order[reps // 2]
                return ms[mid], cyc[mid]

            n_mma = max(1, int(200 * args.ms / max(timed(200, 0)[0], 1e-3)))
            n_side = max(1, int(200 * args.ms / max(timed(0, 200)[0], 1e-3)))
            (t_mma, c_mma), (t_side, c_side), (t_both, c_both) = (
                timed(n_mma, 0), timed(0, n_side), timed(n_mma, n_side))
            ov_ms = (t_mma + t_side - t_both) / min(t_mma, t_side)
            ov_cyc = (c_mma + c_side - c_both) / min(c_mma, c_side)
            flop = 2.0 * M * N * K * n_mma * ctas
            res = dict(mma=mk, side=sk, n_mma=n_mma, n_side=n_side,
                       ms=dict(mma=t_mma, side=t_side, both=t_both),
                       cycles=dict(mma=c_mma, side=c_side, both=c_both),
                       mma_tflops_alone=flop / t_mma / 1e9, overlap_ms=ov_ms, overlap_cycles=ov_cyc,
                       side_cycles_per_step=c_side / n_side,
                       exps_per_sm_cycle=(EXPS_PER_STEP[sk] * CHAINS * 128 * n_side / c_side) or None,
                       mhz=dict(mma=c_mma / t_mma / 1e3, side=c_side / t_side / 1e3, both=c_both / t_both / 1e3))
            results.append(res)
            eps = res["exps_per_sm_cycle"]
            rows.append([mk, sk, f"{t_mma:.2f}", f"{t_side:.2f}", f"{t_both:.2f}", f"{ov_ms:.2f}",
                         f"{ov_cyc:.2f}", f"{res['mma_tflops_alone']:.0f}", f"{eps:.1f}" if eps else "-",
                         f"{res['mhz']['mma']:.0f}/{res['mhz']['side']:.0f}/{res['mhz']['both']:.0f}"])
    env = environment()
    print_table(f"MMA vs MUFU/FFMA on {env['gpu']}: {ctas} CTAs (1 = full overlap, 0 = none)",
                ["mma", "side", "mma ms", "side ms", "both ms", "overlap (ms)", "overlap (cycles)",
                 "TFLOP/s alone", "exps/SM-cycle", "MHz mma/side/both"], rows)
    payload = {"benchmark": "mufu_wgmma_overlap", "environment": env, "ctas": ctas, "results": results}
    path = Path(args.json) if args.json else results_path("mufu-wgmma-overlap")
    write_json(payload, path)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
