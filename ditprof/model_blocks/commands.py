"""CLI: ``ditprof presets`` and ``ditprof make-checkpoint``."""

from __future__ import annotations

import argparse

from ditprof.errors import DitprofError


def register(subparsers) -> None:
    p = subparsers.add_parser("presets", help="list built-in model presets and their per-block sizes")
    p.set_defaults(func=cmd_presets)

    m = subparsers.add_parser(
        "make-checkpoint",
        help="write a deterministic synthetic diffusers checkpoint for a preset",
        description="Write config.json + index + shards of a preset (only the blocks asked for; "
        "tiny presets: the whole model). Default location: the user cache; a second run reuses it.",
    )
    m.add_argument("--preset", required=True, help="preset name (see `ditprof presets`)")
    m.add_argument("--out", default=None, help="output folder (default: cache dir, $DITPROF_CACHE)")
    # --blocks N elsewhere is a block count (profile/compare: the model's, for the extrapolation; validate: the
    # blocks chained); here the blocks written are named by index
    m.add_argument("--block-indices", default=None, metavar="I,J,...|all",
                   help="comma-separated block indices or 'all' (default: 0; tiny: all)")
    m.add_argument("--kind", default=None, help="block stack for double/single models (default: the preset's)")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--dtype", default=None, help="bfloat16 / float16 / float32 (default: the preset's)")
    m.set_defaults(func=cmd_make_checkpoint)


def _size(n: int) -> str:
    """GiB for real models; MiB/KiB so tiny presets do not all read 0.00."""
    if n >= 2**30 / 10:
        return f"{n / 2**30:.2f} GiB"
    if n >= 2**20:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / 2**10:.1f} KiB"


def cmd_presets(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from . import presets_table

    # the stored table while it matches these presets and versions (no torch/diffusers import), else computed
    rows, notes = presets_table.load() or presets_table.compute_rows()
    table = Table(title="ditprof presets: per-block params and bf16 bytes (diffusers' fp32-kept tensors at 4 B)")
    for col, justify in (
        ("preset", "left"), ("family", "left"), ("kind", "left"), ("blocks", "right"), ("heads x dim", "right"),
        ("tokens", "right"), ("text", "right"), ("params/block", "right"), ("bf16/block", "right"),
    ):
        table.add_column(col, justify=justify, no_wrap=True)
    for r in rows:
        params = r["params"]
        table.add_row(r["preset"], r["family"], r["kind"], str(r["blocks"]), f"{r['heads']} x {r['head_dim']}",
                      f"{r['rows']:,}", str(r["text_tokens"]),
                      f"{params / 1e6:,.1f} M" if params >= 1e5 else f"{params:,}", _size(r["bytes"]))
    console = Console()
    if not console.is_terminal:  # piped: do not squeeze the table into 80 columns
        console = Console(width=130)
    console.print(table)
    for line in notes:
        console.print(line, highlight=False)
    return 0


def cmd_make_checkpoint(args: argparse.Namespace) -> int:
    from rich.console import Console

    from .preset_configs import get_preset
    from .synthetic import make_checkpoint, parse_blocks

    preset = get_preset(args.preset)
    blocks = parse_blocks(args.block_indices) if args.block_indices is not None else (None if preset.tiny else [0])
    folder, reused = make_checkpoint(
        preset, args.out, blocks=blocks, kind=args.kind, seed=args.seed, dtype=args.dtype
    )
    Console().print(f"{'reused' if reused else 'wrote'} {preset.name} checkpoint: {folder}")
    return 0


__all__ = ["register", "DitprofError"]
