"""Where the INT8 Q/K prep's time goes, and which layout and tiling of its rotating passes is fastest (issue 18:
the INT8 path must cost <= 3 % over the e4m3 path at the H3 shape, prep included).

On a CUDA GPU, in one process:
1. layouts: every combination of the prep's INT8 layout fields of ``PrepConfig`` (``split_v``, ``qk_prefetch``,
   ``qk_recip``) with the default tiling;
2. tiling: from the fastest layout, one field at a time (rows per Q/K program ``qk_rows``, rows per ``tl.dot``
   ``qk_block``, pipelining stages ``qk_stages``, rows per ``tl.dot`` in the stats pass ``stats_rot_rows``, ...);
   each setting: a fresh ``PrepPlan(qk_int8=True, config=PrepConfig(...))``, its stats launch and its quantize
   launch(es) timed apart
   (CUDA events, median), its outputs checked against the default setting's (INT8 codes within one step in
   <= 0.1 % of places, descales within 1e-5: tests/test_prep_int8.py's tolerance; V bit for bit); the e4m3 prep
   timed beside them. A setting Triton cannot compile is reported with its first error line;
3. ``--end-to-end``: the whole call (the FP8 front door with ``Fp8Options(qk_format=..., prep=PrepConfig(...))``:
   prep + kernel) with e4m3 Q/K, with INT8 Q/K at the default setting and at the fastest, interleaved rounds,
   median: the number the 3 % budget is about; and the kernel alone (the plain grid's build on the prep's Q) on a
   prep of each setting.

    python benchmarks/experimental/prep_int8_sweep.py --shape 1,30272,56,128 --end-to-end --json out.json
    python benchmarks/experimental/prep_int8_sweep.py --list      # the settings of stage 1, no GPU needed
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: attention.prologue_inputs

# session 10 (H200, h3) also measured Q's quantize in the stats launch, V's amax in a stats launch of its own and 8
# warps for the rotating programs: all slower, removed from the prep (benchmarks/NOTES.md, session 10)
# (the knobs are fields of ditprof.kernels.fp8_config.PrepConfig)
LAYOUT_KNOBS = {"split_v": (False, True), "qk_prefetch": (False, True), "qk_recip": (False, True)}
TILING_KNOBS = {"qk_rows": (128, 256, 512, 1024), "qk_block": (32, 64, 128), "qk_stages": (1, 2, 3),
                "stats_rot_rows": (0, 16, 32, 64), "stats_chunk": (128, 256, 512),
                "stats_programs_per_sm": (0, 6), "quant_warps": (4, 8), "stats_warps": (4, 8),
                "stats_v_mult": (1, 2, 4), "stats_v_first": (False, True)}
# with --prologue the plan builds with these in place of qk_block / stats_rot_rows (``prep_triton.build_config``)
PROLOGUE_KNOBS = {"prologue_qk_block": (16, 32, 64), "prologue_stats_rot_rows": (16, 32, 64)}
KNOBS = {**LAYOUT_KNOBS, **TILING_KNOBS, **PROLOGUE_KNOBS, "stats_rot_tail": (False, True)}


def defaults() -> dict:
    """The shipped prep's value of each knob (``PrepConfig()``)."""
    from ditprof.kernels.fp8_config import PrepConfig

    return {k: getattr(PrepConfig(), k) for k in KNOBS}


def config_of(setting: dict):
    """The ``PrepConfig`` of ``setting`` (knobs it does not name keep the shipped values)."""
    from ditprof.kernels.fp8_config import PrepConfig

    return dataclasses.replace(PrepConfig(), **setting)


def layout_settings() -> list[dict]:
    """The default first, then every other combination of the layout knobs (default tiling)."""
    base = defaults()
    combos = [{**base, **dict(zip(LAYOUT_KNOBS, c))} for c in itertools.product(*LAYOUT_KNOBS.values())]
    return [base] + [s for s in combos if s != base]


def tiling_settings(best: dict, prologue: bool = False) -> list[dict]:
    """``best`` with one tiling knob changed at a time (``prologue``: the prologue's block sizes in place of the
    two they replace)."""
    knobs = dict(TILING_KNOBS)
    if prologue:
        del knobs["qk_block"], knobs["stats_rot_rows"]
        knobs.update(PROLOGUE_KNOBS)
    return [{**best, k: v} for k, vals in knobs.items() for v in vals if v != best[k]]


def time_passes(plan, q, k, v, iters: int, pro=None) -> tuple[dict, dict]:
    """Median ms of the stats launch and of the quantize launch, each timed on its own (the quantize pass reads
    what the first stats launch wrote, which stays valid), and the buffers. ``pro``: the fused prologue's tensors
    (``PrepPlan.launch``'s ``pro``) for a plan built with one."""
    import torch

    bufs = plan.buffers(q.device)
    stream = torch.cuda.current_stream().cuda_stream
    plan.launch(q, k, v, bufs, stream, pro=pro)  # compiles both
    torch.cuda.synchronize()
    out = {}
    for name, fn in (("stats", plan.launch_stats), ("quant", plan.launch_quant)):
        times = []
        for _ in range(iters):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn(q, k, v, bufs, stream, pro=pro)
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


def parse_setting(text: str) -> tuple[str, object]:
    """``knob=VALUE`` (True/False/None or an integer) for one of KNOBS."""
    name, _, value = text.partition("=")
    if name not in KNOBS:
        raise SystemExit(f"error: --setting {text!r}: knobs are {', '.join(KNOBS)}")
    words = {"True": True, "False": False, "None": None}
    return name, words[value] if value in words else int(value)


def time_setting(P, s: dict, q, k, v, iters: int, reference: dict | None,
                 prologue=None) -> tuple[dict, dict | None]:
    """One sweep row (and the outputs, for the next rows' check). ``prologue``: (PrologueSpec, pro tensors) to
    sweep the prep with the fused prologue."""
    spec, pro = prologue or (None, None)
    try:
        plan = P.PrepPlan(q, k, v, True, qk_int8=True, config=config_of(s), prologue=spec)
        t, bufs = time_passes(plan, q, k, v, iters, pro)
    except Exception as exc:  # noqa: BLE001 -- a setting Triton cannot compile is a result here
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        return {"setting": s, "error": first}, None
    got = {n: bufs[n].clone() for n in ("q8", "k8", "v8t", "q_scales", "scales")}
    mismatch = None if reference is None else close(got, reference)
    return {"setting": s, "launches": len(plan.launches), **t, "matches_default": mismatch is None,
            "mismatch": mismatch}, got


def end_to_end(shapes: dict, settings: dict, rounds: int, steady_s: float = 0.0) -> dict:
    """Per shape, median ms of the whole call (prep + kernel) and of the kernel alone per named setting (None: e4m3
    Q/K). The whole call: the FP8 front door with ``Fp8Options(qk_format=..., prep=config_of(setting))``; the
    kernel alone: the shipped kernel's plain-grid build on the prep's Q (``bench_helpers.shipped_launch``) on a
    prep of that setting (``fp8_prepare(..., config=...)``). The calls go back to back without a sync, the settings
    alternating call by call (clock and power drift hit every setting alike), each call between its own pair of
    CUDA events: GPU time per call, as ``benchmarks/common.time_cuda`` measures it. ``steady_s``: instead, each
    setting alone for that many seconds at a time (``steady_blocks``): what a model that calls one of them all the
    time sees under the power cap."""
    import torch
    from bench_helpers import empty_outputs, shipped_launch

    from ditprof.kernels import interface
    from ditprof.kernels.fp8_config import Fp8Options
    from ditprof.kernels.prep import fp8_prepare

    out = {}
    for shape_name, (B, S, H, D) in shapes.items():
        g = torch.Generator(device="cuda").manual_seed(1)
        q, k, v = (torch.randn((B, S, H, D), generator=g, device="cuda").to(torch.bfloat16) for _ in range(3))
        scale = D ** -0.5
        calls, kernels = {}, {}
        for name, setting in settings.items():
            config = config_of(setting or {})
            options = Fp8Options(qk_format="e4m3" if setting is None else "int8", prep=config)
            calls[name] = lambda o=options: interface.fp8_attention(q, k, v, scale=scale, options=o)
            prep = fp8_prepare(q, k, v, smooth_k=True, qk_int8=setting is not None, config=config)
            launch = shipped_launch(prep, B, H, S, D, scale, qk_int8=setting is not None)
            o, lse = empty_outputs(B, S, H, D)
            kernels[name] = lambda launch=launch, o=o, lse=lse: launch(o, lse)
        for fn in (*calls.values(), *kernels.values()):
            for _ in range(3):  # compiles, warms
                fn()
        torch.cuda.synchronize()
        res = {}
        for part, fns in (("call", calls), ("kernel", kernels)):
            if steady_s:
                times = steady_blocks(fns, steady_s)
            else:
                times = alternating(fns, rounds)
            for name, ts in times.items():
                res.setdefault(name, {})[part] = {"median_ms": statistics.median(ts), "all_ms": ts}
        interface.finish_finite_checks()
        out[shape_name] = res
    return out


def _timed(fn, events: list) -> None:
    import torch

    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    events.append((a, b))


def alternating(fns: dict, rounds: int) -> dict:
    """ms per call, the functions alternating call by call, back to back."""
    import torch

    events = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            _timed(fn, events[name])
    torch.cuda.synchronize()
    return {name: [a.elapsed_time(b) for a, b in pairs] for name, pairs in events.items()}


def steady_blocks(fns: dict, seconds: float, blocks: int = 3) -> dict:
    """ms per call in steady state: each function alone for ``seconds`` of back-to-back calls, the functions taking
    turns ``blocks`` times; the first half of each block is left out (clocks settle under the power cap)."""
    import time

    import torch

    kept = {name: [] for name in fns}
    for _ in range(blocks):
        for name, fn in fns.items():
            events: list = []
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                _timed(fn, events)
                if len(events) % 8 == 0:
                    events[-8][1].synchronize()  # keep the host at most ~8 calls ahead
            torch.cuda.synchronize()
            kept[name] += [a.elapsed_time(b) for a, b in events[len(events) // 2:]]
    return kept


def prologue_of(q, form: str, rope_dim: int):
    """(PrologueSpec, the ``pro`` tensors) of a per-head RMSNorm + RoPE prologue over ``rope_dim`` channels (0:
    all): ``attention.prologue_inputs``' weights and table, the table as the plan takes it (``pair_tables``)."""
    from attention import prologue_inputs

    from ditprof.kernels.prologue import PrologueSpec, pair_tables

    spec = PrologueSpec("rms", 1e-6, form, rope_dim)
    wq, wk, cos, sin = prologue_inputs(q, form, rope_dim)
    return spec, (wq, wk, *pair_tables(spec, cos, sin), 0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="1,30272,56,128", help="B,S,H,D (self-attention)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--no-tiling", action="store_true", help="stage 1 only")
    ap.add_argument("--end-to-end", action="store_true", help="also time prep + kernel (e4m3, INT8 default, best)")
    ap.add_argument("--rounds", type=int, default=40, help="interleaved rounds of --end-to-end")
    ap.add_argument("--steady", type=float, default=0.0,
                    help="--end-to-end in steady-state blocks of this many seconds per setting instead")
    ap.add_argument("--e2e-shapes", default="h3=1,30272,56,128;flux=1,4608,24,128;ltx=1,7392,32,64",
                    help="name=B,S,H,D;... for --end-to-end")
    ap.add_argument("--setting", action="append", default=[],
                    help="knob=VALUE (a PrepConfig field): skip stages 1-2 and take this (with the defaults) as "
                         "the fastest")
    ap.add_argument("--prologue", choices=("interleaved", "half"), default=None,
                    help="sweep the prep with the fused prologue (per-head RMSNorm + RoPE of this form)")
    ap.add_argument("--rope-dim", type=int, default=0, help="--prologue: rotated channels (0: all)")
    ap.add_argument("--list", action="store_true", help="print the stage-1 settings and exit")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.list:
        for s in layout_settings():
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
    e4m3, _ = time_passes(P.PrepPlan(q, k, v, True), q, k, v, args.iters)
    rows = [{"setting": "e4m3 prep", "stage": 0, **e4m3}]
    prologue = None
    if args.prologue:
        prologue = prologue_of(q, args.prologue, args.rope_dim)
        if args.end_to_end:
            print("error: --end-to-end times the plain call; run it without --prologue", file=sys.stderr)
            return 2
    reference = None
    given = {**defaults(), **dict(parse_setting(x) for x in args.setting)}
    for s in [defaults(), given] if args.setting else layout_settings():
        row, got = time_setting(P, s, q, k, v, args.iters, reference, prologue)
        reference = reference or got
        rows.append({"stage": 1, **row})
    ok = [r for r in rows if r["stage"] == 1 and "error" not in r and r["matches_default"]]
    best = min(ok, key=lambda r: r["total"])["setting"]
    if not args.no_tiling and not args.setting:
        for s in tiling_settings(best, prologue is not None):
            row, _ = time_setting(P, s, q, k, v, args.iters, reference, prologue)
            rows.append({"stage": 2, **row})
        ok = [r for r in rows if r["stage"] in (1, 2) and "error" not in r and r["matches_default"]]
        best = min(ok, key=lambda r: r["total"])["setting"]
    what = f" with the fused prologue ({args.prologue}, {args.rope_dim or D} channels)" if prologue else ""
    table = Table(title=f"INT8 prep{what} at {args.shape} ({torch.cuda.get_device_name()}), ms, median of "
                        f"{args.iters}")
    for col in ("stage", "setting (changed from the default)", "launches", "stats", "quant", "total", "vs e4m3",
                "check"):
        table.add_column(col)
    base = e4m3["total"]
    default = defaults()
    for r in rows:
        name = r["setting"] if isinstance(r["setting"], str) else \
            ",".join(f"{k}={v}" for k, v in r["setting"].items() if v != default[k]) or "default"
        if "error" in r:
            table.add_row(str(r["stage"]), name, "", "", "", "", "", r["error"])
            continue
        table.add_row(str(r["stage"]), name, str(r.get("launches", 2)), f"{r['stats']:.3f}", f"{r['quant']:.3f}",
                      f"{r['total']:.3f}", f"{r['total'] - base:+.3f}",
                      "" if r.get("matches_default", True) else str(r["mismatch"]))
    console = Console(width=170)
    console.print(table)
    console.print(f"fastest: {best}")
    result = {"rows": rows, "best": best}
    if args.end_to_end:
        shapes = {n: tuple(int(x) for x in dims.split(",")) for n, dims in
                  (item.split("=") for item in args.e2e_shapes.split(";"))}
        before = {**default, **{k: vals[0] for k, vals in LAYOUT_KNOBS.items()}}  # session 9's layout
        compared = {"e4m3": None, "int8 session-9 layout": before, "int8 default": default}
        if best != default:
            compared["int8 fastest"] = best
        e2e = end_to_end(shapes, compared, args.rounds, args.steady)
        result["end_to_end"] = e2e
        for shape_name, res in e2e.items():
            for part in ("call", "kernel"):
                ref = res["e4m3"][part]["median_ms"]
                for name, r in res.items():
                    ms = r[part]["median_ms"]
                    console.print(f"{part:6s} {shape_name:6s} {name:22s} {ms:8.3f} ms  {100 * (ms / ref - 1):+6.2f} %")
    if args.json:
        from bench_helpers import run_meta

        meta = run_meta(shape=args.shape, prologue=args.prologue, rope_dim=args.rope_dim)
        Path(args.json).write_text(json.dumps({"meta": meta, **result}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
