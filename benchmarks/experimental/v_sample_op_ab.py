"""The op's launch record with V's descale from sampled rows (``prep_triton.V_SAMPLE``: V leaves the stats pass,
its quantize checks for saturation, a third launch redoes flagged heads) against the shipped record, in one
process: whole calls alternating behind a sleep (GPU time), median of ``--rounds``. The outputs differ by design
(another V descale): the table gives their rel-RMS difference and the redo flags raised (none expected on Gaussian
inputs).

    python benchmarks/experimental/v_sample_op_ab.py --shapes flux,ltx,cogvideox,h3 --rounds 15 --rows 256 --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from bench_helpers import VIDEO_SHAPES, run_meta  # noqa: E402


def measure(name: str, rounds: int, rows: int) -> dict:
    import torch
    from bench_helpers import gaussian_qkv, records_ab

    from ditprof.kernels import launch
    from ditprof.kernels import prep_triton as P

    B, S, H, D = VIDEO_SHAPES[name]
    q, k, v = gaussian_qkv(B, S, H, D, seed=6)
    scale = 1.0 / math.sqrt(D)
    kernel = launch.kernel_name_for_arch(launch.arch_of(q.device.index))
    shipped = launch.Fp8Launch(q, k, v, kernel, False, qk_int8=True)
    saved = P.V_SAMPLE
    P.V_SAMPLE = rows
    try:
        sampled = launch.Fp8Launch(q, k, v, kernel, False, qk_int8=True)
    finally:
        P.V_SAMPLE = saved
    assert sampled.plan.v_sample == rows and shipped.plan.v_sample == 0
    res = records_ab(q, k, v, scale, {"v_sample": sampled, "shipped": shipped}, rounds)
    a, b = shipped(q, k, v, scale).float(), sampled(q, k, v, scale).float()
    torch.cuda.synchronize()
    ws = next(iter(sampled._workspaces.values()), None)
    row = {"shape": name, "B": B, "S": S, "H": H, "D": D, "grid": shipped.summary()["grid"], "rows": rows,
           "reuse": shipped.reuse, **res,
           "rel_rms_vs_shipped": float((a - b).pow(2).mean().sqrt() / a.pow(2).mean().sqrt()),
           "redo_heads": None if ws is None else int(ws["redo"].sum())}
    launch.finish_finite_checks()
    del shipped, sampled
    torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="flux,ltx,cogvideox,h3")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args(argv)
    names = [n for n in args.shapes.split(",") if n]
    bad = [n for n in names if n not in VIDEO_SHAPES]
    if bad:
        print(f"error: unknown shape(s) {bad}; known: {', '.join(VIDEO_SHAPES)}", file=sys.stderr)
        return 2
    rows = [measure(n, args.rounds, args.rows) for n in names]
    print(f"{'shape':10} {'grid':9} {'v_sample':>10} {'shipped':>10} {'ratio':>7} {'round ratios IQR':>18} "
          f"{'rel-RMS diff':>12} redo")
    for r in rows:
        rr = sorted(r["ratios_per_round"])
        iqr = f"{rr[len(rr) // 4]:.4f}-{rr[(3 * len(rr)) // 4]:.4f}"
        print(f"{r['shape']:10} {r['grid']:9} {r['ms']['v_sample']:10.4f} {r['ms']['shipped']:10.4f} "
              f"{r['ratio']:7.4f} {iqr:>18} {r['rel_rms_vs_shipped']:12.2e} {r['redo_heads']}")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump({"meta": run_meta(rounds=args.rounds, rows=args.rows), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
