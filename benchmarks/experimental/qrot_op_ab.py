"""The FP8 front door with Q quantized in the kernel (the default on fp8-sm90's plain grid, ``Fp8Options()``)
against the prep's Q (``Fp8Options(q_in_kernel=False)``), in one process: whole calls (prep + kernel) alternating
call by call behind a sleep (``bench_helpers.sleep_alternating``), median of ``--rounds``; the outputs compared bit
for bit. Shapes whose grid is stream-K keep the prep's Q in both (reported, not timed).

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
    from bench_helpers import calls_ab, front_door_calls, gaussian_qkv, what_ran

    from ditprof.kernels.fp8_config import Fp8Options

    B, S, H, D = SHAPES[name]
    q, k, v = gaussian_qkv(B, S, H, D, seed=3)
    calls = front_door_calls(q, k, v, 1.0 / math.sqrt(D),
                             {"q_in_kernel": Fp8Options(), "prep_q": Fp8Options(q_in_kernel=False)})
    ran = what_ran(calls["q_in_kernel"])
    row = {"shape": name, "B": B, "S": S, "H": H, "D": D, "q_in_kernel": ran["q_in_kernel"], "grid": ran["grid"]}
    if ran["q_in_kernel"]:
        row.update(calls_ab(calls, rounds))
    del q, k, v
    torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    from bench_helpers import records_ab_main

    return records_ab_main(argv, __doc__, SHAPES, "cogvideox,wan1.3b,h3", measure, ("q_in_kernel", "prep_q"),
                           "the prep's Q: not timed")


if __name__ == "__main__":
    sys.exit(main())
