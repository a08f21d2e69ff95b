"""The real fp8 call (``torch.ops.ditprof.fp8_attention``: the prep's launches, then the kernel) with the shipped
kernel vs its PDL build (``fp8_fwd_sm90_pdl.py``), swapped in the call's launch record. Per round and setting, N
calls back to back between two CUDA events (the steady state a model sees: the host runs ahead), ms per call,
the settings alternating round by round; median of the rounds. Prints a table and writes JSON.

    python benchmarks/experimental/pdl_bench.py                  # flux, ltx, h3; int8 and e4m3
"""

from __future__ import annotations


import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from bench_helpers import gaussian_qkv, shape_format_main  # noqa: E402 -- after the path set-up

# the PDL build is the plain grid's (measured before fp8-sm90 took the stream-K grid at the short shapes)
os.environ["DITPROF_FP8_STREAMK"] = "0"

SHAPES = {"flux": (1, 24, 4608, 128), "ltx": (1, 32, 7392, 64), "h3": (1, 56, 30272, 128)}
CALLS = {"flux": 50, "ltx": 30, "h3": 4}


def time_shape(name: str, shape: tuple, qk_int8: bool, rounds: int) -> list[dict]:
    import torch

    from fp8_fwd_sm90_pdl import compile_for_spec

    from ditprof.kernels.launch import record_for
    from ditprof.kernels.op import fp8_attention

    os.environ["DITPROF_FP8_QK"] = "int8" if qk_int8 else "e4m3"
    B, H, S, D = shape
    q, k, v = gaussian_qkv(B, S, H, D)
    ref = fp8_attention(q, k, v)
    rec = record_for(q, k, v, False)
    fns = {"shipped": rec.fn, "pdl": compile_for_spec(rec.spec)}
    n = CALLS[name]
    times: dict = {s: [] for s in fns}
    equal = True
    try:
        for setting, fn in fns.items():  # warm both
            rec.fn = fn
            for _ in range(3):
                out = fp8_attention(q, k, v)
            torch.cuda.synchronize()
            equal &= bool(torch.equal(out, ref)) and rec.fn is fn
        for _ in range(rounds):
            for setting, fn in fns.items():
                rec.fn = fn
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                for _ in range(n):
                    fp8_attention(q, k, v)
                b.record()
                b.synchronize()
                times[setting].append(a.elapsed_time(b) / n)
        equal &= rec.fn is fns["pdl"]  # no fallback to the shipped build during the timing
    finally:
        rec.fn = fns["shipped"]
        del os.environ["DITPROF_FP8_QK"]
    base = statistics.median(times["shipped"])
    fmt = "int8" if qk_int8 else "e4m3"
    return [{"shape": name, "B,H,S,D": shape, "format": fmt, "setting": s, "calls_per_round": n,
             "median_ms": statistics.median(ts), "min_ms": min(ts), "all_ms": ts,
             "change_pct": 100 * (statistics.median(ts) - base) / base, "equal_to_shipped": equal}
            for s, ts in times.items()]


def main() -> int:
    return shape_format_main(
        __doc__, SHAPES, time_shape,
        "fp8 call (prep + kernel), back to back: shipped vs PDL kernel (median of {rounds} rounds, ms per call)",
        ["shape", "format", "setting", "median ms", "min ms", "change %", "equal"],
        lambda r: [r["shape"], r["format"], r["setting"], r["median_ms"], r["min_ms"], r["change_pct"],
                   r["equal_to_shipped"]],
        "pdl-bench", ok=lambda rows: all(r["equal_to_shipped"] for r in rows))


if __name__ == "__main__":
    sys.exit(main())
