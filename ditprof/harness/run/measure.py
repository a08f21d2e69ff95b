"""The one way the harness measures a block under a list of swaps (profile / compare, every ``--sp`` rank,
``ditprof validate``): the swaps installed, every norm module inside its profiler range, the FP8 NaN/Inf checks of
q/k/v deferred to the end (no host sync per call, which can cost a small host-bound block its lead; a non-finite
input still raises, at the latest when the scope ends) -- then ``session.measure``, and the swaps' own records in
the run's report section."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Iterator, Sequence

import torch

from ditprof.errors import DitprofError
from ditprof.harness.run.finite import NonFiniteOutput
from ditprof.harness.run.session import BackendRun, measure
from ditprof.harness.swaps.base import Installed, Swap, applied_all
from ditprof.harness.swaps.base import label as swaps_label
from ditprof.harness.trace.ranges import norm_ranges
from ditprof.kernels.interface import deferred_finite_checks

# after the install, before the measured calls: (the block to call, a scope around the measured calls); the
# compiled run compiles the swapped block here
Prepare = Callable[[torch.nn.Module], "tuple[torch.nn.Module, ContextManager]"]


@contextlib.contextmanager
def swapped(blocks: torch.nn.Module | Sequence[torch.nn.Module], swaps: Sequence[Swap]) -> Iterator[list[Installed]]:
    """The block(s) as every measured call sees them: ``swaps`` installed, norm ranges, deferred finite checks."""
    targets = [blocks] if isinstance(blocks, torch.nn.Module) else list(blocks)
    with applied_all(targets, swaps) as installed, contextlib.ExitStack() as ranges:
        for block in targets:
            ranges.enter_context(norm_ranges(block))
        with deferred_finite_checks():
            yield installed


def measure_swapped(block: torch.nn.Module, swaps: Sequence[Swap], call: Callable[[torch.nn.Module], Any], *,
                    label: str, prepare: Prepare | None = None, diagnose: Callable[[], str] | None = None,
                    **measure_kw: Any) -> BackendRun:
    """``session.measure`` of ``call(block)`` with ``swaps`` in the block; the run's ``extra`` gets every
    installation's ``record()`` and the swaps' descriptions. ``prepare``: see ``Prepare``; ``diagnose``: where a
    non-finite output first appears (run while the swaps are still in), for the one-line error."""
    with swapped(block, swaps) as installed:
        target, scope = prepare(block) if prepare is not None else (block, contextlib.nullcontext())
        for inst in installed:
            inst.start_measuring()
        try:
            with scope:
                run = measure(lambda: call(target), label=label, backend=swaps_label(swaps), **measure_kw)
        except NonFiniteOutput as exc:
            if diagnose is None:
                raise
            raise DitprofError(f"{exc}: {diagnose()}") from None
    for inst in installed:
        run.extra.update(inst.record())
    run.extra["swaps"] = [s.describe() for s in swaps]
    run.extra["configuration"] = swaps_label(swaps)
    run.extra["numerics_only"] = any(s.numerics_only for s in swaps)
    return run


__all__ = ["Prepare", "measure_swapped", "swapped"]
