"""Host (CPU) time per attention call, GPU work kept tiny: where the FP8 path's Python/launch overhead goes.

Small blocks are host-bound in eager mode (docs/RESULTS.md, "eager vs CUDA-graph replay"). This times, on a tiny
shape so that the GPU never holds the host back, the host cost of one call of: torch SDPA, our ``fp8_attention``
through each entry (the op, its Python entry, ``interface.fp8_attention``), the launch record alone, the prep's
three direct launches alone, the op with a key mask, the front door returning the LSE and the op with its launches
made directly (``Fp8Options(graphs=False)``: the rows above replay one CUDA graph per call, the same arguments
repeating). Then a cProfile of the op.
Prints a table, writes JSON (+ the cProfile text) next to it.

    python benchmarks/host_overhead.py --json host_overhead.json
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import io
import json
import platform
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def per_call_us(fn, n: int) -> float:
    """Median over 5 rounds of n back-to-back calls: host microseconds per call (sync only between rounds)."""
    import torch

    rounds = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return sorted(rounds)[2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="1,256,2,128", help="B,S,H,D of q/k/v (BSHD), bf16 (default tiny)")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import torch
    from rich.console import Console
    from rich.table import Table

    from ditprof.kernels import launch_record as L
    from ditprof.kernels.finite_checks import finish_finite_checks
    from ditprof.kernels.fp8_config import Fp8Options
    from ditprof.kernels.interface import fp8_attention
    from ditprof.kernels.kernel_args import LAUNCH_INFO
    from ditprof.kernels.op import fp8_attention as op_entry
    from ditprof.kernels.op import options_key
    from ditprof.kernels.qk_format import qk_format

    if not torch.cuda.is_available():
        raise SystemExit("host_overhead.py: needs a CUDA GPU")
    B, S, H, D = (int(x) for x in args.shape.split(","))
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    scale = D ** -0.5
    keep = torch.rand(B, S, device="cuda", generator=g) < 0.8
    fp8_attention(q, k, v)  # compile + warm caches
    op_entry(q, k, v, key_mask=keep)
    fp8_attention(q, k, v, return_lse=True)
    out = torch.empty_like(q)
    finish_finite_checks()

    # the launch record alone and the front door give the same bits (one record, one cubin)
    fast, front = L.fp8_call(q, k, v, scale), fp8_attention(q, k, v, scale=scale)
    torch.cuda.synchronize()
    rec = L.record_for(q, k, v, False)
    launch = dict(kernel=rec.spec.kernel, tvm_ffi=rec.spec.tvm_ffi, streamk=rec.streamk,
                  last_launch=LAUNCH_INFO["last_launch"],
                  direct_triton=all(s.compiled is not None for s in rec.plan.launches),
                  workspace_reused=rec.reuse, bitwise_equal=bool(torch.equal(fast, front)),
                  finite=bool(torch.isfinite(fast).all()))
    print("launch:", launch, flush=True)
    plan, ws = rec.plan, rec._workspace()
    stream = torch.cuda.current_stream().cuda_stream

    rows = {
        "torch SDPA (BHSD views)": lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt),
        "torch.ops.ditprof.fp8_attention (the op)": lambda: torch.ops.ditprof.fp8_attention(q, k, v, scale, None),
        "op.fp8_attention (Python entry)": lambda: op_entry(q, k, v),
        "interface.fp8_attention": lambda: fp8_attention(q, k, v),
        "launch record alone (no op dispatch)": lambda: L.fp8_call(q, k, v, scale),
        f"prep plan: {len(plan.launches)} direct Triton launches": lambda: plan.launch(q, k, v, ws, stream),
        "kernel launch alone (TVM-FFI call, ints)" if rec.streamk is None else
        "kernel + merge launches alone (stream-K grid)": lambda: rec._launch_kernel(ws, q, out, None, None, scale,
                                                                                  stream),
        "record lookup (launch_record.record_for)": lambda: L.record_for(q, k, v, False),
        "output allocation (torch.empty)": lambda: torch.empty(rec.out_shape, dtype=rec.dtype, device=rec.device),
        "the op with a key mask (compaction + key lengths)": lambda: op_entry(q, k, v, key_mask=keep),
        "interface.fp8_attention(return_lse=True) (its own record, no op)":
            lambda: fp8_attention(q, k, v, return_lse=True),
    }
    res = {name: per_call_us(fn, args.calls) for name, fn in rows.items()}

    def op_under(options: Fp8Options) -> float:
        """The op's host cost under ``options`` (part of the launch record's key: its own record, built by the
        first call)."""
        key = options_key(options)
        torch.ops.ditprof.fp8_attention(q, k, v, scale, None, key)
        return per_call_us(lambda: torch.ops.ditprof.fp8_attention(q, k, v, scale, None, key), args.calls)

    # every launch made directly (no graph replay), then the other Q/K format's op
    res["torch.ops.ditprof.fp8_attention, launched directly (Fp8Options(graphs=False))"] = op_under(
        Fp8Options(graphs=False))
    other = "e4m3" if qk_format(head_dim=D) == "int8" else "int8"
    res[f"torch.ops.ditprof.fp8_attention, Q/K {other}"] = op_under(Fp8Options(qk_format=other))
    launch["graphs"] = rec.graphs.summary() if rec.graphs is not None else None
    # what a capture costs once per repeating argument set: a fresh record's second call captures and replays
    L._RECORDS.clear()  # launch records only: the compiled kernels stay cached
    walls = []
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        torch.ops.ditprof.fp8_attention(q, k, v, scale, None)
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t0) * 1e6)
    launch["new_record_calls_us"] = dict(zip(("record build + direct", "capture + replay", "replay"), walls))

    prof = cProfile.Profile()
    torch.cuda.synchronize()
    prof.enable()
    for _ in range(args.calls):
        torch.ops.ditprof.fp8_attention(q, k, v, scale, None)
    prof.disable()
    finish_finite_checks()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)

    table = Table(title=f"host µs per call, q/k/v {tuple(q.shape)} bf16 ({torch.cuda.get_device_name()})")
    table.add_column("call")
    table.add_column("host µs / call", justify="right")
    for name, us in res.items():
        table.add_row(name, f"{us:.1f}")
    Console().print(table)
    meta = dict(date=dt.datetime.now().isoformat(timespec="seconds"), machine=platform.node(),
                gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                cudnn=torch.backends.cudnn.version(), shape=[B, S, H, D], calls=args.calls,
                qk_format=qk_format(head_dim=D))
    if args.json:
        Path(args.json).write_text(json.dumps(dict(meta=meta, launch=launch, host_us_per_call=res), indent=1))
        Path(args.json).with_suffix(".cprofile.txt").write_text(buf.getvalue())
    print(buf.getvalue()[:6000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
