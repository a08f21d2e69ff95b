"""The op's launch record with Q quantized in the kernel (the default on fp8-sm90's plain grid) against the same
record kind with the prep's Q (``DITPROF_FP8_QROT=0``), in one process: the two records' whole calls (prep + kernel)
alternating call by call behind a sleep (``bench_helpers.sleep_alternating``), median of ``--rounds``; the outputs
compared bit for bit. Shapes whose grid is stream-K keep the prep's Q in both (reported, not timed).

    python benchmarks/experimental/qrot_op_ab.py --shapes cogvideox,wan1.3b,h3 --rounds 15 --json out.json
"""

from __future__ import annotations

import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from bench_helpers import VIDEO_SHAPES  # noqa: E402

SHAPES = VIDEO_SHAPES  # B, S, H, D: all seven


def measure(name: str, rounds: int) -> dict:
    import torch
    from bench_helpers import default_and_switched_records, gaussian_qkv, records_ab

    B, S, H, D = SHAPES[name]
    q, k, v = gaussian_qkv(B, S, H, D, seed=3)
    scale = 1.0 / math.sqrt(D)
    rec_in, rec_prep = default_and_switched_records(q, k, v, "DITPROF_FP8_QROT")
    row = {"shape": name, "B": B, "S": S, "H": H, "D": D, "q_in_kernel": rec_in.q_rot,
           "grid": rec_in.summary()["grid"]}
    if not rec_in.q_rot:
        return row
    row.update(records_ab(q, k, v, scale, {"q_in_kernel": rec_in, "prep_q": rec_prep}, rounds))
    del q, k, v
    torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    from bench_helpers import records_ab_main

    return records_ab_main(argv, __doc__, SHAPES, "cogvideox,wan1.3b,h3", measure, ("q_in_kernel", "prep_q"),
                           "the prep's Q: not timed")


if __name__ == "__main__":
    sys.exit(main())
