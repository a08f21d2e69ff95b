"""Where the fused prologue's prep time goes: the INT8 prep's stats and quantize launches timed apart (CUDA events),
plain and with each part of the prologue (norm only, RoPE only, both; one or two weight groups), at one shape.

    python benchmarks/experimental/prologue_prep_split.py [--shape 1,24,4608,128] [--form interleaved] [--rope-dim R]
        [--half-partner loads|gather]

``--half-partner gather`` swaps the "half" form's two shifted partner loads for a register gather (``tl.gather``)
before anything compiles, to compare the two in separate processes. The variants "..., blocks 64/32" build with the
block sizes the prologue had before ``PrepConfig.prologue_qk_block`` / ``prologue_stats_rot_rows``.

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
    ap.add_argument("--rope-dim", type=int, default=0, help="rotated channels (0: all)")
    ap.add_argument("--half-partner", choices=("loads", "gather"), default="loads")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    ok, why = cuda_ready()
    if not ok:
        print(f"prologue_prep_split: {why}", file=sys.stderr)
        return 1
    import torch

    import dataclasses

    from ditprof.kernels import prep_triton
    from ditprof.kernels.fp8_config import PrepConfig
    from ditprof.kernels.prep_triton import PrepPlan
    from ditprof.kernels.prologue import PrologueSpec

    if args.half_partner == "gather":
        prep_triton._rotate_half_partner = _rotate_half_gather()

    B, H, S, D = (int(x) for x in args.shape.split(","))
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn((B, S, H, D), device="cuda", generator=g).bfloat16() for _ in range(3))
    R = args.rope_dim or D
    ang = torch.rand((S, R // 2), device="cuda", generator=g) * 6
    cos, sin = torch.cos(ang), torch.sin(ang)  # the pair tables (prologue.pair_tables) the plan takes
    old = dataclasses.replace(PrepConfig(), prologue_qk_block=64, prologue_stats_rot_rows=32)
    full = PrologueSpec("rms", 1e-6, args.form, args.rope_dim)
    variants = {"plain": (None, 1, PrepConfig()), "norm": (PrologueSpec("rms", 1e-6, None), 1, PrepConfig()),
                "rope": (PrologueSpec(None, 1e-6, args.form, args.rope_dim), 1, PrepConfig()),
                "norm+rope": (full, 1, PrepConfig()), "norm+rope, 2 weight groups": (full, 2, PrepConfig()),
                "norm+rope, blocks 64/32": (full, 1, old)}
    rows, out = [], {}
    for name, (spec, G, config) in variants.items():
        plan = PrepPlan(q, k, v, True, qk_int8=True, prologue=spec, pro_groups=G, config=config)
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
    path = write_json({"environment": environment(), "shape": [B, H, S, D], "form": args.form, "rope_dim": R,
                       "half_partner": args.half_partner, "variants": out},
                      Path(args.json) if args.json else results_path("prologue-prep-split"))
    print_table(f"INT8 prep with the fused prologue, B,H,S,D = {B},{H},{S},{D}, {args.form} over {R} channels, "
                f"half partner {args.half_partner} (ms, median of 20)",
                ["variant", "stats (K, V)", "quantize (Q, K, V)", "both"], rows)
    print(f"json: {path}")
    return 0


def _rotate_half_gather():
    """A drop-in for ``prep_triton._rotate_half_partner``: the partner channels gathered from n in registers."""
    import triton
    import triton.language as tl

    @triton.jit
    def _rotate_half_gather(n, base, s_s, s_d, rows, ok, d, rs, w_ptr, text_rows, D: tl.constexpr,
                            NORM: tl.constexpr, R: tl.constexpr, G2: tl.constexpr):
        lo = d < R // 2
        p = tl.where(lo, d + R // 2, tl.where(d < R, d - R // 2, d)).to(tl.int32)
        pn = tl.gather(n, tl.broadcast_to(p[None, :], n.shape), axis=1)
        return tl.where(lo[None, :], -pn, pn)

    return _rotate_half_gather


if __name__ == "__main__":
    raise SystemExit(main())
