"""The "attention in context" rows of the terminal summary and report.md (``--attention-alone``; none without it):
per run and attention call, the time in the block, alone on the same tensors and alone right after the block's
GEMMs (medians, ms per call), the ratio in-block / alone, the SM clocks after each phase, and the run's verdict."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ditprof.harness.report.document import sections_of
from ditprof.harness.run.attention_context import GEMM_CALLS_BEFORE

HEADER = ["run", "call", "q (B, S, H, D)", "in block", "alone", "after GEMMs", "in block / alone",
          "SM clock MHz (in block / alone / after GEMMs)"]
TEXT = ("After the measured calls the block ran un-profiled forwards with a clock mark on each side of every "
        "attention call (in block); each call then ran alone on the very tensors it got (alone) and, on a GPU, "
        "alone right after the block's largest linear ran {n} times (after GEMMs). Same tensors: a gap between in "
        "block and alone is not the inputs' layout. The SM clock (NVML, pynvml) is read after each phase.")


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f} ms"


def _clock(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0f}"


def _runs(report: dict) -> list[tuple[str, dict]]:
    return [(f"{s['label']} ({s.get('configuration') or s['attention_backend']})", s["attention_context"])
            for s in sections_of(report) if s and s.get("attention_context")]


def context_rows(report: dict) -> list[list[str]]:
    """One row per attention call of each run, and a total row for a run with several calls."""
    rows = []
    for name, ctx in _runs(report):
        clocks = " / ".join(_clock(ctx["sm_clock_mhz"].get(p)) for p in ("in_block", "alone", "after_gemm"))
        for c in ctx["calls"]:
            ratio = c["in_block_ms"]["median"] / c["alone_ms"]["median"] if c["alone_ms"]["median"] > 0 else None
            rows.append([name, str(c["index"]), str(tuple(c["q_shape"])), _ms(c["in_block_ms"]["median"]),
                         _ms(c["alone_ms"]["median"]), _ms((c["after_gemm_ms"] or {}).get("median")),
                         "n/a" if ratio is None else f"{ratio:.2f}x", clocks])
        if len(ctx["calls"]) > 1:
            ratio = ctx["in_block_over_alone"]
            rows.append([name, "all", "", _ms(ctx["in_block_ms"]), _ms(ctx["alone_ms"]), _ms(ctx["after_gemm_ms"]),
                         "n/a" if ratio is None else f"{ratio:.2f}x", clocks])
    return rows


def verdicts(report: dict) -> list[str]:
    return [f"{name}: {ctx['verdict']}" for name, ctx in _runs(report)]


def print_context(report: dict, console: Console) -> None:
    rows = context_rows(report)
    if not rows:
        return
    table = Table(title="attention in context (ms per call, median)", title_justify="left")
    for i, h in enumerate(HEADER):
        table.add_column(h, justify="right" if i >= 3 else "left")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for line in verdicts(report):
        console.print(line, highlight=False, soft_wrap=True)


def context_lines(report: dict) -> list[str]:
    """report.md's "Attention in context" section."""
    rows = context_rows(report)
    if not rows:
        return []
    gemm = next((ctx["gemm"] for _, ctx in _runs(report) if ctx.get("gemm")), None)
    lines = ["## Attention in context", "", TEXT.format(n=gemm["calls_before"] if gemm else GEMM_CALLS_BEFORE)
             + (f" The linear: `{gemm['module']}` on {tuple(gemm['input_shape'])}." if gemm else ""), "",
             "| " + " | ".join(HEADER) + " |", "|---|---|---|" + "---:|" * (len(HEADER) - 3)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines + [""] + [f"- {line}" for line in verdicts(report)] + [""]


__all__ = ["context_lines", "context_rows", "print_context", "verdicts"]
