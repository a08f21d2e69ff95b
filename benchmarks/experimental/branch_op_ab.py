"""The FP8 front door with the prep's V quantize branched onto a side stream (the default, ``Fp8Options()``, for
problems too large to reuse a workspace: every direct call forks after the stats and joins before the kernel)
against the prep in one chain (``Fp8Options(branch=False)``), in one process, direct calls on the default stream:
whole calls alternating behind a sleep (GPU time), median of ``--rounds``; the outputs compared bit for bit. A shape
whose workspace is reused branches only inside its CUDA graphs (reported, not timed).

    python benchmarks/experimental/branch_op_ab.py --shapes cogvideox,wan1.3b,h3 --rounds 10 --json out.json
"""

from __future__ import annotations

import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from bench_helpers import VIDEO_SHAPES  # noqa: E402

SHAPES = {n: VIDEO_SHAPES[n] for n in ("flux", "ltx", "cogvideox", "wan1.3b", "h3", "wan14b", "hunyuan")}


def measure(name: str, rounds: int) -> dict:
    import torch
    from bench_helpers import calls_ab, front_door_calls, gaussian_qkv, what_ran

    from ditprof.kernels.fp8_config import Fp8Options

    B, S, H, D = SHAPES[name]
    q, k, v = gaussian_qkv(B, S, H, D, seed=5)
    calls = front_door_calls(q, k, v, 1.0 / math.sqrt(D), {"branch": Fp8Options(), "chain": Fp8Options(branch=False)})
    ran = what_ran(calls["branch"])
    row = {"shape": name, "B": B, "S": S, "H": H, "D": D, "grid": ran["grid"]}
    if not ran["graph_replays"]:  # graphs replay only on a reused workspace, whose direct calls never branch
        row.update(calls_ab(calls, rounds))
    del q, k, v
    torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    from bench_helpers import records_ab_main

    return records_ab_main(argv, __doc__, SHAPES, "cogvideox,wan1.3b,h3", measure, ("branch", "chain"),
                           "workspace reused: branches only when captured")


if __name__ == "__main__":
    sys.exit(main())
