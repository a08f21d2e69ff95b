"""Where does a small block's eager time go with the fp8 swap? Times one preset's block (eager, CUDA events around
each call as ``ditprof compare`` does, plus the host time until the call returns) with sdpa and with the fp8
backend under toggles of the launch record, interleaved round by round in one process:

- ``fp8``: as shipped;
- ``fp8 no-flag-reads``: the record never reads its non-finite flags (CHECK_EVERY huge);
- ``fp8 no-reuse``: a fresh workspace every call;
- ``fp8 triton-jit``: the prep through Triton's JIT instead of the compiled launchers;
- ``fp8 sync-check``: DITPROF_FP8_CHECK=sync (a wait every call).

    python benchmarks/experimental/eager_host_diag.py --preset flux.1-dev --rounds 5 --iters 10
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


@contextlib.contextmanager
def toggled(name: str):
    from ditprof.kernels import launch, prep_triton

    saved = (launch.CHECK_EVERY, prep_triton._launch_hooks_set, os.environ.get("DITPROF_FP8_CHECK"))
    reuse = {k: r.reuse for k, r in launch._RECORDS.items()}
    try:
        if name == "fp8 no-flag-reads":
            launch.CHECK_EVERY = 10**9
        elif name == "fp8 no-reuse":
            for r in launch._RECORDS.values():
                r.reuse = False
        elif name == "fp8 triton-jit":
            prep_triton._launch_hooks_set = lambda: True
        elif name == "fp8 sync-check":
            os.environ["DITPROF_FP8_CHECK"] = "sync"
        yield
    finally:
        launch.CHECK_EVERY, prep_triton._launch_hooks_set = saved[0], saved[1]
        if saved[2] is None:
            os.environ.pop("DITPROF_FP8_CHECK", None)
        else:
            os.environ["DITPROF_FP8_CHECK"] = saved[2]
        for k, r in launch._RECORDS.items():
            r.reuse = reuse.get(k, r.reuse)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="flux.1-dev")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import torch

    from ditprof.harness import swap
    from ditprof.kernels import launch, registry
    from ditprof.model_blocks import load_block, make_inputs

    loaded = load_block(args.preset, device="cuda", dtype=torch.bfloat16, progress=False)
    inputs = make_inputs(loaded)
    uses = loaded.family.uses_dispatcher
    variants = ["sdpa", "fp8", "fp8 no-flag-reads", "fp8 no-reuse", "fp8 triton-jit", "fp8 sync-check"]
    res = {v: {"gpu_ms": [], "host_ms": []} for v in variants}

    def one(call):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        call()
        host = (time.perf_counter() - t0) * 1e3
        end.record()
        end.synchronize()
        return start.elapsed_time(end), host

    with torch.inference_mode():
        for _ in range(args.rounds):
            for v in variants:
                b = registry.get("sdpa" if v == "sdpa" else "fp8")
                with swap.swapped(loaded.module, b.name, b.fn, uses_dispatcher=uses), toggled(v):
                    for _ in range(3):
                        one(lambda: inputs.run(loaded.module))
                    for _ in range(args.iters):
                        g, h = one(lambda: inputs.run(loaded.module))
                        res[v]["gpu_ms"].append(g)
                        res[v]["host_ms"].append(h)
                    launch.finish_finite_checks()
    print(f"{args.preset}: block ms (CUDA events) / host ms until the call returns, median of "
          f"{args.rounds}x{args.iters}")
    for v in variants:
        print(f"  {v:20s} {statistics.median(res[v]['gpu_ms']):7.3f} / {statistics.median(res[v]['host_ms']):7.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(preset=args.preset, gpu=torch.cuda.get_device_name(),
                                                   torch=torch.__version__, results=res), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
