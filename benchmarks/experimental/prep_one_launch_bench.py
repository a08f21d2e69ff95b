"""The prep in one launch (``prep_triton.ONE_LAUNCH``) against the shipped two (e4m3) / three (INT8) launches, both
Q/K formats, in one process (issue 17: one prep launch, host cost <= 50 us; the short shapes' GPU time).

Per shape: GPU ms of the prep alone (the plan's launches on a workspace), of the whole call (prep + kernel, one
launch record per setting) and of the kernel alone, each call between its own pair of CUDA events, the settings
alternating call by call (``--steady S``: each setting alone for S seconds at a time instead); then the host time
per call of each setting's record at a tiny shape (CPU side, no sync inside the loop), median of rounds. Also
checks that each one-launch prep gives its format's outputs (V and the descales bit for bit, e4m3 Q/K bit for bit,
INT8 codes within one step).

    python benchmarks/experimental/prep_one_launch_bench.py --json out.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from prep_int8_sweep import alternating, patched, steady_blocks  # noqa: E402

SETTINGS = {  # name: (INT8 Q/K, prep_triton knobs)
    "e4m3 2 launches": (False, {}),
    "e4m3 1 launch": (False, {"ONE_LAUNCH": True}),
    "int8 3 launches": (True, {}),
    "int8 1 launch": (True, {"ONE_LAUNCH": True}),
}
SHAPES = "h3=1,30272,56,128;flux=1,4608,24,128;ltx=1,7392,32,64"


def outputs_match(a: dict, b: dict, qk_int8: bool) -> str | None:
    import torch

    for name in ("v8t", "scales") + (() if qk_int8 else ("q8", "k8")):
        if not torch.equal(a[name].view(torch.uint8), b[name].view(torch.uint8)):
            return f"{name} differs"
    if qk_int8:
        for name in ("q8", "k8"):
            d = (a[name].int() - b[name].int()).abs()
            if int(d.max()) > 1 or int((d > 0).sum()) > 1e-3 * d.numel():
                return f"{name}: {int((d > 0).sum())} codes off"
    return None


def gpu_times(shapes: dict, rounds: int, steady_s: float) -> dict:
    import torch

    from ditprof.kernels import launch

    out = {}
    for shape_name, (B, S, H, D) in shapes.items():
        g = torch.Generator(device="cuda").manual_seed(1)
        q, k, v = (torch.randn((B, S, H, D), generator=g, device="cuda").to(torch.bfloat16) for _ in range(3))
        scale = D ** -0.5
        kernel = launch.kernel_name_for_arch(launch.arch_of(q.device.index))
        stream = torch.cuda.current_stream().cuda_stream
        records, prepared = {}, {}
        for name, (qk_int8, knobs) in SETTINGS.items():
            with patched(knobs):
                rec = records[name] = launch.Fp8Launch(q, k, v, kernel, False, qk_int8=qk_int8)
            for _ in range(3):
                rec(q, k, v, scale)  # compiles, warms
            ws = rec._workspace()
            rec.plan.launch(q, k, v, ws, stream)
            prepared[name] = (ws, torch.empty(rec.out_shape, dtype=rec.dtype, device=q.device))
        torch.cuda.synchronize()
        checks = {}
        for name, (qk_int8, knobs) in SETTINGS.items():
            if knobs:
                base = next(n for n, (f, kn) in SETTINGS.items() if f == qk_int8 and not kn)
                checks[name] = outputs_match(prepared[name][0], prepared[base][0], qk_int8)
        parts = {
            "prep": {n: (lambda rec=records[n], ws=prepared[n][0]: rec.plan.launch(q, k, v, ws, stream))
                     for n in SETTINGS},
            "call": {n: (lambda rec=records[n]: rec(q, k, v, scale)) for n in SETTINGS},
            "kernel": {n: (lambda rec=records[n], ws=prepared[n][0], o=prepared[n][1]:
                           rec._launch_kernel(ws, o, None, scale, stream)) for n in SETTINGS},
        }
        res = {n: {"check": checks.get(n)} for n in SETTINGS}
        for part, fns in parts.items():
            times = steady_blocks(fns, steady_s) if steady_s else alternating(fns, rounds)
            for name, ts in times.items():
                res[name][part] = {"median_ms": statistics.median(ts), "n": len(ts)}
        out[shape_name] = res
    return out


def host_times(calls: int, repeats: int) -> dict:
    """CPU-side µs per call of each setting's launch record (and of its prep launches alone), tiny shape."""
    import torch

    from ditprof.kernels import launch

    g = torch.Generator(device="cuda").manual_seed(2)
    q, k, v = (torch.randn((1, 256, 2, 128), generator=g, device="cuda").to(torch.bfloat16) for _ in range(3))
    kernel = launch.kernel_name_for_arch(launch.arch_of(q.device.index))
    stream = torch.cuda.current_stream().cuda_stream
    out = {}
    for name, (qk_int8, knobs) in SETTINGS.items():
        with patched(knobs):
            rec = launch.Fp8Launch(q, k, v, kernel, False, qk_int8=qk_int8)
        for _ in range(5):
            rec(q, k, v, None)
        ws = rec._workspace()
        fns = {"record call": lambda: rec(q, k, v, None), "prep launches": lambda: rec.plan.launch(q, k, v, ws, stream)}
        row = {"launches": len(rec.plan.launches)}
        for part, fn in fns.items():
            per = []
            for _ in range(repeats):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                per.append((time.perf_counter() - t0) / calls * 1e6)
            torch.cuda.synchronize()
            row[part] = statistics.median(per)
        out[name] = row
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=SHAPES, help="name=B,S,H,D;...")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--steady", type=float, default=0.0)
    ap.add_argument("--host-calls", type=int, default=200)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch
    from rich.console import Console
    from rich.table import Table

    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    shapes = {n: tuple(int(x) for x in dims.split(",")) for n, dims in
              (item.split("=") for item in args.shapes.split(";"))}
    gpu = gpu_times(shapes, args.rounds, args.steady)
    host = host_times(args.host_calls, 5)
    console = Console(width=160)
    table = Table(title=f"prep launches ({torch.cuda.get_device_name()}), GPU ms median"
                  + (f", steady {args.steady} s" if args.steady else f", {args.rounds} alternating rounds"))
    for col in ("shape", "setting", "prep", "call", "kernel", "check"):
        table.add_column(col)
    for shape_name, res in gpu.items():
        for name, r in res.items():
            table.add_row(shape_name, name, f"{r['prep']['median_ms']:.4f}", f"{r['call']['median_ms']:.4f}",
                          f"{r['kernel']['median_ms']:.4f}", "" if r["check"] is None else r["check"])
    console.print(table)
    ht = Table(title=f"host µs per call, (1,256,2,128), {args.host_calls} calls, median of 5")
    for col in ("setting", "launches", "record call", "prep launches"):
        ht.add_column(col)
    for name, r in host.items():
        ht.add_row(name, str(r["launches"]), f"{r['record call']:.1f}", f"{r['prep launches']:.1f}")
    console.print(ht)
    if args.json:
        import triton

        meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": platform.node(),
                "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                "rounds": args.rounds, "steady_s": args.steady}
        Path(args.json).write_text(json.dumps({"meta": meta, "gpu": gpu, "host_us": host}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
