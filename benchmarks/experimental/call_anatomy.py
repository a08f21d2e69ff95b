"""Where one fp8 attention call's GPU time goes at a shape: the real call (the FP8 front door
``interface.fp8_attention``, INT8 or e4m3 Q/K through ``Fp8Options(qk_format=...)``) back to back under
torch.profiler, every GPU kernel of each call with its duration and the gap before it, the call's span (first kernel
start -> last kernel end) and the gap to the next call. Beside it, when the ``fa3-fwd`` wheel is installed, FA3
FP8's kernel alone on pre-quantized inputs in the same process. Issue 17's short shapes: is the distance to FA3
kernel time, prep time or the gaps between the launches?

    python benchmarks/experimental/call_anatomy.py                        # flux, ltx; int8 and e4m3
    python benchmarks/experimental/call_anatomy.py --shapes flux --formats int8 --calls 40
    python benchmarks/experimental/call_anatomy.py --formats int8+prologue   # the fused prologue vs FA3 fed by it
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

PROLOGUE = "int8+prologue"  # the fused prologue's op (raw projections in), beside the plain formats
SHAPES = {"flux": (1, 24, 4608, 128), "ltx": (1, 32, 7392, 64), "cogvideox": (1, 48, 17776, 64),
          "h3": (1, 56, 30272, 128)}


def kernel_events(trace: dict) -> list[dict]:
    """The GPU kernels of a chrome trace (``cat`` "kernel"), sorted by start: {name, ts, dur} in µs."""
    evs = [{"name": e["name"], "ts": float(e["ts"]), "dur": float(e["dur"])}
           for e in trace.get("traceEvents", []) if e.get("cat") == "kernel" and "dur" in e]
    return sorted(evs, key=lambda e: e["ts"])


def split_calls(events: list[dict], reference: list[str]) -> tuple[list[list[dict]], int]:
    """The calls in ``events``: a call starts at each kernel named ``reference[0]`` (the first kernel of one profiled
    call); only calls whose kernel names are ``reference`` are kept (a call that also copied its NaN flags, say,
    is not). Returns (calls, how many were left out)."""
    groups: list[list[dict]] = []
    for e in events:
        if e["name"] == reference[0] or not groups:
            groups.append([])
        groups[-1].append(e)
    calls = []
    for i, g in enumerate(groups):
        if [e["name"] for e in g] == reference:
            prev_end = groups[i - 1][-1]["ts"] + groups[i - 1][-1]["dur"] if i else None
            calls.append([{**g[0], "prev_end": prev_end}] + g[1:])
    return calls, len(groups) - len(calls)


def anatomy(calls: list[list[dict]]) -> dict:
    """Medians over the calls: per kernel slot its name, duration and the gap before it (from the previous kernel's
    end; the first slot's gap is from the previous call's last kernel), the call span and the sum of kernel
    time."""
    if not calls:
        raise ValueError("no complete call in the trace")
    slots = []
    for j in range(len(calls[0])):
        durs = [c[j]["dur"] for c in calls]
        gaps = []
        for i, c in enumerate(calls):
            if j > 0:
                gaps.append(c[j]["ts"] - (c[j - 1]["ts"] + c[j - 1]["dur"]))
            elif c[0].get("prev_end") is not None:  # from whatever kernel ran last before the call
                gaps.append(c[0]["ts"] - c[0]["prev_end"])
        slots.append({"name": calls[0][j]["name"][:90], "dur_us": statistics.median(durs),
                      "gap_before_us": statistics.median(gaps) if gaps else None})
    spans = [c[-1]["ts"] + c[-1]["dur"] - c[0]["ts"] for c in calls]
    busy = [sum(e["dur"] for e in c) for c in calls]
    return {"slots": slots, "span_us": statistics.median(spans), "kernel_sum_us": statistics.median(busy),
            "calls": len(calls)}


def profile_calls(fn, calls: int) -> list[dict]:
    """``fn`` ``calls`` times back to back under the CUDA profiler; the kernel events."""
    import torch

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        prof.export_chrome_trace(path)
        with open(path) as f:
            return kernel_events(json.load(f))


def typical_call(events: list[dict]) -> list[str]:
    """The kernel names of the most frequent call in ``events``. Where a call starts is not known from the trace: each
    kernel name is tried as the first kernel of a call, and the split whose most frequent group covers the most
    events wins. (Splitting at the trace's first kernel failed in session 20 at CogVideoX / h3, where that first
    event was a 1 µs elementwise kernel, likely the non-finite flags' zeroing, that splits a call in two; a reference
    taken from one separately profiled call failed in session 18: that call's list held a kernel the others lacked,
    or missed one.)"""
    best, best_cover = [], 0
    for start in dict.fromkeys(e["name"] for e in events):
        groups: list[list[str]] = []
        for e in events:
            if e["name"] == start or not groups:
                groups.append([])
            groups[-1].append(e["name"])
        group, count = collections.Counter(tuple(g) for g in groups if g[0] == start).most_common(1)[0]
        if count * len(group) > best_cover:
            best, best_cover = list(group), count * len(group)
    return best


def anatomy_of(fn, calls: int) -> dict:
    events = profile_calls(fn, calls)
    calls_, left_out = split_calls(events, typical_call(events))
    return {**anatomy(calls_), "calls_left_out": left_out}


def measure_shape(name: str, shape: tuple, fmt: str, calls: int) -> list[dict]:
    import math

    import torch
    from bench_helpers import gaussian_qkv

    from ditprof.kernels.fp8_config import Fp8Options
    from ditprof.kernels.interface import fp8_attention

    B, H, S, D = shape
    q, k, v = gaussian_qkv(B, S, H, D)
    rows = []
    if fmt == PROLOGUE:
        return rows + measure_prologue(name, q, k, v, calls)
    options = Fp8Options(qk_format=fmt)

    def ours():
        return fp8_attention(q, k, v, options=options)

    for _ in range(3):
        ours()
    torch.cuda.synchronize()
    rows.append({"shape": name, "format": fmt, "who": "ours (op call)", **anatomy_of(ours, calls)})
    try:
        from fa3_fwd_interface import flash_attn_func
    except ImportError:
        return rows
    q8, k8, v8 = (x.to(torch.float8_e4m3fn) for x in (q, k, v))
    ones = torch.ones((B, H), dtype=torch.float32, device="cuda")

    def fa3():
        return flash_attn_func(q8, k8, v8, softmax_scale=1 / math.sqrt(D), causal=False, q_descale=ones,
                               k_descale=ones, v_descale=ones)

    for _ in range(3):
        fa3()
    torch.cuda.synchronize()
    rows.append({"shape": name, "format": "e4m3", "who": "FA3 FP8 kernel only", **anatomy_of(fa3, calls)})
    return rows


def measure_prologue(name: str, q, k, v, calls: int) -> list[dict]:
    """The fused prologue's call (``op.fp8_attention_prologue`` from the raw projections, INT8 Q/K; a repeated call
    replays its launches as one CUDA graph) and, with ``fa3-fwd``, FA3 FP8 fed by the same fused prologue
    (``fa3_prologue.fa3_prologue_inputs`` + the kernel): issue 43's fair pair, kernel by kernel."""
    import torch
    from attention import ROPE_FORMS, prologue_inputs

    from ditprof.kernels.fa3_prologue import fa3_prologue_inputs
    from ditprof.kernels.op import fp8_attention_prologue
    from ditprof.kernels.prologue import PrologueSpec

    D = q.shape[-1]
    form = ROPE_FORMS.get(name, "half")
    wq, wk, cos, sin = prologue_inputs(q, form)
    spec = PrologueSpec("rms", 1e-6, form, D)
    scale = D ** -0.5

    def ours():
        return fp8_attention_prologue(q, k, v, spec, wq=wq, wk=wk, cos=cos, sin=sin, scale=scale)

    fns = {"ours (prologue op call)": ours}
    try:
        from fa3_fwd_interface import flash_attn_func
    except ImportError:
        flash_attn_func = None
    if flash_attn_func is not None:
        def fa3():
            q8, k8, v8, dq, dk, dv = fa3_prologue_inputs(q, k, v, spec, wq=wq, wk=wk, cos=cos, sin=sin)
            return flash_attn_func(q8, k8, v8, softmax_scale=scale, causal=False, q_descale=dq, k_descale=dk,
                                   v_descale=dv)

        fns["FA3 FP8 + the same fused prologue"] = fa3
    rows = []
    for who, fn in fns.items():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        rows.append({"shape": name, "format": PROLOGUE, "who": who, **anatomy_of(fn, calls)})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="flux,ltx")
    ap.add_argument("--formats", default="int8,e4m3")
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    names = [s for s in args.shapes.split(",") if s]
    formats = [f for f in args.formats.split(",") if f]
    if [n for n in names if n not in SHAPES] or [f for f in formats if f not in ("int8", "e4m3", PROLOGUE)]:
        ap.error(f"shapes from {list(SHAPES)}, formats from int8, e4m3, {PROLOGUE}")
    import torch

    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    from bench_helpers import run_meta
    from common import print_table

    rows = []
    for n in names:
        for f in formats:
            rows += measure_shape(n, SHAPES[n], f, args.calls)
    table = []
    for r in rows:
        for j, s in enumerate(r["slots"]):
            table.append([r["shape"], r["format"], r["who"], j, s["name"][:48], s["dur_us"],
                          "" if s["gap_before_us"] is None else s["gap_before_us"],
                          r["span_us"] if j == 0 else "", r["kernel_sum_us"] if j == 0 else ""])
    print_table(f"one call's GPU kernels, medians of {args.calls} back-to-back calls (µs)",
                ["shape", "fmt", "who", "#", "kernel", "dur", "gap before", "call span", "kernel sum"], table)
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": run_meta(calls=args.calls), "rows": rows}, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
