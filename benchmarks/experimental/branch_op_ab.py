"""The op's launch record with the prep's V quantize branched onto a side stream (the default for problems too large
to reuse a workspace: every direct call forks after the stats and joins before the kernel) against a record keeping
the prep in one chain (``DITPROF_FP8_BRANCH=0``), in one process, direct calls on the default stream: whole calls
alternating behind a sleep (GPU time), median of ``--rounds``; the outputs compared bit for bit. (The branch was
measured on captured preps in session 22; this times it where it runs directly.)

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
    from bench_helpers import default_and_switched_records, gaussian_qkv, records_ab

    from ditprof.kernels import launch

    B, S, H, D = SHAPES[name]
    q, k, v = gaussian_qkv(B, S, H, D, seed=5)
    scale = 1.0 / math.sqrt(D)
    rec_branch, rec_chain = default_and_switched_records(q, k, v, "DITPROF_FP8_BRANCH")
    row = {"shape": name, "B": B, "S": S, "H": H, "D": D, "grid": rec_branch.summary()["grid"]}
    if not rec_branch.reuse:  # a reused workspace branches only when captured: nothing to time directly
        row.update(records_ab(q, k, v, scale, {"branch": rec_branch, "chain": rec_chain}, rounds))
    launch._RECORDS.clear()
    torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    from bench_helpers import records_ab_main

    return records_ab_main(argv, __doc__, SHAPES, "cogvideox,wan1.3b,h3", measure, ("branch", "chain"),
                           "workspace reused: branches only when captured")


if __name__ == "__main__":
    sys.exit(main())
