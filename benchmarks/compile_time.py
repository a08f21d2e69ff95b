"""torch.compile time of one block with sdpa vs with the fp8 op swapped in (fresh compile each, same process).

    python benchmarks/compile_time.py [--preset h3] [--tokens N] [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="h3")
    ap.add_argument("--tokens", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch

    from ditprof import dispatch as swap
    from ditprof.kernels import registry
    from ditprof.model_blocks import load_block, make_inputs

    lb = load_block(args.preset, 0, device="cuda", dtype=torch.bfloat16, progress=False)
    inp = make_inputs(lb, tokens=args.tokens)
    rows = []
    for name in ("sdpa", "fp8"):
        torch._dynamo.reset()
        b = registry.get(name)
        with torch.no_grad(), swap.swapped(lb.module, name, b.fn, uses_dispatcher=lb.family.uses_dispatcher):
            compiled = torch.compile(lb.module, fullgraph=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            compiled(**inp.kwargs)
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            ts = []
            for _ in range(5):
                t1 = time.perf_counter()
                compiled(**inp.kwargs)
                torch.cuda.synchronize()
                ts.append(time.perf_counter() - t1)
        rows.append({"backend": name, "first_call_s": first, "steady_call_ms": sorted(ts)[2] * 1e3})
    print(f"{'backend':<8} {'compile + first call s':>22} {'steady call ms':>15}")
    for r in rows:
        print(f"{r['backend']:<8} {r['first_call_s']:22.1f} {r['steady_call_ms']:15.2f}")
    print(f"ratio fp8/sdpa compile: {rows[1]['first_call_s'] / rows[0]['first_call_s']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "compile_time", "date": dt.datetime.now().astimezone().isoformat(),
                       "machine": platform.node(), "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                       "preset": args.preset, "tokens": inp.tokens, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
