"""The shipped fp8 call at one shape, a few times, for ``ncu`` to profile the prep's Triton launches (the stats pass
at Flux's shape moves ~56 MB in ~50 µs, ~1 TB/s: why). Not a benchmark: no timing here.

    ncu --set full -k regex:_stats_kernel|_quant_kernel --launch-skip 3 --launch-count 3 \
        python benchmarks/experimental/prep_ncu_child.py --shape 1,4608,24,128 --format int8
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="1,4608,24,128", help="B,S,H,D (self-attention, BSHD)")
    ap.add_argument("--format", choices=("int8", "e4m3"), default="int8")
    ap.add_argument("--calls", type=int, default=3)
    args = ap.parse_args(argv)
    os.environ["DITPROF_FP8_QK"] = args.format
    import torch

    from ditprof.kernels import fp8_attention

    B, S, H, D = (int(x) for x in args.shape.split(","))
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn((B, S, H, D), generator=g, device="cuda").to(torch.bfloat16) for _ in range(3))
    for _ in range(1 + args.calls):  # the first call compiles
        fp8_attention(q, k, v)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
