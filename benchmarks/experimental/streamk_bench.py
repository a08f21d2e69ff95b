"""fp8-sm90 kernel only: shipped vs split-KV tail vs stream-K tail (``fp8_fwd_sm90_streamk.py``), each with its
merge and alone, on one shipped prep of fresh Gaussian inputs per shape and format; in one process, alternating
call by call behind a sleep, median of the rounds. Prints a table and writes JSON (machine, date, versions).

    python benchmarks/experimental/streamk_bench.py                        # flux, ltx, h3; int8 and e4m3
    python benchmarks/experimental/streamk_bench.py --shapes flux --formats int8 --rounds 30
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from bench_helpers import (  # noqa: E402 -- after the path set-up
    empty_outputs, gaussian_prep, shipped_launch, sleep_alternating, timing_fields, warm)
from common import environment, print_table, results_path, write_json  # noqa: E402

SHAPES = {"flux": (1, 24, 4608, 128), "ltx": (1, 32, 7392, 64), "h3": (1, 56, 30272, 128)}


def time_shape(name: str, shape: tuple, qk_int8: bool, rounds: int) -> list[dict]:
    from fp8_fwd_sm90_splitkv import run_splitkv
    from fp8_fwd_sm90_streamk import run_streamk
    from tile_n_bench import rel_rms

    B, H, S, D = shape
    prep = gaussian_prep(B, H, S, D, qk_int8=qk_int8)
    scale = 1.0 / math.sqrt(D)
    names = ("shipped", "split-KV + merge", "stream-K + merge", "stream-K kernel only")
    outs = {n: empty_outputs(B, S, H, D) for n in names}
    split_args = (prep.q8, prep.k8, prep.v8t, prep.scales, S, S, scale)
    runners = {
        "shipped": functools.partial(shipped_launch(prep, B, H, S, D, scale, qk_int8=qk_int8), *outs["shipped"]),
        "split-KV + merge": lambda: run_splitkv(*split_args, *outs["split-KV + merge"], q_scales=prep.q_scales),
        "stream-K + merge": functools.partial(run_streamk, prep, scale, *outs["stream-K + merge"]),
        "stream-K kernel only": functools.partial(run_streamk, prep, scale, *outs["stream-K kernel only"],
                                                  merge=False),
    }
    warm(runners)
    ref = outs["shipped"][0]
    agree = {n: rel_rms(outs[n][0], ref) for n in ("split-KV + merge", "stream-K + merge")}
    times = sleep_alternating(runners, rounds)
    flops = 4.0 * B * H * S * S * D
    base = statistics.median(times["shipped"])
    fmt = "int8" if qk_int8 else "e4m3"
    return [{"shape": name, "B,H,S,D": shape, "format": fmt, "kernel": k, **timing_fields(ts, flops),
             "change_pct": 100 * (statistics.median(ts) - base) / base, "rel_rms_vs_shipped": agree.get(k)}
            for k, ts in times.items()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list of {', '.join(SHAPES)}")
    ap.add_argument("--formats", default="int8,e4m3")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", default=None, help="output path (default benchmarks/results/streamk-bench-DATE.json)")
    args = ap.parse_args()
    names = [s.strip() for s in args.shapes.split(",") if s.strip()]
    formats = [s.strip() for s in args.formats.split(",") if s.strip()]
    if [n for n in names if n not in SHAPES] or [f for f in formats if f not in ("int8", "e4m3")]:
        ap.error(f"shapes from {list(SHAPES)}, formats from int8, e4m3")
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("needs an sm_90 GPU (H100/H200)")
        return 2
    rows = []
    for n in names:
        for f in formats:
            print(f"{n} {SHAPES[n]} {f} ...", flush=True)
            rows += time_shape(n, SHAPES[n], f == "int8", args.rounds)
    print_table(f"fp8-sm90 kernel only: shipped vs split-KV vs stream-K tail (median of {args.rounds}, ms)",
                ["shape", "format", "kernel", "median ms", "min ms", "TFLOP/s", "change %", "rel-RMS vs shipped"],
                [[r["shape"], r["format"], r["kernel"], r["median_ms"], r["min_ms"], r["tflops"], r["change_pct"],
                  "" if r["rel_rms_vs_shipped"] is None else r["rel_rms_vs_shipped"]] for r in rows])
    path = Path(args.json) if args.json else results_path("streamk-bench")
    write_json({"environment": environment(), "args": vars(args), "rows": rows}, path)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
