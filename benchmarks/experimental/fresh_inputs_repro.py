"""The op at one shape called on fresh q/k/v every call (as a DiT block's processor hands them over: new tensors,
freed after the call), each output checked finite and against the first call's bits. Prints one line per call and a
verdict; ``--json`` writes them. Exploration for the session-23 h3 compare failure (NaN / "q contains NaN or Inf")."""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from bench_helpers import VIDEO_SHAPES, run_meta  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="h3", choices=sorted(VIDEO_SHAPES))
    ap.add_argument("--calls", type=int, default=12)
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    from ditprof.kernels import fp8_attention
    from ditprof.kernels.launch import finish_finite_checks

    B, S, H, D = VIDEO_SHAPES[args.shape]
    g = torch.Generator(device="cuda").manual_seed(0)
    base = [torch.randn((B, S, H, D), generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    ref = None
    rows = []
    for i in range(args.calls):
        q, k, v = (t * 1.0 for t in base)  # fresh allocations on the current stream, like a processor's
        junk = torch.empty(3 * B * S * H * D, dtype=torch.bfloat16, device="cuda")  # reuses freed blocks
        err = None
        try:
            out = fp8_attention(q, k, v)
            del q, k, v
            junk.fill_(float("nan"))  # freed memory of the previous call written on the main stream
            finish_finite_checks()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 -- reported per call
            err = f"{type(exc).__name__}: {exc}"[:200]
            out = None
        finite = bool(torch.isfinite(out).all()) if out is not None else False
        same = None
        if out is not None:
            if ref is None:
                ref = out.clone()
            same = bool(torch.equal(out, ref))
        rows.append({"call": i, "finite": finite, "same_as_first": same, "error": err})
        print(rows[-1], flush=True)
    bad = [r for r in rows if not r["finite"] or r["same_as_first"] is False or r["error"]]
    verdict = {"shape": args.shape, "branch": os.environ.get("DITPROF_FP8_BRANCH"), "bad_calls": len(bad)}
    print("verdict", verdict)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": run_meta(), "verdict": verdict, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
