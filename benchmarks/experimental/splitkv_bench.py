"""Shipped fp8-sm90 kernel vs its split-KV tail variant (``fp8_fwd_sm90_splitkv.py``: kernel + Triton merge), kernel
only, at the DiT shapes of issue 17 / issue 20, e4m3 and INT8 Q/K: both run on the same pre-quantized inputs (the
shipped prep, ``fp8_prepare``, once per shape and format), in one process, alternating call by call; each call
timed between its own pair of CUDA events behind a ~0.5 ms ``torch.cuda._sleep`` (host launch overhead never shows
in the GPU interval), median of the rounds. Also timed: the split kernel without its merge (the merge's share).
Prints a table and writes JSON (environment: machine, date, torch / CUTLASS DSL versions).

    python benchmarks/experimental/splitkv_bench.py                          # 4 shapes x 2 formats
    python benchmarks/experimental/splitkv_bench.py --shapes flux,ltx --formats int8 --rounds 30
    python benchmarks/experimental/splitkv_bench.py --list                   # shapes and plans, no GPU needed
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
from common import environment, print_table, results_path, write_json  # noqa: E402 -- after the path set-up

# name: (B, H, S, D), self-attention
SHAPES = {
    "flux": (1, 24, 4608, 128),
    "ltx": (1, 32, 7392, 64),
    "cogvideox": (1, 48, 17776, 64),  # 4464 tiles = 33 x 132 + 108: no split (the plain grid: a control)
    "h3": (1, 56, 30272, 128),
}
FORMATS = ("e4m3", "int8")


def plan(B: int, H: int, S: int, n_sms: int) -> tuple[int, int, int]:
    from fp8_fwd_sm90_splitkv import key_tiles, splits_for, work_tiles

    return splits_for(work_tiles(B, H, S), n_sms, key_tiles(S))


def make_runners(B: int, H: int, S: int, D: int, fmt: str, seed: int = 0):
    """({name: (out, lse)}, {name: launch callable}, plan) on one prep of fresh Gaussian inputs of the shape."""
    from fp8_fwd_sm90_splitkv import plan_for, run_splitkv

    prep = gaussian_prep(B, H, S, D, qk_int8=fmt == "int8", seed=seed)
    scale = 1.0 / math.sqrt(D)
    shipped = shipped_launch(prep, B, H, S, D, scale, qk_int8=fmt == "int8")
    the_plan = plan_for(prep.q8.device, B, H, S, S)
    names = ("shipped", "split-KV + merge", "split-KV kernel only")
    outs = {name: empty_outputs(B, S, H, D) for name in names}

    def split(merge, o, lse):
        run_splitkv(prep.q8, prep.k8, prep.v8t, prep.scales, S, S, scale, o, lse, q_scales=prep.q_scales,
                    plan=the_plan, merge=merge)

    runners = {"shipped": functools.partial(shipped, *outs["shipped"]),
               "split-KV + merge": functools.partial(split, True, *outs["split-KV + merge"]),
               "split-KV kernel only": functools.partial(split, False, *outs["split-KV kernel only"])}
    return outs, runners, the_plan


def tail_rows(B: int, H: int, S: int, the_plan):
    import torch
    from fp8_fwd_sm90_splitkv import work_coords

    n_full, n_tail, _ = the_plan
    n_m = -(-S // 192)
    mask = torch.zeros((B, S, H), dtype=torch.bool, device="cuda")
    for t in range(n_full, n_full + n_tail):
        m, h, b = work_coords(t, n_m, H)
        mask[b, m * 192:(m + 1) * 192, h] = True
    return mask


def compare(outs, B, H, S, the_plan) -> dict:
    """Full tiles' rows bit-identical to the shipped kernel's; the tail rows' rel-RMS and LSE distance to it."""
    import torch

    o0, l0 = outs["shipped"]
    o, lse = outs["split-KV + merge"]
    tail = tail_rows(B, H, S, the_plan)
    full = ~tail
    res = {"full_rows_bit_identical": bool(torch.equal(o[full], o0[full])
                                           and torch.equal(lse.transpose(1, 2)[full], l0.transpose(1, 2)[full])),
           "all_finite": bool(torch.isfinite(o).all() and torch.isfinite(lse).all())}
    if tail.any():
        d = (o[tail].double() - o0[tail].double()).pow(2).mean().sqrt()
        res["tail_rel_rms_vs_shipped"] = (d / o0[tail].double().pow(2).mean().sqrt()).item()
        res["tail_lse_max_abs_vs_shipped"] = (lse.transpose(1, 2)[tail] - l0.transpose(1, 2)[tail]).abs().max().item()
    return res


def time_case(name: str, shape: tuple, fmt: str, rounds: int) -> list[dict]:
    B, H, S, D = shape
    outs, runners, the_plan = make_runners(B, H, S, D, fmt)
    warm(runners)  # compile + warm
    check = compare(outs, B, H, S, the_plan)
    times = sleep_alternating(runners, rounds)  # settings alternate call by call
    flops = 4.0 * B * H * S * S * D
    base = statistics.median(times["shipped"])
    n_full, n_tail, splits = the_plan
    rows = []
    for kname, ts in times.items():
        med = statistics.median(ts)
        rows.append({"shape": name, "B,H,S,D": shape, "format": fmt, "kernel": kname,
                     "plan": {"n_full": n_full, "n_tail": n_tail, "splits": splits},
                     "ctas": n_full + n_tail * splits if kname != "shipped" else n_full + n_tail,
                     **timing_fields(ts, flops), "saved_ms": base - med, "saved_pct": 100 * (base - med) / base,
                     **check})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list of {', '.join(SHAPES)}")
    ap.add_argument("--formats", default=",".join(FORMATS), help="comma list of e4m3, int8")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", default=None, help="output path (default benchmarks/results/splitkv-bench-DATE.json)")
    ap.add_argument("--list", action="store_true", help="print the shapes and their plans on 132 SMs, then exit")
    args = ap.parse_args()
    names = [s.strip() for s in args.shapes.split(",") if s.strip()]
    fmts = [s.strip() for s in args.formats.split(",") if s.strip()]
    unknown = [n for n in names if n not in SHAPES] + [f for f in fmts if f not in FORMATS]
    if unknown:
        ap.error(f"unknown shapes/formats {unknown}; known: {list(SHAPES)}, {list(FORMATS)}")
    if args.list:
        for n in names:
            B, H, S, _ = SHAPES[n]
            n_full, n_tail, splits = plan(B, H, S, 132)
            print(f"{n}: B,H,S,D = {SHAPES[n]}, {n_full + n_tail} work tiles; on 132 SMs: {n_full} full + "
                  f"{n_tail} tail x {splits} parts = {n_full + n_tail * splits} CTAs")
        return 0
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("needs an sm_90 GPU (H100/H200)")
        return 2
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for n in names:
        for fmt in fmts:
            print(f"{n} {SHAPES[n]} {fmt} ...", flush=True)
            rows += time_case(n, SHAPES[n], fmt, args.rounds)
    print_table(f"fp8-sm90 kernel only: shipped vs split-KV tail (median of {args.rounds} rounds, ms)",
                ["shape", "fmt", "kernel", "plan (full, tail, splits)", "median ms", "min ms", "saved ms", "saved %",
                 "full rows ==", "tail rel-RMS", "tail LSE"],
                [[r["shape"], r["format"], r["kernel"], tuple(r["plan"].values()), r["median_ms"], r["min_ms"],
                  r["saved_ms"], r["saved_pct"], r["full_rows_bit_identical"],
                  r.get("tail_rel_rms_vs_shipped", "-"), r.get("tail_lse_max_abs_vs_shipped", "-")] for r in rows])
    path = Path(args.json) if args.json else results_path("splitkv-bench")
    write_json({"environment": environment(), "args": vars(args), "sm_count": sms, "rows": rows}, path)
    print(f"wrote {path}")
    return 0 if all(r["full_rows_bit_identical"] and r["all_finite"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
