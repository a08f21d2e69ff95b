"""Shipped fp8-sm90 kernel vs its persistent variant (``fp8_fwd_sm90_persistent.py``), kernel only, at the DiT
shapes of issue 17 / issue 20: both run on the same pre-quantized inputs (the shipped prep, ``fp8_prepare``, once
per shape), in one process, interleaved round by round; each launch timed between its own pair of CUDA events
behind a ~0.5 ms ``torch.cuda._sleep`` (so host launch overhead never shows in the GPU interval), median of the
rounds. Each persistent grid size of ``--ctas`` is one row; outputs are compared with the shipped kernel's
(bit-identical expected). Prints a table and writes JSON (environment: machine, date, torch / CUTLASS DSL versions).

    python benchmarks/experimental/persistent_bench.py                       # 4 shapes, grid = SM count
    python benchmarks/experimental/persistent_bench.py --shapes flux,ltx --ctas 132,264,66 --rounds 30
    python benchmarks/experimental/persistent_bench.py --list                # shapes and work tiles, no GPU needed
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

# name: (B, H, S, D), self-attention
SHAPES = {
    "flux": (1, 24, 4608, 128),
    "ltx": (1, 32, 7392, 64),
    "cogvideox": (1, 48, 17776, 64),
    "h3": (1, 56, 30272, 128),
}


def work_tiles(B: int, H: int, S: int) -> int:
    from fp8_fwd_sm90_persistent import work_tiles as tiles

    return tiles(B, H, S)


def make_runners(B: int, H: int, S: int, D: int, ctas: list[int], seed: int = 0):
    """({name: (out, lse)}, {name: launch callable}) on one prep of fresh Gaussian inputs of the shape."""
    from fp8_fwd_sm90_persistent import run_persistent

    prep = gaussian_prep(B, H, S, D, seed=seed)
    scale = 1.0 / math.sqrt(D)
    shipped = shipped_launch(prep, B, H, S, D, scale)
    outs = {"shipped": empty_outputs(B, S, H, D)}  # per kernel: its own out and lse, allocated once

    def persistent(n, o, lse):
        run_persistent(prep.q8, prep.k8, prep.v8t, prep.scales, S, S, scale, o, lse, num_ctas=n)

    runners = {"shipped": functools.partial(shipped, *outs["shipped"])}
    for n in ctas:
        name = f"persistent ({n} CTAs)"
        outs[name] = empty_outputs(B, S, H, D)
        runners[name] = functools.partial(persistent, n, *outs[name])
    return outs, runners


def time_shape(name: str, shape: tuple, ctas: list[int], rounds: int) -> list[dict]:
    import torch

    B, H, S, D = shape
    outs, runners = make_runners(B, H, S, D, ctas)
    warm(runners)  # compile + warm
    ref_o, ref_lse = outs["shipped"]
    same = {}
    for kname in runners:
        o, lse = outs[kname]
        same[kname] = bool(torch.equal(o, ref_o) and torch.equal(lse, ref_lse))
    times = sleep_alternating(runners, rounds)
    flops = 4.0 * B * H * S * S * D
    n_work = work_tiles(B, H, S)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    base = statistics.median(times["shipped"])
    rows = []
    for kname, ts in times.items():
        med = statistics.median(ts)
        grid = n_work if kname == "shipped" else int(kname.split("(")[1].split()[0])
        rows.append({"shape": name, "B,H,S,D": shape, "kernel": kname, "grid": grid, "work_tiles": n_work,
                     "waves": n_work / min(grid, sms) if kname == "shipped" else n_work / grid,
                     **timing_fields(ts, flops), "saved_ms": base - med, "saved_pct": 100 * (base - med) / base,
                     "bit_identical_to_shipped": same[kname]})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list of {', '.join(SHAPES)}")
    ap.add_argument("--ctas", default=None,
                    help="comma list of persistent grid sizes (default: the GPU's SM count, 132 on the H200)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", default=None, help="output path (default benchmarks/results/persistent-bench-DATE.json)")
    ap.add_argument("--list", action="store_true", help="print the shapes and their work tiles, then exit")
    args = ap.parse_args()
    names = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        ap.error(f"unknown shapes {unknown}; known: {list(SHAPES)}")
    if args.list:
        for n in names:
            B, H, S, _ = SHAPES[n]
            print(f"{n}: B,H,S,D = {SHAPES[n]}, {work_tiles(B, H, S)} work tiles of 192 query rows")
        return 0
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("needs an sm_90 GPU (H100/H200)")
        return 2
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ctas = [int(c) for c in args.ctas.split(",")] if args.ctas else [sms]
    rows = []
    for n in names:
        print(f"{n} {SHAPES[n]} ...", flush=True)
        rows += time_shape(n, SHAPES[n], ctas, args.rounds)
    print_table(f"fp8-sm90 kernel only: shipped vs persistent (median of {args.rounds} rounds, ms)",
                ["shape", "kernel", "grid", "waves", "median ms", "min ms", "TFLOP/s", "saved ms", "saved %",
                 "bit-identical"],
                [[r["shape"], r["kernel"], r["grid"], r["waves"], r["median_ms"], r["min_ms"], r["tflops"],
                  r["saved_ms"], r["saved_pct"], r["bit_identical_to_shipped"]] for r in rows])
    path = Path(args.json) if args.json else results_path("persistent-bench")
    write_json({"environment": environment(), "args": vars(args), "sm_count": sms, "rows": rows}, path)
    print(f"wrote {path}")
    return 0 if all(r["bit_identical_to_shipped"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
