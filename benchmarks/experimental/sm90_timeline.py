"""Where does each consumer warpgroup of the sm90 FP8 kernel spend a key tile? An in-kernel clock trace (issue 5).

The kernel compiled with ``trace=True`` makes the CTAs of query block 0 (one per head, spread over the whole
run) write SM-clock timestamps per consumer warp and key tile instead of their LSE: tile start, P V done (V wait +
wgmma + FP32 merge), S ready (K wait + QK wgmma), P ready (softmax + e4m3 pack); and the producer's K / V issue
times. This script runs one shape, turns the stamps into per-phase cycle counts, says how often the consumer
warpgroups were in the softmax at the same time (MUFU shared) and how often one's softmax ran while another one's
GEMM did (the overlap the kernel needs), and writes a Chrome trace (open in Perfetto; 1 "µs" = 1000 SM cycles).

    python benchmarks/sm90_timeline.py [--opts k=v,...] [--shape B,H,S,D] [--out DIR]    # needs an sm_90 GPU
    python benchmarks/sm90_timeline.py --plot-from A.trace.json=v5 B.trace.json=v6 --plot cmp.png   # no GPU
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

PHASES = ("pv", "qk", "softmax")  # [start, pv_done], [pv_done, s_ready], [s_ready, p_ready]
SKIP_TILES = 4  # the first key tiles of a CTA (pipeline fill) are left out of every statistic


def parse_opts(text: str) -> dict:
    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        k, _, v = item.partition("=")
        out[k] = {"true": True, "false": False}.get(v.lower(), None)
        if out[k] is None:
            out[k] = int(v) if v.lstrip("-").isdigit() else v
    return out


def phases_from_stamps(stamps, n_warps: int, n_tiles: int, tiles: int):
    """stamps: one head's LSE row (floats). Returns per warp a list of (tile, phase, t_begin, t_end) and the
    producer's issue times [(tile, t_k, t_v)]."""
    from fp8_fwd_sm90_variants import TRACE_PRODUCER

    per_warp = []
    last = min(n_tiles, tiles)
    for w in range(n_warps):
        rows = []
        for j in range(1, last):
            e = [float(stamps[(w * tiles + j) * 4 + i]) for i in range(4)]
            for p, (a, b) in enumerate(zip(e[:3], e[1:])):
                rows.append((j, PHASES[p], a, b))
        per_warp.append(rows)
    producer = [(j, float(stamps[TRACE_PRODUCER + 2 * j]), float(stamps[TRACE_PRODUCER + 2 * j + 1]))
                for j in range(last)]
    return per_warp, producer


def concurrency(per_warp, warps_per_wg: int = 4, skip_tiles: int = SKIP_TILES):
    """From each warpgroup's first warp: the fraction of the traced time with >= 2 warpgroups in the softmax at
    once, and with >= 1 in the softmax while >= 1 other is in a GEMM phase (pv or qk)."""
    wgs = [per_warp[i] for i in range(0, len(per_warp), warps_per_wg)]
    events = []
    for g, rows in enumerate(wgs):
        for j, ph, a, b in rows:
            if j > skip_tiles and b > a:
                events.append((a, +1, g, ph))
                events.append((b, -1, g, ph))
    events.sort(key=lambda e: (e[0], e[1]))
    state = {}
    t_prev, total, both_soft, soft_and_mma = None, 0.0, 0.0, 0.0
    for t, d, g, ph in events:
        if t_prev is not None and state:
            dt = t - t_prev
            n_soft = sum(1 for p in state.values() if p == "softmax")
            n_mma = sum(1 for p in state.values() if p != "softmax")
            total += dt
            both_soft += dt if n_soft >= 2 else 0.0
            soft_and_mma += dt if (n_soft >= 1 and n_mma >= 1) else 0.0
        if d > 0:
            state[g] = ph
        else:
            state.pop(g, None)
        t_prev = t
    return dict(traced_cycles=total, two_plus_in_softmax=both_soft / max(total, 1.0),
                softmax_while_gemm=soft_and_mma / max(total, 1.0))


def chrome_events(per_warp, producer, head: int) -> list[dict]:
    """Chrome-trace events of one head's CTA: a complete event per warp phase (tid 4.. = consumer warps, as in
    the kernel), an instant per producer K / V issue (tid 0); 1 "µs" = 1000 SM cycles."""
    out = []
    for w, rows in enumerate(per_warp):
        for j, ph, a, b in rows:
            out.append(dict(name=ph, cat=ph, ph="X", pid=head, tid=w + 4, ts=a / 1000.0,
                            dur=max(b - a, 0.0) / 1000.0, args=dict(tile=j)))
    for j, tk, tv in producer:
        for name, t in (("K issue", tk), ("V issue", tv)):
            out.append(dict(name=name, ph="i", s="t", pid=head, tid=0, ts=t / 1000.0, args=dict(tile=j)))
    return out


PHASE_COLORS = {"pv": "#4C72B0", "qk": "#55A868", "softmax": "#C44E52"}


def plot_gantt(traces: list[tuple[str, list[dict]]], path: Path, first_tile: int = 20, n_tiles: int = 6,
               head: int = 0) -> Path:
    """Gantt chart of the first warp of each consumer warpgroup over a few key tiles, one panel per trace:
    where the P V, QK and softmax phases of the warpgroups fall against each other (x: 1000 SM cycles)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(traces), 1, figsize=(11, 1.1 + 1.0 * len(traces)), squeeze=False)
    for ax, (label, events) in zip(axes[:, 0], traces):
        rows = [e for e in events if e.get("ph") == "X" and e["pid"] == head and (e["tid"] - 4) % 4 == 0
                and first_tile <= e["args"]["tile"] < first_tile + n_tiles]
        if not rows:
            raise ValueError(f"{label}: no events for head {head}, tiles {first_tile}..{first_tile + n_tiles - 1}")
        t0 = min(e["ts"] for e in rows)
        wgs = sorted({(e["tid"] - 4) // 4 for e in rows})
        for e in rows:
            y = wgs.index((e["tid"] - 4) // 4)
            ax.barh(y, e["dur"], left=e["ts"] - t0, color=PHASE_COLORS[e["name"]], edgecolor="white", height=0.8)
        ax.set_yticks(range(len(wgs)), [f"WG {g}" for g in wgs])
        ax.invert_yaxis()
        ax.set_title(label, loc="left", fontsize=9)
        ax.set_xlim(left=0)
    axes[-1, 0].set_xlabel("SM cycles / 1000 (from the first phase shown)")
    handles = [matplotlib.patches.Patch(color=c, label=n) for n, c in PHASE_COLORS.items()]
    fig.legend(handles=handles, loc="upper right", ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_from_files(specs: list[str], out: str) -> int:
    """specs: TRACE.json[=LABEL] written by this script; out: PNG path."""
    traces = []
    for spec in specs:
        f, _, label = spec.partition("=")
        traces.append((label or Path(f).name, json.loads(Path(f).read_text())["traceEvents"]))
    print(f"wrote {plot_gantt(traces, Path(out))}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--opts", default="", help="kernel options, k=v,... (overrides of the defaults)")
    ap.add_argument("--shape", default="1,56,30272,128")
    ap.add_argument("--heads-in-trace", type=int, default=2, help="heads (CTAs) written to the Chrome trace")
    ap.add_argument("--out", default=".")
    ap.add_argument("--plot-from", nargs="+", metavar="TRACE[=LABEL]",
                    help="no GPU: draw the Gantt PNG (--plot) of traces this script wrote earlier")
    ap.add_argument("--plot", default="sm90-timeline.png", help="PNG path for --plot-from")
    args = ap.parse_args()
    if args.plot_from:
        return plot_from_files(args.plot_from, args.plot)

    import statistics

    import torch

    import fp8_fwd_sm90_variants as K
    from ditprof.kernels.prep import fp8_prepare
    from common import environment, print_table, write_json

    B, H, S, D = (int(x) for x in args.shape.split(","))
    opts = parse_opts(args.opts)
    full = K.options(**opts)
    n_warps = 4 * full["consumer_wgs"]
    if S < K.TRACE_FLOATS:
        raise SystemExit(f"--shape: S={S} too short for the trace (needs >= {K.TRACE_FLOATS})")
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    prep = fp8_prepare(q, k, v, smooth_k=True)
    u8 = torch.uint8
    out = torch.empty(B, S, H, D, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(B, H, S, device="cuda", dtype=torch.float32)
    scale = D ** -0.5

    def launch(**o):
        K.run_sm90(prep.q8.view(u8), prep.k8.view(u8), prep.v8t.view(u8), prep.scales, prep.sq, prep.sk, scale,
                   out, lse, **o)

    def timed(**o):
        launch(**o)
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        ts = []
        for _ in range(3):
            ev[0].record()
            launch(**o)
            ev[1].record()
            torch.cuda.synchronize()
            ts.append(ev[0].elapsed_time(ev[1]))
        return statistics.median(ts)

    t_plain = timed(**opts)
    t_traced = timed(**opts, trace=True)
    lse.fill_(float("nan"))
    launch(**opts, trace=True)
    torch.cuda.synchronize()
    stamps = lse[0].cpu()
    n_tiles = -(-prep.sk // full["tile_n"])
    per_phase = {p: [] for p in PHASES}
    period, conc, trace_events = [], [], []
    for h in range(H):
        per_warp, producer = phases_from_stamps(stamps[h].tolist(), n_warps, n_tiles, K.TRACE_TILES)
        for w, rows in enumerate(per_warp):
            starts = [a for j, ph, a, b in rows if ph == "pv" and j > SKIP_TILES]
            period += [b - a for a, b in zip(starts, starts[1:])]
            for j, ph, a, b in rows:
                if j > SKIP_TILES:
                    per_phase[ph].append(b - a)
        if h < args.heads_in_trace:
            trace_events += chrome_events(per_warp, producer, h)
        conc.append(concurrency(per_warp))
    med = {p: statistics.median(v) for p, v in per_phase.items()}
    mean = {p: statistics.fmean(v) for p, v in per_phase.items()}
    tile_period = statistics.median(period)
    two_soft = statistics.fmean(c["two_plus_in_softmax"] for c in conc)
    soft_mma = statistics.fmean(c["softmax_while_gemm"] for c in conc)
    tn = full["tile_n"]
    # what the two units need per key tile and warpgroup: 64 x tile_n exps at 16/clk/SM shared by the
    # consumer warpgroups, and 2 x 64 x tile_n x D FP8 FMA at 4096/clk/SM
    mufu_cycles = 64 * tn / 16
    mma_cycles = 2 * 64 * tn * D / 4096
    rows = [[p, f"{med[p]:.0f}", f"{mean[p]:.0f}"] for p in PHASES]
    rows.append(["tile period (start to start)", f"{tile_period:.0f}", ""])
    rows.append([f"alone: MUFU {mufu_cycles:.0f} + tensor {mma_cycles:.0f} per WG-tile; x{full['consumer_wgs']} WGs",
                 f"{full['consumer_wgs'] * (mufu_cycles + mma_cycles):.0f} serial",
                 f"{full['consumer_wgs'] * max(mufu_cycles, mma_cycles):.0f} overlapped"])
    rows.append(["time with >= 2 WGs in softmax", f"{100 * two_soft:.0f} %", ""])
    rows.append(["time with softmax under another WG's GEMM phase", f"{100 * soft_mma:.0f} %", ""])
    rows.append(["kernel ms plain / traced", f"{t_plain:.2f}", f"{t_traced:.2f}"])
    env = environment()
    print_table(f"sm90 kernel timeline, {B}x{H}x{S}x{D}, opts {opts or 'default'} (SM cycles per WG-tile)",
                ["phase", "median", "mean"], rows)
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    tag = "-".join(f"{k}{v}" for k, v in sorted(opts.items())) or "default"
    (outdir / f"sm90-timeline-{tag}.trace.json").write_text(json.dumps(dict(traceEvents=trace_events)))
    plot_gantt([(f"{B}x{H}x{S}x{D}, opts {opts or 'default'}: {tile_period:.0f} cycles per key tile", trace_events)],
               outdir / f"sm90-timeline-{tag}.png")
    write_json(dict(benchmark="sm90_timeline", environment=env, shape=[B, H, S, D], opts=opts, full_options=full,
                    cycles_median=med, cycles_mean=mean, tile_period=tile_period,
                    two_plus_in_softmax=two_soft, softmax_while_gemm=soft_mma,
                    ms_plain=t_plain, ms_traced=t_traced), outdir / f"sm90-timeline-{tag}.json")
    print(f"wrote {outdir}/sm90-timeline-{tag}.json, .trace.json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
