"""``PrologueSwap``: FP8 attention with the processor's norm_q/norm_k and RoPE fused into the FP8 prep
(``kernels.prologue``; ``torch.ops.ditprof.fp8_attention_prologue``), so Q and K go from the projections to the
kernel's operands without the processor's own norm and RoPE passes.

The family adapter owns the fused processor (``BlockFamily.prologue_processor``: it knows where its processor
projects, normalizes, rotates and concatenates); this swap hands it an ``attend`` function and installs it on the
attention modules the family fuses. Every other attention module of the block runs the FP8 backend unfused, as
``AttentionSwap`` routes it; a family without a fused prologue says so in one line (``prologue_missing``).
"""

from __future__ import annotations

from typing import Optional

import torch

from ditprof import dispatch
from ditprof.harness.swaps.attention import AttentionInstalled, AttentionSwap
from ditprof.kernels import op
from ditprof.kernels.fp8_config import Fp8Options
from ditprof.kernels.prologue import PrologueSpec
from ditprof.kernels.registry import Backend

PROLOGUE_BACKENDS = ("fp8", "fp8-emulated")


def prologue_attend(options: Optional[Fp8Options] = None):
    """The ``attend`` a family's fused processor calls: q, k raw (B, S, H, D) projections, v; ``wq``/``wk`` the
    norm weights (G, D) or None (no norm), ``eps``, ``norm`` ("rms" per head; "rms_across": over all heads, weights
    (H, D)), ``rope`` ("half"/"interleaved"/None) with ``cos``/``sin`` (S, rope_dim), ``text_rows`` (G = 2: the first
    rows' own weights). Returns o (B, S, H, D)."""

    def attend(q, k, v, *, wq=None, wk=None, eps=1e-6, norm="rms", rope=None, cos=None, sin=None, text_rows=0):
        spec = PrologueSpec(norm if wq is not None else None, float(eps), rope if cos is not None else None,
                            int(cos.shape[-1]) if (rope and cos is not None) else 0)
        if spec.rope is None:
            cos = sin = None

        def call():
            return op.fp8_attention_prologue(q, k, v, spec, wq=wq, wk=wk, cos=cos, sin=sin, text_rows=text_rows,
                                             options=options)

        if torch.compiler.is_compiling():  # dynamo drops the range; the split finds the op by name
            return call()
        with torch.profiler.record_function(dispatch.ATTENTION_RANGE):
            return call()

    return attend


class PrologueInstalled(AttentionInstalled):
    """The attention swap's state plus the fused processors: (module, processor it had) each."""

    def __init__(self, swap: "PrologueSwap", state: dispatch.SwapState, fused: list, names: list[str],
                 unfused: dict):
        super().__init__(swap, state)
        self.fused = fused
        self.names = names
        self.unfused = unfused

    def undo(self) -> None:
        for mod, previous in reversed(self.fused):
            mod.processor = previous
        self.fused = []
        super().undo()

    def record(self) -> dict:
        out = super().record()
        out["prologue"] = {"fused_modules": list(self.names), "unfused_modules": dict(self.unfused),
                           "spec": "the family's norm_q/norm_k (RMSNorm per head or across heads) and RoPE in "
                                   "the FP8 prep"}
        out["attention_backend"] = f"{self.swap.backend.name}+prologue"
        return out


class PrologueSwap(AttentionSwap):
    """``backend`` (fp8, or its emulation on the CPU) on every attention module, the family's fused processor on
    those it has one for. ``family``: the block's adapter; ``options``: the FP8 options of the run."""

    def __init__(self, backend: Backend, family, *, options: Optional[Fp8Options] = None,
                 uses_dispatcher: bool | None = None, head_dim: int | None = None):
        super().__init__(backend, uses_dispatcher=uses_dispatcher, head_dim=head_dim)
        self.family = family
        self.options = options
        self.name = f"{backend.name}+prologue"

    def describe(self) -> str:
        return f"attention on {self.backend.name} with the {self.family.name} prologue fused into the FP8 prep"

    def install(self, block: torch.nn.Module) -> PrologueInstalled:
        inst = super().install(block)
        attend = prologue_attend(self.options)
        fused, names, unfused = [], [], {}
        try:
            for name, mod in dispatch.attention_modules(block):
                proc = self.family.prologue_processor(mod, attend)
                if proc is None:
                    unfused[name] = "its processor has no fused prologue in the family adapter"
                    continue
                fused.append((mod, mod.processor))
                names.append(name)
                mod.processor = proc
        except BaseException:
            for mod, previous in reversed(fused):
                mod.processor = previous
            inst.undo()
            raise
        return PrologueInstalled(self, inst.state, fused, names, unfused)


__all__ = ["PROLOGUE_BACKENDS", "PrologueInstalled", "PrologueSwap", "prologue_attend"]
