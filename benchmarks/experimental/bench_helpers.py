"""What the experimental GPU benches share: fresh Gaussian inputs, the shipped fp8-sm90 kernel as a launch callable,
per-call GPU timing behind a sleep with the settings alternating call by call, the FP8 front door under two
``Fp8Options`` timed against each other, and the JSON meta (machine, date, versions). torch is imported inside
(``--help`` and ``--list`` run without it). Benches import this with their own folder on ``sys.path``.

(``prep_int8_sweep.alternating`` is the other alternating timer: calls back to back without a sleep or a sync
between them, for the prep and whole-call timings.)"""

from __future__ import annotations

import datetime
import platform
import statistics

SLEEP_CYCLES = 1_000_000  # ~0.5 ms at the H200's clock: the next launch is queued before its start event runs


# issue 17's seven self-attention shapes, (B, S, H, D): the experimental benches take theirs from here
VIDEO_SHAPES = {
    "flux": (1, 4608, 24, 128), "ltx": (1, 7392, 32, 64), "cogvideox": (1, 17776, 48, 64),
    "wan1.3b": (1, 32760, 12, 128), "h3": (1, 30272, 56, 128), "wan14b": (1, 75600, 40, 128),
    "hunyuan": (1, 119056, 24, 128),
}


def gaussian_qkv(B: int, S: int, H: int, D: int, seed: int = 0):
    """Fresh Gaussian (B, S, H, D) bf16 q, k, v on the GPU (self-attention), drawn from one seeded generator."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(torch.randn((B, S, H, D), generator=g, device="cuda").to(torch.bfloat16) for _ in range(3))






def empty_outputs(B: int, S: int, H: int, D: int):
    """An uninitialized bf16 out (B, S, H, D) and fp32 lse (B, H, S) on the GPU."""
    import torch

    return (torch.empty((B, S, H, D), dtype=torch.bfloat16, device="cuda"),
            torch.empty((B, H, S), dtype=torch.float32, device="cuda"))


def shipped_spec(head_dim: int, key_lens: bool = False, qk_int8: bool = False):
    """The ``KernelSpec`` the launch choice gives fp8-sm90 (bf16) on the plain grid with the prep's Q
    (``Fp8Options(streamk=False, q_in_kernel=False)``): its LSE always written, TVM-FFI where it can."""
    from ditprof.kernels.fp8_config import Fp8Options
    from ditprof.kernels.launch_choice import choose_launch

    opts = Fp8Options(qk_format="int8" if qk_int8 else "e4m3", streamk=False, q_in_kernel=False)
    return choose_launch("sm_90a", (1, 1, 1, 1, head_dim), "bfloat16", opts, key_lens=key_lens, write_lse=True,
                         q_in_kernel_ok=False).spec


def shipped_launch(prep, B: int, H: int, S: int, D: int, scale: float, qk_int8: bool = False):
    """``launch(o, lse)``: the shipped fp8-sm90 kernel on ``prep`` (self-attention, no key lengths) on the current
    stream, through ``launch_compiled`` (which may fall back from TVM-FFI to the JIT path: the launcher it returns
    is kept for the next call)."""
    import torch

    from ditprof.kernels.compile_cache import compiled
    from ditprof.kernels.kernel_args import launch_compiled

    spec = shipped_spec(D, qk_int8=qk_int8)
    launcher = {"spec": spec, "fn": compiled(spec)}

    def launch(o, lse):
        launcher["spec"], launcher["fn"] = launch_compiled(
            launcher["spec"], launcher["fn"], prep.q8, prep.k8, prep.v8t, prep.scales, prep.q_scales, None, o, lse,
            B, H, S, S, scale, torch.cuda.current_stream().cuda_stream)

    return launch


def warm(runners: dict, calls: int = 2) -> None:
    """Each runner ``calls`` times (compiles, warms), then a sync."""
    import torch

    for fn in runners.values():
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()


def sleep_alternating(runners: dict, rounds: int, sleep_cycles: int = SLEEP_CYCLES) -> dict:
    """{name: ms per call}: ``rounds`` rounds, the runners alternating call by call; each call between its own pair
    of CUDA events behind a ``torch.cuda._sleep`` (host launch overhead never shows in the GPU interval), synced."""
    import torch

    times: dict = {name: [] for name in runners}
    for _ in range(rounds):
        for name, fn in runners.items():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(sleep_cycles)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times[name].append(a.elapsed_time(b))
    return times



def run_meta(**extra) -> dict:
    """A JSON result's meta: date, machine, GPU, torch / CUDA / Triton / Python versions, then ``extra``."""
    import torch

    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": platform.node(),
            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        pass
    meta["python"] = platform.python_version()
    return {**meta, **extra}


def parse_shapes_rounds(argv, doc: str, shapes: dict, default: str, rounds: int = 15):
    """The command line of an interleaved bench over named shapes: ``--shapes`` (names of ``shapes``), ``--rounds``,
    ``--json``. Returns (names, rounds, json_path), or None after a one-line error naming an unknown shape."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--shapes", default=default)
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--json", dest="json_path", default=None)
    a = ap.parse_args(argv)
    names = [s.strip() for s in a.shapes.split(",") if s.strip()]
    bad = [n for n in names if n not in shapes]
    if bad:
        print(f"unknown shape(s) {bad}; known: {', '.join(shapes)}", file=sys.stderr)
        return None
    return names, a.rounds, a.json_path





def front_door_calls(q, k, v, scale: float, options: dict) -> dict:
    """{name: call()}: the FP8 front door (``interface.fp8_attention``) on q, k, v with each named ``Fp8Options``;
    each call returns its output."""
    from ditprof.kernels import interface

    return {name: (lambda o=o: interface.fp8_attention(q, k, v, scale=scale, options=o))
            for name, o in options.items()}


def what_ran(call, calls: int = 4) -> dict:
    """``call`` made ``calls`` times; the launch summary of what they ran (the fp8 backend's ``launch_stats``:
    kernel, Q/K format, grid, Q in the kernel, ...), with ``graph_replays`` (> 0: a reused workspace whose repeated
    calls replay as one CUDA graph)."""
    import torch

    from ditprof.kernels import registry

    stats = registry.get("fp8").launch_stats
    snap = stats.snapshot()
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    (summary,) = stats.since(snap)
    return summary


def calls_ab(calls: dict, rounds: int) -> dict:
    """Two calls ({name: call() -> output}, the first the one under test) on the same inputs: whole calls
    alternating behind a sleep, median of ``rounds``. {"ms", "all_ms", "ratio" (first / second),
    "ratios_per_round", "bit_identical"} (the two outputs compared with ``torch.equal``)."""
    import torch

    from ditprof.kernels import interface

    outs = {}

    def runner(name, fn):
        def call():
            outs[name] = fn()
        return call

    runners = {name: runner(name, fn) for name, fn in calls.items()}
    warm(runners)
    times = sleep_alternating(runners, rounds)
    interface.finish_finite_checks()
    a, b = calls
    ms = {n: statistics.median(t) for n, t in times.items()}
    return {"ms": ms, "all_ms": times, "ratio": ms[a] / ms[b],
            "ratios_per_round": [x / y for x, y in zip(times[a], times[b])],
            "bit_identical": bool(torch.equal(outs[a], outs[b]))}

def records_ab_main(argv, doc: str, shapes: dict, default: str, measure, names: tuple, untimed: str) -> int:
    """The command line and table of a two-call A/B bench (``calls_ab`` rows from ``measure(shape, rounds)``;
    a row without "ms" is printed with ``untimed``): ``names`` (first, second) the calls' keys, also the column
    heads. Exit status 1 when any pair's outputs differ."""
    import json

    parsed = parse_shapes_rounds(argv, doc, shapes, default)
    if parsed is None:
        return 2
    shape_names, rounds, json_path = parsed
    rows = [measure(n, rounds) for n in shape_names]
    a, b = names
    print(f"{'shape':10} {'grid':9} {a:>12} {b:>12} {'ratio':>7} {'round ratios IQR':>18} bits")
    for r in rows:
        if "ms" not in r:
            print(f"{r['shape']:10} {r['grid']:9} ({untimed})")
            continue
        rr = sorted(r["ratios_per_round"])
        iqr = f"{rr[len(rr) // 4]:.4f}-{rr[(3 * len(rr)) // 4]:.4f}"
        print(f"{r['shape']:10} {r['grid']:9} {r['ms'][a]:12.4f} {r['ms'][b]:12.4f} {r['ratio']:7.4f} {iqr:>18} "
              f"{'same' if r['bit_identical'] else 'DIFFER'}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"meta": run_meta(rounds=rounds), "rows": rows}, f, indent=1)
    return 0 if all(r.get("bit_identical", True) for r in rows) else 1
