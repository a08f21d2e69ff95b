"""The INT8 accumulator preset as a wgmma (``fp8_fwd_sm90_mma_preset``) against the shipped kernel's 20 LDS.128, in
the op's launch record: two records of the same configuration (plain grid, Q in the kernel as shipped), one with its
compiled kernel swapped for the variant; whole calls (prep + kernel) alternating behind a sleep
(``bench_helpers.sleep_alternating``), median of ``--rounds``, the outputs compared bit for bit (the preset is exact,
so they must be equal). Shapes on the stream-K grid are not timed (the variant is the plain grid's build).

    python benchmarks/experimental/mma_preset_bench.py --shapes cogvideox,h3,wan14b --rounds 15 --json out.json
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys

SHAPES = {  # B, S, H, D
    "cogvideox": (1, 17776, 48, 64),
    "h3": (1, 30272, 56, 128),
    "wan14b": (1, 75600, 40, 128),
    "hunyuan": (1, 119056, 24, 128),
    "small64": (1, 6000, 8, 64),
}


def variant_record(q, k, v):
    """(shipped record, variant record): two launch records of q, k, v's configuration (distinct cache keys through
    ``DITPROF_FP8_QROT`` unset / "1", the same rule), the second running ``compile_mma_preset``'s kernel."""
    from fp8_fwd_sm90_mma_preset import compile_mma_preset

    from ditprof.kernels import launch

    os.environ.pop("DITPROF_FP8_QROT", None)
    shipped = launch.record_for(q, k, v, False)
    os.environ["DITPROF_FP8_QROT"] = "1"
    variant = launch.record_for(q, k, v, False)
    os.environ.pop("DITPROF_FP8_QROT")
    if variant is shipped or variant.streamk is not None or not variant.spec.qk_int8:
        return shipped, None
    variant.fn = compile_mma_preset(q.shape[-1], variant.spec.out_dtype, fake=False,
                                    tvm_ffi=variant.spec.tvm_ffi, q_rot=variant.spec.q_rot)
    return shipped, variant


def measure(name: str, rounds: int) -> dict:
    import torch
    from bench_helpers import gaussian_qkv, sleep_alternating, warm

    from ditprof.kernels import launch

    B, S, H, D = SHAPES[name]
    q, k, v = gaussian_qkv(B, S, H, D, seed=5)
    scale = 1.0 / math.sqrt(D)
    shipped, variant = variant_record(q, k, v)
    row = {"shape": name, "B": B, "S": S, "H": H, "D": D, "grid": shipped.summary()["grid"],
           "q_in_kernel": shipped.q_rot}
    if variant is None:
        return row
    variant_fn = variant.fn
    outs = {}

    def runner(key, rec):
        def call():
            outs[key] = rec(q, k, v, scale)
        return call

    runners = {"mma_preset": runner("mma_preset", variant), "shipped": runner("shipped", shipped)}
    warm(runners)
    times = sleep_alternating(runners, rounds)
    launch.finish_finite_checks()
    if variant.fn is not variant_fn:  # a failed TVM-FFI call falls back to the shipped kernel: not this variant
        raise RuntimeError(f"the variant's record fell back to another kernel: {launch.LAUNCH_INFO}")
    row["ms"] = {n: statistics.median(t) for n, t in times.items()}
    row["all_ms"] = times
    row["ratio"] = row["ms"]["mma_preset"] / row["ms"]["shipped"]
    row["ratios_per_round"] = [a / b for a, b in zip(times["mma_preset"], times["shipped"])]
    row["bit_identical"] = bool(torch.equal(outs["mma_preset"], outs["shipped"]))
    del q, k, v, outs
    torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    from bench_helpers import parse_shapes_rounds, run_meta

    parsed = parse_shapes_rounds(argv, __doc__, SHAPES, "cogvideox,h3,wan14b")
    if parsed is None:
        return 2
    names, rounds, json_path = parsed
    rows = [measure(n, rounds) for n in names]
    print(f"{'shape':10} {'grid':9} {'mma preset':>11} {'shipped':>9} {'ratio':>7} {'round ratios IQR':>18} bits")
    for r in rows:
        if "ms" not in r:
            print(f"{r['shape']:10} {r['grid']:9} (not the plain INT8 grid: not timed)")
            continue
        rr = sorted(r["ratios_per_round"])
        iqr = f"{rr[len(rr) // 4]:.4f}-{rr[(3 * len(rr)) // 4]:.4f}"
        print(f"{r['shape']:10} {r['grid']:9} {r['ms']['mma_preset']:11.4f} {r['ms']['shipped']:9.4f} "
              f"{r['ratio']:7.4f} {iqr:>18} {'same' if r['bit_identical'] else 'DIFFER'}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"meta": run_meta(rounds=rounds), "rows": rows}, f, indent=1)
    return 0 if all(r.get("bit_identical", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
