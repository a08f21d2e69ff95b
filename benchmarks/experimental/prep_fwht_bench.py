"""The INT8 prep's Q/K rotate-and-quantize launch: the shipped one (the +-1 matrix on the tensor cores) vs the FWHT
variants of ``prep_fwht.py`` (rows per program, rows per butterfly block, warps), on one shipped stats launch of
fresh Gaussian inputs per shape; alternating call by call behind a sleep, median of the rounds (GPU time of the
launch alone). Each variant's codes are checked against the shipped launch's (within one step). Prints a table and
writes JSON (machine, date, versions).

    python benchmarks/experimental/prep_fwht_bench.py --shapes flux,ltx,h3 --rounds 20
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

SHAPES = {"flux": (1, 4608, 24, 128), "ltx": (1, 7392, 32, 64), "h3": (1, 30272, 56, 128)}
VARIANTS = [(256, 32, 4), (512, 32, 4), (256, 64, 4), (256, 32, 8), (128, 32, 4), (512, 64, 8)]


def time_shape(name: str, shape: tuple, rounds: int) -> list[dict]:
    import torch
    from bench_helpers import gaussian_qkv, sleep_alternating, warm
    from prep_fwht import quantize_qk_fwht

    from ditprof.kernels.prep_triton import PrepPlan

    B, S, H, D = shape
    q, k, v = gaussian_qkv(B, S, H, D)
    plan = PrepPlan(q, k, v, True, qk_int8=True)
    ref = plan.buffers(q.device)
    plan.launch(q, k, v, ref, None)
    quant_args = plan._arguments(q, k, v, ref, None)[1]
    stream = torch.cuda.current_stream().cuda_stream
    bufs = {}
    runners = {"shipped (tensor-core dot)": functools.partial(plan.quants[0], quant_args, stream)}
    for rows, block, warps in VARIANTS:
        label = f"FWHT rows {rows} block {block} warps {warps}"
        b = bufs[label] = dict(ref, q8=torch.empty_like(ref["q8"]), k8=torch.empty_like(ref["k8"]),
                               q_scales=torch.empty_like(ref["q_scales"]))
        runners[label] = functools.partial(quantize_qk_fwht, plan, q, k, b, rows=rows, block=block, warps=warps)
    warm(runners)
    checks = {}
    for label, b in bufs.items():
        dq = (b["q8"].int() - ref["q8"].int()).abs()
        dk = (b["k8"].int() - ref["k8"].int()).abs()
        checks[label] = {"max_code_diff": max(dq.max().item(), dk.max().item()),
                         "frac_codes_diff": ((dq > 0).float().mean().item() + (dk > 0).float().mean().item()) / 2,
                         "q_scales_max_rel": ((b["q_scales"] - ref["q_scales"]).abs()
                                              / ref["q_scales"].abs()).max().item()}
    times = sleep_alternating(runners, rounds)
    base = statistics.median(times["shipped (tensor-core dot)"])
    moved = 2 * (2 * B * S * H * D) + 2 * B * S * H * D  # read q, k (bf16), write q8, k8 (int8)
    rows_out = []
    for label, ts in times.items():
        med = statistics.median(ts)
        c = checks.get(label, {})
        rows_out.append({"shape": name, "B,S,H,D": shape, "launch": label, "median_us": med * 1e3,
                         "min_us": min(ts) * 1e3, "all_ms": ts, "TB_per_s": moved / (med * 1e-3) / 1e12,
                         "change_pct": 100 * (med - base) / base, **c})
    return rows_out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="flux,ltx,h3")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    names = [s for s in args.shapes.split(",") if s]
    if [n for n in names if n not in SHAPES]:
        ap.error(f"shapes from {list(SHAPES)}")
    import torch

    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    from common import environment, print_table, results_path, write_json

    rows = []
    for n in names:
        print(f"{n} {SHAPES[n]} ...", flush=True)
        rows += time_shape(n, SHAPES[n], args.rounds)
    print_table(f"INT8 prep, Q/K rotate + quantize launch alone (median of {args.rounds}, µs)",
                ["shape", "launch", "median µs", "min µs", "TB/s", "change %", "max code diff", "codes differing"],
                [[r["shape"], r["launch"], r["median_us"], r["min_us"], r["TB_per_s"], r["change_pct"],
                  r.get("max_code_diff", ""), r.get("frac_codes_diff", "")] for r in rows])
    path = Path(args.json) if args.json else results_path("prep-fwht-bench")
    write_json({"environment": environment(), "args": vars(args), "rows": rows}, path)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
