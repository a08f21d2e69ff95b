"""fp8-sm90 kernel only: shipped vs split-KV tail vs stream-K tail (``fp8_fwd_sm90_streamk.py``), each with its
merge and alone, on one shipped prep of fresh Gaussian inputs per shape and format; in one process, alternating
call by call behind a sleep, median of the rounds. Prints a table and writes JSON (machine, date, versions).

    python benchmarks/experimental/streamk_bench.py                        # flux, ltx, h3; int8 and e4m3
    python benchmarks/experimental/streamk_bench.py --shapes flux --formats int8 --rounds 30
"""

from __future__ import annotations

import functools
import math
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from bench_helpers import (  # noqa: E402 -- after the path set-up
    empty_outputs, gaussian_prep, shape_format_main, shipped_launch, sleep_alternating, timing_fields, warm)

SHAPES = {"flux": (1, 24, 4608, 128), "ltx": (1, 32, 7392, 64), "h3": (1, 56, 30272, 128)}


def time_shape(name: str, shape: tuple, qk_int8: bool, rounds: int) -> list[dict]:
    from fp8_fwd_sm90_splitkv import run_splitkv
    from fp8_fwd_sm90_streamk import run_streamk

    from ditprof.kernels.accuracy import compare

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
    agree = {n: compare(outs[n][0], ref)["rel_rms"] for n in ("split-KV + merge", "stream-K + merge")}
    times = sleep_alternating(runners, rounds)
    flops = 4.0 * B * H * S * S * D
    base = statistics.median(times["shipped"])
    fmt = "int8" if qk_int8 else "e4m3"
    return [{"shape": name, "B,H,S,D": shape, "format": fmt, "kernel": k, **timing_fields(ts, flops),
             "change_pct": 100 * (statistics.median(ts) - base) / base, "rel_rms_vs_shipped": agree.get(k)}
            for k, ts in times.items()]


def main() -> int:
    return shape_format_main(
        __doc__, SHAPES, time_shape,
        "fp8-sm90 kernel only: shipped vs split-KV vs stream-K tail (median of {rounds}, ms)",
        ["shape", "format", "kernel", "median ms", "min ms", "TFLOP/s", "change %", "rel-RMS vs shipped"],
        lambda r: [r["shape"], r["format"], r["kernel"], r["median_ms"], r["min_ms"], r["tflops"], r["change_pct"],
                       "" if r["rel_rms_vs_shipped"] is None else r["rel_rms_vs_shipped"]],
        "streamk-bench", ok=lambda rows: True)


if __name__ == "__main__":
    sys.exit(main())
