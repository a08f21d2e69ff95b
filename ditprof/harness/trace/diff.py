"""``ditprof diff RUN_A RUN_B``: what changed between two saved runs, per category and per op.

A side is a run folder (profile or compare, any machine or backend), optionally ``:baseline`` / ``:swapped``
(default: the swapped measurement of a compare, the baseline of a profile) or, for a ``compare --each-swap``, the
label of a configuration between them (``:step1``). The per-category numbers are the
reports' own split; the per-op numbers re-split each side's trace (every launching op, per block call). Where
HolisticTraceAnalysis is installed its ``TraceDiff`` adds op counts and durations from the two tb/ runs.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from ditprof.errors import DitprofError

SCHEMA = "ditprof.diff/1"
REPORT_MAJOR = "ditprof.report/"


@dataclass
class Side:
    folder: Path
    section_name: str
    report: dict

    @property
    def section(self) -> dict:
        if self.section_name in ("baseline", "swapped"):
            return self.report[self.section_name]
        return next(c for c in _middle(self.report) if c["label"] == self.section_name)

    @property
    def name(self) -> str:
        m = self.report["model"]
        return f"{self.folder.name}:{self.section_name} ({m.get('preset') or m.get('checkpoint')}, " \
               f"{self.section['attention_backend']}, {self.report['environment'].get('gpu') or 'CPU'})"


def _middle(report: dict) -> list[dict]:
    """The configurations measured between the baseline and the swapped run (``compare --each-swap``)."""
    return (report.get("configurations") or [])[1:-1]


def open_side(spec: str) -> Side:
    """``DIR`` or ``DIR:baseline`` / ``DIR:swapped``; one line when it is not a ditprof run."""
    path, _, which = spec.partition(":") if not Path(spec).exists() else (spec, "", "")
    folder = Path(path).expanduser()
    rep_file = folder / "report.json"
    if not folder.is_dir() or not rep_file.is_file():
        raise DitprofError(f"{spec} is not a ditprof run folder (no report.json in it)")
    try:
        report = json.loads(rep_file.read_text())
    except (OSError, ValueError) as exc:
        raise DitprofError(f"{rep_file} is not readable JSON ({exc})") from None
    schema = report.get("schema") if isinstance(report, dict) else None
    if not isinstance(schema, str) or not schema.startswith(REPORT_MAJOR):
        raise DitprofError(f"{rep_file} is not a ditprof profile/compare report (schema {schema!r}; "
                           f"validate and accuracy-table runs cannot be diffed)")
    steps = [c["label"] for c in _middle(report)]
    if which not in ("", "baseline", "swapped", *steps):
        more = f" or a configuration of this run ({', '.join(steps)})" if steps else ""
        raise DitprofError(f"{spec}: the part after ':' must be baseline or swapped{more}, got {which!r}")
    which = which or ("swapped" if report.get("swapped") else "baseline")
    if which not in steps and not report.get(which):
        raise DitprofError(f"{spec}: this run has no {which} measurement")
    return Side(folder, which, report)


def _ops(side: Side) -> dict[tuple[str, str], float]:
    """Every launching op of the side's trace, ms per block call (re-split with ditprof's own categories)."""
    from ditprof.harness.trace.categories import split_trace

    trace_file = side.folder / side.section["trace"]
    if not trace_file.is_file():
        return {(r["op"], r["category"]): r["ms"] for r in side.section["top_ops"]}  # the report's top ops only
    with gzip.open(trace_file, "rt") as f:
        split = split_trace(json.load(f), mode=side.section["split_mode"])
    return {(r["op"], r["category"]): r["ms"] for r in split.op_ms}


def _hta_diff(a: Side, b: Side, top: int) -> list[dict] | str:
    """HTA's TraceDiff of the two tb runs (op counts and total durations), or why it does not apply."""
    try:
        from hta.trace_diff import TraceDiff
    except ImportError:
        return "HolisticTraceAnalysis is not installed (pip install -e '.[dev]')"
    dirs = [s.folder / Path(s.section["tb_trace"]).parent for s in (a, b)]
    if not all(d.is_dir() for d in dirs):
        return "a side has no tb/ run folder"
    import contextlib
    import io
    import logging

    logging.getLogger("hta").setLevel(logging.ERROR)
    with contextlib.redirect_stdout(io.StringIO()):
        df = TraceDiff.compare_traces(str(dirs[0]), str(dirs[1]))
    df = df.reindex(df["diff_duration"].abs().sort_values(ascending=False).index).head(top)
    return [{"name": str(n), "control_counts": float(r["Control_counts"]), "test_counts": float(r["Test_counts"]),
             "control_total_us": float(r["Control_total_duration"]), "test_total_us": float(r["Test_total_duration"]),
             "diff_us": float(r["diff_duration"])} for n, r in df.iterrows()]


def diff(a: Side, b: Side, top: int = 15) -> dict:
    sa, sb = a.section, b.section
    cats = [c for c in sa["split_ms"] if c in sb["split_ms"]] + \
        [c for c in sb["split_ms"] if c not in sa["split_ms"]]
    categories = [{"category": c, "a_ms": sa["split_ms"].get(c, 0.0), "b_ms": sb["split_ms"].get(c, 0.0)}
                  for c in cats]
    for row in categories:
        row["delta_ms"] = row["b_ms"] - row["a_ms"]
    oa, ob = _ops(a), _ops(b)
    ops = [{"op": op, "category": cat, "a_ms": oa.get((op, cat), 0.0), "b_ms": ob.get((op, cat), 0.0)}
           for op, cat in set(oa) | set(ob)]
    for row in ops:
        row["delta_ms"] = row["b_ms"] - row["a_ms"]
    ops.sort(key=lambda r: -abs(r["delta_ms"]))
    from ditprof.harness.run import noise

    emulated = any(noise.section_numerics_only(s) for s in (sa, sb))
    verdict = noise.change(sa.get("samples_ms"), sb.get("samples_ms"), numerics_only=emulated)
    if verdict and verdict["verdict"] in ("faster", "slower"):
        verdict["verdict"] = f"B {verdict['verdict']}"
    notes = []
    ma, mb = a.report["model"], b.report["model"]
    for key in ("family", "kind", "tokens", "heads", "head_dim", "dtype", "batch"):
        if ma.get(key) != mb.get(key):
            notes.append(f"{key} differs: {ma.get(key)} vs {mb.get(key)}")
    ea, eb = a.report["environment"], b.report["environment"]
    for key in ("gpu", "torch", "cuda", "cudnn", "diffusers"):
        if ea.get(key) != eb.get(key):
            notes.append(f"{key}: {ea.get(key)} vs {eb.get(key)}")
    if sa["split_mode"] != sb["split_mode"]:
        notes.append(f"the splits measure different things: {sa['split_mode']} vs {sb['split_mode']} time")
    return {
        "schema": SCHEMA, "created": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "a": {"folder": str(a.folder), "section": a.section_name, "name": a.name},
        "b": {"folder": str(b.folder), "section": b.section_name, "name": b.name},
        "block_ms": {"a": sa["block_ms"], "b": sb["block_ms"],
                     "ratio_a_over_b": sa["block_ms"]["median"] / sb["block_ms"]["median"], "verdict": verdict},
        "attention_share": {"a": sa["attention_share"], "b": sb["attention_share"]},
        "categories": categories, "ops": ops[:top], "ops_compared": len(ops),
        "hta_trace_diff": _hta_diff(a, b, top), "notes": notes,
    }


def _ms(x: float) -> str:
    return f"{x:+.3f}" if abs(x) < 10 else f"{x:+.1f}"


def markdown(d: dict) -> str:
    v = d["block_ms"]["verdict"]
    lines = [f"# ditprof diff", "", f"A: {d['a']['name']}  ", f"B: {d['b']['name']}", "",
             f"Block median {d['block_ms']['a']['median']:.3f} ms → {d['block_ms']['b']['median']:.3f} ms "
             f"(A/B {d['block_ms']['ratio_a_over_b']:.2f}x" + (f", {v['verdict']}" if v else "") + ")", "",
             "| category | A ms | B ms | B − A ms |", "|---|---:|---:|---:|"]
    lines += [f"| {r['category']} | {r['a_ms']:.3f} | {r['b_ms']:.3f} | {_ms(r['delta_ms'])} |"
              for r in d["categories"]]
    lines += ["", f"Ops with the largest change (of {d['ops_compared']}, ms per block call):", "",
              "| op | category | A ms | B ms | B − A ms |", "|---|---|---:|---:|---:|"]
    lines += [f"| `{r['op']}` | {r['category']} | {r['a_ms']:.4f} | {r['b_ms']:.4f} | {_ms(r['delta_ms'])} |"
              for r in d["ops"]]
    if d["notes"]:
        lines += ["", "Differences between the two runs: " + "; ".join(d["notes"]) + "."]
    if isinstance(d["hta_trace_diff"], str):
        lines += ["", f"HTA TraceDiff: not run ({d['hta_trace_diff']})."]
    return "\n".join(lines) + "\n"


TABLE_OPS = 8  # op rows of the terminal table (diff.md lists the --top ones)


def terminal_table(d: dict, ops: int = TABLE_OPS):
    """The terminal table: the block, each category, then the ops that changed most -- each op with its category,
    as diff.md has it (one op name can count in two categories, e.g. an aten::copy_ inside attention)."""
    from rich.table import Table

    v = d["block_ms"]["verdict"]
    table = Table(title=f"ditprof diff  A: {d['a']['name']}\n              B: {d['b']['name']}",
                  title_justify="left")
    for col in ("row", "category", "A ms", "B ms", "B − A ms"):
        table.add_column(col, justify="left" if col in ("row", "category") else "right")
    a_med, b_med = d["block_ms"]["a"]["median"], d["block_ms"]["b"]["median"]
    table.add_row("block (median)", "", f"{a_med:.3f}", f"{b_med:.3f}",
                  f"{b_med - a_med:+.3f}" + (f" ({v['verdict']})" if v else ""))
    for r in d["categories"]:
        table.add_row("category total", r["category"], f"{r['a_ms']:.3f}", f"{r['b_ms']:.3f}",
                      f"{r['delta_ms']:+.3f}")
    for r in d["ops"][:ops]:
        table.add_row(f"  {r['op'][:60]}", r["category"], f"{r['a_ms']:.4f}", f"{r['b_ms']:.4f}",
                      f"{r['delta_ms']:+.4f}")
    return table


def png(d: dict) -> bytes:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ditprof.harness.report.plots import COLORS

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.6), dpi=110, gridspec_kw={"width_ratios": [1, 1.4]})
    for i, side in enumerate(("a", "b")):
        bottom = 0.0
        for r in d["categories"]:
            ax.bar(i, r[f"{side}_ms"], bottom=bottom, color=COLORS.get(r["category"], "#999"), width=0.55,
                   label=r["category"] if i == 0 else None)
            bottom += r[f"{side}_ms"]
    ax.set_xticks([0, 1], ["A", "B"])
    ax.set_ylabel("ms per block call")
    ax.set_title(f"A/B {d['block_ms']['ratio_a_over_b']:.2f}x"
                 + (f" ({d['block_ms']['verdict']['verdict']})" if d["block_ms"]["verdict"] else ""))
    ax.legend(fontsize=8)
    ops = d["ops"][:10][::-1]
    bx.barh(range(len(ops)), [r["delta_ms"] for r in ops],
            color=[COLORS.get(r["category"], "#999") for r in ops])
    bx.set_yticks(range(len(ops)), [r["op"][:40] for r in ops], fontsize=7)
    bx.axvline(0, color="k", lw=0.8)
    bx.set_xlabel("B − A, ms per block call")
    bx.set_title("largest per-op changes")
    fig.suptitle(f"A: {d['a']['name']}\nB: {d['b']['name']}", fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
