"""A report's summary: the rows shared by the rich table on stdout and report.md, and report.md itself."""

from __future__ import annotations

import math
from typing import Callable, Sequence

from rich.console import Console
from rich.table import Table

from ditprof.harness.report.context_lines import context_lines, print_context
from ditprof.harness.report.document import configurations_of, sections_of
from ditprof.harness.run.memory import fmt_bytes
from ditprof.harness.trace.categories import REPORTED_CATEGORIES


# --------------------------------------------------------------------------- formatting helpers

def _ms(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if x >= 1000:
        return f"{x / 1000:.3f} s"
    if x >= 10:
        return f"{x:.1f} ms"
    return f"{x:.3f} ms"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:.1f}%"


def _x(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def _band(ms: dict) -> str:
    return f"{_ms(ms['median'])} [{_ms(ms['min'])} – {_ms(ms['max'])}]"


def execution_of(section: dict) -> str:
    """``eager`` or ``compile:<mode>`` of one measurement."""
    c = section.get("compile")
    return f"compile:{c['mode']}" if c else "eager"


def backend_cell(report: dict, sec: dict) -> str:
    """A run's attention backend, for FP8 backends with the Q/K format (the section's ``qk_format``, which the
    attention swap records from ``Backend.qk_format``) and the kernel's grid(s) of the run."""
    name = sec["attention_backend"]
    fmt = sec.get("qk_format")
    grids = sorted({la["grid"] for la in sec.get("fp8_launches") or []})
    grid = f", {' + '.join(grids)} grid" if grids else ""
    return f"{name} (Q/K {fmt}{grid})" if fmt else name


def linears_cell(sec: dict | None) -> str:
    """A run's linears: ``bf16``, or the FP8 granularity with how many (and what share of the weights) run in FP8."""
    lin = (sec or {}).get("linears")
    if not lin:
        return "bf16" if sec else ""
    n, total = len(lin["swapped"]), len(lin["swapped"]) + len(lin["kept"])
    return (f"fp8 {lin['granularity']}{' (emulated)' if lin['numerics_only'] else ''}: {n} of {total} "
            f"({lin['swapped_weight_share']:.0%} of linear weights)")


def linears_lines(report: dict) -> list[str]:
    """report.md's FP8 linears section: how they ran, which are in FP8, which stayed bf16 and why (none without)."""
    out = []
    for sec in sections_of(report):
        lin = (sec or {}).get("linears")
        if not lin:
            continue
        out += [f"## FP8 linears — {sec['label']}", "", f"{lin['path']}; {lin['granularity']} scales; {lin.get('execution', 'as the block runs')}.", "",
                f"- in FP8 ({len(lin['swapped'])}): " + (", ".join(f"`{n}`" for n in lin["swapped"]) or "none")]
        out += [f"- kept bf16: `{n}` — {why}" for n, why in lin["kept"].items()]
        out.append("")
    return out


def fp8_launch_lines(report: dict) -> list[str]:
    """report.md's table of our FP8 kernel's call configurations per run (none without ``fp8_launches``)."""
    launches = [(sec["label"], la) for sec in sections_of(report) if sec
                for la in sec.get("fp8_launches") or []]
    if not launches:
        return []
    lines = ["## FP8 kernel launches", "", "One row per call configuration of our kernel during the timed and "
             "profiled calls (`kernels.launch_record`): the stream-K grid spreads the last, partial round of work "
             "tiles over all SMs (n_full whole tiles, then n_tail tiles' key tiles over the tail CTAs); a call whose "
             "arguments repeat an earlier one's replays its launches as one CUDA graph (graph replays).", "",
             "| run | q (B, S, H, D) | keys | kernel | Q/K | grid | launch | calls |",
             "|---|---|---:|---|---|---|---|---:|"]
    for label, la in launches:
        sk = la.get("streamk")
        grid = (f"stream-K ({sk['n_full']} whole + {sk['n_tail']} spread over {sk['tail_ctas']} CTAs)"
                if sk else la["grid"])
        qk = (la["qk_format"] or "none") + (", Q quantized in the kernel" if la.get("q_in_kernel") else "")
        replays = la.get("graph_replays")
        how = la["launch"] + (f", {replays} graph replays" if replays else "")
        lines.append(f"| {label} | {tuple(la['q_shape'])} | {la['k_len']} | {la['kernel']} | {qk} "
                     f"| {grid} | {how} | {la['calls']} |")
    fallbacks = fallback_lines(report)
    return lines + [""] + (fallbacks + [""] if fallbacks else [])


def fallback_lines(report: dict) -> list[str]:
    """One line per FP8 call configuration that runs a fallback after fp8-sm120's self-check failed on this GPU
    (``kernels.self_check``; none where every build passed)."""
    return [f"- fallback ({sec['label']}, q {tuple(la['q_shape'])}): {la['fallback']}"
            for sec in sections_of(report) if sec for la in sec.get("fp8_launches") or [] if la.get("fallback")]


INTERLEAVED_NOTE = ("- The baseline's and the swap's measurements run one after the other, so a host or clock that "
                    "drifts between them moves the block ratio (small blocks, where the host sets the eager time, "
                    "most). The \"in turns\" row times eager calls of both after that, alternating every few calls "
                    "(`--interleave` rounds): its ratio, the median of the rounds' ratios, is the one drift cannot "
                    "bias; \"within noise\" when the rounds' ratios straddle 1.")


# One value per configuration, each after the first followed by its change against the configuration before it:
# (metric, value 1, value 2, change 2 vs 1, value 3, change 3 vs 2, ...). A compare of two: (metric, baseline,
# swapped, change); a profile: (metric, value).
Row = tuple[str, ...]

EACH_SWAP_NOTE = ("- Configurations (`--each-swap`): each adds one swap to the one before it, measured one after the "
                  "other on the same block; a change column is the previous configuration's time over this one's "
                  "(above 1: faster) with that pair's noise verdict; the output's rel-RMS / cosine is each "
                  "configuration's against the baseline; the rounds in turns and Amdahl's prediction compare the "
                  "baseline with the last configuration.")


def row(metric: str, values: Sequence[str], changes: Sequence[str] = ()) -> Row:
    """A summary row: ``changes[i]`` is ``values[i + 1]``'s change against ``values[i]`` (none given: empty)."""
    changes = list(changes) or [""] * (len(values) - 1)
    cells = [metric, values[0]]
    for value, change in zip(values[1:], changes):
        cells += [value, change]
    return tuple(cells)


def _ends(metric: str, n: int, first: str, last: str, change: str) -> Row:
    """A row of the baseline and the last configuration alone (the rounds in turns, Amdahl): the middle empty."""
    if n == 1:
        return (metric, first)
    return row(metric, [first] + [""] * (n - 2) + [last], [""] * (n - 2) + [change])


def _judged(s: dict | None, fb, fs, verdict) -> str:
    """The ratio with the verdict of the noise check: a numerics emulation's time is no speed result."""
    if not (s and fs) or fb is None:
        return ""
    if verdict and verdict["verdict"] == "numerics only":
        return "numerics only"
    return f"{fb / fs:.2f}x" + (" (within noise)" if verdict and verdict["verdict"] == "within noise" else "")


def _changes(runs: list[dict], value: Callable[[dict], float | None], kind: str = "block") -> list[str]:
    """Each configuration's change against the one before it: the ratio of ``value`` (previous / this) with the
    pair's noise verdict (``kind``: block or graph samples, from ``change_vs_previous``)."""
    return [_judged(cur, value(prev), value(cur), (cur.get("change_vs_previous") or {}).get(kind))
            for prev, cur in zip(runs, runs[1:])]


def _overhead(sec: dict) -> str:
    o = sec["profiler_overhead_pct"]
    return f"{o:+.1f}%" + (" (noise)" if o < 0 else "")


def _block_rows(report: dict, runs: list[dict]) -> list[Row]:
    """Backend, execution, the block's time (and in turns), under the profiler and the profiler's overhead."""
    clock = "CUDA events" if runs[0]["timing_source"] == "cuda_events" else "host clock"
    rows = [
        row("attention backend", [backend_cell(report, r) for r in runs]),
        *([row("linears", [linears_cell(r) for r in runs])] if any(r.get("linears") for r in runs) else []),
        row("execution", [execution_of(r) for r in runs]),
        row(f"block ({clock}) median [min–max]", [_band(r["block_ms"]) for r in runs],
            _changes(runs, lambda r: r["block_ms"]["median"])),
    ]
    inter = report.get("interleaved")
    if inter:
        # the phases run one after the other: host or clock drift between them lands in the ratio above; in turns
        # it hits both alike (the baseline and the last configuration)
        rows.append(_ends(f"block, baseline and swap in turns ({inter['rounds']} rounds) median [min–max]",
                          len(runs), _band(inter["baseline_ms"]), _band(inter["swapped_ms"]),
                          f"{inter['ratio']:.2f}x" + (" (within noise)" if inter["verdict"] == "within noise"
                                                      else "")))
    rows += [row("block under profiler (median)", [_ms(r["profiled_block_ms"]) for r in runs]),
             row("profiler overhead", [_overhead(r) for r in runs])]
    return rows


def _compile_cell(sec: dict) -> str:
    c = sec.get("compile")
    return f"{c['first_call_s']:.2f} s, {c['recompiles']} recompile(s)" if c else ""


def _compile_rows(report: dict, runs: list[dict]) -> list[Row]:
    if not any(r.get("compile") for r in runs):
        return []
    return [row("compile: first call (tracing + codegen), recompiles", [_compile_cell(r) for r in runs])]


def _graph_cell(sec: dict, g: dict | None) -> str:
    return _band(g) if g else "n/a (" + sec.get("graph_note", "") + ")"


def _host_cell(sec: dict, g: dict | None) -> str:
    if not g:
        return ""
    d = sec["block_ms"]["median"] - g["median"]
    # a GPU-bound block: replays and eager calls differ only by run-to-run (clock) noise, either sign
    return _ms(d) + (" (≤ 0: GPU-bound, noise)" if d <= 0 else "")


def _graph_rows(report: dict, runs: list[dict]) -> list[Row]:
    graphs = [r.get("graph_block_ms") for r in runs]
    if not any(graphs):
        return []
    return [row("block (CUDA graph replay) median [min–max]", [_graph_cell(r, g) for r, g in zip(runs, graphs)],
                _changes(runs, lambda r: (r.get("graph_block_ms") or {}).get("median"), "graph")),
            row("host overhead per call (eager − replay)", [_host_cell(r, g) for r, g in zip(runs, graphs)])]


def _rank_cell(r: dict) -> str:
    return f"{_ms(r['block_ms']['median'])} (comm {_ms(r['split_ms'].get('communication', 0.0))})"


def _sp_rows(report: dict, runs: list[dict]) -> list[Row]:
    """Sequence parallel runs: the slowest rank, the max over ranks and each rank's block time."""
    sp = report.get("sp")
    if not sp:
        return []
    rows = [row(f"sequence parallel: Ulysses over {sp['degree']} ranks ({sp['process_group_backend']})",
                [f"slowest: rank {r['rank']}" for r in runs]),
            row("block, max over ranks per call: median [min–max]",
                [_band(r["block_ms_max_over_ranks"]) for r in runs])]
    for i, rb in enumerate(runs[0]["ranks"]):
        rows.append(row(f"rank {rb['rank']}: block median (communication)", [_rank_cell(r["ranks"][i]) for r in runs]))
    return rows


def _split_rows(report: dict, runs: list[dict]) -> list[Row]:
    """Per-category op time, its total, the attention share and peak memory."""
    kind = "GPU kernel time" if runs[0]["split_mode"] == "cuda" else "CPU op self time"
    rows = []
    for cat in REPORTED_CATEGORIES:
        if all(r["split_ms"].get(cat) is None for r in runs):
            continue  # communication: only where there is some (--sp runs); fused: compiled runs only

        def value(r: dict, cat: str = cat) -> float:
            return r["split_ms"].get(cat) or 0.0

        rows.append(row(f"{cat} ({kind})", [_ms(value(r)) for r in runs], _changes(runs, value)))
    rows.append(row(f"split total ({kind})", [_ms(r["split_total_ms"]) for r in runs],
                    _changes(runs, lambda r: r["split_total_ms"])))
    rows.append(row("attention share", [_pct(r["attention_share"]) for r in runs]))
    rows.append(row("peak memory", [fmt_bytes(r["peak_memory_bytes"]) for r in runs]))
    return rows


def _accuracy_cell(acc: dict | None) -> str:
    return f"{acc['block_output_rel_rms']:.2e} / {acc['block_output_cosine']:.5f}" if acc else ""


def _check_rows(report: dict, runs: list[dict]) -> list[Row]:
    """The gathered SP output's check and each configuration's output vs the baseline's."""
    sp = report.get("sp")
    rows = []
    if sp:
        def chk(label):
            c = sp["check"].get(label)
            return f"{c['block_output_rel_rms']:.2e} " + ("ok" if c["passed"] else "FAILED") if c else ""

        tol = next(iter(sp["check"].values()))["tolerance"] if sp["check"] else float("nan")
        rows.append(row(f"gathered SP output vs single device: rel-RMS (tol {tol:.0e})",
                        [chk(r["label"]) for r in runs]))
    if any(r.get("accuracy") for r in runs):
        rows.append(row("output vs baseline: rel-RMS / cosine", [_accuracy_cell(r.get("accuracy")) for r in runs]))
    return rows


def _model_change(prev: dict, cur: dict) -> str:
    """The whole model's time against the previous configuration's (numerics only: no ratio)."""
    if not (cur.get("model_band_ms") and prev.get("model_band_ms")):
        return ""
    change = cur.get("change_vs_previous") or {}
    if change.get("speedup_note") or (cur.get("extrapolation") or {}).get("speedup_note"):
        return "numerics only"  # the ratios are None: a numerics emulation's time is no speed result
    return _judged(cur, prev["model_band_ms"]["median"], cur["model_band_ms"]["median"], change.get("block"))


def _model_rows(report: dict, runs: list[dict]) -> list[Row]:
    """The whole model's time per configuration, the noise warning and Amdahl's prediction (baseline vs last)."""
    ex, nz, n = report["extrapolation"], report.get("noise") or {}, len(runs)
    scope = f"{ex['n_blocks']} blocks" + (f" × {ex['steps']} steps" if ex["steps"] > 1 else "") + \
        (" × 2 CFG" if ex["cfg"] else "")
    rows = [row(f"model time ({scope})", [_band(r["model_band_ms"]) if r.get("model_band_ms") else "" for r in runs],
                [_model_change(p, c) for p, c in zip(runs, runs[1:])])]
    if nz.get("warning"):
        rows.append(row("timing noise", [nz["warning"]] + [""] * (n - 1)))
    if ex.get("amdahl_predicted_speedup") and not nz.get("numerics_only"):
        rows.append(_ends(f"Amdahl: share {_pct(runs[0]['attention_share'])} × attention "
                          f"{ex['attention_speedup']:.2f}x", n, "",
                          _ms(ex["amdahl_predicted_swapped_block_ms"]) + " / block predicted",
                          _x(ex["amdahl_predicted_speedup"]) + " predicted"))
        rows.append(_ends("measured swapped block", n, "", _ms(ex["measured_swapped_block_ms"]), _x(ex["speedup"])))
    return rows


def summary_rows(report: dict) -> list[Row]:
    """The rows (``Row``: one value per configuration, each later one with its change) shared by the rich table
    and report.md."""
    runs = configurations_of(report)
    return [r for part in (_block_rows, _compile_rows, _graph_rows, _sp_rows, _split_rows, _check_rows, _model_rows)
            for r in part(report, runs)]


def column_names(runs: list[dict], single: str = "measured") -> list[str]:
    """The value and change columns' headers of ``Row``: a profile's one value (``single``); a compare's baseline,
    swapped, change; more configurations (``--each-swap``): each by label and configuration, each change against
    the one before it."""
    if len(runs) == 1:
        return [single]
    if len(runs) == 2:
        return ["baseline", "swapped", "change"]
    names = [f"{runs[0]['label']} ({runs[0].get('configuration') or runs[0]['attention_backend']})"]
    for prev, cur in zip(runs, runs[1:]):
        names += [f"{cur['label']} ({cur.get('configuration') or cur['attention_backend']})",
                  f"change vs {prev['label']}"]
    return names


LIMIT_CATEGORIES = ("attention", "gemm", "norm", "elementwise")
LIMIT_HEADER = ("run", "category", "rate", "compared with", "% of peak")


def _rate(x: float | None, unit: str) -> str:
    if x is None:
        return "n/a"
    if unit == "TFLOP/s" and x < 1:  # CPU rates: GFLOP/s read better than 0.00147 TFLOP/s
        return f"{x * 1e3:.3g} GFLOP/s"
    return f"{x:.3g} {unit}"


def _peak_cell(e: dict) -> str:
    if e["peak"] is None:
        return "n/a"
    if e["peak_kind"] == "measured":
        what = "measured matmul rate" if e["work_unit"] == "FLOP" else "measured copy rate"
    else:
        what = f"{e['precision'].upper()} peak" if e["precision"] else "memory peak"
    return f"{what} {_rate(e['peak'], e['unit'])}"


def _share_cell(e: dict) -> str:
    if e["share_of_peak"] is not None:
        # a measured rate is the plan's probe, not a ceiling: a category can beat it (a CPU's attention kernel
        # against its small matmul probe), which the cell says rather than passing for a share of a peak
        above = e["peak_kind"] == "measured" and e["share_of_peak"] > 1
        return _pct(e["share_of_peak"]) + (" (above the measured rate)" if above else "")
    why = e["note"].split(":")[0] if e["note"] else "no rate"
    return f"n/a ({why})"


def limit_rows(report: dict) -> list[tuple[str, str, str, str, str]]:
    """(run, category, rate, compared with, % of peak) per run and category with ``limits`` (none without)."""
    rows = []
    for sec in sections_of(report):
        for cat in LIMIT_CATEGORIES if sec and sec.get("limits") else ():
            e = sec["limits"].get(cat)
            if e:
                rows.append((sec["label"], cat + (f" ({e['precision']})" if e["precision"] else ""),
                             _rate(e["rate"], e["unit"]), _peak_cell(e), _share_cell(e)))
    return rows


def limits_note(report: dict) -> str:
    """Where the peaks come from (the device's datasheet entry or the plan's measured rates), for under the table."""
    from ditprof.harness.report.limits import peaks_for

    kinds = {e["peak_kind"] for sec in sections_of(report) if sec
             for e in (sec.get("limits") or {}).values()}
    peaks = peaks_for((report.get("environment") or {}).get("gpu"))
    if peaks is None or "datasheet" not in kinds:
        return "no datasheet peaks for this device: shares are of the plan's measured matmul and copy rates"
    return (f"peaks: {peaks.name}, dense, from the {peaks.source}"
            + ("; where it states none, the plan's measured rates" if "measured" in kinds else ""))


def model_line(report: dict) -> str:
    m = report["model"]
    tok = f"{m['tokens']} tokens" + (f" + {m['text_tokens']} text" if m.get("text_tokens") else "")
    if m.get("layout"):  # one sequence of several modalities: say how it splits
        tok = m["layout"]
    return (f"{m.get('preset') or m.get('checkpoint')} · {m['family']} block {m['block_index']}/{m['n_blocks']} "
            f"({m.get('kind') or 'main'}) · {m['heads']}×{m['head_dim']} heads · {tok} · "
            f"{m['block_params'] / 1e6:.1f} M params ({fmt_bytes(m['block_bytes'])}) · {m.get('dtype')}")


def env_line(report: dict) -> str:
    e = report["environment"]
    where = e.get("gpu") or f"CPU ({e.get('cpu')}, {e.get('torch_threads')} threads)"
    return (f"torch {e['torch']} · CUDA {e.get('cuda') or '-'} · cuDNN {e.get('cudnn') or '-'} · {where} · "
            f"cutlass-dsl {e.get('nvidia_cutlass_dsl') or '-'}")


def print_summary(report: dict, out_dir: str, console: Console | None = None) -> None:
    console = console or Console()
    if not console.is_terminal and console.width < 120:
        console = Console(width=120)
    title = "ditprof compare" if report["swapped"] else "ditprof profile"
    table = Table(title=f"{title}: {model_line(report)}", caption=env_line(report), title_justify="left",
                  caption_justify="left")
    table.add_column("metric")
    for name in column_names(sections_of(report)):
        table.add_column(name, justify="right")
    for cells in summary_rows(report):
        table.add_row(*cells)
    console.print(table)
    top = Table(title="heaviest ops (per block call)", title_justify="left")
    top.add_column("run")
    top.add_column("op")
    top.add_column("category")
    top.add_column("time", justify="right")
    for sec in sections_of(report):
        if sec:
            for row in sec["top_ops"][:5]:
                top.add_row(sec["label"], row["op"], row["category"], _ms(row["ms"]))
    console.print(top)
    rows = limit_rows(report)
    if rows:
        lim = Table(title="how close to the limit (per block call)", caption=limits_note(report), title_justify="left",
                    caption_justify="left")
        for i, name in enumerate(LIMIT_HEADER):
            lim.add_column(name, justify="right" if i >= 2 else "left")
        for row in rows:
            lim.add_row(*row)
        console.print(lim)
    print_context(report, console)
    if report.get("swap_skipped"):
        console.print(f"swap not run: {report['swap_skipped']}")
    for sec in sections_of(report):
        lin = (sec or {}).get("linears")
        if lin and lin["kept"]:
            none = "no linear of this block runs in FP8; " if not lin["swapped"] else ""
            console.print(f"{none}linears kept bf16 ({sec['label']}): "
                          + "; ".join(f"{n} ({why})" for n, why in lin["kept"].items()),
                          highlight=False, soft_wrap=True)
    for line in fallback_lines(report):
        console.print(line[2:], highlight=False, soft_wrap=True)
    console.print(f"outputs: {out_dir}")


COMPILED_NOTE = (
    "- Compiled (`--compile`, torch.compile fullgraph): the compile line is the first call's wall time (tracing, "
    "code generation, kernel compiles; the inductor cache can shorten it) and the graphs compiled after it; "
    "warm-up ran until a call compiled nothing. Inside the compiled graph the attention is found by its op "
    "(SDPA, `ditprof::fp8_attention`, `ditprof_compile::opaque_attention`), an inductor kernel by the aten ops it "
    "is named after: one category, that category; several (a norm with its modulation, a GEMM epilogue), "
    "`fused`. The compiled runtime's host time (guards, wrappers) is in the block time, not in the split.")


LIMITS_TEXT = ("Attention and GEMM: the plan's FLOPs per block call over the category's time in the split; norm "
               "and elementwise: the bytes their ops read and write (from the profiled calls' recorded shapes, the "
               "output estimated from the inputs) over their time. The share is of the device's dense datasheet "
               "peak in the format the category ran in (an FP8 attention swap and FP8 linears: the FP8 peak), or, "
               "for a device not in the table, of the plan's measured matmul / copy rate. A numerics emulation's "
               "time is no speed: no share.")


def limit_lines(report: dict) -> list[str]:
    """report.md's "How close to the limit" table (none without ``limits``)."""
    rows = limit_rows(report)
    if not rows:
        return []
    lines = ["## How close to the limit", "", LIMITS_TEXT, "", limits_note(report)[:1].upper() + limits_note(report)[1:] + ".", "",
             "| " + " | ".join(LIMIT_HEADER) + " |", "|---|---|---:|---:|---:|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return lines + [""]


def markdown(report: dict) -> str:
    m, st = report["model"], report["settings"]
    lines = [f"# ditprof {report['command']} — {m.get('preset') or m.get('checkpoint')}", "",
             f"Created {report['created']}.", "",
             f"**Model:** {model_line(report)}", "",
             f"**Environment:** {env_line(report)}", "",
             f"**Settings:** device {st['device']}, warm-up {st['warmup']}, {st['iters']} timed and "
             f"{st['iters']} profiled iterations, seed {st['seed']}, {st.get('execution', 'eager')}"
             + (f", GPU memory budget {fmt_bytes(st['gpu_memory_budget_bytes'])}"
                if st.get("gpu_memory_budget_bytes") else "") + ".", ""]
    names = ["metric", *column_names(sections_of(report), single="value")]
    lines += ["## Summary", "", "| " + " | ".join(names) + " |", "|---|" + "---:|" * (len(names) - 1)]
    for metric, *values in summary_rows(report):
        lines.append("| " + " | ".join(x.replace("|", "\\|") for x in [metric.strip(), *values]) + " |")
    if report.get("swap_skipped"):
        lines += ["", f"**Swap not run:** {report['swap_skipped']}."]
    elif report["model"].get("attention_mask"):
        lines += ["", f"**Attention mask:** {report['model']['attention_mask']}."]
    b = report["baseline"]
    lines += ["", "## How to read this", "",
              "- Block time comes from " + ("CUDA events" if b["timing_source"] == "cuda_events" else
                                            "the host clock") +
              " around the block call, outside the profiler; the profiled time is the same call under "
              "torch.profiler, and the difference is the profiler overhead.",
              "- On a GPU the block is also captured once into a CUDA graph and replayed (CUDA events around each "
              "replay): no Python, dispatcher or launch cost, what a served model with CUDA graphs sees. Eager "
              "minus replay is the host overhead per call; when it is large (small blocks) the eager block time "
              "measures the host, and the replay line is the one that shows what the attention swap buys. "
              "The replay's output is checked against the eager output.",
              *([INTERLEAVED_NOTE] if report.get("interleaved") else []),
              *([EACH_SWAP_NOTE] if len(sections_of(report)) > 2 else []),
              "- The split assigns " + ("every GPU kernel to the op that launched it" if b["split_mode"] == "cuda"
                                        else "each aten op's self time on the host") +
              "; everything inside the `ditprof::attention` range (the attention call, for baseline and swap "
              "alike) is attention. The split total can differ from the block time (gaps, launch overhead). "
              "It averages the profiled calls, leaving out any call slower than 1.5x the median call "
              f"(baseline: {b['split_iterations_used']} of {b['split_iterations']} used).",
              *([COMPILED_NOTE] if b.get("compile") else []),
              "- Extrapolation multiplies the block time by the number of blocks"
              " (× steps × 2 with CFG); the Amdahl prediction uses the baseline attention share and the "
              "attention-only speedup.", ""]
    sp = report.get("sp")
    if sp:
        lines[-1:] = [
            f"- Sequence parallel (Ulysses, {sp['degree']} ranks, {sp['process_group_backend']}): each rank runs "
            f"the block on {sp['tokens_per_rank']} tokens; self-attention regroups q/k/v to all tokens × "
            f"{sp['heads_per_rank']} heads with an all-to-all and back; cross-attention: "
            f"{sp['cross_attention_note']}. `communication` is the all-to-alls (collective, layout copies and "
            "waiting for peers). The columns show the slowest rank (largest median block time), which the "
            "extrapolation uses; every rank's numbers are under `ranks` in report.json, one trace per rank "
            "(`rank<r>.<run>.trace.json.gz`), and `tb/baseline/`, `tb/swapped/` are one HTA job each.", ""]
    lines += [
              "## Files", ""]
    lines += [f"- `{f}`" for f in report["files"]]
    lines += ["", "Open the `.trace.json.gz` files in https://ui.perfetto.dev or chrome://tracing; point "
              "TensorBoard (torch-tb-profiler: `tensorboard --logdir tb`, one run per measurement) at `tb/`, and "
              "HolisticTraceAnalysis at one run's folder (`TraceAnalysis(trace_dir=\"tb/baseline\")`; an `--sp` "
              "run's folder holds one trace per rank).", ""]
    lines += linears_lines(report)
    lines += fp8_launch_lines(report)
    lines += limit_lines(report)
    lines += context_lines(report)
    for sec in sections_of(report):
        if not sec:
            continue
        lines += [f"## Heaviest ops — {sec['label']} ({sec.get('configuration') or sec['attention_backend']})", "", "| op | category | ms |",
                  "|---|---|---:|"]
        lines += [f"| `{r['op']}` | {r['category']} | {r['ms']:.4f} |" for r in sec["top_ops"]]
        lines.append("")
    return "\n".join(lines)
