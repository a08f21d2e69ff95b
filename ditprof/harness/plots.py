"""``split.png``: stacked bars of the per-category block time, baseline vs swapped."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")  # noqa: E402 - headless, set before pyplot
import matplotlib.pyplot as plt  # noqa: E402

from ditprof.harness.categories import ALL_CATEGORIES  # noqa: E402

COLORS = {
    "attention": "#d62728",
    "communication": "#9467bd",
    "gemm": "#1f77b4",
    "norm": "#2ca02c",
    "elementwise": "#ff7f0e",
    "other": "#7f7f7f",
}


def _fmt_ms(ms: float) -> str:
    if ms >= 1000:
        return f"{ms / 1000:.2f} s"
    return f"{ms:.3g} ms"


def split_png(runs: list[dict], title: str, unit_note: str = "") -> bytes:
    """``runs``: report sections (``attention_backend``, ``split_ms``, ``attention_share``); PNG bytes."""
    labels = [f"{r['label']}\n{r['attention_backend']}" for r in runs]
    fig, ax = plt.subplots(figsize=(3.2 + 1.6 * len(runs), 4.8), dpi=110)
    bottoms = [0.0] * len(runs)
    for cat in ALL_CATEGORIES:
        vals = [r["split_ms"].get(cat, 0.0) for r in runs]
        if cat == "communication" and not any(vals):
            continue  # single-device runs: no empty legend entry
        ax.bar(labels, vals, bottom=bottoms, color=COLORS[cat], label=cat, width=0.55)
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    for i, r in enumerate(runs):
        ax.text(i, bottoms[i], f"{_fmt_ms(bottoms[i])}\nattn {r['attention_share'] * 100:.1f}%",
                ha="center", va="bottom", fontsize=8)
        clean = (r.get("block_ms") or {}).get("median")
        if clean:
            ax.plot([i - 0.34, i + 0.34], [clean, clean], color="black", linestyle="--", linewidth=1,
                    label="block time (clean timing)" if i == 0 else None)
            bottoms[i] = max(bottoms[i], clean)
    ax.set_ylabel("time per block call (ms)" + (f" — {unit_note}" if unit_note else ""))
    ax.set_title(title, fontsize=9)
    ax.set_ylim(0, max(bottoms + [1e-9]) * 1.22)
    handles, names = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], names[::-1], fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
