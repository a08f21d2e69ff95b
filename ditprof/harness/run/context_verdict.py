"""The one line the "attention in context" section ends with: what its numbers point to, and only that.

Three times of the same attention calls (sums over the block's calls of each call's median, ms): in the block,
alone on the very tensors the block handed them, and alone right after the block's largest linear ran (CUDA only).
Same tensors, so a gap between in-block and alone is not the inputs' layout; a gap between alone and after the
GEMMs is the state the GEMMs leave, and the SM clock read after each phase says whether that state includes a
lower clock. Differences within ``SAME_WITHIN`` are "about the same"."""

from __future__ import annotations

# a relative difference of times smaller than this is reported as "about the same" (run-to-run noise of a
# repeated kernel is a few per cent)
SAME_WITHIN = 0.03
# the SM clock after the GEMMs counts as lower than the alone phase's when it is lower by more than this share
CLOCK_DROP = 0.03

CPU_NOTE = "on the CPU there is no after-GEMMs phase and no SM clock (the clocks are not available)"
NO_LINEAR_NOTE = "the block has no nn.Linear: no after-GEMMs phase"


def _pct(x: float) -> str:
    return f"{x * 100:.0f} %"


def _mhz(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0f} MHz"


def _alone_part(in_block: float, alone: float) -> str:
    """In-block against alone: the same tensors, so any gap is not the inputs' layout."""
    if alone < in_block * (1 - SAME_WITHIN):
        return (f"alone on the same tensors takes {_pct(1 - alone / in_block)} less time than in the block: "
                f"not the inputs' layout")
    if alone > in_block * (1 + SAME_WITHIN):
        return f"alone on the same tensors takes {_pct(alone / in_block - 1)} more time than in the block"
    return (f"alone on the same tensors takes about the in-block time (within {_pct(SAME_WITHIN)}): the block "
            f"adds nothing measurable to its attention calls")


def _gemm_part(in_block: float, alone: float, after: float, clock_alone: float | None,
               clock_after: float | None) -> str:
    """After the GEMMs against alone, with the clocks where read."""
    gap = in_block > alone * (1 + SAME_WITHIN)
    if after <= alone * (1 + SAME_WITHIN):
        return (f"right after the block's GEMMs it takes about the alone time (within {_pct(SAME_WITHIN)})"
                + (": the state the GEMMs leave does not explain the in-block gap" if gap else ""))
    part = f"right after the block's GEMMs it takes {_pct(after / alone - 1)} more time than alone"
    if clock_alone is None or clock_after is None:
        part += " (SM clock not read: no GPU, or pynvml not installed)"
    elif clock_after < clock_alone * (1 - CLOCK_DROP):
        part += f" with the SM clock at {_mhz(clock_after)} (alone: {_mhz(clock_alone)})"
    else:
        part += (f" with the SM clock about unchanged ({_mhz(clock_after)}, alone: {_mhz(clock_alone)}): not a "
                 f"lower clock")
    if gap:
        part += ": the in-block gap follows the GPU's state after the GEMMs"
    return part


def verdict(in_block_ms: float, alone_ms: float, after_gemm_ms: float | None,
            clocks: dict[str, float | None] | None = None, no_after: str = CPU_NOTE) -> str:
    """What the three times (and the SM clocks, ``clocks["alone"]`` / ``clocks["after_gemm"]`` in MHz, None where
    not read) point to, as one line. ``after_gemm_ms`` None: no after-GEMMs phase, ``no_after`` says why."""
    clocks = clocks or {}
    parts = [_alone_part(in_block_ms, alone_ms)]
    if after_gemm_ms is None:
        parts.append(no_after)
    else:
        parts.append(_gemm_part(in_block_ms, alone_ms, after_gemm_ms, clocks.get("alone"), clocks.get("after_gemm")))
    return "; ".join(parts)


__all__ = ["CLOCK_DROP", "CPU_NOTE", "NO_LINEAR_NOTE", "SAME_WITHIN", "verdict"]
