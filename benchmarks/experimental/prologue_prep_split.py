"""Where the fused prologue's prep time goes: the INT8 prep's stats and quantize launches timed apart (CUDA events),
plain and with each part of the prologue (norm only, RoPE only, both; one or two weight groups), at one shape.

    python benchmarks/experimental/prologue_prep_split.py [--shape 1,24,4608,128] [--form interleaved]

Exploration, not a shipped benchmark: prints a table and writes JSON beside the others' results.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import cuda_ready, environment, fmt, print_table, results_path, time_cuda, write_json  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="1,24,4608,128", help="B,H,S,D")
    ap.add_argument("--form", default="interleaved")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    ok, why = cuda_ready()
    if not ok:
        print(f"prologue_prep_split: {why}", file=sys.stderr)
        return 1
    import torch

    from ditprof.kernels.prep_triton import PrepPlan
    from ditprof.kernels.prologue import PrologueSpec

    B, H, S, D = (int(x) for x in args.shape.split(","))
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn((B, S, H, D), device="cuda", generator=g).bfloat16() for _ in range(3))
    ang = torch.rand((S, D // 2), device="cuda", generator=g) * 6
    cos, sin = torch.cos(ang).repeat_interleave(2, -1).contiguous(), torch.sin(ang).repeat_interleave(2, -1).contiguous()
    variants = {"plain": (None, 1), "norm": (PrologueSpec("rms", 1e-6, None), 1),
                "rope": (PrologueSpec(None, 1e-6, args.form), 1), "norm+rope": (PrologueSpec("rms", 1e-6, args.form), 1),
                "norm+rope, 2 weight groups": (PrologueSpec("rms", 1e-6, args.form), 2)}
    rows, out = [], {}
    for name, (spec, G) in variants.items():
        plan = PrepPlan(q, k, v, True, qk_int8=True, prologue=spec, pro_groups=G)
        bufs = plan.buffers(q.device)
        kw = {}
        if spec is not None:
            w = (torch.rand((G, D), device="cuda", generator=g) + 0.5).bfloat16()
            kw = {"pro": (w, w.clone(), cos, sin, S // 9 if G == 2 else 0)}
        stats, quant, both = (time_cuda(fn, iters=20)["ms"] for fn in (
            lambda: plan.launch_stats(q, k, v, bufs, **kw), lambda: plan.launch_quant(q, k, v, bufs, **kw),
            lambda: plan.launch(q, k, v, bufs, **kw)))
        out[name] = {"stats_ms": stats, "quant_ms": quant, "prep_ms": both}
        rows.append([name, fmt(stats), fmt(quant), fmt(both)])
    path = write_json({"environment": environment(), "shape": [B, H, S, D], "form": args.form, "variants": out},
                      Path(args.json) if args.json else results_path("prologue-prep-split"))
    print_table(f"INT8 prep with the fused prologue, B,H,S,D = {B},{H},{S},{D} (ms, median of 20)",
                ["variant", "stats (K, V)", "quantize (Q, K, V)", "both"], rows)
    print(f"json: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
