"""The op's launch record replaying each call as one CUDA graph (the default; captured calls branch the prep's V
quantize beside its Q/K one) against a record launching every call directly (``DITPROF_FP8_GRAPHS=0``), in one
process: whole calls alternating behind a sleep (GPU time only: the host's launch cost never shows), median of
``--rounds``; the outputs compared bit for bit.

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
    from bench_helpers import default_and_switched_records, gaussian_qkv, records_ab

    from ditprof.kernels import launch

    B, S, H, D = SHAPES[name]
    q, k, v = gaussian_qkv(B, S, H, D, seed=4)
    scale = 1.0 / math.sqrt(D)
    rec_graph, rec_direct = default_and_switched_records(q, k, v, "DITPROF_FP8_GRAPHS")
    row = {"shape": name, "B": B, "S": S, "H": H, "D": D, "grid": rec_graph.summary()["grid"]}
    if rec_graph.graphs is not None:  # None where the workspace is too large to reuse: no graphs, nothing to time
        row.update(records_ab(q, k, v, scale, {"graph": rec_graph, "direct": rec_direct}, rounds))
        row["graphs"] = rec_graph.graphs.summary()
    launch._RECORDS.clear()
    torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    from bench_helpers import records_ab_main

    return records_ab_main(argv, __doc__, SHAPES, "flux,ltx", measure, ("graph", "direct"),
                           "workspace not reused: no graphs")


if __name__ == "__main__":
    sys.exit(main())
