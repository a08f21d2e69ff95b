"""The fused attention prologue: a block processor's ``norm_q``/``norm_k`` (RMSNorm per head or across all heads,
with its weight) and RoPE, folded into the FP8 prep, so Q and K go from the projections' output straight to the
kernel's operands.

``PrologueSpec`` (frozen, declared by a family adapter) says what the processor does between its projections and
the attention: the norm, its epsilon, the RoPE form and how many leading channels of each head it rotates. The call
gives the tensors: the norm weights ``wq``/``wk`` (G, D) with G = 1, or G = 2 for a joint sequence whose first
``text_rows`` rows were normed with their own weights (row 0: the text's, row 1: the rest's), and the rotary table
``cos``/``sin`` (S, rope_dim).

Numerics (``prologue_torch``, the reference of the fused Triton kernels): per row of one head, in fp32,
n = x * rsqrt(mean_d(x^2) + eps) * w, then r = n * cos + rotate(n) * sin on the first ``rope_dim`` channels
(``"half"``: rotate(n) = cat(-n2, n1) over the two halves of those channels, as ``rotate_half``;
``"interleaved"``: pairs (2i, 2i+1) -> (-n[2i+1], n[2i])), the other channels passed through; the result is rounded
once to the inputs' dtype, and that is what the prep quantizes. The unfused processor rounds after each of its
steps (diffusers' RMSNorm after the normalization and after the weight, RoPE after its products), so the fused
values are as accurate or more, and equal to the unfused ones to a few rounding steps of bf16.

``norm="rms_across"`` (Wan: norm_q/norm_k are RMSNorms over all heads, inner_dim = H * D): a program of one head
cannot compute its row's factor, so it is computed first, ``row_factors``: rs[b, s] = 1/sqrt(mean over (H, D) of
x^2 + eps), one fp32 reduction per row, a (B, S) float32 tensor each for q and k (``rsq``/``rsk``; one extra read
of q and k, no 16-bit write of normed tensors), and n = x * rs * w with the weight (H, D) (the norm's (H * D,)
weight viewed per head: head h takes row h). G (text / rest weights) does not apply to it.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass
from typing import Optional

import torch

from ditprof.errors import DitprofError

NORMS = ("rms", "rms_across")
ROPE_FORMS = ("half", "interleaved")


@dataclass(frozen=True)
class PrologueSpec:
    """What a processor does to Q and K before its attention: ``norm`` ("rms" per head, "rms_across" over all
    heads, or None), ``eps``,
    ``rope`` ("half", "interleaved" or None) over the first ``rope_dim`` channels of each head (0: all)."""

    norm: Optional[str] = "rms"
    eps: float = 1e-6
    rope: Optional[str] = "half"
    rope_dim: int = 0

    def __post_init__(self):
        if self.norm is not None and self.norm not in NORMS:
            raise DitprofError(f"prologue norm must be one of {NORMS} or None, got {self.norm!r}")
        if self.rope is not None and self.rope not in ROPE_FORMS:
            raise DitprofError(f"prologue rope must be one of {ROPE_FORMS} or None, got {self.rope!r}")
        if not (self.eps > 0):
            raise DitprofError(f"prologue eps must be positive, got {self.eps!r}")
        if self.rope_dim < 0 or self.rope_dim % 2:
            raise DitprofError(f"prologue rope_dim must be even and >= 0, got {self.rope_dim}")

    @property
    def across(self) -> bool:
        """The norm is over all heads of a row (its factors ``row_factors`` come with the call)."""
        return self.norm == "rms_across"

    def rotated(self, head_dim: int) -> int:
        """Channels of a head the RoPE rotates (0 without RoPE)."""
        if self.rope is None:
            return 0
        return self.rope_dim or head_dim


def spec_key(spec: PrologueSpec) -> str:
    """``spec`` as the custom op's string argument (a constant of a compiled graph): "norm,eps,rope,rope_dim"."""
    return f"{spec.norm or ''},{spec.eps!r},{spec.rope or ''},{spec.rope_dim}"


@functools.lru_cache(maxsize=64)  # the op parses its argument on every call; not traced by dynamo (spec_key is)
def spec_from_key(key: str) -> PrologueSpec:
    """The ``PrologueSpec`` of ``spec_key``'s string; a one-line error for anything else."""
    parts = key.split(",")
    if len(parts) != 4:
        raise DitprofError(f"not a prologue key: {key!r} (build it with kernels.prologue.spec_key)")
    norm, eps, rope, rope_dim = parts
    try:
        return PrologueSpec(norm or None, float(eps), rope or None, int(rope_dim))
    except ValueError:
        raise DitprofError(f"not a prologue key: {key!r} (build it with kernels.prologue.spec_key)") from None


def check_prologue_inputs(spec: PrologueSpec, x: torch.Tensor, w: Optional[torch.Tensor],
                          cos: Optional[torch.Tensor], sin: Optional[torch.Tensor], text_rows: int,
                          who: str = "q", rs: Optional[torch.Tensor] = None) -> None:
    """One-line DitprofErrors for tensors that do not fit ``spec`` and x (B, S, H, D); ``rs``: the row factors
    of ``rms_across`` (B, S) float32, or None (to be computed)."""
    if x.dim() != 4:
        raise DitprofError(f"prologue {who} must be (B, S, H, D), got shape {tuple(x.shape)}")
    B, S, H, D = x.shape
    if spec.across:
        if w is None or tuple(w.shape) != (H, D):
            raise DitprofError(f"prologue norm weight of {who} must be ({H}, {D}) (rms_across: the norm's "
                               f"(H * D,) weight per head), got {None if w is None else tuple(w.shape)}")
        if rs is not None and (tuple(rs.shape) != (B, S) or rs.dtype != torch.float32):
            raise DitprofError(f"prologue row factors of {who} must be float32 ({B}, {S}), got {rs.dtype} "
                               f"{tuple(rs.shape)}")
    elif rs is not None:
        raise DitprofError(f"prologue row factors ({who}) are for norm='rms_across' only, not {spec.norm!r}")
    elif spec.norm is not None:
        if w is None or w.dim() != 2 or w.shape[1] != D or w.shape[0] not in (1, 2):
            raise DitprofError(f"prologue norm weight of {who} must be (1 or 2, {D}), got "
                               f"{None if w is None else tuple(w.shape)}")
        if w.shape[0] == 2 and not (0 <= text_rows <= S):
            raise DitprofError(f"prologue text_rows must be in [0, {S}], got {text_rows}")
    R = spec.rotated(D)
    if R:
        if R > D:
            raise DitprofError(f"prologue rope_dim {R} exceeds head_dim {D}")
        for name, t in (("cos", cos), ("sin", sin)):
            if t is None or tuple(t.shape) != (S, R):
                raise DitprofError(f"prologue {name} must be ({S}, {R}), got {None if t is None else tuple(t.shape)}")


def check_prologue_call(spec: PrologueSpec, q: torch.Tensor, k: torch.Tensor, wq: Optional[torch.Tensor],
                        wk: Optional[torch.Tensor], cos: Optional[torch.Tensor], sin: Optional[torch.Tensor],
                        text_rows: int, rsq: Optional[torch.Tensor] = None,
                        rsk: Optional[torch.Tensor] = None) -> None:
    """One-line DitprofErrors for a fused-prologue call: q and k (B, S, H, D) of one sequence length (one RoPE
    table), each fitting ``spec`` with its weights (and ``rms_across``'s row factors where given), and wq / wk
    with the same rows."""
    if q.dim() == 4 and k.dim() == 4 and q.shape[1] != k.shape[1]:
        raise DitprofError(f"the fused prologue needs q and k of one sequence length (one RoPE table), got "
                           f"{q.shape[1]} and {k.shape[1]}")
    check_prologue_inputs(spec, q, wq, cos, sin, text_rows, who="q", rs=rsq)
    check_prologue_inputs(spec, k, wk, cos, sin, text_rows, who="k", rs=rsk)
    if spec.norm is not None and wq.shape[0] != wk.shape[0]:
        raise DitprofError(f"prologue wq and wk must have the same rows (G), got {wq.shape[0]} and {wk.shape[0]}")


def row_factors(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``rms_across``'s factor of every row of x (B, S, H, D): (B, S) float32 1/sqrt(mean over (H, D) of x^2 +
    eps). One fp32 reduction (on CUDA the norm reads the 16-bit x as it is: no fp32 copy of x); its square is the
    sum of squares to a few fp32 ulps, far below the 16-bit rounding of the normed values."""
    ms = torch.linalg.vector_norm(x, dim=(-2, -1), dtype=torch.float32).square() / (x.shape[-2] * x.shape[-1])
    return torch.rsqrt(ms + eps)


def norm_groups(spec: PrologueSpec, w: Optional[torch.Tensor]) -> int:
    """Rows G of the norm weights as the prep's plan takes them (``pro_groups``): 2 for text / rest weights,
    else 1 (``rms_across``'s (H, D) weight is per head, not per group)."""
    return 2 if spec.norm == "rms" and w is not None and w.shape[0] == 2 else 1


def aligned(t: Optional[torch.Tensor], dtype: Optional[torch.dtype] = None) -> Optional[torch.Tensor]:
    """A prologue tensor as the Triton prep takes it: contiguous, 16-byte aligned, in ``dtype`` when given. A
    model's own tensors already are, so this copies nothing and their addresses stay the launch graphs' keys."""
    if t is None:
        return None
    t = t.contiguous() if dtype is None else t.to(dtype).contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def _pair_columns(form: str, t: torch.Tensor) -> tuple:
    # (the first, the second) channel of each rotated pair of a (S, R) table in the RoPE form ``form``
    if form == "interleaved":
        return t[:, 0::2], t[:, 1::2]
    return t.chunk(2, dim=-1)


# id(processor's table) -> (weakref to it, its _version, the pair table): the same table object (a forward's one
# rotary embedding, handed to every block) gives the same pair table, so the launch graphs keyed on the prologue
# tensors' addresses hit
_PAIR_CACHE: dict = {}
_PAIR_CACHE_MAX = 16


def _pair_table(spec: PrologueSpec, t: torch.Tensor, name: str) -> torch.Tensor:
    key = id(t)
    hit = _PAIR_CACHE.get(key)
    if hit is not None and hit[0]() is t and hit[1] == t._version:
        return hit[2]
    first, second = _pair_columns(spec.rope, t)
    capturing = t.is_cuda and torch.cuda.is_current_stream_capturing()
    if not capturing and not torch.equal(first, second):  # once per table object: not inside a graph capture
        raise DitprofError(f"prologue {name} table has different values on the two channels of a rotated pair "
                           f"({spec.rope!r} form): RoPE needs one angle per pair")
    packed = aligned(first, torch.float32)
    if len(_PAIR_CACHE) >= _PAIR_CACHE_MAX:
        _PAIR_CACHE.pop(next(iter(_PAIR_CACHE)))

    def drop(ref, key=key):  # the table is gone: so is its pair table (unless the id was reused since)
        if _PAIR_CACHE.get(key, (None,))[0] is ref:
            del _PAIR_CACHE[key]

    _PAIR_CACHE[key] = (weakref.ref(t, drop), t._version, packed)
    return packed


def pair_tables(spec: PrologueSpec, cos: Optional[torch.Tensor], sin: Optional[torch.Tensor]) -> tuple:
    """The processor's (S, R) rotary tables as the Triton kernels read them: one (cos, sin) per rotated pair,
    (S, R/2) float32 each ("interleaved": the even channels; "half": the first half), half the bytes every head's
    programs re-read. A RoPE rotates each pair by one angle, so the two channels of a pair hold the same values;
    a table that does not is a DitprofError (checked once per table object, outside graph captures). (None, None)
    without RoPE."""
    if spec.rope is None or cos is None:
        return None, None
    return _pair_table(spec, cos, "cos"), _pair_table(spec, sin, "sin")


def prologue_tensors(spec: PrologueSpec, wq, wk, cos, sin, text_rows: int, rsq=None, rsk=None) -> tuple:
    """(wq, wk, cos, sin, text_rows) as the prep's plan takes them (``aligned``; the tables as ``pair_tables``),
    with ``rms_across``'s row factors (rsq, rsk) after them where given."""
    pc, ps = pair_tables(spec, cos, sin)
    pro = (aligned(wq), aligned(wk), pc, ps, int(text_rows))
    return pro if rsq is None else pro + (aligned(rsq), aligned(rsk))


def _rotate(n: torch.Tensor, form: str) -> torch.Tensor:
    if form == "half":
        n1, n2 = n.chunk(2, dim=-1)
        return torch.cat((-n2, n1), dim=-1)
    pairs = n.unflatten(-1, (-1, 2))
    return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)


def prologue_torch(spec: PrologueSpec, x: torch.Tensor, w: Optional[torch.Tensor] = None,
                   cos: Optional[torch.Tensor] = None, sin: Optional[torch.Tensor] = None,
                   text_rows: int = 0, rs: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The processor's norm + RoPE on x (B, S, H, D) as the fused prologue computes them (module docstring):
    fp32 throughout, one rounding to x's dtype at the end. ``rs``: ``rms_across``'s row factors (None: computed
    here by ``row_factors``)."""
    check_prologue_inputs(spec, x, w, cos, sin, text_rows, rs=rs)
    n = x.float()
    if spec.across:
        rs = row_factors(x, spec.eps) if rs is None else rs
        n = n * rs[:, :, None, None] * w.float()
    elif spec.norm is not None:
        n = n * torch.rsqrt(n.pow(2).mean(-1, keepdim=True) + spec.eps)
        wf = w.float()
        if wf.shape[0] == 2:
            rows = torch.arange(x.shape[1], device=x.device) < text_rows
            n = n * torch.where(rows[:, None, None], wf[0], wf[1])
        else:
            n = n * wf[0]
    R = spec.rotated(x.shape[-1])
    if R:
        c, s = cos.float()[:, None, :], sin.float()[:, None, :]
        head = n[..., :R]
        head = head * c + _rotate(head, spec.rope) * s
        n = torch.cat((head, n[..., R:]), dim=-1)
    return n.to(x.dtype)


__all__ = ["NORMS", "PrologueSpec", "ROPE_FORMS", "aligned", "check_prologue_call", "check_prologue_inputs",
           "norm_groups", "pair_tables", "prologue_tensors", "prologue_torch", "row_factors", "spec_from_key", "spec_key"]
