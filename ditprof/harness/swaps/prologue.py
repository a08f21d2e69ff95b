"""``PrologueSwap``: FP8 attention with the processor's norm_q/norm_k and RoPE fused into the FP8 prep
(``kernels.prologue``; ``torch.ops.ditprof.fp8_attention_prologue``), so Q and K go from the projections to the
kernel's operands without the processor's own norm and RoPE passes.

The family adapter owns the fused processor (``BlockFamily.prologue_processor``: it knows where its processor
projects, normalizes, rotates and concatenates); this swap hands it an ``attend`` function and installs it on the
attention modules the family fuses. Every other attention module of the block runs the FP8 backend unfused, as
``AttentionSwap`` routes it; a family without a fused prologue says so in one line (``prologue_missing``).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ditprof import dispatch
from ditprof.harness.swaps.attention import AttentionInstalled, AttentionSwap
from ditprof.kernels import masks as masks_mod
from ditprof.kernels import op
from ditprof.kernels.fp8_config import Fp8Options
from ditprof.kernels.prologue import PrologueSpec
from ditprof.kernels.registry import Backend

PROLOGUE_BACKENDS = ("fp8", "fp8-emulated")


def prologue_attend(options: Optional[Fp8Options] = None, masks: Optional[dict] = None,
                    wrap: Optional[Callable[[Callable], Callable]] = None):
    """The ``attend`` a family's fused processor calls: q, k raw (B, S, H, D) projections, v; ``wq``/``wk`` the
    norm weights (G, D) or None (no norm), ``eps``, ``norm`` ("rms" per head; "rms_across": over all heads, weights
    (H, D)), ``rope`` ("half"/"interleaved"/None) with ``cos``/``sin`` (S, rope_dim), ``text_rows`` (G = 2: the first rows take row 0 of the weights), ``attn_mask`` the block's
    key-padding mask or None (its kept keys must be each item's first: ``masks.prefix_key_lens``). Returns o
    (B, S, H, D). ``masks``: the attention swap's mask counts (for the report), as ``dispatch.wrap_backend`` keeps.
    ``wrap``: the op is called as ``wrap(op.fp8_attention_prologue)`` (``--attention-alone`` captures the calls
    through it)."""
    verified: set = set()  # mask forms checked (one host sync each), as dispatch.wrap_backend checks them
    masks = {} if masks is None else masks

    def key_lens_of(attn_mask, q, k):
        shape = (q.shape[0], q.shape[2], q.shape[1], k.shape[1])  # B, H, S_q, S_k
        key = (tuple(attn_mask.shape), attn_mask.dtype, attn_mask.device)
        # checked once per form, eagerly, outside a capture (a sync); compiled or captured calls reuse the check
        check = (key not in verified and not torch.compiler.is_compiling()
                 and not (q.is_cuda and torch.cuda.is_current_stream_capturing()))
        lens = masks_mod.prefix_key_lens(attn_mask, *shape, check=check)
        if check:
            verified.add(key)
        masks["key_padding"] = masks.get("key_padding", 0) + 1
        return lens

    def attend(q, k, v, *, wq=None, wk=None, eps=1e-6, norm="rms", rope=None, cos=None, sin=None, text_rows=0,
               attn_mask=None):
        spec = PrologueSpec(norm if wq is not None else None, float(eps), rope if cos is not None else None,
                            int(cos.shape[-1]) if (rope and cos is not None) else 0)
        if spec.rope is None:
            cos = sin = None
        key_lens = None if attn_mask is None else key_lens_of(attn_mask, q, k)

        def call():
            fn = op.fp8_attention_prologue if wrap is None else wrap(op.fp8_attention_prologue)
            return fn(q, k, v, spec, wq=wq, wk=wk, cos=cos, sin=sin, text_rows=text_rows, options=options,
                      key_lens=key_lens)

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
        self.attend_wrap: Optional[Callable[[Callable], Callable]] = None

    def wrapped(self, wrap: Callable[[Callable], Callable]) -> "PrologueSwap":
        """A copy whose backend function and fused prologue op both run through ``wrap``."""
        other = super().wrapped(wrap)
        other.attend_wrap = wrap
        return other

    def describe(self) -> str:
        return f"attention on {self.backend.name} with the {self.family.name} prologue fused into the FP8 prep"

    def install(self, block: torch.nn.Module) -> PrologueInstalled:
        inst = super().install(block)
        attend = prologue_attend(self.options, inst.state.masks, self.attend_wrap)
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
