"""Where the INT8 Q/K prep's time goes, and which tiling of its rotating passes is fastest (issue 18: the INT8 prep
must come within ~0.25 ms of the e4m3 prep at the H3 shape for the <= 3 % budget).

On a CUDA GPU: for each setting of the rotating passes' module constants (rows per Q/K program ``QK_ROWS``, rows per
``tl.dot`` ``QK_BLOCK``, software-pipelining stages ``QK_STAGES``, rows per ``tl.dot`` in the stats pass
``STATS_ROT_ROWS``), a fresh ``PrepPlan(qk_int8=True)`` times its stats launch and its quantize launch apart (CUDA
events, median), and checks its outputs against the default setting's (INT8 codes within one step in <= 0.1 % of
places, descales within 1e-5: the tolerance of tests/test_prep_int8.py; V bit for bit). The e4m3 prep is timed
beside it in the same process. A setting Triton cannot compile is reported with its first error line.

    python benchmarks/experimental/prep_int8_sweep.py --shape 1,30272,56,128 --json out.json
    python benchmarks/experimental/prep_int8_sweep.py --list      # the settings, no GPU needed
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import json
import platform
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

KNOBS = {"QK_ROWS": (256, 512, 1024), "QK_BLOCK": (32, 64, 128), "QK_STAGES": (1, 2, 3), "STATS_ROT_ROWS": (32, 64)}


def settings(quick: bool) -> list[dict]:
    """The default first, then every other combination (``quick``: one knob at a time from the default)."""
    from ditprof.kernels import prep_triton as P

    default = {k: getattr(P, k) for k in KNOBS}
    if quick:
        others = [{**default, k: v} for k, vals in KNOBS.items() for v in vals if v != default[k]]
    else:
        others = [dict(zip(KNOBS, combo)) for combo in itertools.product(*KNOBS.values())]
        others = [s for s in others if s != default]
    return [default] + others


@contextlib.contextmanager
def patched(setting: dict):
    from ditprof.kernels import prep_triton as P

    saved = {k: getattr(P, k) for k in setting}
    for k, v in setting.items():
        setattr(P, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(P, k, v)


def time_passes(plan, q, k, v, iters: int) -> tuple[dict, dict]:
    """Median ms of the stats launch and of the quantize launch, each timed on its own (the quantize pass reads
    what the first stats launch wrote, which stays valid), and the buffers."""
    import torch

    bufs = plan.buffers(q.device)
    stream = torch.cuda.current_stream().cuda_stream
    plan.launch(q, k, v, bufs, stream)  # compiles both
    torch.cuda.synchronize()
    out = {}
    for name, fn in (("stats", plan.launch_stats), ("quant", plan.launch_quant)):
        times = []
        for _ in range(iters):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn(q, k, v, bufs, stream)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        out[name] = statistics.median(times)
    out["total"] = out["stats"] + out["quant"]
    return out, bufs


def close(a: dict, b: dict) -> str | None:
    """None if ``a`` matches ``b`` within the INT8 prep's stated tolerance, else what differs."""
    import torch

    for name in ("q8", "k8"):
        d = (a[name].int() - b[name].int()).abs()
        if int(d.max()) > 1 or int((d > 0).sum()) > 1e-3 * d.numel():
            return f"{name}: max diff {int(d.max())}, {int((d > 0).sum())} codes off"
    if not torch.equal(a["v8t"].view(torch.uint8), b["v8t"].view(torch.uint8)):
        return "v8t differs"
    for name in ("q_scales",):
        if float(((a[name] - b[name]).abs() / b[name]).max()) > 1e-5:
            return f"{name} beyond 1e-5"
    if float(((a["scales"] - b["scales"]).abs() / b["scales"]).max()) > 1e-5:
        return "scales beyond 1e-5"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="1,30272,56,128", help="B,S,H,D (self-attention)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--full", action="store_true", help="every combination (default: one knob at a time)")
    ap.add_argument("--list", action="store_true", help="print the settings and exit")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    grid = settings(quick=not args.full)
    if args.list:
        for s in grid:
            print(s)
        return 0
    import torch
    from rich.console import Console
    from rich.table import Table

    from ditprof.kernels import prep_triton as P

    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU (use --list to see the settings)", file=sys.stderr)
        return 2
    B, S, H, D = (int(x) for x in args.shape.split(","))
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn((B, S, H, D), generator=g, device="cuda").to(torch.bfloat16) for _ in range(3))
    rows = []
    e4m3, _ = time_passes(P.PrepPlan(q, k, v, True), q, k, v, args.iters)
    rows.append({"setting": "e4m3 prep", **e4m3})
    reference = None
    for s in grid:
        with patched(s):
            try:
                t, bufs = time_passes(P.PrepPlan(q, k, v, True, qk_int8=True), q, k, v, args.iters)
            except Exception as exc:  # noqa: BLE001 -- a setting Triton cannot compile is a result here
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
                rows.append({"setting": s, "error": first})
                continue
        got = {n: bufs[n].clone() for n in ("q8", "k8", "v8t", "q_scales", "scales")}
        mismatch = None if reference is None else close(got, reference)
        reference = reference or got
        rows.append({"setting": s, **t, "matches_default": mismatch is None, "mismatch": mismatch})
    table = Table(title=f"INT8 prep at {args.shape} ({torch.cuda.get_device_name()}), ms, median of {args.iters}")
    for col in ("setting", "stats", "quant", "total", "vs e4m3", "check"):
        table.add_column(col)
    base = e4m3["total"]
    for r in rows:
        if "error" in r:
            table.add_row(str(r["setting"]), "", "", "", "", r["error"])
            continue
        table.add_row(str(r["setting"]), f"{r['stats']:.3f}", f"{r['quant']:.3f}", f"{r['total']:.3f}",
                      f"{r['total'] - base:+.3f}",
                      "" if r.get("matches_default", True) else str(r["mismatch"]))
    Console(width=160).print(table)
    if args.json:
        meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": platform.node(),
                "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": args.shape}
        try:
            import triton

            meta["triton"] = triton.__version__
        except ImportError:
            pass
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
