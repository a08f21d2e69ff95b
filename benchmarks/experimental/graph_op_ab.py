"""The FP8 front door replaying each repeated call as one CUDA graph (the default, ``Fp8Options()``; captured calls
branch the prep's V quantize beside its Q/K one) against the same calls launched directly
(``Fp8Options(graphs=False)``), in one process: whole calls alternating behind a sleep (GPU time only: the host's
launch cost never shows), median of ``--rounds``; the outputs compared bit for bit. Shapes too large to reuse a
workspace have no graphs (reported, not timed).

    python benchmarks/experimental/graph_op_ab.py --shapes flux,ltx --rounds 25 --json out.json
"""

from __future__ import annotations

import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from bench_helpers import VIDEO_SHAPES  # noqa: E402

SHAPES = {n: VIDEO_SHAPES[n] for n in ("flux", "ltx", "cogvideox", "wan1.3b", "h3")}  # B, S, H, D


def measure(name: str, rounds: int) -> dict:
    import torch
    from bench_helpers import calls_ab, front_door_calls, gaussian_qkv, what_ran

    from ditprof.kernels.fp8_config import Fp8Options

    B, S, H, D = SHAPES[name]
    q, k, v = gaussian_qkv(B, S, H, D, seed=4)
    calls = front_door_calls(q, k, v, 1.0 / math.sqrt(D), {"graph": Fp8Options(), "direct": Fp8Options(graphs=False)})
    ran = what_ran(calls["graph"])
    row = {"shape": name, "B": B, "S": S, "H": H, "D": D, "grid": ran["grid"]}
    if ran["graph_replays"]:  # none where the workspace is too large to reuse: no graphs, nothing to time
        row.update(calls_ab(calls, rounds))
    del q, k, v
    torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    from bench_helpers import records_ab_main

    return records_ab_main(argv, __doc__, SHAPES, "flux,ltx", measure, ("graph", "direct"),
                           "workspace not reused: no graphs")


if __name__ == "__main__":
    sys.exit(main())
