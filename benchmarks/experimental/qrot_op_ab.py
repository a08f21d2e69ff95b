"""The op's launch record with Q quantized in the kernel (the default on fp8-sm90's plain grid) against the same
record kind with the prep's Q (``DITPROF_FP8_QROT=0``), in one process: the two records' whole calls (prep + kernel)
alternating call by call behind a sleep (``bench_helpers.sleep_alternating``), median of ``--rounds``; the outputs
compared bit for bit. Shapes whose grid is stream-K keep the prep's Q in both (reported, not timed).

    python benchmarks/experimental/qrot_op_ab.py --shapes cogvideox,wan1.3b,h3 --rounds 15 --json out.json
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

SHAPES = {  # B, S, H, D
    "flux": (1, 4608, 24, 128), "ltx": (1, 7392, 32, 64), "cogvideox": (1, 17776, 48, 64),
    "wan1.3b": (1, 32760, 12, 128), "h3": (1, 30272, 56, 128), "wan14b": (1, 75600, 40, 128),
    "hunyuan": (1, 119056, 24, 128),
}


def measure(name: str, rounds: int) -> dict:
    import torch
    from bench_helpers import gaussian_qkv, sleep_alternating, warm

    from ditprof.kernels import launch

    B, S, H, D = SHAPES[name]
    q, k, v = gaussian_qkv(B, S, H, D, seed=3)
    scale = 1.0 / math.sqrt(D)
    os.environ.pop("DITPROF_FP8_QROT", None)
    rec_in = launch.record_for(q, k, v, False)
    os.environ["DITPROF_FP8_QROT"] = "0"
    rec_prep = launch.record_for(q, k, v, False)
    os.environ.pop("DITPROF_FP8_QROT")
    row = {"shape": name, "B": B, "S": S, "H": H, "D": D, "q_in_kernel": rec_in.q_rot,
           "grid": rec_in.summary()["grid"]}
    if not rec_in.q_rot:
        return row
    outs = {}

    def runner(key, rec):
        def call():
            outs[key] = rec(q, k, v, scale)
        return call

    runners = {"q_in_kernel": runner("q_in_kernel", rec_in), "prep_q": runner("prep_q", rec_prep)}
    warm(runners)
    times = sleep_alternating(runners, rounds)
    launch.finish_finite_checks()
    row["ms"] = {n: statistics.median(t) for n, t in times.items()}
    row["all_ms"] = times
    row["ratio"] = row["ms"]["q_in_kernel"] / row["ms"]["prep_q"]
    row["ratios_per_round"] = [a / b for a, b in zip(times["q_in_kernel"], times["prep_q"])]
    row["bit_identical"] = bool(torch.equal(outs["q_in_kernel"], outs["prep_q"]))
    del q, k, v, outs
    torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    from bench_helpers import parse_shapes_rounds, run_meta

    parsed = parse_shapes_rounds(argv, __doc__, SHAPES, "cogvideox,wan1.3b,h3")
    if parsed is None:
        return 2
    names, rounds, json_path = parsed
    rows = [measure(n, rounds) for n in names]
    print(f"{'shape':10} {'grid':9} {'Q in kernel':>12} {'prep Q':>9} {'ratio':>7} {'round ratios IQR':>18} bits")
    for r in rows:
        if "ms" not in r:
            print(f"{r['shape']:10} {r['grid']:9} (the prep's Q: not timed)")
            continue
        rr = sorted(r["ratios_per_round"])
        iqr = f"{rr[len(rr) // 4]:.4f}-{rr[(3 * len(rr)) // 4]:.4f}"
        print(f"{r['shape']:10} {r['grid']:9} {r['ms']['q_in_kernel']:12.4f} {r['ms']['prep_q']:9.4f} "
              f"{r['ratio']:7.4f} {iqr:>18} {'same' if r['bit_identical'] else 'DIFFER'}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"meta": run_meta(rounds=rounds), "rows": rows}, f, indent=1)
    return 0 if all(r.get("bit_identical", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
