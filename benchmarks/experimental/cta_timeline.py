"""Per-CTA timeline of the shipped fp8-sm90 kernel (and of the persistent variant) from ``%globaltimer``: where does a
short shape (flux: B=1, H=24, S=4608, D=128, 576 CTAs of 192 query rows on 132 SMs) lose time against FA3 FP8
(0.344 ms vs 0.292 ms, kernel only)? Per-CTA fixed cost (launch, Q + first K/V latency, pipeline fill, epilogue), the
partial last round (48 of 132 SMs busy), or a slower key loop than at long shapes?

The kernels
-----------
``TimelineAttention`` is the shipped ``Sm90Fp8Attention`` with a few ``%globaltimer`` stamps (ns, int64) written into
an extra int64 buffer (one row of ``SLOTS`` per CTA, row = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y *
blockIdx.z)). The stamps are all outside the key-tile loop (the CPU test checks that the loop's SASS is the shipped
one's), at:

  slot 0 START      the CTA's first instruction (thread 0)
  slot 1 FIRST_K    the producer is about to issue its first K TMA (lane 0 of the producer warp; the Q TMA is
                    issued, the first K slot is free, so only one mbarrier try_wait is between)
  slot 2 FIRST_S    consumer warpgroup 0: its first S = Q K_0^T has completed (after the wgmma wait and the K release;
                    that is the Q and first K load latency plus one Q K^T)
  slot 3 LAST_MERGE consumer warpgroup 0: the last P V merged into O (the key loop is over; the epilogue starts)
  slot 4..6 EPI_DONE consumer warpgroup w (0, 1, 2): its epilogue's O / LSE stores issued (its last instruction)
  slot 7 SMID       %smid (low 32 bits); the persistent variant puts its CTA index (blockIdx.x) in the high 32 bits

The CTA's end is the latest EPI_DONE (the producer warp is done long before: its last TMA is ~3 tiles before the
end). The stamps go to an extra pointer argument rather than into the LSE buffer (as the variants file's ``trace``
option does): the LSE stores stay, so the traced kernel does exactly the shipped kernel's work and its output can be
compared with the shipped kernel's bit for bit (``--check``).

``PersistentTimelineAttention`` is the persistent variant (``fp8_fwd_sm90_persistent.py``, e4m3 only) with one row
per work tile (row = the tile's index t): slot 0 is consumer warpgroup 0's start of the tile's Q wait, slots 1-6 as
above (per work tile), slot 7 smid | cta << 32.

How the stamps stay out of the loop without copying ``attend``: FIRST_S is stamped by the first ``softmax_stats``
call traced in a kernel (a trace-time flag: the prologue's call is traced before the loop body's), LAST_MERGE and
EPI_DONE by the ``epilogue`` override, FIRST_K right before the shipped ``load_kv`` (a stamp inside its loop moved
ptxas's uniform-register allocation: +7 UMOVs in the consumers' e4m3 key loop).
The CTA's row index is read with side-effecting inline asm at each stamp (``%ctaid`` / ``%nctaid``) so no value is
kept live across the consumers' loop (at 160 registers one more live value spills).

Host side (``python benchmarks/experimental/cta_timeline.py --shape 1,24,4608,128 --format int8 --json out.json
--plot out.png``): warm-ups, then ``--runs`` traced launches (the last one's table is analysed, every run's span is
kept) alternating with the shipped kernel (untraced, same process, behind a sleep each: its median shows the
tracing overhead). ``analyze`` (pure numpy, tested on synthetic tables in ``test_cta_timeline.py``) gives the span,
the per-SM rounds, busy time and idle tail, the median fixed parts, the key-loop rate (µs per 160-key tile, against
the 2.1 µs measured at h3) and the split of the SM-time (SMs x span) into loop, fixed cost and idle.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

SLOTS = 8
START, FIRST_K, FIRST_S, LAST_MERGE, EPI_DONE, SMID = 0, 1, 2, 3, 4, 7
H3_TILE_US = 2.1  # µs per 160-key tile per CTA in the shipped kernel's loop at h3 (the rate this is compared with)
PHASE_NAMES = ("start -> first S", "key loop", "last merge -> end")


# ====================================================================== analysis (no GPU, no cutlass)
def _union_us(intervals: list) -> float:
    """Length of the union of [a, b) intervals."""
    total, cur_a, cur_b = 0.0, None, None
    for a, b in sorted(intervals):
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    return total + (cur_b - cur_a if cur_b is not None else 0.0)


def analyze(stamps: np.ndarray, n_tiles: int, num_wg: int = 3, num_sms: int | None = None,
            ref_tile_us: float = H3_TILE_US) -> dict:
    """The timeline of one launch from its stamp table (rows x SLOTS int64, ns; see the module docstring).

    ``n_tiles``: key tiles per CTA (the loop rate is (LAST_MERGE - FIRST_S) / n_tiles: that interval holds n_tiles
    softmaxes and P Vs and n_tiles - 1 Q K^Ts). ``num_sms``: the device's SM count (SMs that ran nothing count as
    idle for the whole span); default the number of distinct smids. Times in µs from the first START."""
    st = np.asarray(stamps, dtype=np.int64)
    if st.ndim != 2 or st.shape[1] != SLOTS or len(st) == 0:
        raise ValueError(f"stamps must be (rows, {SLOTS}) with rows > 0")
    times = st[:, :EPI_DONE + num_wg]
    if (times <= 0).any():
        raise ValueError("a stamp was not written (<= 0): a CTA did not run or the buffer was not zeroed")
    t0 = int(times[:, START].min())
    us = (times - t0) / 1000.0
    start, first_k, first_s, last_merge = us[:, START], us[:, FIRST_K], us[:, FIRST_S], us[:, LAST_MERGE]
    end = us[:, EPI_DONE:EPI_DONE + num_wg].max(axis=1)
    smid = (st[:, SMID] & 0xFFFFFFFF).astype(np.int64)
    span = float(end.max())
    order_errors = int(((first_s < start) | (last_merge < first_s) | (end < last_merge)).sum())

    sms = np.unique(smid)
    n_sms = max(num_sms or len(sms), len(sms))
    per_sm, busy, tails, gaps = [], [], [], []
    rounds_of = np.zeros(len(st), dtype=np.int64)
    for s in sms:
        idx = np.flatnonzero(smid == s)
        idx = idx[np.argsort(start[idx], kind="stable")]
        rounds_of[idx] = np.arange(len(idx))
        b = _union_us(list(zip(start[idx], end[idx])))
        tail = span - float(end[idx].max())
        busy.append(b)
        tails.append(tail)
        gaps.extend((start[idx][1:] - end[idx][:-1]).tolist())  # CTA k's end -> CTA k+1's start on this SM
        per_sm.append({"smid": int(s), "ctas": int(len(idx)), "busy_us": b, "idle_tail_us": tail,
                       "first_start_us": float(start[idx][0])})
    counts = np.array([p["ctas"] for p in per_sm])
    hist = {int(c): int((counts == c).sum()) for c in np.unique(counts)}
    if n_sms > len(sms):
        hist[0] = n_sms - len(sms)
    rounds = []
    for r in range(int(counts.max())):
        sel = rounds_of == r
        rounds.append({"round": r, "ctas": int(sel.sum()), "median_start_us": float(np.median(start[sel])),
                       "max_end_us": float(end[sel].max()),
                       "median_duration_us": float(np.median(end[sel] - start[sel]))})

    loop = last_merge - first_s
    dur = end - start
    sm_time = span * n_sms
    loop_t, cta_t = float(loop.sum()), float(dur.sum())
    idle_t = sm_time - float(sum(busy))  # idle = SM-time with no CTA resident (head, gaps, tail, unused SMs)
    overlap_t = cta_t - float(sum(busy))  # CTAs of one SM overlapping in time (0 with one CTA per SM)
    tile_us = float(np.median(loop)) / n_tiles
    return {
        "ctas": int(len(st)), "sms_used": int(len(sms)), "sms": int(n_sms), "n_tiles": int(n_tiles),
        "span_us": span, "order_errors": order_errors,
        "timer_granularity_ns": int(np.gcd.reduce((times - t0).ravel())) if len(st) > 1 else 0,
        "ctas_per_sm_hist": hist, "rounds": rounds, "max_rounds": int(counts.max()),
        "median_busy_us": float(np.median(busy)), "median_idle_tail_us": float(np.median(tails)),
        "max_idle_tail_us": float(max(tails)), "median_gap_us": float(np.median(gaps)) if gaps else 0.0,
        "median_cta_us": float(np.median(dur)),
        "median_start_to_first_k_us": float(np.median(first_k - start)),
        "median_start_to_first_s_us": float(np.median(first_s - start)),
        "median_last_merge_to_end_us": float(np.median(end - last_merge)),
        "median_loop_us": float(np.median(loop)),
        "tile_us": tile_us, "tile_us_vs_h3": tile_us / ref_tile_us,
        "fraction_loop": loop_t / sm_time, "fraction_fixed": (cta_t - loop_t - overlap_t) / sm_time,
        "fraction_idle": idle_t / sm_time,
        "per_sm": per_sm,
    }


def summary_lines(a: dict, label: str = "") -> list[str]:
    """A readable report of ``analyze``'s result."""
    hist = ", ".join(f"{n} SMs x {c} CTAs" for c, n in sorted(a["ctas_per_sm_hist"].items(), reverse=True))
    lines = [
        f"{label}span {a['span_us']:.1f} µs: {a['ctas']} rows on {a['sms_used']}/{a['sms']} SMs ({hist}); "
        f"timer granularity {a['timer_granularity_ns']} ns; stamp order errors {a['order_errors']}",
        f"  per CTA (median): {a['median_cta_us']:.2f} µs = start->first K {a['median_start_to_first_k_us']:.2f}, "
        f"start->first S {a['median_start_to_first_s_us']:.2f} + loop {a['median_loop_us']:.2f} "
        f"({a['n_tiles']} tiles, {a['tile_us']:.3f} µs/tile = {a['tile_us_vs_h3']:.2f} x h3's {H3_TILE_US}) + "
        f"last merge->end {a['median_last_merge_to_end_us']:.2f}",
        f"  per SM: busy median {a['median_busy_us']:.1f} µs, idle tail median {a['median_idle_tail_us']:.1f} / max "
        f"{a['max_idle_tail_us']:.1f} µs, CTA->CTA gap median {a['median_gap_us']:.2f} µs",
        f"  SM-time: loop {100 * a['fraction_loop']:.1f} %, fixed {100 * a['fraction_fixed']:.1f} %, idle "
        f"{100 * a['fraction_idle']:.1f} %",
    ]
    for r in a["rounds"]:
        lines.append(f"  round {r['round']}: {r['ctas']} CTAs, start median {r['median_start_us']:.1f} µs, "
                     f"duration median {r['median_duration_us']:.1f} µs, last end {r['max_end_us']:.1f} µs")
    return lines


def plot_gantt(stamps: np.ndarray, path, num_wg: int = 3, title: str = "") -> None:
    """SM on y, µs on x; each CTA (row) as three bars: start -> first S, the key loop, last merge -> its end."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    st = np.asarray(stamps, dtype=np.int64)
    t0 = st[:, START].min()
    us = (st[:, :EPI_DONE + num_wg] - t0) / 1000.0
    end = us[:, EPI_DONE:].max(axis=1)
    smid = (st[:, SMID] & 0xFFFFFFFF)
    phases = [(us[:, START], us[:, FIRST_S]), (us[:, FIRST_S], us[:, LAST_MERGE]), (us[:, LAST_MERGE], end)]
    colours = ("tab:orange", "tab:blue", "tab:red")
    n_sm = int(smid.max()) + 1
    fig, ax = plt.subplots(figsize=(14, max(4, n_sm * 0.06)))
    for (a, b), colour, name in zip(phases, colours, PHASE_NAMES):
        for s in np.unique(smid):
            sel = smid == s
            ax.broken_barh(list(zip(a[sel], b[sel] - a[sel])), (s - 0.4, 0.8), facecolors=colour, linewidth=0)
        ax.plot([], [], color=colour, lw=6, label=name)
    ax.set_xlabel("µs from the first CTA start (%globaltimer)")
    ax.set_ylabel("SM (%smid)")
    ax.set_ylim(-1, n_sm)
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ====================================================================== host script (GPU)
def n_key_tiles(sk: int, tile_n: int = 160) -> int:
    return -(-sk // tile_n)


def _launcher(fn, prep, B, H, S, D, scale, persistent: bool, num_ctas: int):
    """``launch(o, lse, stamps)`` of the compiled traced kernel (JIT path, cute pointers)."""
    import cuda.bindings.driver as cuda
    import cutlass
    import torch
    from cutlass import Float32, Int32, Int64, cute
    from cutlass.cute.runtime import make_ptr

    from ditprof.kernels import fp8_fwd_sm90 as K

    gm = cute.AddressSpace.gmem
    u8 = cutlass.Uint8

    def ptr(ty, t, align):
        return make_ptr(ty, t.data_ptr(), gm, assumed_align=align)

    def launch(o, lse, stamps):
        qs = prep.q_scales if prep.q_scales is not None else prep.scales
        extra = (Int32(num_ctas),) if persistent else ()
        fn(ptr(u8, prep.q8, 16), ptr(u8, prep.k8, 16), ptr(u8, prep.v8t, 16), ptr(Float32, prep.scales, 4),
           ptr(Float32, qs, 4), ptr(Int32, prep.scales, 4), ptr(K.BFloat16, o, 16), ptr(Float32, lse, 4),
           Int32(B), Int32(H), Int32(S), Int32(S), Int32(prep.q8.shape[2]), Int32(prep.k8.shape[2]),
           Float32(scale), *extra, ptr(Int64, stamps, 8), cuda.CUstream(torch.cuda.current_stream().cuda_stream))

    return launch


def run(args) -> dict:
    import torch

    import bench_helpers as BH
    import fp8_fwd_sm90_persistent as P

    B, H, S, D = (int(x) for x in args.shape.split(","))
    qk_int8 = args.format == "int8"
    if args.persistent and qk_int8:
        raise SystemExit("the persistent variant has no INT8 Q/K mode: --format e4m3")
    prep = BH.gaussian_prep(B, H, S, D, qk_int8=qk_int8)
    scale = 1.0 / math.sqrt(D)
    n_m = -(-S // 192)
    rows = n_m * H * B
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    num_ctas = min(sms, rows)
    from cta_timeline_kernels import compile_timeline

    fn = compile_timeline(D, "bfloat16", fake=False, persistent=args.persistent, qk_int8=qk_int8)
    traced = _launcher(fn, prep, B, H, S, D, scale, args.persistent, num_ctas)
    shipped = BH.shipped_launch(prep, B, H, S, D, scale, qk_int8=qk_int8)
    o_t, lse_t = BH.empty_outputs(B, S, H, D)
    o_s, lse_s = BH.empty_outputs(B, S, H, D)
    stamps = torch.zeros((rows, SLOTS), dtype=torch.int64, device="cuda")
    tables = []

    runners = {"traced": lambda: traced(o_t, lse_t, stamps), "shipped": lambda: shipped(o_s, lse_s)}
    if args.persistent:  # the untraced persistent kernel too: the tracing overhead of this variant
        o_p, lse_p = BH.empty_outputs(B, S, H, D)
        runners["persistent"] = lambda: P.run_persistent(prep.q8, prep.k8, prep.v8t, prep.scales, S, S, scale, o_p,
                                                         lse_p, num_ctas=num_ctas)
    BH.warm(runners, calls=args.warmup)
    spans = []
    times = {k: [] for k in runners}
    for _ in range(args.runs):
        stamps.zero_()  # a fresh table per run (analyze rejects unwritten stamps); before the sleep, not timed
        t = BH.sleep_alternating(runners, 1)
        for k in times:
            times[k] += t[k]
        tables.append(stamps.cpu().numpy().copy())
        spans.append(analyze(tables[-1], n_key_tiles(S), num_sms=sms)["span_us"])
    a = analyze(tables[-1], n_key_tiles(S), num_sms=sms)
    label = f"{'persistent' if args.persistent else 'shipped'} {args.format} {args.shape}: "
    out = {"shape": [B, H, S, D], "format": args.format, "persistent": args.persistent, "num_ctas": num_ctas,
           "traced_ms": BH.timing_fields(times["traced"], 4.0 * B * H * S * S * D),
           "shipped_ms": BH.timing_fields(times["shipped"], 4.0 * B * H * S * S * D),
           "spans_us": spans, "analysis": a}
    if args.persistent:
        out["persistent_ms"] = BH.timing_fields(times["persistent"], 4.0 * B * H * S * S * D)
    if args.check and not args.persistent:
        # the traced kernel does the shipped kernel's work: the same output, bit for bit
        out["check_equal_o"] = bool(torch.equal(o_t, o_s))
        out["check_equal_lse"] = bool(torch.equal(lse_t, lse_s))
    elif args.check:
        torch.cuda.synchronize()  # the untraced persistent kernel's output from the last round
        out["check_equal_o"] = bool(torch.equal(o_t, o_p))
        out["check_equal_lse"] = bool(torch.equal(lse_t, lse_p))
    for line in summary_lines(a, label):
        print(line)
    print(f"  kernel: traced median {out['traced_ms']['median_ms'] * 1000:.1f} µs, shipped (untraced) median "
          f"{out['shipped_ms']['median_ms'] * 1000:.1f} µs; span over {len(spans)} runs: median "
          f"{float(np.median(spans)):.1f} µs")
    if args.persistent:
        print(f"  untraced persistent median {out['persistent_ms']['median_ms'] * 1000:.1f} µs")
    if "check_equal_o" in out:
        print(f"  check: O equal {out['check_equal_o']}, LSE equal {out['check_equal_lse']}")
    if args.json:
        out["meta"] = BH.run_meta(script="cta_timeline.py")
        out["stamps_last"] = tables[-1].tolist()
        Path(args.json).write_text(json.dumps(out, indent=1))
    if args.plot:
        plot_gantt(tables[-1], args.plot, title=label.rstrip(": "))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="1,24,4608,128", help="B,H,S,D (self-attention)")
    p.add_argument("--format", choices=("int8", "e4m3"), default="int8", help="Q/K format of the shipped prep")
    p.add_argument("--persistent", action="store_true", help="the persistent variant (e4m3 only), one CTA per SM")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--runs", type=int, default=10, help="traced launches (alternating with the shipped kernel)")
    p.add_argument("--check", action="store_true", help="also check the traced output equals the untraced kernel's")
    p.add_argument("--json")
    p.add_argument("--plot")
    args = p.parse_args(argv)
    out = run(args)
    if args.check and not (out.get("check_equal_o") and out.get("check_equal_lse")
                           and out["analysis"]["order_errors"] == 0):
        print("CHECK FAILED")
        return 1
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main())
