"""FP8 prep: per-(batch, head) descales, K smoothing, Q/K/V -> float8_e4m3fn in the layouts the kernel reads.

Contract (docs/ARCHITECTURE.md, "kernels" and "FP8 numerics"), inputs q (B,Sq,H,D), k and v (B,Sk,H,D) in
bf16/fp16 (``layout="BHSD"`` takes (B,H,S,D)):

- ``q8``  (B,H,Sq_pad,D) e4m3, Sq_pad = ceil(Sq/128)*128, pad rows zero;
- ``k8``  (B,H,Sk_pad,D) e4m3, Sk_pad = ceil(Sk/32)*32, pad rows zero;
- ``v8t`` (B,H,D,Sk_pad) e4m3, feature-major; position p of each 16-key group holds key
  ``g + 8*(e//2) + 2*quad + e%2`` (g = p//16*16, quad = (p%16)//4, e = p%4); pad zero;
- ``scales`` float32 (B,H,3): descales of q, k, v = amax/448 (1.0 where amax == 0);
- ``sq``, ``sk``: true lengths; ``k_mean`` (B,H,D) float32 when smoothing (else None) — not part of the
  contract, handy to correct an LSE (smoothing shifts each score row by q . mean_k).

INT8 Q/K mode (``qk_int8=True``; the default e4m3 mode above is unchanged). Rpm1 = ``rotation.rotation_pm1``
(diag(+-1 signs) @ Sylvester Hadamard, entries +-1, Rpm1 Rpm1^T = D I):

- rotation: Q' = fp32(Q @ Rpm1) / D, K' = fp32(K @ Rpm1) (the torch chain sums in float64, exact for 16-bit inputs;
  the Triton kernels with ``tl.dot``, fp32 accumulation), so Q' K'^T = Q K^T in real arithmetic;
- smoothing in the rotated basis: mu' = fp32(sum_fp64(K' over the item's own keys) / n), K' <- fp32(K' - mu');
  ``k_mean`` is reported in the ORIGINAL basis, k_mean = mu' @ Rpm1^T / D (float64, rounded to fp32), so the LSE
  correction softmax_scale * q . k_mean is unchanged;
- ``q8`` (B,H,Sq_pad,D) int8 and ``q_scales`` float32 (B,H,Sq_pad): per token, q_scale = fp32(amax_d|Q'| / 127)
  (1.0 where that amax is 0 and on pad rows), q8 = clamp(rne(fp32(Q' / q_scale)), -127, 127), pad rows 0;
- ``k8`` (B,H,Sk_pad,D) int8: descale_k = fp32(amax|K' - mu'| / 127) over the item's own keys (1.0 where 0),
  k8 = clamp(rne(fp32(K' / descale_k)), -127, 127), pad rows 0;
- ``scales`` (B,H,3): [..., 0] = 1.0 (Q's scale is per token; NaN where the head's Q holds a NaN or Inf, which is
  how the finiteness checks see Q in this mode), [..., 1] = descale_k, [..., 2] = V's descale as in e4m3 mode;
  ``v8t`` unchanged (e4m3).
- The Triton prep and the torch chain may differ by one in a small fraction of the int8 codes and by an ulp or so
  in the scales (tensor-core sums are not the float64 sums); the e4m3 mode stays bit for bit.

Numerics, identical in both implementations here:
- smoothing: mean_k = fp32(sum_fp64(K over the true tokens) / Sk) per (b, h, channel); K <- fp32(K - mean_k);
- descale = fp32(amax / 448) (IEEE division); X8 = e4m3(clamp(fp32(X / descale), -448, 448)), IEEE division,
  round to nearest even (saturation is the clamp); V (both modes) by its reciprocal instead,
  V8 = e4m3(clamp(fp32(V * fp32(1 / descale)), -448, 448)) (``quantize_v_e4m3``);
- non-finite inputs are detected from the amax (NaN counts as Inf) with one device->host copy: DitprofError.
  ``check_finite="defer"`` starts that copy (into pinned memory, async) and returns at once; the caller launches
  more work (the attention kernel) and then calls ``Fp8Prepared.check_finite()``, which waits only for the copy
  (i.e. for the prep), so the sync no longer stalls the GPU queue. ``interface.fp8_attention`` does this.

Fused prologue (``fp8_prepare_prologue``, INT8 Q/K mode): q and k are the projections' raw rows; the processor's
per-head RMSNorm and RoPE (``kernels/prologue.py``, ``prologue_torch``: fp32, one rounding to the inputs' dtype) are
applied to them first, then everything above follows unchanged. The Triton kernels apply it to each Q/K tile right
after loading it, in the K stats pass and in the Q/K quantize pass (no normed / rotated copy of q or k is written);
the torch chain is ``prologue_torch`` then ``fp8_prepare_torch(qk_int8=True)``. The two agree to the INT8 tolerance
above (a prologue value may also round to the other neighbouring 16-bit value, now and then).

``fp8_prepare`` runs the fused Triton kernels (``prep_triton.py``) on CUDA tensors; ``fp8_prepare_torch`` is the
naive chain of torch ops (reference for tests, fallback where Triton is missing or the tensors are on the CPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

import numpy as np
import torch

from ditprof.errors import DitprofError
from ditprof.kernels.checks import check_qkv
from ditprof.kernels.fp8_config import PrepConfig
from ditprof.kernels.key_order import key_order_for_positions
from ditprof.kernels.prep_layout import padded_lengths
from ditprof.kernels.prologue import PrologueSpec, check_prologue_call, prologue_tensors, prologue_torch, row_factors
from ditprof.kernels.rotation import rotation_pm1

FP8_MAX = 448.0
INT8_MAX = 127.0
_NAMES = ("q", "k", "v")


@dataclass
class Fp8Prepared:
    q8: torch.Tensor
    k8: torch.Tensor
    v8t: torch.Tensor
    scales: torch.Tensor
    sq: int
    sk: int
    k_mean: Optional[torch.Tensor] = None
    # per-token descales of Q (B, H, Sq_pad) float32 in the INT8 Q/K mode (``qk_int8=True``); None in e4m3 mode
    q_scales: torch.Tensor | None = None
    # pending deferred finiteness check (check_finite="defer"): (pinned host copy of the scales, CUDA event)
    _pending: Optional[tuple] = field(default=None, repr=False, compare=False)

    def check_finite(self) -> None:
        """Finish a deferred finiteness check (``fp8_prepare(..., check_finite="defer")``): wait for the async
        copy of the descales, then raise ``DitprofError("q contains NaN or Inf")`` (or k, v) as the eager check
        would. A no-op when nothing is pending (eager check, ``check_finite=False``, or already checked)."""
        finish_finite_check(self.take_finite_check())

    def take_finite_check(self) -> Optional[tuple]:
        """Hand the pending check over (None if there is none): ``finish_finite_check`` it later. Holds only a
        pinned copy of the descales and an event, not this object's FP8 tensors."""
        pending, self._pending = self._pending, None
        return pending


def finish_finite_check(pending: Optional[tuple]) -> None:
    """Wait for a deferred check's copy (no-op for None) and raise like the eager check on non-finite input."""
    if pending is None:
        return
    host, event = pending
    event.synchronize()
    _raise_if_nonfinite(host)


# ---------------------------------------------------------------- small shared helpers (no numerics)

def _to_bshd(x: torch.Tensor, layout: str) -> torch.Tensor:
    return x if layout == "BSHD" else x.transpose(1, 2)


def _check_inputs(q, k, v, layout: str):
    """Validate and return (B,S,H,D)-indexed views (no copies)."""
    return check_qkv(q, k, v, who="the fp8 prep", layout=layout, pow2_head_dim=True)


def _raise_if_nonfinite(scales: torch.Tensor) -> None:
    """One device->host copy of the (B*H, 3) descales (no extra kernels): which of q, k, v had a non-finite amax.

    Skipped while a CUDA graph is being captured (no sync possible there)."""
    if scales.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    # numpy on the host copy: several times less host time than the same test as torch ops, which matters where
    # per-call host overhead makes a small fp8 block host-bound
    host = scales.detach().reshape(-1, 3).cpu().numpy()
    finite = np.isfinite(host)
    if finite.all():
        return
    bad = (~finite).any(axis=0).tolist()
    for name, flag in zip(_NAMES, bad):
        if flag:
            raise DitprofError(f"{name} contains NaN or Inf")


def _start_finite_check(scales: torch.Tensor) -> Optional[tuple]:
    """Deferred form of ``_raise_if_nonfinite``: an async copy of the descales into pinned host memory and an event
    after it, on the current stream; ``Fp8Prepared.check_finite`` waits on the event. None under graph capture."""
    if torch.cuda.is_current_stream_capturing():
        return None
    flat = scales.detach().reshape(-1)
    host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
    host.copy_(flat, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return host, event


# ---------------------------------------------------------------- Triton availability

_TRITON = None  # module once imported, or the import error string


def _triton_module():
    global _TRITON
    if _TRITON is None:
        try:
            from ditprof.kernels import prep_triton

            _TRITON = prep_triton
        except Exception as exc:  # ImportError, or triton failing to initialise
            _TRITON = f"{type(exc).__name__}: {exc}"
    return _TRITON


def triton_available(device="cuda") -> tuple[bool, str]:
    device = torch.device(device)
    mod = _triton_module()
    if isinstance(mod, str):
        return False, f"triton unavailable ({mod})"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return False, "CUDA is not available"
        return True, ""
    if mod.INTERPRET:
        return True, "TRITON_INTERPRET=1"
    return False, f"Triton kernels need CUDA tensors (got {device.type}); set TRITON_INTERPRET=1 to interpret"


# ---------------------------------------------------------------- public API

def fp8_prepare(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    smooth_k: bool = True,
    layout: str = "BSHD",
    *,
    backend: str = "auto",
    check_finite: Union[bool, str] = True,
    out: Optional[Fp8Prepared] = None,
    key_lens: Optional[torch.Tensor] = None,
    qk_int8: bool = False,
    config: PrepConfig = PrepConfig(),
) -> Fp8Prepared:
    """Fused FP8 prep. ``backend``: "auto" (Triton where it can run, else the torch chain), "triton", "torch".

    ``check_finite=False`` skips the one device->host sync (non-finite inputs then give garbage, not an error).
    ``check_finite="defer"`` (CUDA): starts the check without waiting; call ``result.check_finite()`` after
    launching the work that consumes the result (on CPU tensors and the torch backend it checks at once).
    ``out``: an ``Fp8Prepared`` whose q8, k8, v8t, scales (and q_scales with ``qk_int8``; contiguous, right shapes)
    are written in place and returned (buffer reuse, CUDA graphs; tests poison them first).
    ``key_lens`` (B,) int32 on the inputs' device: batch item b's K mean and K/V descales come from its first
    key_lens[b] keys only (what the kernels attend to; clamped to [0, Sk]); the other rows are still quantized.
    ``qk_int8``: the INT8 Q/K mode (Hadamard-rotated, per-token Q scales; see the module docstring).
    ``config``: the Triton kernels' launch configuration (``prep_triton``; the torch chain has none): the same
    outputs for every valid one.
    """
    if backend not in ("auto", "triton", "torch"):
        raise DitprofError(f"backend must be 'auto', 'triton' or 'torch', got {backend!r}")
    if check_finite not in (True, False, "defer"):
        raise DitprofError(f"check_finite must be True, False or 'defer', got {check_finite!r}")
    qk_int8 = bool(qk_int8)
    qs, ks, vs = _check_inputs(q, k, v, layout)
    if backend == "auto":
        ok, _ = triton_available(qs.device)
        backend = "triton" if ok else "torch"
    bufs = _check_out(out, qs, ks, qk_int8) if out is not None else None
    if backend == "torch":
        res = _prepare_torch(qs, ks, vs, smooth_k, bool(check_finite), key_lens, qk_int8)
        if bufs is None:
            return res
        for dst, src in zip(bufs, (res.q8, res.k8, res.v8t, res.scales, res.q_scales)):
            dst.copy_(src)
        return Fp8Prepared(*bufs[:4], res.sq, res.sk, res.k_mean, q_scales=bufs[4] if qk_int8 else None)
    ok, why = triton_available(qs.device)
    if not ok:
        raise DitprofError(f"fp8_prepare(backend='triton'): {why}")
    res = _triton_module().prepare_triton(qs, ks, vs, smooth_k, out=bufs, key_lens=key_lens, qk_int8=qk_int8,
                                          config=config)
    return _prepared(res, qs, ks, check_finite)


def fp8_prepare_prologue(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spec: PrologueSpec,
    wq: Optional[torch.Tensor],
    wk: Optional[torch.Tensor],
    cos: Optional[torch.Tensor],
    sin: Optional[torch.Tensor],
    text_rows: int = 0,
    *,
    smooth_k: bool = True,
    check_finite: Union[bool, str] = True,
    config: PrepConfig = PrepConfig(),
    backend: str = "auto",
    out: Optional[Fp8Prepared] = None,
) -> Fp8Prepared:
    """The INT8 Q/K prep of RAW q and k (B, S, H, D) (the projections' output, before the processor's norm_q /
    norm_k and RoPE) with the prologue ``spec`` fused in: norm weights ``wq``/``wk`` (G, D) (G = 2: rows below
    ``text_rows`` take row 0; ``rms_across``: (H, D), the row factors computed here by ``prologue.row_factors``),
    rotary table ``cos``/``sin`` (S, rope_dim); q and k of one sequence length. The same outputs as
    ``fp8_prepare(prologue_torch(q), prologue_torch(k), v, qk_int8=True)`` within the INT8 tolerance.
    ``backend``, ``check_finite``, ``config``, ``out``: as for ``fp8_prepare``."""
    if backend not in ("auto", "triton", "torch"):
        raise DitprofError(f"backend must be 'auto', 'triton' or 'torch', got {backend!r}")
    if check_finite not in (True, False, "defer"):
        raise DitprofError(f"check_finite must be True, False or 'defer', got {check_finite!r}")
    if not isinstance(spec, PrologueSpec):
        raise DitprofError(f"spec must be a PrologueSpec, got {type(spec).__name__}")
    qs, ks, vs = _check_inputs(q, k, v, "BSHD")
    check_prologue_call(spec, qs, ks, wq, wk, cos, sin, text_rows)
    rsq = rsk = None
    if spec.across:
        rsq, rsk = row_factors(qs, spec.eps), row_factors(ks, spec.eps)
    if backend == "auto":
        backend = "triton" if triton_available(qs.device)[0] else "torch"
    if backend == "torch":
        qn, kn = (prologue_torch(spec, x, w, cos, sin, text_rows, rs) for x, w, rs in ((qs, wq, rsq), (ks, wk, rsk)))
        return fp8_prepare(qn, kn, vs, smooth_k, backend="torch", check_finite=bool(check_finite), out=out,
                           qk_int8=True)
    ok, why = triton_available(qs.device)
    if not ok:
        raise DitprofError(f"fp8_prepare_prologue(backend='triton'): {why}")
    bufs = _check_out(out, qs, ks, True) if out is not None else None
    res = _triton_module().prepare_triton(qs, ks, vs, smooth_k, out=bufs, qk_int8=True, config=config,
                                          prologue=spec, pro=prologue_tensors(spec, wq, wk, cos, sin, text_rows, rsq, rsk))
    return _prepared(res, qs, ks, check_finite)


def _prepared(res: tuple, qs: torch.Tensor, ks: torch.Tensor, check_finite) -> Fp8Prepared:
    """The Triton prep's outputs (q8, k8, v8t, scales, k_mean, q_scales) as an ``Fp8Prepared``, with the finiteness
    check of ``check_finite`` (True: now; "defer": started, read later; False: none)."""
    q8, k8, v8t, scales, k_mean, q_scales = res
    pending = None
    if check_finite == "defer" and scales.is_cuda:
        pending = _start_finite_check(scales)
    elif check_finite:
        _raise_if_nonfinite(scales)
    return Fp8Prepared(q8, k8, v8t, scales, qs.shape[1], ks.shape[1], k_mean, q_scales=q_scales, _pending=pending)


def _check_out(out, qs, ks, qk_int8: bool = False):
    B, Sq, H, D = qs.shape
    Sq_pad, Sk_pad = padded_lengths(Sq, ks.shape[1])
    qk_dtype = torch.int8 if qk_int8 else torch.float8_e4m3fn
    want = {
        "q8": ((B, H, Sq_pad, D), qk_dtype),
        "k8": ((B, H, Sk_pad, D), qk_dtype),
        "v8t": ((B, H, D, Sk_pad), torch.float8_e4m3fn),
        "scales": ((B, H, 3), torch.float32),
    }
    if qk_int8:
        want["q_scales"] = ((B, H, Sq_pad), torch.float32)
    bufs = []
    for name, (shape, dtype) in want.items():
        t = getattr(out, name)
        if t is None:
            raise DitprofError(f"out.{name} must be a contiguous {dtype} tensor of shape {shape} on {qs.device}, "
                               f"got None")
        if tuple(t.shape) != shape or t.dtype != dtype or t.device != qs.device or not t.is_contiguous():
            raise DitprofError(
                f"out.{name} must be a contiguous {dtype} tensor of shape {shape} on {qs.device}, "
                f"got {t.dtype} {tuple(t.shape)} on {t.device}"
            )
        bufs.append(t)
    return tuple(bufs)


def fp8_prepare_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    smooth_k: bool = True,
    layout: str = "BSHD",
    *,
    check_finite: bool = True,
    key_lens: Optional[torch.Tensor] = None,
    qk_int8: bool = False,
) -> Fp8Prepared:
    """The same contract as ``fp8_prepare`` as a plain chain of torch ops (any device)."""
    qs, ks, vs = _check_inputs(q, k, v, layout)
    return _prepare_torch(qs, ks, vs, smooth_k, check_finite, key_lens, bool(qk_int8))


# ---------------------------------------------------------------- INT8 Q/K numerics (shared with fp8_emulation)

def rotate_qk(qh: torch.Tensor, kh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, H, S, D) Q and K, any float dtype -> fp32 Q' = fp32(Q @ Rpm1) / D and K' = fp32(K @ Rpm1).

    The products are summed in float64 (exact for bf16/fp16 inputs unless a row spans > ~38 binades), then rounded
    once to fp32; /D is a power of two (exact)."""
    D = qh.shape[-1]
    rot = rotation_pm1(D, torch.float64, qh.device)
    qr = torch.matmul(qh.double(), rot).float() / D
    kr = torch.matmul(kh.double(), rot).float()
    return qr, kr


def k_mean_original_basis(mu_rot: torch.Tensor) -> torch.Tensor:
    """The smoothing mean of the rotated basis (..., D) back in the original one: fp32(mu' @ Rpm1^T / D)."""
    D = mu_rot.shape[-1]
    rot = rotation_pm1(D, torch.float64, mu_rot.device)
    return (torch.matmul(mu_rot.double(), rot.T) / D).float()


def int8_descale(amax: torch.Tensor) -> torch.Tensor:
    """fp32(amax / 127) (IEEE division), 1.0 where amax == 0; NaN/Inf propagate."""
    amax = amax.float()
    ds = amax / torch.tensor(INT8_MAX, dtype=torch.float32, device=amax.device)
    return torch.where(amax == 0, torch.ones_like(ds), ds)


def quantize_int8(x: torch.Tensor, descale: torch.Tensor) -> torch.Tensor:
    """int8(clamp(rne(fp32(x / descale)), -127, 127)); ``descale`` broadcasts against ``x``."""
    y = x.float() / descale
    return torch.round(y).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)


# below this descale 1 / descale could overflow fp32: the exact quotient there (the Triton kernels branch the same way)
RECIP_MIN_DESCALE = 1e-26


def quantize_v_e4m3(x: torch.Tensor, descale: torch.Tensor) -> torch.Tensor:
    """V's e4m3 codes (both Q/K modes): e4m3(clamp(fp32(x * fp32(1 / descale)), +-448)), round to nearest even;
    the exact quotient where descale < RECIP_MIN_DESCALE (or NaN). ``descale`` broadcasts against ``x``.

    One multiply per element instead of a correctly rounded quotient (the prep's V programs are issue-bound, so
    it shortens them). It differs from e4m3(x / descale) only where x / descale
    lies at an e4m3 midpoint (bf16 V over a per-head descale does, now and then): there the product, an fp32 ulp
    off, picks the neighbour that round-half-even would not; both are equally near."""
    xf = x.float()
    recip = torch.ones_like(descale) / descale
    y = torch.where(descale >= RECIP_MIN_DESCALE, xf * recip, xf / descale)
    return y.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def _prepare_torch(qs, ks, vs, smooth_k, check_finite, key_lens=None, qk_int8=False) -> Fp8Prepared:
    B, Sq, H, D = qs.shape
    Sk = ks.shape[1]
    Sq_pad, Sk_pad = padded_lengths(Sq, Sk)
    dev = qs.device
    # (B, H, S, D) fp32 copies
    qf = qs.transpose(1, 2).float()
    kf = ks.transpose(1, 2).float()
    vf = vs.transpose(1, 2).float()
    if qk_int8:
        qf, kf = rotate_qk(qs.transpose(1, 2), ks.transpose(1, 2))
    # rows of each item's own keys (all Sk without key_lens): only they enter the K mean and the K/V descales
    if key_lens is None:
        keep = torch.ones((B, 1, Sk, 1), dtype=torch.bool, device=dev)
        n_keys = torch.full((B,), float(Sk), dtype=torch.float64, device=dev)
    else:
        n = key_lens.to(dev).long().clamp(0, Sk)
        keep = (torch.arange(Sk, device=dev)[None, :] < n[:, None])[:, None, :, None]
        n_keys = n.double().clamp(min=1)
    k_mean = None
    if smooth_k:
        # exact for 16-bit inputs (e4m3 mode); in INT8 mode a float64 sum of the fp32 K'
        kd = kf.double() if qk_int8 else ks.transpose(1, 2).double()
        ksum = torch.where(keep, kd, 0.0).sum(dim=2)  # (B, H, D)
        # divide by a device tensor, not a Python number: CUDA turns x / scalar into x * (1/scalar)
        k_mean = (ksum / n_keys[:, None, None]).float()
        kf = kf - k_mean[:, :, None, :]
        if qk_int8:
            k_mean = k_mean_original_basis(k_mean)
    amax_k, amax_v = (torch.where(keep, x.abs(), 0.0).amax(dim=(2, 3)) for x in (kf, vf))
    q_scales = None
    if qk_int8:
        q_rows = int8_descale(qf.abs().amax(dim=3))  # (B, H, Sq)
        q_ok = torch.isfinite(q_rows).all(dim=2)
        scales = torch.stack([torch.where(q_ok, 1.0, float("nan")), int8_descale(amax_k),
                              amax_v / torch.tensor(FP8_MAX, dtype=torch.float32, device=dev)], dim=-1)
        scales[..., 2] = torch.where(amax_v == 0, torch.ones_like(amax_v), scales[..., 2])
    else:
        amax = torch.stack([qf.abs().amax(dim=(2, 3)), amax_k, amax_v], dim=-1)  # (B, H, 3)
        scales = amax / torch.tensor(FP8_MAX, dtype=torch.float32, device=dev)
        scales = torch.where(amax == 0, torch.ones_like(scales), scales)
    if check_finite:
        _raise_if_nonfinite(scales)

    def quant(x, i):
        y = x / scales[:, :, i, None, None]
        return y.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8)

    u8 = torch.uint8
    if qk_int8:
        q8 = torch.zeros((B, H, Sq_pad, D), dtype=torch.int8, device=dev)
        q8[:, :, :Sq] = quantize_int8(qf, q_rows[..., None])
        q_scales = torch.ones((B, H, Sq_pad), dtype=torch.float32, device=dev)
        q_scales[:, :, :Sq] = q_rows
        k8 = torch.zeros((B, H, Sk_pad, D), dtype=torch.int8, device=dev)
        k8[:, :, :Sk] = quantize_int8(kf, scales[:, :, 1, None, None])
    else:
        q8 = torch.zeros((B, H, Sq_pad, D), dtype=u8, device=dev)
        q8[:, :, :Sq] = quant(qf, 0)
        k8 = torch.zeros((B, H, Sk_pad, D), dtype=u8, device=dev)
        k8[:, :, :Sk] = quant(kf, 1)
    v8 = torch.zeros((B, H, Sk_pad, D), dtype=u8, device=dev)
    v8[:, :, :Sk] = quantize_v_e4m3(vf, scales[:, :, 2, None, None]).view(u8)
    perm = key_order_for_positions(torch.arange(Sk_pad, device=dev))
    v8t = v8[:, :, perm].transpose(2, 3).contiguous()
    f8 = torch.float8_e4m3fn
    if not qk_int8:
        q8, k8 = q8.view(f8), k8.view(f8)
    return Fp8Prepared(q8, k8, v8t.view(f8), scales, Sq, Sk, k_mean, q_scales=q_scales)


def prep_backend_name(device="cuda") -> str:
    """Which implementation ``fp8_prepare(backend='auto')`` would use on ``device``."""
    return "triton" if triton_available(device)[0] else "torch"


__all__ = [
    "FP8_MAX",
    "INT8_MAX",
    "Fp8Prepared",
    "fp8_prepare",
    "fp8_prepare_prologue",
    "fp8_prepare_torch",
    "int8_descale",
    "k_mean_original_basis",
    "key_order_for_positions",
    "padded_lengths",
    "prep_backend_name",
    "quantize_int8",
    "quantize_v_e4m3",
    "rotate_qk",
    "triton_available",
]
