"""``ditprof kernels ...``: accuracy of the FP8 numerics, SASS inspection of our kernel, backend list.

Heavy imports (torch-side modules, CuTe DSL) happen inside the command functions so that building the CLI
parser stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys

from ditprof.errors import DitprofError


def register(subparsers) -> None:
    parser = subparsers.add_parser("kernels", help="attention kernels: accuracy, SASS inspection, list",
                                   description="Attention kernels: accuracy, SASS inspection, list.")
    sub = parser.add_subparsers(dest="kernels_command", metavar="SUBCOMMAND")
    parser.set_defaults(func=lambda _args: (parser.print_help(), 2)[1])

    from ditprof.kernels.accuracy_cases import FAMILIES, shape_text

    acc = sub.add_parser("accuracy", help=f"FP8 backends vs a float64 reference on {len(FAMILIES)} input families "
                                          f"({', '.join(FAMILIES)})")
    acc.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    acc.add_argument("--shape", metavar="B,H,S,D", help=f"default {shape_text('cpu')} on cpu, {shape_text('cuda')} on cuda")
    acc.add_argument("--kv-len", type=int, metavar="N", help="key/value length (default: S; cross-attention)")
    acc.add_argument("--seed", type=int, default=0)
    acc.add_argument("--json", action="store_true", help="print JSON instead of a table")
    acc.add_argument("--no-smooth-k", dest="smooth_k", action="store_false",
                     help="turn K smoothing off in the FP8 backends")
    acc.set_defaults(func=cmd_accuracy)

    ins = sub.add_parser("inspect", help="compile a kernel for an arch on this machine and report its SASS")
    ins.add_argument("--kernel", default="fp8-sm120")
    ins.add_argument("--arch", default="sm_120a")
    ins.add_argument("--key-lens", action="store_true",
                     help="the variant that reads per-batch key counts on the device (key-padding masks)")
    ins.add_argument("--qk-format", choices=("e4m3", "int8"), default=None,
                     help="Q and K as e4m3 or as Hadamard-rotated INT8 (the Q K^T MMA becomes IMMA / IGMMA); "
                          "default: DITPROF_FP8_QK, else int8")
    ins.add_argument("--grid", choices=("plain", "stream-K"), default="plain",
                     help="fp8-sm90's build: the plain grid, or the stream-K grid few-round problems run on")
    ins.add_argument("--q-in-kernel", action="store_true",
                     help="fp8-sm90 INT8's build that rotates and quantizes Q itself (what the op runs on the "
                          "plain grid)")
    ins.add_argument("--pv-mma", choices=("f32", "block_scaled"), default=None,
                     help="fp8-sm120's P V mma: f32 (QMMA.F32) or block_scaled (QMMA.SF, unit scales; sm_120a / "
                          "sm_121a); default: what the launcher compiles for the arch")
    ins.add_argument("--json", action="store_true")
    ins.set_defaults(func=cmd_inspect)

    lst = sub.add_parser("list", help="attention backends and whether each runs on a device")
    lst.add_argument("--device", default=None, help="default: cuda when present, else cpu")
    lst.add_argument("--json", action="store_true")
    lst.set_defaults(func=cmd_list)


# ------------------------------------------------------------------------------------------ accuracy

def cmd_accuracy(args: argparse.Namespace) -> int:
    from ditprof.kernels import accuracy
    from ditprof.report_stdout import stdout_to_stderr

    shape = accuracy.parse_shape(args.shape) if args.shape else None
    with stdout_to_stderr(args.json):  # --json: kernel compilers' output stays off stdout
        results, notes = accuracy.run_accuracy(shape, args.kv_len, args.seed, args.device, args.smooth_k)
    for note in notes:
        print(f"ditprof: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    shape = shape or accuracy.DEFAULT_SHAPE[args.device]
    kv = args.kv_len if args.kv_len is not None else shape[2]
    table = Table(title=f"attention vs float64 reference: B,H,S,D={','.join(map(str, shape))}, Sk={kv}, "
                        f"{args.device}, seed {args.seed}, K smoothing {'on' if args.smooth_k else 'off'}")
    for column in ("inputs", "backend", "rel-RMS", "max-abs", "cosine"):
        table.add_column(column, justify="left" if column in ("inputs", "backend") else "right")
    for family, rows in results.items():
        for i, (backend, m) in enumerate(rows.items()):
            table.add_row(family if i == 0 else "", backend, f"{m['rel_rms'] * 100:.2f}%", f"{m['max_abs']:.4f}",
                          f"{m['cosine']:.5f}")
    Console().print(table)
    return 0


# ------------------------------------------------------------------------------------------ inspect

def cmd_inspect(args: argparse.Namespace) -> int:
    try:
        from ditprof.kernels.inspect_sass import inspect_kernel
    except ModuleNotFoundError as exc:
        if exc.name == "ditprof.kernels.inspect_sass":
            raise DitprofError("kernel inspection not available yet") from None
        raise DitprofError(f"kernel inspection needs {exc.name}: {exc}") from None
    report = inspect_kernel(args.kernel, args.arch, key_lens=args.key_lens, qk_format=args.qk_format,
                            grid=args.grid, q_in_kernel=args.q_in_kernel, pv_mma=args.pv_mma)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    summary = Table(title=f"{report.get('kernel', args.kernel)} for {report.get('arch', args.arch)}")
    summary.add_column("field")
    summary.add_column("value", justify="right")
    for key, value in report.items():
        if not isinstance(value, dict):
            summary.add_row(key, str(value))
    console = Console()
    console.print(summary)
    # SASS opcodes, then the full instruction forms of the MMAs (accumulator, block-scaled or not)
    for title, column, counts in (("SASS opcodes", "opcode", report.get("instructions")),
                                  ("MMA instruction forms", "instruction", report.get("mma_variants"))):
        if counts:
            table = Table(title=title)
            table.add_column(column)
            table.add_column("count", justify="right")
            for name, count in counts.items():
                table.add_row(name, str(count))
            console.print(table)
    return 0


# ------------------------------------------------------------------------------------------ list

def cmd_list(args: argparse.Namespace) -> int:
    from ditprof.kernels import registry

    device = registry.resolve_device(args.device)
    rows = []
    for backend in registry.all_backends():
        ok, reason = backend.available(device)
        rows.append({"name": backend.name, "available": ok, "reason": reason, "description": backend.description})
    if args.json:
        print(json.dumps({"device": str(device), "backends": rows}, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"attention backends on {device}")
    for column in ("backend", "available", "why not / description"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["name"], "yes" if row["available"] else "no",
                      row["description"] if row["available"] else row["reason"])
    Console().print(table)
    return 0
