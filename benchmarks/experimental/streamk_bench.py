"""fp8-sm90 kernel only: the plain grid vs the split-KV tail (experimental) vs the shipped stream-K grid
(``ditprof/kernels/fp8_fwd_sm90_streamk.py``, where ``streamk_plan`` takes the shape; on every shape here), each
with its merge and alone, on one shipped prep of fresh Gaussian inputs per shape and format; in one process,
alternating call by call behind a sleep, median of the rounds. Prints a table and writes JSON (machine, date,
versions).

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


def streamk_launch(prep, scale: float, qk_int8: bool, merge: bool = True):
    """``launch(o, lse)``: fp8-sm90 on the stream-K grid on ``prep`` (the plan on the device's SM count even where
    ``streamk_plan`` would keep the plain grid), its merge (JIT, with the LSE) when ``merge``."""
    import dataclasses

    import torch

    from ditprof.kernels.fp8_fwd_sm90 import config_for
    from ditprof.kernels.launch import compiled, launch_compiled, sm_count, spec_for, streamk_workspace
    from ditprof.kernels.streamk_merge import device_table, streamk_merge
    from ditprof.kernels.streamk_schedule import TILE_M, plan

    B, H, _, D = prep.q8.shape
    sq, sk = int(prep.sq), int(prep.sk)
    n_kt = -(-sk // config_for("sm_90a", D).tile_n)
    p = plan(-(-sq // TILE_M) * H * B, sm_count(torch.cuda.current_device()), n_kt) + (n_kt,)
    spec = dataclasses.replace(spec_for("fp8-sm90", "sm_90a", D, "bfloat16", True, qk_int8=qk_int8), streamk=True)
    fn = compiled(spec)
    o_part, lse_part = streamk_workspace(p, D, torch.bfloat16, prep.q8.device)
    table = device_table(*p, prep.q8.device) if p[1] else None

    def launch(o, lse):
        launch_compiled(spec, fn, prep.q8, prep.k8, prep.v8t, prep.scales, prep.q_scales, None, o, lse, B, H, sq, sk,
                        scale, torch.cuda.current_stream().cuda_stream, streamk=(o_part, lse_part, p[:3]))
        if merge and table is not None:
            streamk_merge(o_part, lse_part, table, o, lse, p[0], sq)

    return launch, p


def time_shape(name: str, shape: tuple, qk_int8: bool, rounds: int) -> list[dict]:
    from fp8_fwd_sm90_splitkv import run_splitkv

    from ditprof.kernels.accuracy import compare

    B, H, S, D = shape
    prep = gaussian_prep(B, H, S, D, qk_int8=qk_int8)
    scale = 1.0 / math.sqrt(D)
    names = ("plain grid", "split-KV + merge", "stream-K + merge", "stream-K kernel only")
    outs = {n: empty_outputs(B, S, H, D) for n in names}
    split_args = (prep.q8, prep.k8, prep.v8t, prep.scales, S, S, scale)
    with_merge, p = streamk_launch(prep, scale, qk_int8)
    alone, _ = streamk_launch(prep, scale, qk_int8, merge=False)
    runners = {
        "plain grid": functools.partial(shipped_launch(prep, B, H, S, D, scale, qk_int8=qk_int8), *outs["plain grid"]),
        "split-KV + merge": lambda: run_splitkv(*split_args, *outs["split-KV + merge"], q_scales=prep.q_scales),
        "stream-K + merge": functools.partial(with_merge, *outs["stream-K + merge"]),
        "stream-K kernel only": functools.partial(alone, *outs["stream-K kernel only"]),
    }
    warm(runners)
    ref = outs["plain grid"][0]
    agree = {n: compare(outs[n][0], ref)["rel_rms"] for n in ("split-KV + merge", "stream-K + merge")}
    times = sleep_alternating(runners, rounds)
    flops = 4.0 * B * H * S * S * D
    base = statistics.median(times["plain grid"])
    fmt = "int8" if qk_int8 else "e4m3"
    return [{"shape": name, "B,H,S,D": shape, "format": fmt, "kernel": k, "streamk_plan": p, **timing_fields(ts, flops),
             "change_pct": 100 * (statistics.median(ts) - base) / base, "rel_rms_vs_plain": agree.get(k)}
            for k, ts in times.items()]


def main() -> int:
    return shape_format_main(
        __doc__, SHAPES, time_shape,
        "fp8-sm90 kernel only: plain grid vs split-KV vs stream-K tail (median of {rounds}, ms)",
        ["shape", "format", "kernel", "median ms", "min ms", "TFLOP/s", "change %", "rel-RMS vs plain"],
        lambda r: [r["shape"], r["format"], r["kernel"], r["median_ms"], r["min_ms"], r["tflops"], r["change_pct"],
                   "" if r["rel_rms_vs_plain"] is None else r["rel_rms_vs_plain"]],
        "streamk-bench", ok=lambda rows: True)


if __name__ == "__main__":
    sys.exit(main())
