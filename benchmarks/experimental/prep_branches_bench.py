"""The INT8 prep's launches as a CUDA graph with concurrent branches, against the shipped chain (all on one stream).

The shipped prep is three launches in a row: stats (K's rotated stats and V's amax, the descales in its last
programs) -> the Q/K quantize launch -> V's quantize launch. Two of those dependencies are not real: Q's INT8
quantize needs no stats (per-row descales), and V's quantize does not wait for K's. At short shapes every launch is
a few waves with a latency-bound tail (flux: stats 52 us at ~1.1 TB/s, NOTES session 21's call anatomy), so work
that may overlap could fill idle SMs. Schedules (each captured into one CUDA graph; forks and joins by events):

- ``chain``: the shipped order, one stream;
- ``kv``: stats -> {Q/K quantize || V quantize};
- ``q``: {Q quantize || stats -> K quantize -> V quantize} (grids whose prep quantizes Q: the stream-K shapes);
- ``q_kv``: {Q quantize || stats -> {K quantize || V quantize}}.

Every schedule's outputs (q8, k8, v8t, descales, Q's row descales) are compared bit for bit with the chain's after
poisoning them; then the graphs are replayed alternating call by call (``bench_helpers.sleep_alternating``),
median of ``--rounds``.

    python benchmarks/experimental/prep_branches_bench.py --shapes flux,ltx,wan1.3b,cogvideox,h3 --rounds 30
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from bench_helpers import VIDEO_SHAPES  # noqa: E402

SHAPES = {n: VIDEO_SHAPES[n] for n in ("flux", "ltx", "wan1.3b", "cogvideox", "h3")}  # B, S, H, D
OUTPUTS = ("q8", "k8", "v8t", "scales", "q_scales")


def split_qk(plan):
    """(Q-only, K-only) copies of the plan's Q/K quantize launch (Q-only None where the plan has no Q programs)."""
    qk = plan.quants[0]
    names = qk.names

    def variant(programs: int, **fixed):
        launch = copy.copy(qk)
        launch.template = list(qk.template)
        for name, val in fixed.items():
            launch.template[names.index(name)] = val
        launch.grid = (programs, qk.grid[1], 1)
        launch.compiled = None
        return launch

    nq, nk = qk.template[names.index("NQ")], qk.template[names.index("NK")]
    return (variant(nq, NK=0) if nq else None), variant(nk, NQ=0)


def schedules(plan, q, k, v, ws, has_q: bool) -> dict:
    """{name: fn(main, sides)}: each makes the prep's launches on torch streams ``main`` and ``sides`` (two) with
    forks and joins by ``wait_stream`` (an event). "chain" and "kv" are the shipped ``PrepPlan.launch`` without and
    with its branch stream."""
    q_only, k_only = split_qk(plan)
    v_launch = plan.quants[1]
    args = plan._arguments(q, k, v, ws, None)

    def chain(main, sides):
        plan.launch(q, k, v, ws, main.cuda_stream)

    def kv(main, sides):
        plan.launch(q, k, v, ws, main.cuda_stream, branch=sides[0])

    def q_beside_stats(main, sides):
        sides[0].wait_stream(main)
        q_only(args[1], sides[0].cuda_stream)
        plan.stats(args[0], main.cuda_stream)
        k_only(args[1], main.cuda_stream)
        v_launch(args[1], main.cuda_stream)
        main.wait_stream(sides[0])

    def q_and_v_beside(main, sides):
        sides[0].wait_stream(main)
        q_only(args[1], sides[0].cuda_stream)
        plan.stats(args[0], main.cuda_stream)
        sides[1].wait_stream(main)
        k_only(args[1], main.cuda_stream)
        v_launch(args[1], sides[1].cuda_stream)
        main.wait_stream(sides[0])
        main.wait_stream(sides[1])

    out = {"chain": chain, "kv": kv}
    if has_q:
        out.update(q=q_beside_stats, q_kv=q_and_v_beside)
    return out


def capture(fn):
    import torch

    main, sides = torch.cuda.Stream(), (torch.cuda.Stream(), torch.cuda.Stream())
    main.wait_stream(torch.cuda.current_stream())
    fn(main, sides)  # eager first: the JIT compiles each launch outside the capture
    torch.cuda.current_stream().wait_stream(main)
    for s in sides:
        torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(main):
        graph.capture_begin(capture_error_mode="thread_local")
        fn(main, sides)
        graph.capture_end()
    torch.cuda.synchronize()
    return graph


def measure(name: str, rounds: int) -> dict:
    import torch
    from bench_helpers import gaussian_qkv, sleep_alternating

    from ditprof.kernels import launch

    B, S, H, D = SHAPES[name]
    q, k, v = gaussian_qkv(B, S, H, D, seed=5)
    rec = launch.record_for(q, k, v, False)
    plan = rec.plan
    if not (plan.qk_int8 and len(plan.quants) == 2):
        raise SystemExit("prep_branches_bench.py: needs the INT8 prep with V's own launch (SPLIT_V)")
    ws = rec._workspace()
    has_q = not plan.skip_q
    graphs = {n: capture(fn) for n, fn in schedules(plan, q, k, v, ws, has_q).items()}
    # with Q in the kernel, q8 is a placeholder and q_scales the shared rotation matrix: not outputs
    outs = [n for n in OUTPUTS if n in ws and ws[n].numel() > 1 and not (rec.q_rot and n == "q_scales")]

    def run_checked(n):
        for t in outs:
            ws[t].view(torch.uint8).fill_(0x7F)  # NaN / 127 codes: an unwritten byte stays visible
        graphs[n].replay()
        torch.cuda.synchronize()
        return {t: ws[t].clone() for t in outs}

    want = run_checked("chain")
    same = {n: all(torch.equal(run_checked(n)[t], want[t]) for t in outs) for n in graphs}
    times = sleep_alternating({n: g.replay for n, g in graphs.items()}, rounds)
    med = {n: statistics.median(ts) * 1e3 for n, ts in times.items()}
    row = {"shape": name, "B": B, "S": S, "H": H, "D": D, "grid": rec.summary()["grid"], "prep_has_q": has_q,
           "bits_equal": same, "median_us": med, "all_ms": times,
           "vs_chain": {n: med[n] / med["chain"] for n in med}}
    return row


def main(argv=None) -> int:
    from bench_helpers import parse_shapes_rounds, run_meta
    from rich.console import Console
    from rich.table import Table

    parsed = parse_shapes_rounds(argv, __doc__, SHAPES, "flux,ltx,wan1.3b,cogvideox,h3", rounds=30)
    if parsed is None:
        return 2
    names, rounds, json_path = parsed
    import torch

    from ditprof.kernels import launch

    rows = []
    for s in names:
        rows.append(measure(s, rounds))
        launch._RECORDS.clear()  # the shape's workspace goes with its record
        torch.cuda.empty_cache()
    table = Table(title="INT8 prep as one CUDA graph: µs per replay (median), ratio to the chain")
    for col in ("shape", "grid", "chain", "kv", "q", "q_kv", "bits equal"):
        table.add_column(col, justify="left" if col in ("shape", "grid") else "right")
    for r in rows:
        med, rel = r["median_us"], r["vs_chain"]
        cells = [f"{med[n]:.1f} ({rel[n]:.3f})" if n in med else "-" for n in ("kv", "q", "q_kv")]
        table.add_row(r["shape"], r["grid"], f"{med['chain']:.1f}", *cells,
                      "yes" if all(r["bits_equal"].values()) else f"NO {r['bits_equal']}")
    Console().print(table)
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"meta": run_meta(rounds=rounds), "rows": rows}, f, indent=1)
    return 0 if all(all(r["bits_equal"].values()) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
