"""CLI: ``ditprof validate`` (N chained blocks vs N x one block, whole-step estimate) and
``ditprof accuracy-table`` (swap accuracy per family across token counts)."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import sys
from typing import Any

from ditprof.errors import DitprofError
from ditprof.report_stdout import stdout_to_stderr

# /2: rows per configuration (``config``, ``configuration``, ``linears``), the table's ``configs`` and ``linears``;
# /3: rows' ``prologue`` (the fused-prologue rows of --prologue), the table's ``prologue``
ACCURACY_SCHEMA = "ditprof.accuracy-table/3"
# what a row measures against the baseline: a swap backend alone, with the block's linears in FP8, or the
# baseline attention with FP8 linears (``--configs``; the linears ones need ``--linears``)
CONFIGS = ("attention", "attention+linears", "linears")
CPU_ACCURACY_PRESETS = ("h3", "wan2.1-t2v-1.3b", "qwen-image", "flux.1-dev", "hunyuan-video", "ltx-video",
                        "cogvideox-5b")
# hunyuan-video-1.5's mask masks positions: the fp8 backends take it as per-batch key subsets
CUDA_ACCURACY_PRESETS = CPU_ACCURACY_PRESETS + ("flux.2-dev", "ltx-2", "hunyuan-video-1.5")
# why a CPU run's default leaves the CUDA extras out (the --help text, the run's note and its JSON say it)
CPU_LEFT_OUT_WHY = ("too slow for a CPU default: flux.2-dev's block has ~0.98 B parameters, ltx-2 runs six "
                    "attention calls a block with a 1024-row prompt, hunyuan-video-1.5 a 1985-row text stream; "
                    "--presets runs them")
CUDA_ACCURACY_TOKENS = (1024, 4096, 16384)
CPU_ACCURACY_TOKENS = (256, 1024)


def _console(json_out: bool):
    from rich.console import Console

    console = Console(stderr=json_out)
    if not console.is_terminal and console.width < 120:
        console = Console(stderr=json_out, width=120)
    return console


# --------------------------------------------------------------------------- validate

def cmd_validate(args) -> int:
    from ditprof.harness.run import atomic
    from ditprof.harness.cli.args import (check_counts, check_gpu_memory, check_size, default_out, fp8_options_of,
                                          source_of)
    from ditprof.harness.run.compile_mode import check_args as compile_mode_of
    from ditprof.harness.run.runner import check_prologue, resolve_device
    from ditprof.harness.validate.report import summary_table, to_json, write
    from ditprof.harness.validate.run import ValidateSpec, validate

    compile_as = compile_mode_of(args)
    device = resolve_device(args.device)
    source, source_kind = source_of(args, device)
    check_size(args)
    check_counts(args, ("tokens", "height", "width", "frames", "blocks", "steps", "iters", "chain_iters"))
    check_gpu_memory(args)
    if source_kind == "preset":
        from ditprof.model_blocks import get_preset

        get_preset(source)
    from ditprof.harness.swaps import backends
    from ditprof.harness.swaps.linears import linears_swaps

    attention = args.attention or backends.DEFAULT_BASELINE
    prologue = check_prologue(args, "validate", None, attention)  # one line where it cannot apply
    out = default_out(args.out, source, prefix="validate-")
    atomic.check_writable(out)
    spec = ValidateSpec(
        source=source, source_kind=source_kind, kind=args.kind, blocks=args.blocks,
        attention=attention, device=device, tokens=args.tokens,
        height=args.height, width=args.width, frames=args.frames, gpu_memory=args.gpu_memory, steps=args.steps,
        cfg=bool(args.cfg), out=out, warmup=args.warmup, iters=args.iters, chain_iters=args.chain_iters,
        seed=args.seed, whole_step=not args.no_whole_step,
        stream=True if args.stream else None, compile=compile_as, fp8_options=fp8_options_of(args),
        linears=args.linears, linears_compile=getattr(args, "linears_compile", True), prologue=prologue,
    )
    linears_swaps(args.linears, device)  # one line before any work where they cannot run (no torchao)
    console = _console(args.json)
    with stdout_to_stderr(args.json):
        rep = validate(spec, console)
        write(rep, out)
    if args.json:
        sys.stdout.write(to_json(rep))
    else:
        console.print(summary_table(rep))
        console.print(f"wrote {out}/validate.json and validate.md")
    return 0


# --------------------------------------------------------------------------- accuracy table

def _parse_list(text: str | None, what: str, conv=str) -> list:
    if text is None:
        return []
    try:
        items = [conv(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise DitprofError(f"--{what} must be a comma-separated list, got {text!r}") from None
    if not items:
        raise DitprofError(f"--{what} is empty")
    return items


def _block_output(lb, inputs, swaps) -> tuple[Any, list]:
    """(the block output on the host, the swaps' installations) with ``swaps`` in the block."""
    from ditprof.harness.swaps.base import applied_all

    with applied_all(lb.module, swaps) as installed:
        out = inputs.run(lb.module).detach().to("cpu", copy=True)
    return out, installed


def check_configs(configs: list[str], linears: str | None) -> list[str]:
    """The table's configurations, checked: known names, and --linears where one runs FP8 linears."""
    for c in configs:
        if c not in CONFIGS:
            raise DitprofError(f"--configs: unknown configuration {c!r} (known: {', '.join(CONFIGS)})")
        if "linears" in c and not linears:
            raise DitprofError(f"--configs {c} runs the linears in FP8: give --linears rowwise|tensorwise")
    return list(dict.fromkeys(configs))


def _configurations(configs: list[str], base, sw: list, prologue: bool = False) -> list[tuple[str, Any, bool]]:
    """(configuration, attention backend, fused prologue) in table order: each swap backend alone and with FP8
    linears -- with ``prologue`` each of these on a backend that has a fused prologue again with it -- then the
    baseline attention with FP8 linears."""
    from ditprof.harness.swaps.prologue import PROLOGUE_BACKENDS

    out = []
    for s in sw:
        for c in configs:
            if c != "linears":
                out += [(c, s, False)] + ([(c, s, True)] if prologue and s.name in PROLOGUE_BACKENDS else [])
    return out + ([("linears", base, False)] if "linears" in configs else [])


def check_prologue_table(prologue: bool, configs: list[str], sw: list) -> None:
    """``--prologue``: one line where no row can take it (no swap backend with a fused prologue; no attention
    configuration)."""
    from ditprof.harness.swaps.prologue import PROLOGUE_BACKENDS

    if not prologue:
        return
    if not any(s.name in PROLOGUE_BACKENDS for s in sw):
        raise DitprofError(f"--prologue fuses the processor's norm and RoPE into the FP8 prep: it needs the swap "
                           f"backend {' or '.join(PROLOGUE_BACKENDS)} among --backends, not "
                           f"{', '.join(s.name for s in sw)}")
    if configs == ["linears"]:
        raise DitprofError("--prologue adds a fused-prologue row to each attention configuration: --configs "
                           "linears has none (add attention or attention+linears)")


def _linears_cell(section: dict | None) -> dict | None:
    """A row's summary of its FP8 linears (None: bf16 linears)."""
    if section is None:
        return None
    return {"swapped": len(section["swapped"]), "kept": len(section["kept"]),
            "swapped_weight_share": section["swapped_weight_share"], "numerics_only": section["numerics_only"]}


def _attention(b, fam, fused: bool):
    from ditprof.harness.swaps.attention import AttentionSwap
    from ditprof.harness.swaps.prologue import PrologueSwap

    if fused:
        return PrologueSwap(b, fam, uses_dispatcher=fam.uses_dispatcher)
    return AttentionSwap(b, uses_dispatcher=fam.uses_dispatcher)


def _row(lb, inputs, ref, c: str, b, fused: bool, lin: list, common: dict) -> tuple[dict, list]:
    """One ok row: configuration ``c`` on ``b`` (``fused``: with the family's fused prologue) against ``ref``;
    and the installations' records."""
    from ditprof.harness.report.document import accuracy
    from ditprof.harness.swaps.base import label

    swaps = [_attention(b, lb.family, fused)] + (lin if "linears" in c else [])
    out, installed = _block_output(lb, inputs, swaps)
    records = [i.record() for i in installed]
    acc = accuracy(ref, out)
    return ({**common, "backend": b.name, "config": c, "prologue": fused, "configuration": label(swaps),
             "status": "ok", "route": records[0]["route"], "text_tokens": inputs.text_tokens,
             "linears": _linears_cell(records[-1].get("linears")),
             "rel_rms": acc["block_output_rel_rms"], "cosine": acc["block_output_cosine"],
             "max_abs_diff": acc["block_output_max_abs_diff"], "finite": acc["finite"]}, records)


def _preset_rows(preset, tokens: list[int], base, pairs: list, linears: str | None, device, seed: int,
                 qk_outliers: bool, progress, task) -> tuple[list[dict[str, Any]], dict | None, dict | None]:
    """The rows of one preset -- each token count, each configuration vs the baseline on the same inputs -- its
    FP8 linears' section (swapped / kept; None without --linears) and its fused prologue's (the fused modules, or
    why the family has none; None where no row asks for it). A family without a fused prologue has no fused
    rows."""
    import torch

    from ditprof.harness.swaps.attention import AttentionSwap
    from ditprof.harness.swaps.linears import linears_swaps
    from ditprof.model_blocks import get_family, make_inputs
    from ditprof.model_blocks.synthetic import qk_outlier_norms, synthetic_block

    fam = get_family(preset.family)
    if progress:
        progress.update(task, description=f"accuracy table: {preset.name} (making block weights)")
    with torch.inference_mode(False):  # normal tensors: the fused prologue's weight cache reads their versions
        lb = synthetic_block(preset, 0, device=device, seed=seed)
    outliers = qk_outlier_norms(lb.module, lb.head_dim, seed) if qk_outliers else []
    lin = linears_swaps(linears, device, fam)
    pro = {"missing": fam.prologue_missing} if any(f for _, _, f in pairs) and fam.prologue_missing else None
    pairs = [(c, b, f) for c, b, f in pairs if not (f and fam.prologue_missing)]
    rows: list[dict[str, Any]] = []
    section = None
    for t in tokens:
        if progress:
            progress.update(task, description=f"accuracy table: {preset.name}, {t} tokens")
        common = dict(preset=preset.name, family=fam.name, kind=lb.kind, heads=lb.heads, head_dim=lb.head_dim,
                      tokens=t, baseline=base.name, qk_outlier_norms=len(outliers))
        try:
            inputs = make_inputs(lb, tokens=t, seed=seed, device=device)
        except DitprofError as exc:
            rows += [{**common, "backend": b.name, "config": c, "prologue": f, "status": "skipped",
                      "reason": str(exc)} for c, b, f in pairs]
            if progress:
                progress.advance(task)
            continue
        ref, _ = _block_output(lb, inputs, [AttentionSwap(base, uses_dispatcher=fam.uses_dispatcher)])
        for c, b, f in pairs:
            row, records = _row(lb, inputs, ref, c, b, f, lin, common)
            rows.append(row)
            section = next((r["linears"] for r in records if "linears" in r), section)
            pro = next(({k: r["prologue"][k] for k in ("fused_modules", "unfused_modules")}
                        for r in records if "prologue" in r), pro)
        del inputs, ref
        if progress:
            progress.advance(task)
    return rows, section, pro


def _linears_section(linears: str | None, device, per_preset: dict) -> dict | None:
    """The table's FP8 linears: granularity, how they ran, and per preset which were swapped and kept."""
    from ditprof.harness.swaps.linears import linears_swaps

    if not linears:
        return None
    (swap,) = linears_swaps(linears, device)
    return {"granularity": linears, "config": swap.config.name, "path": swap.path(),
            "numerics_only": swap.numerics_only,
            "presets": {p: {"swapped": sec["swapped"], "kept": sec["kept"],
                            "swapped_weight_share": sec["swapped_weight_share"]}
                        for p, sec in per_preset.items() if sec is not None}}


def accuracy_table(presets: list[str], tokens: list[int], device: torch.device, swaps: list[str], *,
                   baseline: str = "sdpa", seed: int = 0, console=None, qk_outliers: bool = False,
                   presets_not_run: dict[str, str] | None = None, linears: str | None = None,
                   configs: list[str] | None = None, prologue: bool = False) -> dict:
    """Block-output rel-RMS and cosine of each configuration vs the baseline on the same inputs.

    One row per (preset, token count, configuration): ``configs`` (default: ``attention``, and with ``linears``
    all of ``CONFIGS``) -- each swap backend alone (``attention``), with the block's linears in FP8 at
    granularity ``linears`` (``attention+linears``), and the baseline attention with FP8 linears (``linears``).
    A token count a family cannot take is recorded as a row with its reason, and the run goes on.
    ``qk_outliers``: the synthetic QK-norm weights get a few large channels per head
    (``synthetic.qk_outlier_norms``), as trained DiTs have. ``presets_not_run``: the default presets this run left
    out, with why (recorded as given). ``prologue``: each attention configuration on a backend with a fused
    prologue (``swaps.prologue.PROLOGUE_BACKENDS``) again with the family's norm_q/norm_k and RoPE fused into the
    FP8 prep (``PrologueSwap``), where the family declares one; the table's ``prologue`` says per preset which
    modules were fused, or why none.
    """
    from contextlib import nullcontext

    import torch

    from ditprof.progress import make_progress
    from ditprof.harness.run.environment import environment
    from ditprof.harness.swaps import backends
    from ditprof.harness.swaps.linears import linears_swaps
    from ditprof.model_blocks import get_preset

    configs = check_configs(configs or (list(CONFIGS) if linears else ["attention"]), linears)
    base = backends.resolve(baseline, device)
    sw = [backends.resolve(s, device) for s in swaps]
    linears_swaps(linears, device)  # one line before any work where they cannot run (no torchao)
    check_prologue_table(prologue, configs, sw)
    for t in tokens:
        if t < 1:
            raise DitprofError(f"--tokens must be positive (got {t})")
    resolved = [get_preset(p) for p in presets]
    pairs = _configurations(configs, base, sw, prologue)
    rows: list[dict[str, Any]] = []
    per_preset: dict[str, dict | None] = {}
    per_preset_prologue: dict[str, dict | None] = {}
    prog = make_progress(console) if console is not None else nullcontext()
    with prog as progress, torch.inference_mode():
        task = progress.add_task("accuracy table", total=len(resolved) * len(tokens)) if progress else None
        for preset in resolved:
            got, per_preset[preset.name], per_preset_prologue[preset.name] = _preset_rows(
                preset, tokens, base, pairs, linears, device, seed, qk_outliers, progress, task)
            rows += got
            if console is not None and (per_preset_prologue[preset.name] or {}).get("missing"):
                console.print(f"[yellow]--prologue[/]: {preset.family} has no fused prologue "
                              f"({per_preset_prologue[preset.name]['missing']}); {preset.name} has the unfused "
                              f"rows only", highlight=False)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return {
        "schema": ACCURACY_SCHEMA,
        "created": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "device": str(device),
        "baseline": base.name,
        "backends": [s.name for s in sw],
        "configs": configs,
        "linears": _linears_section(linears, device, per_preset),
        "prologue": ({"backends": sorted({b.name for _, b, f in pairs if f}), "presets": per_preset_prologue,
                      "spec": "the family's norm_q/norm_k (RMSNorm per head) and RoPE in the FP8 prep"}
                     if prologue else None),
        "presets": presets,
        "presets_not_run": dict(presets_not_run or {}),
        "tokens": tokens,
        "weights": f"synthetic block 0 of each preset (seed {seed}), bf16, generated on {device.type}"
                   + ("; QK-norm weights with 4 channels per head x 20 (--qk-outliers)" if qk_outliers else ""),
        "qk_outliers": qk_outliers,
        "inputs": "make_inputs(seed) at each token count; the same inputs for baseline and swap",
        "metric": "block output of each configuration vs the baseline (its attention, bf16 linears): "
                  "rel-RMS = ||swap - base|| / ||base||, cosine",
        "rows": rows,
        "environment": environment(device),
    }


def _linears_text(r: dict) -> str:
    """A row's linears column: bf16, or how many ran in FP8 (and their share of the weights)."""
    lin = r.get("linears")
    if lin is None:
        return "bf16"
    if not lin["swapped"]:
        return "bf16 (none can run in FP8)"
    return f"FP8: {lin['swapped']} ({lin['swapped_weight_share'] * 100:.0f} %)"


def _backend_text(r: dict) -> str:
    """A row's backend column: the backend, and whether the family's prologue was fused into its FP8 prep."""
    return r["backend"] + (" + fused prologue" if r.get("prologue") else "")


def _prologue_notes(rep: dict) -> list[str]:
    """The markdown lines on --prologue: what the fused rows fuse and the presets whose family has none."""
    pro = rep.get("prologue")
    if not pro:
        return []
    missing = [f"{p} ({sec['missing']})" for p, sec in pro["presets"].items() if sec and sec.get("missing")]
    return ([f"Fused prologue (`+ fused prologue` rows): {pro['spec']}, on {', '.join(pro['backends'])}"]
            + ([f"No fused prologue, unfused rows only: {'; '.join(missing)}"] if missing else []) + [""])


def accuracy_markdown(rep: dict) -> str:
    env = rep["environment"]
    where = env.get("gpu") or f"CPU ({env.get('cpu')}, {env.get('torch_threads')} threads)"
    lin = rep.get("linears")
    lines = [
        f"Swap accuracy: block output vs `{rep['baseline']}` on the same inputs — {rep['device']}, {where}, "
        f"torch {env['torch']}, {rep['created']}",
        "",
    ]
    if lin:
        lines += [f"FP8 linears: {lin['granularity']} scales, {lin['path']}; the family's modulation projections "
                  f"and linears torchao cannot take stay bf16 (`linears` in the JSON lists them)", ""]
    lines += _prologue_notes(rep)
    lines += [
        "| family | preset | heads × dim | tokens | backend |" + (" linears |" if lin else "") + " rel-RMS | cosine |",
        "|---|---|---|---:|---|" + ("---|" if lin else "") + "---:|---:|",
    ]
    for r in rep["rows"]:
        head = (f"| {r['family']} | {r['preset']} ({r['kind']}) | {r['heads']} × {r['head_dim']} | {r['tokens']} | "
                f"{_backend_text(r)} |")
        if r["status"] == "ok":
            lines.append(head + (f" {_linears_text(r)} |" if lin else "") + f" {r['rel_rms']:.2e} | "
                         f"{r['cosine']:.6f} |")
        else:
            lines.append(head + (f" {'FP8' if 'linears' in r.get('config', '') else 'bf16'} |" if lin else "")
                         + f" {r['status']}: {r['reason']} | |")
    return "\n".join(lines) + "\n"


def accuracy_rich(rep: dict):
    from rich.table import Table

    lin = rep.get("linears")
    t = Table(title=f"swap accuracy vs {rep['baseline']} ({rep['device']}): block output on the same inputs"
                    + (f"; FP8 linears {lin['granularity']}" + (" (numerics only)" if lin["numerics_only"] else "")
                       if lin else "") + ("; + fused prologue rows" if rep.get("prologue") else ""),
              title_justify="left")
    cols = [("family", "left"), ("preset", "left"), ("heads x dim", "right"), ("tokens", "right"),
            ("backend", "left")] + ([("linears", "left")] if lin else []) + [("rel-RMS", "right"), ("cosine", "right")]
    for c, j in cols:
        t.add_column(c, justify=j)
    for r in rep["rows"]:
        head = [r["family"], r["preset"], f"{r['heads']} x {r['head_dim']}", str(r["tokens"]), _backend_text(r)]
        if r["status"] == "ok":
            t.add_row(*head, *([_linears_text(r)] if lin else []), f"{r['rel_rms']:.2e}", f"{r['cosine']:.6f}")
        else:
            t.add_row(*head, *([""] if lin else []), f"[yellow]{r['status']}[/]", r["reason"][:60])
    return t


def default_presets(device_type: str) -> tuple[list[str], dict[str, str]]:
    """(the default presets on this device type, {preset the CUDA default has but this run leaves out: why})."""
    if device_type == "cuda":
        return list(CUDA_ACCURACY_PRESETS), {}
    left_out = [p for p in CUDA_ACCURACY_PRESETS if p not in CPU_ACCURACY_PRESETS]
    return list(CPU_ACCURACY_PRESETS), {p: CPU_LEFT_OUT_WHY for p in left_out}


def _presets_help() -> str:
    extras = [p for p in CUDA_ACCURACY_PRESETS if p not in CPU_ACCURACY_PRESETS]
    return (f"comma list (default on CPU: {', '.join(CPU_ACCURACY_PRESETS)}; on CUDA also {', '.join(extras)}, "
            f"not on CPU: {CPU_LEFT_OUT_WHY})")


def cmd_accuracy_table(args) -> int:
    from ditprof.harness.run import atomic
    from ditprof.harness.swaps import backends
    from ditprof.harness.run.runner import resolve_device

    device = resolve_device(args.device)
    presets = _parse_list(args.presets, "presets")
    not_run: dict[str, str] = {}
    if not presets:
        presets, not_run = default_presets(device.type)
    tokens = _parse_list(args.tokens, "tokens", int) or list(
        CUDA_ACCURACY_TOKENS if device.type == "cuda" else CPU_ACCURACY_TOKENS)
    if args.backends:
        swaps = _parse_list(args.backends, "backends")
    else:
        swaps = ["fp8-emulated"]
        if device.type == "cuda" and backends.availability("fp8", device)[0]:
            swaps.append("fp8")
    configs = check_configs(_parse_list(args.configs, "configs"), args.linears) if args.configs else None
    from ditprof.harness.cli.args import default_out

    out = default_out(args.out, "accuracy-table")
    atomic.check_writable(out)
    console = _console(args.json)
    if not_run:
        console.print(f"accuracy-table on {device.type}: leaves out {', '.join(not_run)} of the CUDA default, "
                      f"{CPU_LEFT_OUT_WHY}", markup=False, highlight=False, soft_wrap=True)
    with stdout_to_stderr(args.json):
        rep = accuracy_table(presets, tokens, device, swaps, baseline=args.baseline, seed=args.seed,
                             console=console, qk_outliers=args.qk_outliers, presets_not_run=not_run,
                             linears=args.linears, configs=configs, prologue=args.prologue)
    with atomic.staged_dir(out) as stage:
        atomic.write_text(stage / "accuracy-table.md", accuracy_markdown(rep))
        atomic.write_text(stage / "accuracy-table.json", json.dumps(rep, indent=2, default=_json_default) + "\n")
    if args.json:
        sys.stdout.write(json.dumps(rep, indent=2, default=_json_default) + "\n")
    else:
        console.print(accuracy_rich(rep))
        console.print(f"wrote {out}/accuracy-table.json and accuracy-table.md")
    return 0


def _json_default(o):
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return str(o)


# --------------------------------------------------------------------------- registration

def register(subparsers) -> None:
    p = subparsers.add_parser(
        "validate", help="run N distinct blocks chained and compare with N x one block",
        description="Chain N distinct blocks (own weights each), time the chain with CUDA events (host clock on "
                    "CPU) and compare with the one-block extrapolation N x block time; also the whole-step "
                    "estimate (blocks + the model's non-block modules); with another attention backend or "
                    "--linears, the accuracy of the blocks' output against sdpa with bf16 linears, after one block "
                    "and after the chain; with --prologue also the fused blocks against the unfused FP8 ones.")
    src = p.add_argument_group("what to run")
    src.add_argument("--preset", help="built-in preset (default h3 on CUDA, h3-mini on CPU); distinct synthetic "
                                      "weights per block, generated on the device")
    src.add_argument("--checkpoint", metavar="DIR_OR_REPO", help="diffusers folder or HF repo id: real shards")
    src.add_argument("--kind", default=None, help=argparse.SUPPRESS)
    src.add_argument("--blocks", type=int, metavar="N",
                     help="blocks to chain (default: all the model's on CUDA, 4 on CPU)")
    src.add_argument("--attention", metavar="BACKEND", help="attention backend (default: sdpa)")
    from ditprof.harness.cli.commands import add_compile_flag, add_fp8_flags, add_linears_flag, add_prologue_flag

    add_prologue_flag(src)
    add_fp8_flags(src)
    add_linears_flag(p, False, where="(every block of the chain, after its attention swap; the accuracy is "
                                     "against sdpa with bf16 linears)")
    run = p.add_argument_group("inputs and device")
    run.add_argument("--device", metavar="cpu|cuda", help="default: cuda when available")
    run.add_argument("--tokens", type=int, metavar="N",
                     help="video/image tokens; MiniMax-H3: packed rows, split into text, audio and video "
                          "(default: the preset's)")
    run.add_argument("--height", type=int, metavar="H")
    run.add_argument("--width", type=int, metavar="W")
    run.add_argument("--frames", type=int, metavar="F")
    run.add_argument("--gpu-memory", dest="gpu_memory", metavar="SIZE",
                     help="device memory budget, e.g. 16GiB: blocks that do not fit are streamed from host memory")
    run.add_argument("--stream", action="store_true", help="stream blocks from host memory even if they fit")
    add_compile_flag(run)
    run.add_argument("--seed", type=int, default=0, help="weight and input seed (default 0)")
    run.add_argument("--warmup", type=int, metavar="N", help="one-block warm-up calls (default 2 CUDA, 1 CPU)")
    run.add_argument("--iters", type=int, metavar="N", help="timed one-block calls (default 10 CUDA, 5 CPU)")
    run.add_argument("--chain-iters", dest="chain_iters", type=int, metavar="N",
                     help="timed chain passes (default 3)")
    ws = p.add_argument_group("whole step")
    ws.add_argument("--steps", type=int, metavar="S", help="denoising steps (per-video estimate)")
    ws.add_argument("--cfg", action="store_true", help="classifier-free guidance (2 passes per step)")
    ws.add_argument("--no-whole-step", dest="no_whole_step", action="store_true",
                    help="skip measuring the non-block modules")
    p.add_argument("--out", metavar="DIR", help="output folder (default traces/validate-<source>-<timestamp>/)")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    p.set_defaults(func=cmd_validate)

    a = subparsers.add_parser(
        "accuracy-table", help="swap accuracy per family: block-output rel-RMS and cosine vs sdpa",
        description="For one preset per family, block-output rel-RMS and cosine of fp8-emulated (and fp8 on "
                    "CUDA) vs the baseline on the same inputs, across token counts -- with --linears also with the "
                    "block's linears in FP8, with --prologue also with the family's fused attention prologue; "
                    "writes a table and JSON.")
    a.add_argument("--presets", help=_presets_help())
    a.add_argument("--tokens", help="comma list of token counts (default: "
                                    f"{','.join(map(str, CUDA_ACCURACY_TOKENS))} on CUDA; "
                                    f"{','.join(map(str, CPU_ACCURACY_TOKENS))} on CPU)")
    a.add_argument("--backends", help="comma list of swap backends (default: fp8-emulated, + fp8 on CUDA)")
    a.add_argument("--baseline", default="sdpa", help="reference backend (default sdpa)")
    from ditprof.kernels.fp8_linear_config import GRANULARITIES

    a.add_argument("--linears", choices=GRANULARITIES, metavar="|".join(GRANULARITIES),
                   help="also run the block's linears in FP8 (torchao's dynamic float8 on a GPU with FP8 tensor "
                        "cores, its numerics emulated elsewhere; the family's modulation projections stay bf16): "
                        "each backend with FP8 linears, and the baseline attention with FP8 linears")
    a.add_argument("--configs", help=f"comma list of the configurations to run, of {', '.join(CONFIGS)} (default: "
                                     f"attention; with --linears all three)")
    a.add_argument("--prologue", action="store_true",
                   help="also each attention configuration on fp8 / fp8-emulated with the family's norm_q/norm_k "
                        "(RMSNorm per head) and RoPE fused into the FP8 prep (rows '+ fused prologue'); a family "
                        "without a fused prologue says why and keeps its unfused rows only")
    a.add_argument("--device", metavar="cpu|cuda", help="default: cuda when available")
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--qk-outliers", dest="qk_outliers", action="store_true",
                   help="give the synthetic QK-norm weights 4 channels per head x 20, as trained DiTs have")
    a.add_argument("--out", metavar="DIR", help="output folder (default traces/accuracy-table-<timestamp>/)")
    a.add_argument("--json", action="store_true", help="print the JSON on stdout")
    a.set_defaults(func=cmd_accuracy_table)
