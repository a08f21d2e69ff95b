"""Does the fused prologue's INT8 Q/K quantize pay for re-reading the RoPE tables per head? An experiment: the same
quantize (prologue, rotation, codes and scales: ``prep_triton._quant_rows_int8``'s arithmetic) with each program
doing HEADS heads of the same rows, the fp32 cos/sin rows loaded once per block of rows and used for every head,
against the shipped quantize launch (one head per program) in the same process.

    python benchmarks/experimental/prologue_quant_heads.py [--shape 1,56,30272,128] [--form half] [--rope-dim 96]
        [--heads 1,2,4,8]

First the shipped prep runs (stats + quantize); then each variant writes its own q8, k8 and q_scales from the same
stats, and must match the shipped ones bit for bit (same arithmetic, only the loop order differs) before it is
timed. Under ``TRITON_INTERPRET=1`` on the CPU (``--device cpu``, tiny shapes) only the check runs. Exploration,
not shipped: prints a table and writes JSON beside the others' results.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import environment, fmt, print_table, results_path, time_cuda, write_json  # noqa: E402

from ditprof.kernels.prep_triton import (  # noqa: E402
    _abs_bits, _codes_k, _codes_q, _load_rows, _prologue_combine, _prologue_norm, _prologue_rotate, _rope_rows,
    _rot_dot, _to_int8,
)


@triton.jit
def _quant_heads_kernel(src, s_b, s_s, s_h, s_d, dst, H, S, S_pad, rot_ptr, mean_ptr, scales_ptr, qs_ptr, w_ptr,
                        cos_ptr, sin_ptr, text_rows, eps, IS_Q: tl.constexpr, D: tl.constexpr, ROWS: tl.constexpr,
                        BLOCK: tl.constexpr, HEADS: tl.constexpr, SUB_MEAN: tl.constexpr, FAST: tl.constexpr,
                        RECIP: tl.constexpr, F32DOT: tl.constexpr, NORM: tl.constexpr, ROPE: tl.constexpr,
                        R: tl.constexpr, G2: tl.constexpr):
    # program (t, g): rows [t*ROWS, (t+1)*ROWS) (< S_pad) of heads [h0, h0 + HEADS) of batch item b
    t = tl.program_id(0)
    g = tl.program_id(1)
    groups = H // HEADS
    b = (g // groups).to(tl.int64)
    h0 = (g % groups) * HEADS
    d = tl.arange(0, D).to(tl.int64)
    rot = tl.load(rot_ptr + d[:, None] * D + d[None, :])
    n_rows = tl.minimum(ROWS, S_pad - t * ROWS)
    end = tl.minimum(S, t * ROWS + n_rows)
    for i in range(0, n_rows, BLOCK):
        rows = t * ROWS + i + tl.arange(0, BLOCK)
        r64 = rows.to(tl.int64)
        ok = (rows < end)[:, None]
        c = tl.zeros([BLOCK, D], tl.float32)
        sn = tl.zeros([BLOCK, D], tl.float32)
        if ROPE != 0:  # once for all the program's heads
            c, sn = _rope_rows(cos_ptr, sin_ptr, rows, ok, d, BLOCK, D, ROPE, R)
        for hh in range(HEADS):
            h = (h0 + hh).to(tl.int64)
            bh64 = b * H + h
            base = src + b * s_b + h * s_h
            x = _load_rows(base, s_s, s_d, t * ROWS + i, end, d, BLOCK)
            # ``prep_triton._prologue_rows`` with the table rows loaded above
            n, rs = _prologue_norm(x, rows, end, d, w_ptr, text_rows, eps, BLOCK, D, NORM, G2, None)
            partner = n
            if ROPE != 0:
                partner = _prologue_rotate(n, base, s_s, s_d, rows, ok, d, rs, w_ptr, text_rows, BLOCK, D, NORM,
                                           ROPE, R, G2)
            x = _prologue_combine(x, n, partner, c, sn, ok, d, D, ROPE, R, F32DOT)
            xr = _rot_dot(x, rot, F32DOT)
            if IS_Q:
                xr = xr * (1.0 / D)
                amax = tl.max(_abs_bits(xr), axis=1).to(tl.float32, bitcast=True)
                qs = tl.where(amax == 0.0, 1.0, tl.math.div_rn(amax, 127.0))
                y = _codes_q(xr, qs, FAST, RECIP)
                tl.store(qs_ptr + bh64 * S_pad + r64, qs, mask=rows < S_pad)
            else:
                mu = tl.zeros([D], dtype=tl.float32)
                if SUB_MEAN:
                    mu = tl.load(mean_ptr + bh64 * D + d)
                y = _codes_k(xr, (rows < S)[:, None], mu, tl.load(scales_ptr + bh64 * 3 + 1), SUB_MEAN, FAST, RECIP)
            tl.store(dst + (bh64 * S_pad + r64)[:, None] * D + d[None, :], _to_int8(y), mask=(rows < S_pad)[:, None])


def launch_heads(plan, q, k, bufs, out, pro, heads: int, rows: int, interpret: bool) -> None:
    """Q's and K's codes (and Q's scales) into ``out`` (q8, k8, q_scales), HEADS heads per program, from the stats
    the shipped prep left in ``bufs``."""
    from ditprof.kernels.prep_triton import prologue_constants

    wq, wk, cos, sin, text_rows = pro
    cfg = plan.config
    pc = prologue_constants(plan.prologue, plan.D, plan.pro_groups)
    common = dict(H=plan.H, rot_ptr=bufs["rot"], mean_ptr=bufs["k_mean_rot"], scales_ptr=bufs["scales"],
                  qs_ptr=out[2], cos_ptr=cos, sin_ptr=sin, text_rows=text_rows, eps=pc["eps"], D=plan.D, ROWS=rows,
                  BLOCK=cfg.qk_block, HEADS=heads, SUB_MEAN=plan.smooth_k, FAST=bool(cfg.fast_div),
                  RECIP=cfg.qk_recip, F32DOT=interpret, NORM=pc["PRO_NORM"], ROPE=pc["PRO_ROPE"], R=pc["PRO_R"],
                  G2=pc["PRO_G2"])
    for x, dst, w, S, S_pad, is_q in ((q, out[0], wq, plan.Sq, plan.Sq_pad, True),
                                      (k, out[1], wk, plan.Sk, plan.Sk_pad, False)):
        sb, ss, sh, sd = x.stride()
        grid = (triton.cdiv(S_pad, rows), plan.B * plan.H // heads)
        _quant_heads_kernel[grid](x, sb, ss, sh, sd, dst, S=S, S_pad=S_pad, w_ptr=w, IS_Q=is_q,
                                  num_warps=cfg.quant_warps, **common)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="1,56,30272,128", help="B,H,S,D")
    ap.add_argument("--form", default="half")
    ap.add_argument("--rope-dim", type=int, default=96)
    ap.add_argument("--heads", default="1,2,4,8", help="heads per program to try (each must divide H)")
    ap.add_argument("--rows", type=int, default=128, help="rows per program of the variants")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import torch

    from ditprof.kernels.prep_triton import INTERPRET, PrepPlan
    from ditprof.kernels.prologue import PrologueSpec

    if args.device == "cuda" and not torch.cuda.is_available():
        print("prologue_quant_heads: needs CUDA (or --device cpu under TRITON_INTERPRET=1)", file=sys.stderr)
        return 1
    B, H, S, D = (int(x) for x in args.shape.split(","))
    dev = torch.device(args.device)
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn((B, S, H, D), device=dev, generator=g).bfloat16() for _ in range(3))
    R = args.rope_dim or D
    ang = torch.rand((S, R // 2), device=dev, generator=g) * 6
    cos, sin = torch.cos(ang), torch.sin(ang)  # the pair tables (prologue.pair_tables) the plan takes
    spec = PrologueSpec("rms", 1e-6, args.form, args.rope_dim)
    w = (torch.rand((1, D), device=dev, generator=g) + 0.5).bfloat16()
    pro = (w, w.clone(), cos, sin, 0)
    plan = PrepPlan(q, k, v, True, qk_int8=True, prologue=spec)
    bufs = plan.buffers(dev)
    plan.launch(q, k, v, bufs, pro=pro)
    want = (bufs["q8"].clone(), bufs["k8"].clone(), bufs["q_scales"].clone())
    rows, out = [], {}
    if dev.type == "cuda":
        shipped = time_cuda(lambda: plan.quants[0](plan._arguments(q, k, v, bufs, None, pro=pro)[1], None),
                            iters=20)["ms"]
        rows.append(["shipped (1 head / program)", fmt(shipped), "-"])
        out["shipped_ms"] = shipped
    for heads in (int(x) for x in args.heads.split(",")):
        if H % heads:
            continue
        got = tuple(torch.full_like(t, -7 if t.dtype == torch.int8 else float("nan")) for t in want)  # poisoned
        launch_heads(plan, q, k, bufs, got, pro, heads, args.rows, INTERPRET)
        same = all(torch.equal(a, b) for a, b in zip(got, want))
        ms = None
        if dev.type == "cuda" and same:
            ms = time_cuda(lambda: launch_heads(plan, q, k, bufs, got, pro, heads, args.rows, False), iters=20)["ms"]
        out[f"heads_{heads}"] = {"bitwise_equal": same, "ms": ms}
        rows.append([f"{heads} heads / program, {args.rows} rows", fmt(ms) if ms else "-", "yes" if same else "NO"])
    path = write_json({"environment": environment(), "shape": [B, H, S, D], "form": args.form, "rope_dim": R,
                       "results": out}, Path(args.json) if args.json else results_path("prologue-quant-heads"))
    print_table(f"INT8 Q/K quantize with the fused prologue, B,H,S,D = {B},{H},{S},{D}, {args.form} over {R} "
                f"(ms, median of 20; Python launch included for the variants)", ["variant", "ms", "bit for bit"],
                rows)
    print(f"json: {path}")
    return 0 if all(r["bitwise_equal"] for key, r in out.items() if key.startswith("heads_")) else 1


if __name__ == "__main__":
    raise SystemExit(main())
