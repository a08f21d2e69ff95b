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
import math
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from common import environment, print_table, results_path, write_json  # noqa: E402

# name: (B, H, S, D), self-attention
SHAPES = {"h3": (1, 56, 30272, 128), "flux": (1, 24, 4608, 128), "ltx": (1, 32, 7392, 64)}
SLEEP_CYCLES = 1_000_000  # ~0.5 ms at the H200's clock: the next launch is queued before its start event runs


def make_runners(B: int, H: int, S: int, D: int, seed: int = 0):
    """({name: (out, lse)}, {name: launch callable}) on one INT8 prep of fresh Gaussian inputs of the shape."""
    import torch
    from fp8_fwd_sm90_tile_scales import n_key_tiles, run_tile_scales

    from ditprof.kernels.launch import compiled, launch_compiled, spec_for
    from ditprof.kernels.prep import fp8_prepare

    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn((B, S, H, D), generator=g, device="cuda").to(torch.bfloat16) for _ in range(3))
    prep = fp8_prepare(q, k, v, smooth_k=True, qk_int8=True)
    del q, k, v
    scale = 1.0 / math.sqrt(D)
    n_t = n_key_tiles(prep.k8.shape[2])
    kts = prep.scales[..., 1:2].expand(B, H, n_t).contiguous()
    vts = prep.scales[..., 2:3].expand(B, H, n_t).contiguous()
    spec = spec_for("fp8-sm90", "sm_90a", D, "bfloat16", True, qk_int8=True)
    launcher = {"spec": spec, "fn": compiled(spec)}  # launch_compiled may fall back from TVM-FFI to the JIT path
    outs = {name: (torch.empty((B, S, H, D), dtype=torch.bfloat16, device="cuda"),
                   torch.empty((B, H, S), dtype=torch.float32, device="cuda")) for name in ("shipped", "tile scales")}

    def shipped():
        o, lse = outs["shipped"]
        launcher["spec"], launcher["fn"] = launch_compiled(
            launcher["spec"], launcher["fn"], prep.q8, prep.k8, prep.v8t, prep.scales, prep.q_scales, None, o, lse,
            B, H, S, S, scale, torch.cuda.current_stream().cuda_stream)

    def variant():
        o, lse = outs["tile scales"]
        run_tile_scales(prep.q8, prep.k8, prep.v8t, prep.q_scales, kts, vts, S, S, scale, o, lse)

    return outs, {"shipped": shipped, "tile scales": variant}


def agreement(outs: dict) -> dict:
    """How close the variant's output is to the shipped one (equal scales: fp32 rounding only)."""
    (o1, l1), (o2, l2) = outs["shipped"], outs["tile scales"]
    d = (o2.double() - o1.double())
    return {"rel_rms": (d.pow(2).mean().sqrt() / o1.double().pow(2).mean().sqrt()).item(),
            "bf16_equal_fraction": (o1 == o2).float().mean().item(),
            "lse_max_diff": (l2 - l1).abs().max().item(), "finite": bool(o2.isfinite().all() and l2.isfinite().all())}


def time_shape(name: str, shape: tuple, rounds: int) -> list[dict]:
    import torch

    B, H, S, D = shape
    outs, runners = make_runners(B, H, S, D)
    for fn in runners.values():  # compile + warm
        fn()
        fn()
    torch.cuda.synchronize()
    agree = agreement(outs)
    times: dict = {kname: [] for kname in runners}
    for _ in range(rounds):
        for kname, fn in runners.items():  # alternating call by call
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(SLEEP_CYCLES)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times[kname].append(a.elapsed_time(b))
    flops = 4.0 * B * H * S * S * D
    base = statistics.median(times["shipped"])
    rows = []
    for kname, ts in times.items():
        med = statistics.median(ts)
        rows.append({"shape": name, "B,H,S,D": shape, "kernel": kname, "median_ms": med, "min_ms": min(ts),
                     "max_ms": max(ts), "all_ms": ts, "tflops": flops / med / 1e9,
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
