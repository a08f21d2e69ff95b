"""Host (CPU) time per attention call, GPU work kept tiny: where the FP8 path's Python/launch overhead goes.

Small blocks are host-bound in eager mode (docs/RESULTS.md, "eager vs CUDA-graph replay"). This times, on a tiny
shape so that the GPU never holds the host back, the host cost of one call of: torch SDPA, our ``fp8_attention``
(whole), its prep alone (``fp8_prepare``, deferred check), the kernel launch alone (``launch_prepared`` on a
prepared input), and the finiteness check (``check_finite``). Then a cProfile of the whole ``fp8_attention``.
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

    from ditprof.kernels.interface import fp8_attention, launch_prepared
    from ditprof.kernels.prep import fp8_prepare

    if not torch.cuda.is_available():
        raise SystemExit("host_overhead.py: needs a CUDA GPU")
    B, S, H, D = (int(x) for x in args.shape.split(","))
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    scale = D ** -0.5
    fp8_attention(q, k, v)  # compile + warm caches
    prep = fp8_prepare(q, k, v, smooth_k=True, check_finite="defer")
    prep.check_finite()
    out = torch.empty_like(q)

    def prep_only():
        p = fp8_prepare(q, k, v, smooth_k=True, check_finite="defer")
        p.check_finite()

    def prep_no_check():
        fp8_prepare(q, k, v, smooth_k=True, check_finite=False)

    import os

    from ditprof.kernels import fp8_fwd_sm90 as K

    def with_launch(path, fn):
        def call():
            os.environ["DITPROF_TVM_FFI"] = "1" if path == "tvm_ffi" else "0"
            try:
                return fn()
            finally:
                os.environ.pop("DITPROF_TVM_FFI", None)
        return call

    # the two launch paths give the same bits (same cubin, same arguments)
    outs = {}
    for path in ("jit", "tvm_ffi"):
        o = torch.full_like(q, float("nan"))
        with_launch(path, lambda: launch_prepared(prep, o, "BSHD", scale))()
        torch.cuda.synchronize()
        outs[path] = (o, K.LAUNCH_INFO["last_launch"])
    same = torch.equal(outs["jit"][0], outs["tvm_ffi"][0]) and bool(torch.isfinite(outs["jit"][0]).all())
    launch = dict(paths_used={p: v[1] for p, v in outs.items()}, bitwise_equal=same,
                  tvm_ffi_error=K.LAUNCH_INFO["tvm_ffi_error"])
    print("launch paths:", launch, flush=True)

    rows = {
        "torch SDPA (BHSD views)": lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt),
        "fp8_attention (whole, default launch)": lambda: fp8_attention(q, k, v),
        "fp8_attention (whole, JIT-executor launch)": with_launch("jit", lambda: fp8_attention(q, k, v)),
        "fp8_prepare + deferred finiteness check": prep_only,
        "fp8_prepare, no finiteness check": prep_no_check,
        "launch_prepared, TVM-FFI launch": with_launch("tvm_ffi", lambda: launch_prepared(prep, out, "BSHD", scale)),
        "launch_prepared, JIT-executor launch": with_launch("jit", lambda: launch_prepared(prep, out, "BSHD", scale)),
    }
    res = {name: per_call_us(fn, args.calls) for name, fn in rows.items()}

    prof = cProfile.Profile()
    torch.cuda.synchronize()
    prof.enable()
    for _ in range(args.calls):
        fp8_attention(q, k, v)
    prof.disable()
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
                cudnn=torch.backends.cudnn.version(), shape=[B, S, H, D], calls=args.calls)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(meta=meta, launch=launch, host_us_per_call=res), indent=1))
        Path(args.json).with_suffix(".cprofile.txt").write_text(buf.getvalue())
    print(buf.getvalue()[:6000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
