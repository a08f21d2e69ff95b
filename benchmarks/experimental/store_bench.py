"""Shipped fp8-sm90 kernel (16-byte O stores since session 12) vs its other epilogue stores (``fp8_fwd_sm90_store.py``:
``u16``, the epilogue before, and ``b32``),
kernel only, on one shipped prep of fresh Gaussian inputs per shape and Q/K format. In one process, alternating
call by call, each launch between its own CUDA events behind a ~0.5 ms sleep; median of the rounds. The variants'
outputs are compared with the shipped kernel's (they must be equal bit for bit). Prints a table and writes JSON
(machine, date, versions).

    python benchmarks/experimental/store_bench.py                    # h3, flux, ltx; int8 and e4m3
    python benchmarks/experimental/store_bench.py --shapes flux --formats int8 --rounds 30
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

SHAPES = {"h3": (1, 56, 30272, 128), "flux": (1, 24, 4608, 128), "ltx": (1, 32, 7392, 64)}
STORES = ("u16", "b32")


def time_shape(name: str, shape: tuple, qk_int8: bool, rounds: int) -> list[dict]:
    import torch

    from fp8_fwd_sm90_store import run_store

    B, H, S, D = shape
    prep = gaussian_prep(B, H, S, D, qk_int8=qk_int8)
    scale = 1.0 / math.sqrt(D)
    outs = {n: empty_outputs(B, S, H, D) for n in ("shipped",) + STORES}
    runners = {"shipped": functools.partial(shipped_launch(prep, B, H, S, D, scale, qk_int8=qk_int8),
                                            *outs["shipped"])}
    for st in STORES:
        runners[st] = functools.partial(run_store, prep, scale, *outs[st], st)
    warm(runners)
    equal = {st: bool(torch.equal(outs[st][0], outs["shipped"][0]) and torch.equal(outs[st][1], outs["shipped"][1]))
             for st in STORES}
    times = sleep_alternating(runners, rounds)
    flops = 4.0 * B * H * S * S * D
    base = statistics.median(times["shipped"])
    fmt = "int8" if qk_int8 else "e4m3"
    return [{"shape": name, "B,H,S,D": shape, "format": fmt, "kernel": k, **timing_fields(ts, flops),
             "change_pct": 100 * (statistics.median(ts) - base) / base, "equal_to_shipped": equal.get(k, True)}
            for k, ts in times.items()]


def main() -> int:
    return shape_format_main(
        __doc__, SHAPES, time_shape,
        "fp8-sm90 kernel only: shipped (b128) epilogue vs u16 / b32 (median of {rounds} rounds, ms)",
        ["shape", "format", "kernel", "median ms", "min ms", "TFLOP/s", "change %", "equal"],
        lambda r: [r["shape"], r["format"], r["kernel"], r["median_ms"], r["min_ms"], r["tflops"], r["change_pct"],
                       r["equal_to_shipped"]],
        "store-bench", ok=lambda rows: all(r["equal_to_shipped"] for r in rows))


if __name__ == "__main__":
    sys.exit(main())
