"""Issue 20 lever 1 end to end: the single-pass INT8 prep (``prep_single_pass.py``: no stats pass, K and V scales per
160-key tile, a K mean of 64 sampled keys) feeding the fp8-sm90 variant that reads those scales
(``fp8_fwd_sm90_tile_scales.py``), against the shipped call (launch record: three prep launches + the kernel) in
the same process.

On an H200 (sm_90a), per shape: GPU ms of the whole call for the shipped INT8 and e4m3 paths and for the single-pass
path, and of the single-pass path's prep and kernel alone, the settings alternating call by call, each call between
its own pair of CUDA events, median of the rounds; then the accuracy of both INT8 paths against the float64
reference on a smaller shape per input kind (gaussian, k_bias, v_bias, peaky, outlier from
``ditprof.kernels.accuracy.make_inputs``). Rich table + JSON (machine, date, versions).

    python benchmarks/experimental/single_pass_e2e.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPES = "h3=1,30272,56,128;cogvideox=1,17776,48,64;ltx=1,7392,32,64;flux=1,4608,24,128"
ACCURACY_SHAPE = (1, 4096, 8, 128)
KINDS = ("gaussian", "k_bias", "v_bias", "peaky", "outlier")


def single_pass_attention(q, k, v, scale: float, out=None, prepared=None):
    """(B, S, H, D) bf16/fp16 q, k, v -> (B, Sq, H, D) output of the single-pass prep + the tile-scales kernel.
    ``prepared``: a dict from an earlier ``prepare_single_pass`` to reuse (the kernel alone)."""
    import torch

    import fp8_fwd_sm90_tile_scales as T
    import prep_single_pass as P

    B, Sq, H, D = q.shape
    p = prepared if prepared is not None else P.prepare_single_pass(q, k, v)
    out = out if out is not None else torch.empty_like(q)
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    T.run_tile_scales(p["q8"], p["k8"], p["v8t"], p["q_scales"], p["k_tile_scales"], p["v_tile_scales"], Sq,
                      k.shape[1], scale, out, lse)
    return out


def timing(shapes: dict, rounds: int) -> dict:
    import torch

    from bench_helpers import gaussian_qkv
    from ditprof.kernels import launch
    from prep_int8_sweep import alternating
    import prep_single_pass as P

    res = {}
    for name, (B, S, H, D) in shapes.items():
        q, k, v = gaussian_qkv(B, S, H, D, seed=3)
        scale = D ** -0.5
        kernel = launch.kernel_name_for_arch(launch.arch_of(q.device.index))
        shipped = {fmt: launch.Fp8Launch(q, k, v, kernel, False, qk_int8=fmt == "int8") for fmt in ("int8", "e4m3")}
        out = torch.empty_like(q)
        prepared = P.prepare_single_pass(q, k, v)
        for _ in range(2):  # compiles, warms
            for rec in shipped.values():
                rec(q, k, v, scale)
            single_pass_attention(q, k, v, scale, out)
        torch.cuda.synchronize()
        fns = {
            "shipped int8 call": lambda: shipped["int8"](q, k, v, scale),
            "shipped e4m3 call": lambda: shipped["e4m3"](q, k, v, scale),
            "single-pass call": lambda: single_pass_attention(q, k, v, scale, out),
            "single-pass prep": lambda: P.prepare_single_pass(q, k, v, out=prepared),
            "single-pass kernel": lambda: single_pass_attention(q, k, v, scale, out, prepared),
        }
        times = alternating(fns, rounds)
        res[name] = {n: statistics.median(t) for n, t in times.items()}
        diff = (out.float() - shipped["int8"](q, k, v, scale).float())
        res[name]["rel_rms_vs_shipped_int8"] = float(diff.pow(2).mean().sqrt() / out.float().pow(2).mean().sqrt())
    return res


def accuracy() -> dict:
    from ditprof.kernels.accuracy import make_inputs
    from ditprof.kernels.interface import fp8_attention_kernel
    from ditprof.kernels.reference import attention_reference

    B, S, H, D = ACCURACY_SHAPE
    res = {}
    for kind in KINDS:
        q, k, v = (x.cuda() for x in make_inputs(kind, (B, H, S, D), seed=0))
        ref = attention_reference(q, k, v, scale=D ** -0.5).float()
        row = {}
        for name, fn in (("shipped int8", lambda: fp8_attention_kernel(q, k, v, scale=None, qk_format="int8")),
                         ("single pass", lambda: single_pass_attention(q, k, v, D ** -0.5))):
            o = fn().float()
            row[name] = float((o - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt())
        res[kind] = row
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=SHAPES, help="name=B,S,H,D;...")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch
    from rich.console import Console
    from rich.table import Table

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("error: needs an sm_90 GPU (H100/H200)", file=sys.stderr)
        return 2
    shapes = {n: tuple(int(x) for x in dims.split(",")) for n, dims in
              (item.split("=") for item in args.shapes.split(";"))}
    acc = accuracy()
    times = timing(shapes, args.rounds)
    console = Console(width=170)
    t = Table(title=f"single-pass prep + tile-scales kernel vs shipped ({torch.cuda.get_device_name()}), "
                    f"GPU ms, median of {args.rounds} alternating rounds")
    cols = ("shipped int8 call", "shipped e4m3 call", "single-pass call", "single-pass prep", "single-pass kernel")
    for c in ("shape",) + cols + ("call vs shipped int8", "rel-RMS vs shipped int8"):
        t.add_column(c)
    for name, r in times.items():
        t.add_row(name, *(f"{r[c]:.4f}" for c in cols),
                  f"{r['single-pass call'] / r['shipped int8 call']:.3f}x", f"{r['rel_rms_vs_shipped_int8']:.2e}")
    console.print(t)
    a = Table(title=f"rel-RMS vs float64, {ACCURACY_SHAPE} (B,S,H,D), seed 0")
    for c in ("kind", "shipped int8", "single pass"):
        a.add_column(c)
    for kind, r in acc.items():
        a.add_row(kind, f"{r['shipped int8']:.4%}", f"{r['single pass']:.4%}")
    console.print(a)
    if args.json:
        from bench_helpers import run_meta

        meta = run_meta(rounds=args.rounds)
        Path(args.json).write_text(json.dumps({"meta": meta, "timing": times, "accuracy": acc}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
