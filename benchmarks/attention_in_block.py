"""Where the in-block attention time goes: our FP8 attention inside the real MiniMax-H3 block vs the same call
alone, on the very tensors the block hands it (one process, CUDA events).

    python benchmarks/attention_in_block.py [--preset h3] [--iters 10] [--json out.json]

Per backend (sdpa, fp8, fp8 + fused prologue): (1) in block: CUDA events around each attention call while the block
runs; (2) alone: the same call on the saved q, k, v, back to back; (3) after GEMMs: alone, each call right after
four calls of the block's largest linear (the L2 and clock state a GEMM leaves); (4) the profiler's view: the block's
``ditprof::attention`` range, GPU kernel time. SM clocks are read (NVML) after each phase. The gaps between the
columns say whether in-block time is the inputs' layout (1 vs 2 is then zero: same tensors), the state a GEMM leaves
(3), or the range's extent (4).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cuda_ready, environment, fmt, print_table, results_path, write_json  # noqa: E402


def _clock_mhz():
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        return pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
    except Exception:
        return None


def _events_ms(pairs):
    import torch

    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in pairs]


class Recorder:
    """Wraps an attention function: CUDA events around every call, the first call's arguments kept for the alone
    runs."""

    def __init__(self, fn):
        import inspect

        self.fn, self.pairs, self.saved = fn, [], None
        self.__signature__ = inspect.signature(fn)  # the dispatcher reads which mask arguments the backend takes

    def __call__(self, *args, **kwargs):
        import torch

        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        out = self.fn(*args, **kwargs)
        b.record()
        self.pairs.append((a, b))
        if self.saved is None:
            self.saved = (args, kwargs)
        return out

    def call(self):
        args, kwargs = self.saved
        return self.fn(*args, **kwargs)


def timed_swap(name, fam):
    """(swap, recorder): the swap with its attention function wrapped in a Recorder."""
    from ditprof.harness.swaps.attention import AttentionSwap
    from ditprof.harness.swaps.prologue import PrologueSwap
    from ditprof.kernels import op, registry

    if name == "fp8+prologue":
        rec = Recorder(op.fp8_attention_prologue)
        op.fp8_attention_prologue = rec  # prologue_attend reads the module attribute at call time
        return PrologueSwap(registry.get("fp8"), fam, uses_dispatcher=fam.uses_dispatcher), rec
    b = registry.get(name)
    rec = Recorder(b.fn)
    return AttentionSwap(dataclasses.replace(b, fn=rec), uses_dispatcher=fam.uses_dispatcher), rec


def measure(loaded, inputs, swap, rec, iters):
    """(in-block ms list, alone ms list, after-GEMM ms list, profiler range ms, clocks) for one swap."""
    import torch

    gemm = _gemm_load(loaded, inputs)
    with torch.no_grad(), swap.applied(loaded.module):
        for _ in range(3):
            inputs.run(loaded.module)
        rec.pairs.clear()
        for _ in range(iters):
            inputs.run(loaded.module)
        in_block = _events_ms(rec.pairs)
        clocks = {"in_block": _clock_mhz()}
        alone = _time(rec.call, iters)
        clocks["alone"] = _clock_mhz()
        after = _time(rec.call, iters, before=gemm)
        clocks["after_gemm"] = _clock_mhz()
        prof = _profiled_range_ms(loaded, inputs)
    return in_block, alone, after, prof, clocks


def _gemm_load(loaded, inputs):
    """The block's largest linear on a (rows, in_features) activation: the GEMM load an attention call follows."""
    import torch

    lin = max((m for m in loaded.module.modules() if isinstance(m, torch.nn.Linear)), key=lambda m: m.weight.numel())
    rows = max(t.shape[-2] for t in inputs.kwargs.values() if torch.is_tensor(t) and t.dim() >= 2)
    x = torch.randn((rows, lin.in_features), device="cuda", dtype=lin.weight.dtype)
    return lambda: lin(x)


def _time(fn, iters, before=None):
    import torch

    pairs = []
    with torch.no_grad():
        for _ in range(3):
            fn()
        for _ in range(iters):
            if before is not None:
                for _ in range(4):
                    before()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            pairs.append((a, b))
    return _events_ms(pairs)


def _profiled_range_ms(loaded, inputs):
    """GPU kernel time inside the ``ditprof::attention`` ranges of one block call (torch.profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        inputs.run(loaded.module)
        torch.cuda.synchronize()
    # the range appears as the CPU op and as its GPU annotation (the GPU span): the largest device time of the two
    times = [(getattr(ev, "device_time_total", 0) or 0) / 1000.0 for ev in prof.key_averages()
             if ev.key == "ditprof::attention"]
    return max(times) if times else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="h3")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    ok, why = cuda_ready()
    if not ok:
        print(f"attention_in_block: {why}", file=sys.stderr)
        return 1
    from ditprof.model_blocks import make_inputs
    from ditprof.model_blocks.synthetic import synthetic_block

    loaded = synthetic_block(args.preset, 0, device="cuda")
    inputs = make_inputs(loaded)
    fam = loaded.family
    names = ["sdpa", "fp8"] + ([] if fam.prologue_missing else ["fp8+prologue"])
    rows, out = [], {}
    for name in names:
        swap, rec = timed_swap(name, fam)
        try:
            ib, al, ag, pr, clocks = measure(loaded, inputs, swap, rec, args.iters)
        finally:
            if name == "fp8+prologue":
                from ditprof.kernels import op

                op.fp8_attention_prologue = rec.fn
        med = {k: statistics.median(v) for k, v in (("in_block", ib), ("alone", al), ("after_gemm", ag))}
        out[name] = {"in_block_ms": ib, "alone_ms": al, "after_gemm_ms": ag, "profiler_range_ms": pr,
                     "median_ms": med, "sm_clock_mhz": clocks}
        rows.append([name, fmt(med["in_block"]), fmt(med["alone"]), fmt(med["after_gemm"]), fmt(pr),
                     f"{clocks}"])
    path = write_json({"environment": environment(), "preset": args.preset, "iters": args.iters,
                       "backends": out}, Path(args.json) if args.json else results_path("attention-in-block"))
    print_table(f"attention in the {args.preset} block vs alone (the attention call; ms, median)", ["backend", "in block", "alone", "after GEMMs", "profiler range",
                                             "SM clock MHz"], rows)
    print(f"json: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
