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
from common import environment, print_table, results_path, write_json

# name: (B, H, S, D), self-attention
SHAPES = {
    "flux": (1, 24, 4608, 128),
    "ltx": (1, 32, 7392, 64),
    "cogvideox": (1, 48, 17776, 64),
    "h3": (1, 56, 30272, 128),
}
SLEEP_CYCLES = 1_000_000  # ~0.5 ms at the H200's clock: the next launch is queued before its start event runs


def work_tiles(B: int, H: int, S: int) -> int:
    from fp8_fwd_sm90_persistent import work_tiles as tiles

    return tiles(B, H, S)


def make_runners(B: int, H: int, S: int, D: int, ctas: list[int], seed: int = 0):
    """({name: (out, lse)}, {name: launch callable}) on one prep of fresh Gaussian inputs of the shape."""
    import torch
    from fp8_fwd_sm90_persistent import run_persistent

    from ditprof.kernels.launch import compiled, launch_compiled, spec_for
    from ditprof.kernels.prep import fp8_prepare

    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn((B, S, H, D), generator=g, device="cuda").to(torch.bfloat16) for _ in range(3))
    prep = fp8_prepare(q, k, v, smooth_k=True)
    del q, k, v
    scale = 1.0 / math.sqrt(D)
    spec = spec_for("fp8-sm90", "sm_90a", D, "bfloat16", True)
    launcher = {"spec": spec, "fn": compiled(spec)}  # launch_compiled may fall back from TVM-FFI to the JIT path
    outs = {}  # per kernel: its own out and lse, allocated once

    def buffers(name):
        outs[name] = (torch.empty((B, S, H, D), dtype=torch.bfloat16, device="cuda"),
                      torch.empty((B, H, S), dtype=torch.float32, device="cuda"))
        return outs[name]

    def shipped(o, lse):
        launcher["spec"], launcher["fn"] = launch_compiled(
            launcher["spec"], launcher["fn"], prep.q8, prep.k8, prep.v8t, prep.scales, None, None, o, lse, B, H, S,
            S, scale, torch.cuda.current_stream().cuda_stream)

    def persistent(n, o, lse):
        run_persistent(prep.q8, prep.k8, prep.v8t, prep.scales, S, S, scale, o, lse, num_ctas=n)

    runners = {"shipped": functools.partial(shipped, *buffers("shipped"))}
    for n in ctas:
        name = f"persistent ({n} CTAs)"
        runners[name] = functools.partial(persistent, n, *buffers(name))
    return outs, runners


def time_shape(name: str, shape: tuple, ctas: list[int], rounds: int) -> list[dict]:
    import torch

    B, H, S, D = shape
    outs, runners = make_runners(B, H, S, D, ctas)
    for fn in runners.values():  # compile + warm
        fn()
        fn()
    torch.cuda.synchronize()
    ref_o, ref_lse = outs["shipped"]
    same = {}
    for kname in runners:
        o, lse = outs[kname]
        same[kname] = bool(torch.equal(o, ref_o) and torch.equal(lse, ref_lse))
    times: dict = {kname: [] for kname in runners}
    for _ in range(rounds):
        for kname, fn in runners.items():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(SLEEP_CYCLES)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times[kname].append(a.elapsed_time(b))
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
                     "median_ms": med, "min_ms": min(ts), "max_ms": max(ts), "all_ms": ts,
                     "tflops": flops / med / 1e9, "saved_ms": base - med, "saved_pct": 100 * (base - med) / base,
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
