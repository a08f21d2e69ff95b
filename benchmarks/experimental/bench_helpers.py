"""What the experimental GPU benches share: the shared prep of fresh Gaussian inputs, the shipped fp8-sm90 kernel as
a launch callable, per-call GPU timing behind a sleep with the settings alternating call by call, the per-row timing
fields and the JSON meta (machine, date, versions). torch is imported inside (``--help`` and ``--list`` run without
it). Benches import this with their own folder on ``sys.path``.

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


def gaussian_prep(B: int, H: int, S: int, D: int, qk_int8: bool = False, seed: int = 0):
    """The shipped prep (``fp8_prepare``, smoothed K; INT8 or e4m3 Q/K) of ``gaussian_qkv``; the inputs are
    freed."""
    from ditprof.kernels.prep import fp8_prepare

    q, k, v = gaussian_qkv(B, S, H, D, seed)
    prep = fp8_prepare(q, k, v, smooth_k=True, qk_int8=qk_int8)
    del q, k, v
    return prep


def empty_outputs(B: int, S: int, H: int, D: int):
    """An uninitialized bf16 out (B, S, H, D) and fp32 lse (B, H, S) on the GPU."""
    import torch

    return (torch.empty((B, S, H, D), dtype=torch.bfloat16, device="cuda"),
            torch.empty((B, H, S), dtype=torch.float32, device="cuda"))


def shipped_launch(prep, B: int, H: int, S: int, D: int, scale: float, qk_int8: bool = False):
    """``launch(o, lse)``: the shipped fp8-sm90 kernel on ``prep`` (self-attention, no key lengths) on the current
    stream, through ``launch_compiled`` (which may fall back from TVM-FFI to the JIT path: the launcher it returns
    is kept for the next call)."""
    import torch

    from ditprof.kernels.launch import compiled, launch_compiled, spec_for

    spec = spec_for("fp8-sm90", "sm_90a", D, "bfloat16", True, qk_int8=qk_int8)
    launcher = {"spec": spec, "fn": compiled(spec)}

    def launch(o, lse):
        launcher["spec"], launcher["fn"] = launch_compiled(
            launcher["spec"], launcher["fn"], prep.q8, prep.k8, prep.v8t, prep.scales, prep.q_scales, None, o, lse,
            B, H, S, S, scale, torch.cuda.current_stream().cuda_stream)

    return launch


def launch_build(fn, prep, scale: float, out, lse, key_lens=None, sk=None) -> None:
    """``fn``, a build with the shipped fp8-sm90 kernel's arguments (a subclass's compile, cute's JIT calling
    convention), on ``prep`` (INT8 Q/K when it has Q scales) through ``launch_compiled``'s JIT path, on the current
    stream; ``sk``: a key count other than the prep's."""
    import torch

    from ditprof.kernels.launch import DTYPE_NAMES, KernelSpec, launch_compiled

    B, H, _, D = prep.q8.shape
    spec = KernelSpec("fp8-sm90", "sm_90a", D, DTYPE_NAMES[out.dtype], True, key_lens is not None, False,
                      prep.q_scales is not None)
    launch_compiled(spec, fn, prep.q8, prep.k8, prep.v8t, prep.scales, prep.q_scales, key_lens, out, lse, B, H,
                    prep.sq, prep.sk if sk is None else sk, scale, torch.cuda.current_stream().cuda_stream)


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


def timing_fields(ts: list, flops: float) -> dict:
    """A result row's timing fields: median / min / max / all ms and TFLOP/s at the median."""
    med = statistics.median(ts)
    return {"median_ms": med, "min_ms": min(ts), "max_ms": max(ts), "all_ms": ts, "tflops": flops / med / 1e9}


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


def shape_format_main(description: str, shapes: dict, time_shape, title: str, columns: list, row_cells,
                      json_name: str, ok=lambda rows: True) -> int:
    """The command line of a kernel bench over (shape, Q/K format): ``--shapes`` (names of ``shapes``),
    ``--formats`` (int8, e4m3), ``--rounds``, ``--json``; rows from ``time_shape(name, shape, qk_int8, rounds)``,
    a table (``title`` with ``{rounds}``; ``row_cells(row)`` per row), JSON with the environment. Exit status 0
    when ``ok(rows)``, 1 otherwise, 2 without an sm_90 GPU. (The caller put ``benchmarks/`` on ``sys.path``.)"""
    import argparse
    from pathlib import Path

    from common import environment, print_table, results_path, write_json

    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(shapes), help=f"comma list of {', '.join(shapes)}")
    ap.add_argument("--formats", default="int8,e4m3", help="comma list of int8, e4m3")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", default=None, help=f"output path (default benchmarks/results/{json_name}-DATE.json)")
    args = ap.parse_args()
    names = [s.strip() for s in args.shapes.split(",") if s.strip()]
    formats = [s.strip() for s in args.formats.split(",") if s.strip()]
    if [n for n in names if n not in shapes] or [f for f in formats if f not in ("int8", "e4m3")]:
        ap.error(f"shapes from {list(shapes)}, formats from int8, e4m3")
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("needs an sm_90 GPU (H100/H200)")
        return 2
    rows = []
    for n in names:
        for f in formats:
            print(f"{n} {shapes[n]} {f} ...", flush=True)
            rows += time_shape(n, shapes[n], f == "int8", args.rounds)
    print_table(title.format(rounds=args.rounds), columns, [row_cells(r) for r in rows])
    path = Path(args.json) if args.json else results_path(json_name)
    write_json({"environment": environment(), "args": vars(args), "rows": rows}, path)
    print(f"wrote {path}")
    return 0 if ok(rows) else 1


def default_and_switched_records(q, k, v, var: str, value: str = "0"):
    """Two launch records of q, k, v (the op's own, ``launch.record_for``): with the environment switch ``var``
    unset (the shipped default) and with ``var=value``; the process's own setting of ``var`` is restored after."""
    import os

    from ditprof.kernels import launch

    saved = os.environ.pop(var, None)
    try:
        default = launch.record_for(q, k, v, False)
        os.environ[var] = value
        switched = launch.record_for(q, k, v, False)
    finally:
        os.environ.pop(var, None)
        if saved is not None:
            os.environ[var] = saved
    return default, switched


def records_ab(q, k, v, scale: float, records: dict, rounds: int) -> dict:
    """Two launch records ({name: record}, the first the one under test) on the same q, k, v: whole calls (prep +
    kernel) alternating behind a sleep, median of ``rounds``. {"ms", "all_ms", "ratio" (first / second),
    "ratios_per_round", "bit_identical"} (the two outputs compared with ``torch.equal``)."""
    import torch

    from ditprof.kernels import launch

    outs = {}

    def runner(name, rec):
        def call():
            outs[name] = rec(q, k, v, scale)
        return call

    runners = {name: runner(name, rec) for name, rec in records.items()}
    warm(runners)
    times = sleep_alternating(runners, rounds)
    launch.finish_finite_checks()
    a, b = records
    ms = {n: statistics.median(t) for n, t in times.items()}
    return {"ms": ms, "all_ms": times, "ratio": ms[a] / ms[b],
            "ratios_per_round": [x / y for x, y in zip(times[a], times[b])],
            "bit_identical": bool(torch.equal(outs[a], outs[b]))}


def records_ab_main(argv, doc: str, shapes: dict, default: str, measure, names: tuple, untimed: str) -> int:
    """The command line and table of a two-record A/B bench (``records_ab`` rows from ``measure(shape, rounds)``;
    a row without "ms" is printed with ``untimed``): ``names`` (first, second) the records' keys, also the column
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
