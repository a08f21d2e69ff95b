"""``validate``'s outputs: the summary table, validate.md and validate.json."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ditprof.harness.run import atomic
from ditprof.harness.run.memory import fmt_bytes

SCHEMA = "ditprof.validate/1"


def _ms(x: float) -> str:
    return f"{x:,.1f} ms" if x >= 100 else f"{x:,.3f} ms"


def _linears_line(lin: dict) -> str:
    """One line on the FP8 linears: how many swapped and kept, how they ran."""
    by_reason: dict[str, list[str]] = {}
    for name, why in lin["kept"].items():
        by_reason.setdefault(why, []).append(name)
    kept = "; ".join(f"{', '.join(names)} ({why})" for why, names in by_reason.items()) or "none"
    head = (f"{len(lin['swapped'])} linears in FP8 ({lin['granularity']} scales, "
            f"{lin['swapped_weight_share'] * 100:.0f} % of the weights)" if lin["swapped"]
            else "no linear of this block runs in FP8")
    return f"{head}; kept bf16: {kept}; {lin['path']}"


def _prologue_line(pro: dict) -> str:
    """One line on the fused prologue: the fused (and unfused) modules, or why the family has none."""
    if not pro["fused"]:
        return f"none fused: {pro.get('missing') or 'no module of this block has a fused processor'}; the " \
               f"attention runs the unfused FP8 path"
    kept = "; ".join(f"{m} ({why})" for m, why in pro["unfused_modules"].items())
    return f"fused: {', '.join(pro['fused_modules'])}" + (f"; unfused: {kept}" if kept else "") + f"; {pro['spec']}"


def _accuracy_rows(rep: dict) -> list[tuple[str, str, str]]:
    """(quantity, value, note) rows of the accuracy against the reference (and, a fused prologue run, against the
    unfused FP8 blocks); none where the run is the reference."""
    acc = rep.get("accuracy")
    if not acc:
        return []
    out = []
    for sec, vs in ((acc, ""), (acc.get("vs_unfused"), " vs unfused")):
        if not sec:
            continue
        for key, what in (("block", "one block"), ("chain", f"{rep['blocks']} blocks chained")):
            a = sec[key]
            out.append((f"accuracy{vs}, {what}", f"{a['rel_rms']:.2e}",
                        f"rel-RMS vs {sec['reference']}; cosine {a['cosine']:.6f}" + ("" if a["finite"] else
                                                                                       ", non-finite")))
    return out


def summary_table(rep: dict):
    from rich.table import Table

    m = rep["model"]
    src = m["preset"] or m["checkpoint"]
    t = Table(title=f"validate: {src}, {rep['blocks']} of {m['model_n_blocks']} {m['kind']} blocks, "
                    f"{m['tokens']} tokens, {rep.get('configuration') or rep['attention_backend']}, "
                    f"{rep['settings']['device']} "
                    f"({rep['timing_source'].replace('_', ' ')})", title_justify="left")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    t.add_column("note")
    one, ch = rep["one_block_ms"], rep["chain_ms"]
    t.add_row("one block", _ms(one["median"]), f"median of {len(one['samples'])}, "
              f"{_ms(one['min'])} - {_ms(one['max'])}")
    t.add_row(f"{rep['blocks']} x one block", _ms(rep["extrapolated_ms"]), "extrapolation")
    t.add_row(f"{rep['blocks']} blocks chained", _ms(ch["median"]),
              f"median of {len(ch['samples'])} passes; {rep['timed']}")
    pb = rep["chain_per_block_ms"]
    t.add_row("per block in the chain", _ms(pb["median"]), f"{_ms(pb['min'])} - {_ms(pb['max'])}")
    err = rep["error_pct"]
    colour = "green" if rep["within_goal"] else "yellow"
    t.add_row("extrapolation error", f"[{colour}]{err:+.2f} %[/]", f"goal |error| <= {rep['goal_pct']:.0f} % "
              f"(H3 x 50 on the H200)")
    t.add_row("error, best calls", f"{rep['error_best_pct']:+.2f} %", "N x fastest call vs sum of each block's "
              "fastest call in the chain")
    if rep.get("numerics_only"):
        t.add_row("numerics only", "[yellow]emulated[/]", "an emulation runs in the blocks: its times are not a speed")
    if rep.get("linears"):
        t.add_row("linears", f"{len(rep['linears']['swapped'])} in FP8", _linears_line(rep["linears"]))
    if rep.get("prologue"):
        t.add_row("prologue", "fused" if rep["prologue"]["fused"] else "[yellow]none[/]",
                  _prologue_line(rep["prologue"]))
    for row in _accuracy_rows(rep):
        t.add_row(*row)
    t.add_row("mode", rep["mode"], rep["memory"]["note"])
    t.add_row("execution", rep["settings"].get("execution", "eager"),
              "every block torch.compiled (fullgraph); the rest of the model runs eager" if rep.get("compile")
              else "")
    c = rep.get("compile")
    if c:
        t.add_row("compile: first call", f"{c['first_call_s']:.2f} s",
                  f"{c['recompiles']} recompile(s) (the chain's blocks included), first chain pass "
                  f"{c['chain_first_pass_s']:.2f} s")
    t.add_row("weights", fmt_bytes(m["block_bytes"]) + " / block", rep["weights"])
    if rep["memory"]["peak_allocated_bytes"] is not None:
        t.add_row("peak device memory", fmt_bytes(rep["memory"]["peak_allocated_bytes"]), "max_memory_allocated")
    if not rep["output_finite"]:
        t.add_row("output", "[red]non-finite[/]", "the chain's final hidden states hold inf/NaN")
    ws = rep.get("whole_step")
    if ws:
        ex, fc, rest = ws["extrapolated"], ws["from_chain"], ws["rest"]
        t.add_section()
        t.add_row(f"block part ({m['model_n_blocks']} blocks)", _ms(ex["block_part_ms"]),
                  f"from the chain: {_ms(fc['block_part_ms'])}")
        t.add_row("rest (non-block modules)", _ms(ex["rest_ms"]),
                  ", ".join(f"{k} {_ms(v)}" for k, v in rest["parts_ms"].items()))
        t.add_row("per step", _ms(ex["per_step_ms"]), f"block share {ex['block_share'] * 100:.1f} %; "
                  f"from the chain: {_ms(fc['per_step_ms'])}")
        if ex["steps"]:
            t.add_row(f"per video ({ex['steps']} steps{' x 2 CFG' if ex['cfg'] else ''})",
                      f"{ex['per_video_ms'] / 1000:,.2f} s",
                      f"blocks {ex['per_video_block_ms'] / 1000:,.2f} s + rest {ex['per_video_rest_ms'] / 1000:,.2f} s;"
                      f" from the chain: {fc['per_video_ms'] / 1000:,.2f} s")
    return t


def markdown(rep: dict) -> str:
    m = rep["model"]
    one, ch = rep["one_block_ms"], rep["chain_ms"]
    lines = [
        f"# ditprof validate: {m['preset'] or m['checkpoint']}",
        "",
        f"- {rep['blocks']} of {m['model_n_blocks']} {m['kind']} blocks ({m['block_class']}), {m['tokens']} tokens, "
        f"`{rep.get('configuration') or rep['attention_backend']}`, {rep['settings']['device']}, "
        f"{rep['timing_source']}" + (" — numerics only: an emulation runs in the blocks, its times are not a speed"
                                     if rep.get("numerics_only") else ""),
        f"- weights: {rep['weights']}; {fmt_bytes(m['block_bytes'])} per block",
        f"- mode: {rep['mode']} — {rep['memory']['note']}",
        f"- execution: {rep['settings'].get('execution', 'eager')}" + (
            f"; compile: first call {rep['compile']['first_call_s']:.2f} s, {rep['compile']['recompiles']} "
            f"recompile(s)" if rep.get("compile") else ""),
        "",
        "| quantity | ms |",
        "|---|---:|",
        f"| one block (median; min–max) | {one['median']:.3f} ({one['min']:.3f}–{one['max']:.3f}) |",
        f"| {rep['blocks']} × one block (extrapolation) | {rep['extrapolated_ms']:.3f} |",
        f"| {rep['blocks']} blocks chained (median; min–max) | {ch['median']:.3f} ({ch['min']:.3f}–{ch['max']:.3f}) |",
        f"| **error** | **{rep['error_pct']:+.2f} %** (goal ±{rep['goal_pct']:.0f} %) |",
        f"| error, best calls | {rep['error_best_pct']:+.2f} % |",
    ]
    lines += _accuracy_markdown(rep)
    ws = rep.get("whole_step")
    if ws:
        ex, fc = ws["extrapolated"], ws["from_chain"]
        lines += [
            "",
            "## Whole denoising step",
            "",
            "| part | extrapolated (ms) | from the chain (ms) |",
            "|---|---:|---:|",
            f"| blocks ({m['model_n_blocks']}) | {ex['block_part_ms']:.3f} | {fc['block_part_ms']:.3f} |",
            f"| rest (non-block modules) | {ex['rest_ms']:.3f} | {fc['rest_ms']:.3f} |",
            f"| per step | {ex['per_step_ms']:.3f} | {fc['per_step_ms']:.3f} |",
        ]
        if ex["steps"]:
            lines.append(f"| per video ({ex['passes']} passes) | {ex['per_video_ms']:.1f} | {fc['per_video_ms']:.1f} |")
        lines += ["", "Rest by module: " + ", ".join(f"`{k}` {v:.3f} ms" for k, v in ws["rest"]["parts_ms"].items())]
        wa = ws.get("accuracy")
        if wa:
            lines += ["", f"Accuracy the blocks hand to the rest (after {wa['blocks']} blocks): rel-RMS "
                          f"{wa['rel_rms']:.2e}, cosine {wa['cosine']:.6f}; the rest runs as the model has it"]
    return "\n".join(lines) + "\n"


def _accuracy_table_md(sec: dict, title: str, n: int) -> list[str]:
    lines = ["", f"## {title}: `{sec['configuration']}` vs `{sec['reference']}`", "",
             "| after | rel-RMS | cosine | max abs diff |", "|---|---:|---:|---:|"]
    for key, what in (("block", "block 0 (one block)"), ("chain", f"{n} blocks chained")):
        a = sec[key]
        lines.append(f"| {what} | {a['rel_rms']:.2e} | {a['cosine']:.6f} | {a['max_abs_diff']:.3g} |")
    return lines + ["", "Per block: " + ", ".join(f"{x:.2e}" for x in sec["per_block_rel_rms"]), "", sec["note"]]


def _accuracy_markdown(rep: dict) -> list[str]:
    """The FP8 linears, fused prologue and accuracy sections of validate.md (none without them)."""
    lines: list[str] = []
    if rep.get("linears"):
        lines += ["", "## FP8 linears", "", "- " + _linears_line(rep["linears"])]
    if rep.get("prologue"):
        lines += ["", "## Fused attention prologue", "", "- " + _prologue_line(rep["prologue"])]
    acc = rep.get("accuracy")
    if acc:
        lines += _accuracy_table_md(acc, "Accuracy", rep["blocks"])
        if acc.get("vs_unfused"):
            lines += _accuracy_table_md({"configuration": acc["configuration"], **acc["vs_unfused"]},
                                        "Fused vs unfused prologue", rep["blocks"])
    return lines


def to_json(rep: dict) -> str:
    def default(o):
        if isinstance(o, float) and not math.isfinite(o):
            return None
        return str(o)

    return json.dumps(rep, indent=2, default=default) + "\n"


def write(rep: dict, out: Path) -> Path:
    out = atomic.check_writable(out)
    with atomic.staged_dir(out) as stage:
        atomic.write_text(stage / "validate.md", markdown(rep))
        atomic.write_text(stage / "validate.json", to_json(rep))
    return out
