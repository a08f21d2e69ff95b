"""``split.png``: stacked bars of the per-category block time, baseline vs swapped."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")  # noqa: E402 - headless, set before pyplot
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from ditprof.harness.trace.categories import REPORTED_CATEGORIES  # noqa: E402

COLORS = {
    "attention": "#d62728",
    "communication": "#9467bd",
    "gemm": "#1f77b4",
    "norm": "#2ca02c",
    "elementwise": "#ff7f0e",
    "fused": "#e377c2",
    "other": "#7f7f7f",
}


def _fmt_ms(ms: float) -> str:
    if ms >= 1000:
        return f"{ms / 1000:.2f} s"
    return f"{ms:.3g} ms"


LIMIT_CATEGORIES = ("attention", "gemm", "norm", "elementwise")


def _shade(j: int, n: int) -> float:
    """The alpha of run ``j`` of ``n`` in the limits panel: the baseline solid, the later runs ever lighter."""
    return 1.0 if j == 0 else 0.5 - 0.25 * (j - 1) / max(1, n - 2)


def _run_name(r: dict) -> str:
    """A run's configuration, one swap a line (``fp8\n+ fp8-linears-rowwise``), for a bar's tick label."""
    return (r.get("configuration") or r["attention_backend"]).replace(" + ", "\n+ ")


def _limits_panel(ax, runs: list[dict]) -> None:
    """Share of peak per category (report.limits), one bar per run; "n/a" where there is none (a numerics
    emulation, bytes unknown)."""
    cats = [c for c in LIMIT_CATEGORIES if any(c in (r.get("limits") or {}) for r in runs)]
    width = 0.8 / len(runs)
    top = 0.0
    for j, r in enumerate(runs):
        xs = [i + (j - (len(runs) - 1) / 2) * width for i in range(len(cats))]
        entries = [(r.get("limits") or {}).get(c) or {} for c in cats]
        heights = [(e.get("share_of_peak") or 0.0) * 100 for e in entries]
        ax.bar(xs, heights, width * 0.9, color=[COLORS[c] for c in cats], alpha=_shade(j, len(runs)),
               edgecolor="black", linewidth=0.5)
        for x, h, e in zip(xs, heights, entries):
            share = e.get("share_of_peak")
            ax.text(x, h, "n/a" if share is None else (f"{h:.0f}%" if h >= 10 else f"{h:.2g}%"), ha="center",
                    va="bottom", fontsize=7)
        top = max([top] + heights)
    ax.set_xticks(range(len(cats)), cats, fontsize=8)
    ax.set_ylim(0, max(top, 1.0) * 1.35)
    measured = any(e.get("peak_kind") == "measured" for r in runs for e in (r.get("limits") or {}).values())
    ax.set_ylabel("% of peak" + (" or measured rate" if measured else ""), fontsize=8)
    ax.set_title("how close to the limit (FLOP/s or bytes/s vs " + ("the device's peak" if not measured
                 else "peak / the plan's measured rate") + ")", fontsize=8)
    # the bars take their category's colour: the legend tells the runs apart by shade alone
    handles = [Patch(facecolor="0.45", alpha=_shade(j, len(runs)), edgecolor="black", linewidth=0.5,
                     label=f"{r['label']} ({r.get('configuration') or r['attention_backend']})") for j, r in enumerate(runs)]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def split_figure(runs: list[dict], title: str, unit_note: str = "", note: str = ""):
    """The ``split.png`` figure (tests inspect its artists): the stacked split (axes[0]) and, where the runs have
    ``limits``, their share of peak per category under it (axes[1]). ``note``: a line under the title."""
    labels = [f"{r['label']}\n{_run_name(r)}" for r in runs]
    with_limits = any(r.get("limits") for r in runs)
    if with_limits:
        fig, (ax, lim_ax) = plt.subplots(2, 1, figsize=(3.2 + 1.6 * len(runs), 7.0), dpi=110,
                                         gridspec_kw={"height_ratios": [3.0, 1.4]})
    else:
        fig, ax = plt.subplots(figsize=(3.2 + 1.6 * len(runs), 4.8), dpi=110)
    bottoms = [0.0] * len(runs)
    for cat in REPORTED_CATEGORIES:
        if not any(cat in r["split_ms"] for r in runs):
            continue  # communication (--sp) and fused (--compile) only where a run has them
        vals = [r["split_ms"].get(cat, 0.0) for r in runs]
        if cat == "communication" and not any(vals):
            continue  # single-device runs: no empty legend entry
        ax.bar(labels, vals, bottom=bottoms, color=COLORS[cat], label=cat, width=0.55)
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    tops = list(bottoms)
    for i, r in enumerate(runs):
        clean = (r.get("block_ms") or {}).get("median")
        if clean:
            ax.plot([i - 0.34, i + 0.34], [clean, clean], color="black", linestyle="--", linewidth=1,
                    label="block time (clean timing)" if i == 0 else None)
            tops[i] = max(tops[i], clean)
    ax.set_ylim(0, max(tops + [1e-9]) * 1.3)
    pad = max(tops + [1e-9]) * 0.03  # the value label sits above both the bar and the dashed block-time line
    for i, r in enumerate(runs):
        ax.text(i, tops[i] + pad, f"{_fmt_ms(bottoms[i])}\nattn {r['attention_share'] * 100:.1f}%",
                ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("time per block call (ms)" + (f" — {unit_note}" if unit_note else ""))
    ax.set_title(title + (f"\n{note}" if note else ""), fontsize=9)
    handles, names = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], names[::-1], fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if with_limits:
        _limits_panel(lim_ax, runs)
    fig.tight_layout()
    return fig


def split_png(runs: list[dict], title: str, unit_note: str = "", note: str = "") -> bytes:
    """``runs``: report sections (``attention_backend``, ``split_ms``, ``attention_share``); PNG bytes."""
    fig = split_figure(runs, title, unit_note, note)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def _steps_note(configurations: list[dict]) -> str:
    """More than two configurations: each one's block time against the previous one's."""
    def step(c: dict) -> str:
        ch = c["change_vs_previous"]
        what = "numerics only" if ch["speedup"] is None else f"{ch['speedup']:.2f}x"
        return f"{c['label']} {what}" + (" (within noise)" if (ch.get("block") or {}).get("verdict") ==
                                         "within noise" else "")

    return "block vs the previous configuration: " + ", ".join(step(c) for c in configurations[1:])


def speedup_note(report: dict) -> str:
    """'block 1.23x faster with fp8 (CUDA-graph replay 1.24x)' -- with the noise verdict -- or ''; with more than
    two configurations each one's change against the previous one."""
    b, s, nz = report["baseline"], report.get("swapped"), report.get("noise") or {}
    if not s:
        return ""
    if len(report.get("configurations") or []) > 2:
        return _steps_note(report["configurations"])
    block = nz.get("block") or {}
    if block.get("verdict") == "numerics only":
        return f"{s.get('configuration') or s['attention_backend']} emulates numerics: its time is not a speed result"
    x = b["block_ms"]["median"] / s["block_ms"]["median"]
    text = f"block {x:.2f}x {'faster' if x >= 1 else 'slower'} with {s.get('configuration') or s['attention_backend']}"
    if block.get("verdict") == "within noise":
        text += " (within noise)"
    gb, gs = b.get("graph_block_ms"), s.get("graph_block_ms")
    if gb and gs:
        text += f"; CUDA-graph replay {gb['median'] / gs['median']:.2f}x"
    return text
