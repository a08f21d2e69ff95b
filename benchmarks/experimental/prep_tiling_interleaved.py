"""The INT8 prep's tiling knobs at several shapes, timed interleaved (``prep_int8_sweep.py`` times one setting after
the other, which at the short shapes' 0.1 ms leaves differences of 0.02 ms inside the drift): each named setting
(``PrepConfig`` fields) gets its own plan (``PrepPlan(..., config=PrepConfig(...))``) and workspace, and the
settings' whole preps (all launches) alternate call by call, each between its own pair of CUDA events; median of
the rounds. Outputs are checked against the default setting's (INT8 codes within one step, V and descales as
``prep_int8_sweep.close`` states).

    python benchmarks/experimental/prep_tiling_interleaved.py --settings "chunk128=stats_chunk=128;rows256=qk_rows=256"
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from prep_int8_sweep import alternating, close, config_of, parse_setting  # noqa: E402

SHAPES = "flux=1,4608,24,128;ltx=1,7392,32,64;cogvideox=1,17776,48,64;h3=1,30272,56,128"


def parse_settings(text: str) -> dict:
    """``name=knob=V[,knob=V];...`` -> {name: {knob: V}}; the default setting is always first."""
    out = {"default": {}}
    for item in filter(None, text.split(";")):
        name, _, knobs = item.partition("=")
        out[name] = dict(parse_setting(k) for k in knobs.split(","))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settings", required=True)
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch

    from ditprof.kernels import prep_triton as P

    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    settings = parse_settings(args.settings)
    stream = torch.cuda.current_stream().cuda_stream
    result = {}
    for item in args.shapes.split(";"):
        shape_name, dims = item.split("=")
        B, S, H, D = (int(x) for x in dims.split(","))
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn((B, S, H, D), generator=g, device="cuda").to(torch.bfloat16) for _ in range(3))
        fns, ref, rows = {}, None, {}
        for name, knobs in settings.items():
            plan = P.PrepPlan(q, k, v, True, qk_int8=True, config=config_of(knobs))
            bufs = plan.buffers(q.device)
            plan.launch(q, k, v, bufs, None)  # compiles
            plan.launch(q, k, v, bufs, stream)
            torch.cuda.synchronize()
            got = {n: bufs[n].clone() for n in ("q8", "k8", "v8t", "q_scales", "scales")}
            ref = ref or got
            rows[name] = {"check": close(got, ref), "launches": len(plan.launches)}
            fns[name] = (lambda plan=plan, bufs=bufs: plan.launch(q, k, v, bufs, stream))
        times = alternating(fns, args.rounds)
        base = statistics.median(times["default"])
        for name, ts in times.items():
            med = statistics.median(ts)
            rows[name].update(median_ms=med, vs_default=med / base - 1)
            print(f"{shape_name:10s} {name:16s} {med:.4f} ms {100 * (med / base - 1):+6.1f} %  "
                  f"{rows[name]['check'] or ''}")
        result[shape_name] = rows
    if args.json:
        import triton

        meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": platform.node(),
                "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                "rounds": args.rounds, "settings": settings}
        Path(args.json).write_text(json.dumps({"meta": meta, "shapes": result}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
