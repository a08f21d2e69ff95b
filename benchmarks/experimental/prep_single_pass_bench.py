"""The single-pass INT8 prep (prep_single_pass.py, issue 20 lever 1) against the shipped preps, on a CUDA GPU.

Per shape (h3, flux, ltx, cogvideox; self-attention, bf16): the shipped INT8 prep (``PrepPlan(..., qk_int8=True)``:
stats pass + quantize pass, 3 launches), the shipped e4m3 prep (2 launches) and the single-pass prep at its default
and a few of its knob settings; each setting's whole prep between its own pair of CUDA events, the settings
alternating call by call (``prep_int8_sweep.alternating``: clock and power drift hit all alike), ``--rounds`` rounds,
median. Each plan is built once and launched with a stream (the compiled launchers directly after the first call),
as ``kernels.launch`` does. The byte floor per shape: Q, K, V read once and the codes written once (+ the scales),
over 4.0 TB/s.

    python benchmarks/experimental/prep_single_pass_bench.py --json out.json
    python benchmarks/experimental/prep_single_pass_bench.py --shapes h3 --variants default,two_pass --rounds 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

SHAPES = {"h3": (1, 30272, 56, 128), "flux": (1, 4608, 24, 128), "ltx": (1, 7392, 32, 64),
          "cogvideox": (1, 17776, 48, 64)}
BYTES_PER_S = 4.0e12
# single-pass settings: plan keywords and module constants patched while the plan is built
VARIANTS = {
    "default": ({}, {}),
    "two_pass": ({"two_pass": True}, {}),
    "one_launch": ({"split_v": False}, {}),
    "k_tiles_2": ({"k_tiles": 2}, {}),  # twice the K programs: a shorter tail at flux / ltx
    "pipelined": ({"k_stages": None}, {}),
    "no_reg_cap": ({}, {"QK_MAXNREG": None, "V_MAXNREG": None}),
}
DEFAULT_VARIANTS = "default,two_pass,one_launch,k_tiles_2"


def byte_floor_ms(B: int, S: int, H: int, D: int) -> float:
    """Q, K, V (16-bit) read once; q8, k8, v8t (1 byte), q_scales and the tile scales written once; 4.0 TB/s."""
    from ditprof.kernels.prep import padded_lengths

    sq_pad, sk_pad = padded_lengths(S, S)
    read = 3 * B * S * H * D * 2
    written = B * H * D * (sq_pad + 2 * sk_pad) + 4 * B * H * (sq_pad + 2 * -(-sk_pad // 160))
    return (read + written) / BYTES_PER_S * 1e3


def prep_calls(q, k, v, variants: list[str]) -> dict:
    """{setting name: a function that runs that prep once on the current stream} (plans and buffers made here)."""
    import torch

    import prep_single_pass as SP
    from ditprof.kernels.prep_triton import PrepPlan
    from prep_int8_sweep import patched_module

    stream = torch.cuda.current_stream().cuda_stream
    calls = {}
    shipped = {"shipped int8": PrepPlan(q, k, v, True, qk_int8=True), "shipped e4m3": PrepPlan(q, k, v, True)}
    for name, plan in shipped.items():
        bufs = plan.buffers(q.device)
        calls[name] = lambda plan=plan, bufs=bufs: plan.launch(q, k, v, bufs, stream)
    for var in variants:
        keywords, constants = VARIANTS[var]
        with patched_module(SP, constants):
            plan = SP.SinglePassPlan(q, k, v, **keywords)
        bufs = plan.buffers(q.device)
        calls[f"single pass {var}"] = lambda plan=plan, bufs=bufs: plan.launch(q, k, v, bufs, stream)
        calls[f"single pass {var}"].flags = bufs["flags"]
    return calls


def run_shape(shape, variants: list[str], rounds: int) -> dict:
    import torch
    from bench_helpers import gaussian_qkv
    from prep_int8_sweep import alternating

    B, S, H, D = shape
    q, k, v = gaussian_qkv(B, S, H, D, seed=0)
    calls = prep_calls(q, k, v, variants)
    for fn in calls.values():  # compile, warm
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    bad = [name for name, fn in calls.items() if hasattr(fn, "flags") and fn.flags.any()]
    if bad:
        raise RuntimeError(f"non-finite flags set on finite input: {bad}")
    times = alternating(calls, rounds)
    return {name: {"median_ms": statistics.median(ts), "all_ms": ts} for name, ts in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated names of {list(SHAPES)}")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"single-pass settings of {list(VARIANTS)}")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    shapes = args.shapes.split(",")
    variants = args.variants.split(",")
    unknown = [s for s in shapes if s not in SHAPES] + [x for x in variants if x not in VARIANTS]
    if unknown:
        print(f"error: unknown shape or variant {unknown}", file=sys.stderr)
        return 2
    import torch
    from rich.console import Console
    from rich.table import Table

    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    results, floors = {}, {}
    for name in shapes:
        results[name] = run_shape(SHAPES[name], variants, args.rounds)
        floors[name] = byte_floor_ms(*SHAPES[name])
        torch.cuda.empty_cache()
    table = Table(title=f"prep, ms per call (median of {args.rounds}, alternating), {torch.cuda.get_device_name()}")
    for col in ("shape", "setting", "ms", "vs shipped int8", "x byte floor"):
        table.add_column(col)
    for name in shapes:
        base = results[name]["shipped int8"]["median_ms"]
        table.add_row(name, "byte floor (4.0 TB/s)", f"{floors[name]:.3f}", "", "1.00")
        for setting, r in results[name].items():
            ms = r["median_ms"]
            table.add_row(name, setting, f"{ms:.3f}", f"{100 * (ms / base - 1):+.1f} %", f"{ms / floors[name]:.2f}")
    Console(width=140).print(table)
    if args.json:
        from bench_helpers import run_meta

        meta = run_meta(rounds=args.rounds)
        out = {"meta": meta, "shapes": {n: SHAPES[n] for n in shapes}, "byte_floor_ms": floors, "results": results}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
