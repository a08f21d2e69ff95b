"""A swap: something a measurement changes in a block, that puts itself in and takes itself out again.

    swaps = [AttentionSwap(registry.get("fp8"))]          # what to change (objects, composed in a list)
    with applied_all(block, swaps) as installed:          # installed in list order, undone in reverse
        ...                                               # measure the block
    sections = [i.record() for i in installed]            # what each swap says about itself, for the report

The measurement (``harness.run.measure``) knows nothing of what a swap does: it installs the list, calls
``start_measuring()`` on each installation before the measured calls, and merges their ``record()``\\ s into the
run's report section. Today's swap is the attention backend (``AttentionSwap``); a swap of the linears to FP8 or
of a fused attention prologue is one more class with ``install`` (``swaps.linears.LinearsSwap``).
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch


class Installed:
    """One swap put into one block: ``undo()`` restores the block as it was; ``record()`` is what the report's
    section of the measurement says about it (merged into that section, keys the swap chooses)."""

    def undo(self) -> None:
        raise NotImplementedError

    def start_measuring(self) -> None:
        """The measured calls begin (after warm-up and compilation): counters that cover them start here."""

    def record(self) -> dict:
        return {}


class Swap:
    """Something a measurement changes in a block. ``name``: its short label (the report's column header material,
    ``fp8``); ``describe()``: one line for people; ``install(block)`` changes the block and returns what undoes it."""

    name: str = "swap"
    numerics_only: bool = False  # an emulation: its numbers are the point, its time is not a speed

    def describe(self) -> str:
        return self.name

    def install(self, block: torch.nn.Module) -> Installed:
        raise NotImplementedError

    @contextlib.contextmanager
    def applied(self, block: torch.nn.Module) -> Iterator[Installed]:
        installed = self.install(block)
        try:
            yield installed
        finally:
            installed.undo()


def label(swaps: Sequence[Swap]) -> str:
    """The name of a list of swaps, as messages and reports show it: ``fp8``, ``fp8 + fp8-linears``."""
    return " + ".join(s.name for s in swaps) or "unchanged"


@contextlib.contextmanager
def applied_all(blocks: torch.nn.Module | Sequence[torch.nn.Module], swaps: Sequence[Swap]
                ) -> Iterator[list[Installed]]:
    """Every swap installed on every block (a list of blocks: a chain), in list order; undone in reverse order on
    exit, also when an install fails half-way."""
    targets = [blocks] if isinstance(blocks, torch.nn.Module) else list(blocks)
    with contextlib.ExitStack() as stack:
        installed = [stack.enter_context(s.applied(b)) for b in targets for s in swaps]
        yield installed


__all__ = ["Installed", "Swap", "applied_all", "label"]
