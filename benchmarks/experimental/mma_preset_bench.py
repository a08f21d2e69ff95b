"""The INT8 accumulator preset as a wgmma (``fp8_fwd_sm90_mma_preset``) against the shipped kernel's 20 LDS.128, in
the op's launch record: two records of the same configuration (plain grid, Q in the kernel as shipped), one with its
compiled kernel swapped for the variant; whole calls (prep + kernel) alternating behind a sleep
(``bench_helpers.sleep_alternating``), median of ``--rounds``, the outputs compared bit for bit (the preset is exact,
so they must be equal). Shapes on the stream-K grid are not timed (the variant is the plain grid's build).

    python benchmarks/experimental/mma_preset_bench.py --shapes cogvideox,h3,wan14b --rounds 15 --json out.json
"""

from __future__ import annotations

import math
import os
import sys

SHAPES = {  # B, S, H, D
    "cogvideox": (1, 17776, 48, 64),
    "h3": (1, 30272, 56, 128),
    "wan14b": (1, 75600, 40, 128),
    "hunyuan": (1, 119056, 24, 128),
    "small64": (1, 6000, 8, 64),
}


def variant_record(q, k, v):
    """(shipped record, variant record): two launch records of q, k, v's configuration (distinct cache keys through
    ``DITPROF_FP8_QROT`` unset / "1", the same rule), the second running ``compile_mma_preset``'s kernel."""
    from fp8_fwd_sm90_mma_preset import compile_mma_preset

    from ditprof.kernels import launch

    os.environ.pop("DITPROF_FP8_QROT", None)
    shipped = launch.record_for(q, k, v, False)
    os.environ["DITPROF_FP8_QROT"] = "1"
    variant = launch.record_for(q, k, v, False)
    os.environ.pop("DITPROF_FP8_QROT")
    if variant is shipped or variant.streamk is not None or not variant.spec.qk_int8:
        return shipped, None
    variant.fn = compile_mma_preset(q.shape[-1], variant.spec.out_dtype, fake=False,
                                    tvm_ffi=variant.spec.tvm_ffi, q_rot=variant.spec.q_rot)
    return shipped, variant


def measure(name: str, rounds: int) -> dict:
    import torch
    from bench_helpers import gaussian_qkv, records_ab

    from ditprof.kernels import launch

    B, S, H, D = SHAPES[name]
    q, k, v = gaussian_qkv(B, S, H, D, seed=5)
    scale = 1.0 / math.sqrt(D)
    shipped, variant = variant_record(q, k, v)
    row = {"shape": name, "B": B, "S": S, "H": H, "D": D, "grid": shipped.summary()["grid"],
           "q_in_kernel": shipped.q_rot}
    if variant is None:
        return row
    variant_fn = variant.fn
    row.update(records_ab(q, k, v, scale, {"mma_preset": variant, "shipped": shipped}, rounds))
    if variant.fn is not variant_fn:  # a failed TVM-FFI call falls back to the shipped kernel: not this variant
        raise RuntimeError(f"the variant's record fell back to another kernel: {launch.LAUNCH_INFO}")
    del q, k, v
    torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    from bench_helpers import records_ab_main

    return records_ab_main(argv, __doc__, SHAPES, "cogvideox,h3,wan14b", measure, ("mma_preset", "shipped"),
                           "not the plain INT8 grid: not timed")


if __name__ == "__main__":
    sys.exit(main())
