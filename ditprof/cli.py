"""Command line entry point.

Each layer contributes its own subcommands through a ``register(subparsers)`` function so that
this file stays a thin router: model_blocks (presets, make-checkpoint), harness (profile,
compare, backends, validate) and kernels (``kernels inspect``, ``kernels accuracy``).
A command raises ``ditprof.errors.DitprofError`` for bad input; we print it as one line.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ditprof import __version__
from ditprof.errors import DitprofError

# Commands that never import torch (they stay fast); every other command gets torch imported up front, with Ctrl-C
# held back meanwhile (``interrupt.deferred``).
LIGHT_COMMANDS = ("presets", "diff")
# Modules that expose register(subparsers). Imported lazily so `ditprof presets` stays fast.
COMMAND_MODULES = (
    "ditprof.model_blocks.commands",
    "ditprof.harness.cli.commands",
    "ditprof.kernels.commands",
    "ditprof.harness.validate.commands",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ditprof",
        description="Profile one DiT transformer block and swap its attention for an FP8 kernel.",
    )
    parser.add_argument("--version", action="version", version=f"ditprof {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from ditprof import interrupt

    interrupt.install()
    try:  # Ctrl-C at any point, the imports of torch and diffusers included: one line, exit code 130
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        if args.command not in LIGHT_COMMANDS:
            with interrupt.deferred():
                import torch  # noqa: F401 -- its import must not be interrupted halfway (interrupt.deferred)
        try:
            rc = args.func(args)
        except DitprofError as exc:
            print(f"ditprof: error: {exc}", file=sys.stderr)
            return 2
    except KeyboardInterrupt:
        interrupt.report_interrupt()
        return 130
    finally:
        _remove_empty_output_parents()
    return int(rc or 0)


def _remove_empty_output_parents() -> None:
    """Folders made on the way to an output folder by a run that did not finish (the default ``traces/``)."""
    atomic = sys.modules.get("ditprof.harness.run.atomic")  # only if a command got as far as importing it
    if atomic is not None:
        atomic.remove_created_left_empty()


def entry() -> None:
    """The console script (and ``python -m ditprof``). An interrupted run exits 130 with ``os._exit``: a Ctrl-C
    that landed inside C code evaluating Python (torch's library registration during import) makes the
    interpreter turn a normal exit into death by SIGINT at shutdown, although ``main`` handled it."""
    import os

    rc = main()
    if rc == 130:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    sys.exit(rc)


if __name__ == "__main__":
    entry()
