"""Shipped fp8-sm90 INT8 kernel vs its per-tile-descale variant (``fp8_fwd_sm90_tile_scales.py``, issue 20 lever 1),
kernel only, on the same codes: the shipped INT8 prep (``fp8_prepare(qk_int8=True)``) once per shape, the variant given
the per-head descales broadcast to every 160-key tile (what it computes does not depend on the scale values; the
outputs then agree up to fp32 rounding, reported). In one process, alternating call by call; each launch timed
between its own CUDA events behind a ~0.5 ms ``torch.cuda._sleep`` (host launch overhead never shows), median of
the rounds. Prints a table and writes JSON (machine, date, torch / CUTLASS DSL versions).

    python benchmarks/experimental/tile_scales_bench.py                     # h3, flux, ltx
    python benchmarks/experimental/tile_scales_bench.py --shapes flux --rounds 30
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
SHAPES = {"h3": (1, 56, 30272, 128), "flux": (1, 24, 4608, 128), "ltx": (1, 32, 7392, 64)}


def make_runners(B: int, H: int, S: int, D: int, seed: int = 0):
    """({name: (out, lse)}, {name: launch callable}) on one INT8 prep of fresh Gaussian inputs of the shape."""
    from fp8_fwd_sm90_tile_scales import n_key_tiles, run_tile_scales

    prep = gaussian_prep(B, H, S, D, qk_int8=True, seed=seed)
    scale = 1.0 / math.sqrt(D)
    n_t = n_key_tiles(prep.k8.shape[2])
    kts = prep.scales[..., 1:2].expand(B, H, n_t).contiguous()
    vts = prep.scales[..., 2:3].expand(B, H, n_t).contiguous()
    shipped = shipped_launch(prep, B, H, S, D, scale, qk_int8=True)
    outs = {name: empty_outputs(B, S, H, D) for name in ("shipped", "tile scales")}

    def variant():
        o, lse = outs["tile scales"]
        run_tile_scales(prep.q8, prep.k8, prep.v8t, prep.q_scales, kts, vts, S, S, scale, o, lse)

    return outs, {"shipped": functools.partial(shipped, *outs["shipped"]), "tile scales": variant}


def agreement(outs: dict) -> dict:
    """How close the variant's output is to the shipped one (equal scales: fp32 rounding only)."""
    (o1, l1), (o2, l2) = outs["shipped"], outs["tile scales"]
    d = (o2.double() - o1.double())
    return {"rel_rms": (d.pow(2).mean().sqrt() / o1.double().pow(2).mean().sqrt()).item(),
            "bf16_equal_fraction": (o1 == o2).float().mean().item(),
            "lse_max_diff": (l2 - l1).abs().max().item(), "finite": bool(o2.isfinite().all() and l2.isfinite().all())}


def time_shape(name: str, shape: tuple, rounds: int) -> list[dict]:
    B, H, S, D = shape
    outs, runners = make_runners(B, H, S, D)
    warm(runners)  # compile + warm
    agree = agreement(outs)
    times = sleep_alternating(runners, rounds)  # alternating call by call
    flops = 4.0 * B * H * S * S * D
    base = statistics.median(times["shipped"])
    rows = []
    for kname, ts in times.items():
        med = statistics.median(ts)
        rows.append({"shape": name, "B,H,S,D": shape, "kernel": kname, **timing_fields(ts, flops),
                     "change_pct": 100 * (med - base) / base, **({} if kname == "shipped" else agree)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list of {', '.join(SHAPES)}")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", default=None, help="output path (default benchmarks/results/tile-scales-bench-DATE.json)")
    args = ap.parse_args()
    names = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        ap.error(f"unknown shapes {unknown}; known: {list(SHAPES)}")
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("needs an sm_90 GPU (H100/H200)")
        return 2
    rows = []
    for n in names:
        print(f"{n} {SHAPES[n]} ...", flush=True)
        rows += time_shape(n, SHAPES[n], args.rounds)
    print_table(f"fp8-sm90 INT8 kernel only: shipped vs per-tile descales (median of {args.rounds} rounds, ms)",
                ["shape", "kernel", "median ms", "min ms", "TFLOP/s", "change %", "rel-RMS vs shipped"],
                [[r["shape"], r["kernel"], r["median_ms"], r["min_ms"], r["tflops"], r["change_pct"],
                  r.get("rel_rms", "")] for r in rows])
    path = Path(args.json) if args.json else results_path("tile-scales-bench")
    write_json({"environment": environment(), "args": vars(args), "rows": rows}, path)
    print(f"wrote {path}")
    return 0 if all(r.get("finite", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
