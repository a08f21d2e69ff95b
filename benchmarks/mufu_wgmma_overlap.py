"""Can Hopper run MUFU.EX2 and FP8 warpgroup MMA at the same time? (issue 5; benchmarks/NOTES.md, session 2)

The FP8 attention kernel gives the tensor cores and the MUFU (exp) unit equal work at head_dim 128, and ncu read
XU% + tensor% ~= 100 % in every schedule tried, as if the two never ran together. This micro-benchmark asks the
hardware directly. One CTA per SM, two warpgroups:

* warpgroup 0 issues ``n_mma`` rounds of 4 x ``wgmma m64n256k32`` e4m3 -> fp32 (both operands in shared memory,
  one group in flight behind the one being waited for), like the attention kernel's QK / PV chains;
* warpgroup 1 runs ``n_mufu`` rounds of 16 independent ``ex2.approx`` chains (one warp per scheduler).

Three launches of the same compiled kernel: MMA only, MUFU only, both. If both ~= max(alone) the units overlap;
if both ~= sum(alone) they exclude each other. Round counts are scaled so that the two alone take about as long.

    python benchmarks/mufu_wgmma_overlap.py [--ms 20] [--json PATH]     # needs an sm_90 GPU

Compiles on any machine (``--compile-only`` with CUTE_DSL_ARCH=sm_90a) for a SASS check.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float8E4M3FN, Float32, Int32, Uint8
from cutlass.cute.nvgpu import OperandMajorMode, warpgroup
from cutlass.tensor_utils import LayoutEnum

import cuda.bindings.driver as cuda

sys.path.insert(0, str(Path(__file__).resolve().parent))

M, N, K = 64, 256, 128  # one warpgroup's wgmma tile; 4 k-blocks of 32 per round
MUFU_CHAINS = 16


class OverlapProbe:
    @cute.jit
    def __call__(self, pOut: cute.Pointer, n_mma: Int32, n_mufu: Int32, ctas: Int32, stream: cuda.CUstream):
        f8 = Float8E4M3FN
        mOut = cute.make_tensor(pOut, cute.make_layout((256, ctas), stride=(1, 256)))
        mma = sm90_utils.make_trivial_tiled_mma(f8, f8, OperandMajorMode.K, OperandMajorMode.K, Float32,
                                                (1, 1, 1), (M, N))
        tiler = (M, N, K)
        sA_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, tiler, f8, 1)
        sB_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, tiler, f8, 1)

        @cute.struct
        class Smem:
            sA: cute.struct.Align[cute.struct.MemRange[f8, cute.cosize(sA_layout)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[f8, cute.cosize(sB_layout)], 1024]

        self.smem = Smem
        self.kernel(mma, mOut, n_mma, n_mufu, sA_layout, sB_layout).launch(
            grid=(ctas, 1, 1), block=[256, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mma: cute.TiledMma, mOut: cute.Tensor, n_mma: Int32, n_mufu: Int32,
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

        if wg == 0:
            mma.set(warpgroup.Field.ACCUMULATE, True)
            thr = mma.get_slice(tidx)
            tA = thr.make_fragment_A(thr.partition_A(sA))
            tB = thr.make_fragment_B(thr.partition_B(sB))
            acc = cute.make_rmem_tensor(thr.partition_shape_C((M, N)), Float32)
            acc.fill(0.0)
            for _ in cutlass.range(n_mma, unroll=1):
                warpgroup.fence()
                for kb in cutlass.range_constexpr(K // 32):
                    cute.gemm(mma, acc, tA[None, None, kb, 0], tB[None, None, kb, 0], acc)
                warpgroup.commit_group()
                warpgroup.wait_group(1)  # one round in flight behind the one waited for
            warpgroup.wait_group(0)
            mOut[tidx, cta] = acc[0] + acc[cute.size(acc) - 1]
        else:
            x = cute.make_rmem_tensor((MUFU_CHAINS,), Float32)
            for c in cutlass.range_constexpr(MUFU_CHAINS):
                x[c] = Float32(c) * Float32(0.0625) - Float32(0.5)
            for _ in cutlass.range(n_mufu, unroll=1):
                for c in cutlass.range_constexpr(MUFU_CHAINS):
                    x[c] = cute.arch.exp2(x[c]) - Float32(1.5)  # stays in [-1, 0.5]: no overflow, no denormals
            s = Float32(0.0)
            for c in cutlass.range_constexpr(MUFU_CHAINS):
                s = s + x[c]
            mOut[tidx, cta] = s


def compile_probe(*, fake: bool, options_extra: str = ""):
    from cutlass.cute.runtime import make_ptr

    old = os.environ.get("CUTE_DSL_ARCH")
    os.environ["CUTE_DSL_ARCH"] = "sm_90a"
    try:
        if fake:
            stream = cute.runtime.make_fake_stream()
        else:
            import torch

            stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
        return cute.compile(OverlapProbe(), make_ptr(Float32, 0, cute.AddressSpace.gmem, assumed_align=4),
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
        compile_probe(fake=True)
        print("compiled for sm_90a")
        return 0
    import torch
    from cutlass.cute.runtime import make_ptr

    from common import environment, print_table, results_path, write_json

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("needs an sm_90 GPU", file=sys.stderr)
        return 1
    fn = compile_probe(fake=False)
    ctas = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.empty((ctas, 256), dtype=torch.float32, device="cuda")
    stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    ptr = make_ptr(Float32, out.data_ptr(), cute.AddressSpace.gmem, assumed_align=4)

    def timed(n_mma: int, n_mufu: int, reps: int = 5) -> float:
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        fn(ptr, Int32(n_mma), Int32(n_mufu), Int32(ctas), stream)
        times = []
        for _ in range(reps):
            ev[0].record()
            fn(ptr, Int32(n_mma), Int32(n_mufu), Int32(ctas), stream)
            ev[1].record()
            torch.cuda.synchronize()
            times.append(ev[0].elapsed_time(ev[1]))
        return sorted(times)[len(times) // 2]

    # scale each unit's rounds to about --ms alone
    n_mma = max(1, int(1000 * args.ms / max(timed(1000, 0), 1e-3)))
    n_mufu = max(1, int(1000 * args.ms / max(timed(0, 1000), 1e-3)))
    t_mma, t_mufu, t_both = timed(n_mma, 0), timed(0, n_mufu), timed(n_mma, n_mufu)
    flop = 2.0 * M * N * K * n_mma * ctas
    ex2 = MUFU_CHAINS * 128 * n_mufu * ctas
    overlap = (t_mma + t_mufu - t_both) / min(t_mma, t_mufu)  # 1 = full overlap, 0 = none
    rows = [["MMA only (1 warpgroup)", f"{t_mma:.3f}", f"{flop / t_mma / 1e9:.0f} TFLOP/s", ""],
            ["MUFU only (1 warpgroup)", f"{t_mufu:.3f}", f"{ex2 / t_mufu / 1e9:.0f} G ex2/s", ""],
            ["both", f"{t_both:.3f}", "", f"overlap {overlap:.2f} (1 = full, 0 = none)"]]
    env = environment()
    print_table(f"MUFU.EX2 vs FP8 wgmma on {env['gpu']}: {ctas} CTAs, n_mma {n_mma}, n_mufu {n_mufu}",
                ["launch", "ms", "rate", "note"], rows)
    payload = {"benchmark": "mufu_wgmma_overlap", "environment": env, "ctas": ctas, "n_mma": n_mma,
               "n_mufu": n_mufu, "ms": {"mma": t_mma, "mufu": t_mufu, "both": t_both}, "overlap": overlap}
    path = Path(args.json) if args.json else results_path("mufu-wgmma-overlap")
    write_json(payload, path)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
