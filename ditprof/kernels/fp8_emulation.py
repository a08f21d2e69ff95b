"""``fp8-emulated``: our FP8 attention kernel's numerics in plain torch (CPU and CUDA).

This pins the numbers of docs/ARCHITECTURE.md "FP8 numerics", which the CuTe DSL kernel and the prep follow:

1. Per (batch, head): with ``smooth_k``, K <- fp32(K - mean_k), mean_k = fp32(sum_fp64(K over the true tokens)
   / Sk) per channel (softmax-invariant: it shifts every score of a query row by the same q . mean_k).
   descale_x = fp32(amax|X| / 448) (1.0 where amax == 0); X8 = e4m3(clamp(X / descale_x, +-448)), IEEE
   division, round to nearest even (``quantize_per_head``, ``smooth_k``; the prep's tests compare against these);
   V8 by the reciprocal instead, e4m3(clamp(V * fp32(1 / descale_v), +-448)) (``prep.quantize_v_e4m3``).
2. qk_scale = descale_q * descale_k * fp32(softmax_scale * log2(e)); S = (Q8 K8^T) * qk_scale in fp32, so the
   softmax runs in the exp2 domain.
3. Keys in strips of 32, natural order. Per strip: m_new = max(m, rowmax S); alpha = exp2(m - m_new);
   P = exp2(S - m_new) in fp32; l = l * alpha + rowsum(P) (fp32 P, before rounding);
   O = O * alpha + e4m3(P * 256) @ V8 with fp32 accumulation. The x256 lifts P in [0, 1] out of e4m3's
   subnormal range. Two-level, as fp8-sm120 does it: each strip's product is computed from zero (every P V mma
   issued with C = 0) and added to the fp32 O, never accumulated into O inside the tensor core (``acc_bits`` /
   ``acc_promote`` model a narrow accumulator). The kernel masks keys >= Sk of the last strip to -inf (P = 0
   exactly); here the last strip is simply shorter, which gives the same sums (the masked terms are exact zeros).
4. O = O * ((descale_v / 256) / l) -> q's dtype (one multiply, as the kernel's epilogue does it).
   LSE (natural log) = m / log2(e) + ln(l); with smoothing this is the LSE of the *smoothed* scores, so we add
   softmax_scale * (q . mean_k) (fp32) to return the LSE of the scores the caller asked for.

INT8 Q/K (``qk_format="int8"``): Q and K Hadamard-rotated by the +-1 matrix of
``rotation.rotation_pm1`` (Q' = Q Rpm1 / D, K' = K Rpm1), K smoothed in that basis, Q int8 per token, K int8 per
head, V e4m3 as above; the quantization is the prep's own (``prep.rotate_qk``, ``int8_descale``, ``quantize_int8``).
It is as accurate as e4m3 or more on every input kind measured, by far on outlier-heavy inputs.

Not bit-exact with the GPU kernel (ex2.approx vs exp2, MMA summation order), but close: a flipped e4m3 rounding
of one P element is the typical difference.

Accuracy vs the float64 reference (rel-RMS = ||o - ref|| / ||ref||, cosine over the flattened output; the measured
tables are in benchmarks/NOTES.md): tests/test_fp8_emulation.py bounds gaussian and smoothed k_bias inputs to
rel-RMS <= 5.5% with cosine >= 0.998 (the accuracy goals), unsmoothed k_bias to >= 15% (smoothing matters),
peaky inputs (q x3) to <= 10% with cosine >= 0.995 (peaky misses the 0.998 cosine goal: tripled scores triple the
effect of Q/K rounding on the exponent; it grows slowly with Sk).

Memory: the strip loop never builds an (Sq, Sk) score matrix; per-strip temporaries are (B, H, Sq, 32) and
queries are processed in chunks of at most ~``_CHUNK_BYTES`` of fp32 output each.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ditprof.errors import DitprofError
from ditprof.kernels.checks import check_key_mask, check_qkv
from ditprof.kernels.qk_format import QK_FORMATS
from ditprof.kernels.qk_format import qk_format as process_qk_format
from ditprof.kernels.registry import register
from ditprof.kernels.rotation import hadamard_rotation

FP8_MAX = 448.0
STRIP = 32
P_SCALE = 256.0
LOG2E = math.log2(math.e)
FP8 = torch.float8_e4m3fn
INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_NAMES = ("q", "k", "v")
_CHUNK_BYTES = 1 << 30  # fp32 O bytes per query chunk


# ------------------------------------------------------------------------------------------ quantization

def smooth_k(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """K (B, H, Sk, D) of true tokens only -> (fp32 K - mean_k, mean_k (B, H, D) fp32).

    The sum is float64 (exact for bf16/fp16 values in practice, so the mean does not depend on the summation
    order); divided by a float64 tensor, not a Python number (CUDA would turn x / c into x * (1/c)).
    """
    total = k.double().sum(dim=2)
    count = torch.tensor(float(k.shape[2]), dtype=torch.float64, device=k.device)
    mean = (total / count).float()
    return k.float() - mean[:, :, None, :], mean


def descale_per_head(x: torch.Tensor) -> torch.Tensor:
    """(B, H, S, D) -> fp32 (B, H): amax|x| / 448, 1.0 where the head is all zeros; NaN/Inf propagate."""
    amax = x.float().abs().amax(dim=(2, 3))
    descale = amax / torch.tensor(FP8_MAX, dtype=torch.float32, device=x.device)
    return torch.where(amax == 0, torch.ones_like(descale), descale)


def quantize_per_head(x: torch.Tensor, descale: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, H, S, D) -> (e4m3 (B, H, S, D), fp32 descale (B, H)); x ~= x8.float() * descale."""
    if descale is None:
        descale = descale_per_head(x)
    scaled = x.float() / descale[:, :, None, None]
    # clamp = saturation: a quotient a rounding step above 448 must not become NaN
    return scaled.clamp(-FP8_MAX, FP8_MAX).to(FP8), descale


# ------------------------------------------------------------------------------------------ validation

def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Shapes, dtypes and devices the emulation takes (any device, fp32 too); one-line DitprofError otherwise."""
    check_qkv(q, k, v, who="fp8-emulated", dtypes=INPUT_DTYPES)


def _raise_if_nonfinite(descales: torch.Tensor) -> None:
    """NaN/Inf anywhere in a head makes its amax (hence descale) non-finite; one host sync for all three."""
    bad = (~torch.isfinite(descales)).reshape(-1, 3).any(dim=0).tolist()
    for name, flag in zip(_NAMES, bad):
        if flag:
            raise DitprofError(f"{name} contains NaN/Inf")


# ------------------------------------------------------------------------------------------ attention

def truncate_mantissa(x: torch.Tensor, bits: int) -> torch.Tensor:
    """``x`` (fp32) cut to ``bits`` explicit mantissa bits, rounding toward zero: an MMA accumulator narrower than
    fp32's 23 bits that aligns its addends and drops what falls below its last bit (Ada / consumer Blackwell FP8
    mma.sync keep about 13: SageAttention2's "FP22", thu-ml/SageAttention#287). Round-to-nearest would hide the
    systematic loss that grows with the number of strips."""
    m, e = torch.frexp(x)
    step = float(2 ** (bits + 1))  # frexp's mantissa is in [0.5, 1): bits + 1 significant bits
    return torch.ldexp(torch.trunc(m * step) / step, e)


def _strip_softmax(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, qk_scale: torch.Tensor,
                   acc_bits: Optional[int] = None, acc_promote: bool = True):
    """Online softmax over 32-key strips. q8 (B,H,n,D), k8/v8 (B,H,Sk,D) e4m3 (or int8 Q/K) values as fp32,
    qk_scale (B,H,1,1) or per query row (B,H,n,1).
    Returns unnormalised O (B,H,n,D) and the row state m (log2 domain), l, both (B,H,n).

    ``acc_bits`` models the P V MMA's accumulator: each strip's P8 @ V8 is cut to that many mantissa bits (one
    MMA's output, ``truncate_mantissa``). ``acc_promote=False``: O itself lives in that accumulator -- O <-
    trunc(O * alpha + P8 @ V8), the earlier mma.sync kernel's accumulation across strips; True (the
    default): each strip's product, from a fresh accumulator, is added to an FP32 O rescaled in FP32 -- O <-
    O * alpha + trunc(P8 @ V8), two-level accumulation as fp8-sm120 does it now (one strip per fresh accumulator,
    ``fp8_fwd_sm120.PV_ACC_STRIPS`` = 1: FMUL then FADD, the same two roundings as here)."""
    B, H, n, D = q8.shape
    Sk = k8.shape[2]
    o = torch.zeros((B, H, n, D), dtype=torch.float32, device=q8.device)
    m = torch.full((B, H, n), float("-inf"), dtype=torch.float32, device=q8.device)
    l = torch.zeros((B, H, n), dtype=torch.float32, device=q8.device)
    for start in range(0, Sk, STRIP):
        keys = slice(start, min(start + STRIP, Sk))
        # fp32 matmuls of e4m3 values: the inputs are exact even if TF32 is allowed (3 mantissa bits < 10); of int8
        # values: every partial sum is an integer below D * 127^2 < 2^24, exact too
        s = torch.matmul(q8, k8[:, :, keys].transpose(-1, -2)).mul_(qk_scale)
        # every strip has >= 1 real key, so m_new is finite and alpha = exp2(-inf) = 0 on the first strip
        m_new = torch.maximum(m, s.amax(dim=-1))
        alpha = torch.exp2(m - m_new)
        p = torch.exp2(s.sub_(m_new[..., None]))
        l = l * alpha + p.sum(dim=-1)
        p8 = p.mul_(P_SCALE).to(FP8).float()
        pv = torch.matmul(p8, v8[:, :, keys])
        if acc_bits is None:
            o.mul_(alpha[..., None]).add_(pv)
        elif acc_promote:
            o.mul_(alpha[..., None]).add_(truncate_mantissa(pv, acc_bits))
        else:
            o = truncate_mantissa(o.mul_(alpha[..., None]).add_(pv), acc_bits)
        m = m_new
    return o, m, l


def fp8_attention_emulated(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: Optional[float] = None,
                           smooth_k: bool = True, return_lse: bool = False,
                           key_mask: Optional[torch.Tensor] = None, acc_bits: Optional[int] = None,
                           acc_promote: bool = True, rotate_qk: bool = False, qk_format: Optional[str] = None):
    """FP8 attention numerics. q (B, Sq, H, D), k and v (B, Sk, H, D), bf16/fp16/fp32, any device.

    ``key_mask`` (B, Sk) bool: only the keys marked True take part, per batch item (a padded prompt) -- their
    mean for the smoothing, their amax for the descales and their scores, exactly as if the others were absent.
    ``acc_bits`` / ``acc_promote``: the P V accumulator model of ``_strip_softmax`` (None: exact fp32).
    ``rotate_qk``: Q and K rotated by ``hadamard_rotation`` (in fp32, before smoothing and quantization; e4m3 only).
    ``qk_format``: None (the process default for this head_dim, ``kernels.qk_format``; e4m3 with ``rotate_qk``),
    "e4m3" (per-head e4m3 Q/K, the first kernels' format) or "int8": the prep's INT8 Q/K mode
    (``prep.fp8_prepare(qk_int8=True)``): Q' = fp32(Q Rpm1) / D, K' = fp32(K Rpm1) (``prep.rotate_qk``),
    K' smoothed in the rotated basis, Q int8 with one scale per token, K int8 with one per head
    (``prep.int8_descale`` / ``prep.quantize_int8``), V e4m3 as always; S = (q8 k8^T) exactly (integers below
    2^24) times fp32((q_scale_row * descale_k) * softmax_scale * log2(e)). The LSE correction uses the mean in the
    original basis (``prep.k_mean_original_basis``), as ``interface`` does with the prep's ``k_mean``.
    Returns o (B, Sq, H, D) in q's dtype, and with ``return_lse`` also the natural-log LSE, fp32 (B, H, Sq).
    """
    qk_format = _checked_qk_format(q, rotate_qk, qk_format)
    check_inputs(q, k, v)
    if key_mask is not None:
        check_key_mask(key_mask, k)
        if bool(key_mask.all()):
            key_mask = None  # every key: the unmasked path
    if key_mask is not None:  # one batch item at a time, over its own keys
        return _per_item(q, k, v, key_mask, return_lse, scale=scale, smooth_k=smooth_k, acc_bits=acc_bits,
                         acc_promote=acc_promote, rotate_qk=rotate_qk, qk_format=qk_format)
    B, Sq, H, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    qf, kf, vf = (x.transpose(1, 2).float() for x in (q, k, v))  # (B, H, S, D)
    softmax_scale_log2 = torch.tensor(scale * LOG2E, dtype=torch.float32, device=q.device)
    if qk_format == "int8":
        q8, k8, qk_scale, dv, k_mean = _quantize_qk_int8(q, k, vf, smooth_k, softmax_scale_log2)
    else:
        qf, q8, k8, qk_scale, dv, k_mean = _quantize_qk_e4m3(qf, kf, vf, rotate_qk, smooth_k, softmax_scale_log2)
    from ditprof.kernels.prep import quantize_v_e4m3

    v8 = quantize_v_e4m3(vf, dv[:, :, None, None]).float()
    pv_scale = dv / torch.tensor(P_SCALE, dtype=torch.float32, device=q.device)
    out, lse = _attend(q8, k8, v8, qk_scale, pv_scale, acc_bits, acc_promote, return_lse)
    if lse is not None and k_mean is not None:
        lse += scale * torch.matmul(qf, k_mean[..., None]).squeeze(-1)
    out = out.to(q.dtype).transpose(1, 2).contiguous()
    return (out, lse) if return_lse else out


def _checked_qk_format(q: torch.Tensor, rotate_qk: bool, qk_format: Optional[str]) -> str:
    """The Q/K format a call runs (None: the process default for q's head_dim; e4m3 with ``rotate_qk``), checked."""
    if qk_format is None:
        qk_format = "e4m3" if rotate_qk else process_qk_format(head_dim=q.shape[-1])
    if qk_format not in QK_FORMATS:
        raise DitprofError(f"qk_format must be 'e4m3' or 'int8', got {qk_format!r}")
    if rotate_qk and qk_format == "int8":
        raise DitprofError("rotate_qk is the e4m3 emulation's rotation; qk_format='int8' always rotates")
    return qk_format


def _per_item(q, k, v, key_mask, return_lse: bool, **kwargs):
    """The emulation of each batch item over its own keys (``key_mask[b]``), concatenated along the batch."""
    if not bool(key_mask.any(dim=-1).all()):
        raise DitprofError("key_mask masks every key of a batch item")
    parts = [fp8_attention_emulated(q[b:b + 1], k[b:b + 1, key_mask[b]], v[b:b + 1, key_mask[b]],
                                    return_lse=return_lse, **kwargs)
             for b in range(q.shape[0])]
    if not return_lse:
        return torch.cat(parts, dim=0)
    return torch.cat([p[0] for p in parts], dim=0), torch.cat([p[1] for p in parts], dim=0)


def _quantize_qk_int8(q, k, vf, smooth_k: bool, softmax_scale_log2):
    """The prep's INT8 Q/K mode: (q8, k8 as fp32, qk_scale (B, H, Sq, 1), V's descale, k_mean in the original basis
    or None)."""
    from ditprof.kernels import prep

    qr, kr = prep.rotate_qk(q.transpose(1, 2), k.transpose(1, 2))
    k_mean = None
    if smooth_k:
        kr, mu_rot = _smooth_keys(kr)
        k_mean = prep.k_mean_original_basis(mu_rot)
    q_scales = prep.int8_descale(qr.abs().amax(dim=3))  # (B, H, Sq)
    dq = torch.where(torch.isfinite(q_scales).all(dim=2), 1.0, float("nan"))
    dk = prep.int8_descale(kr.abs().amax(dim=(2, 3)))
    dv = descale_per_head(vf)
    _raise_if_nonfinite(torch.stack([dq, dk, dv], dim=-1))
    q8 = prep.quantize_int8(qr, q_scales[..., None]).float()
    k8 = prep.quantize_int8(kr, dk[:, :, None, None]).float()
    qk_scale = ((q_scales * dk[:, :, None]) * softmax_scale_log2)[..., None]  # (B, H, Sq, 1)
    return q8, k8, qk_scale, dv, k_mean


def _quantize_qk_e4m3(qf, kf, vf, rotate_qk: bool, smooth_k: bool, softmax_scale_log2):
    """Per-head e4m3 Q/K (optionally rotated first): (Q as the LSE correction sees it, q8, k8 as fp32, qk_scale
    (B, H, Sq, 1), V's descale, k_mean or None)."""
    B, H, Sq, D = qf.shape
    if rotate_qk:
        rot = hadamard_rotation(D, device=qf.device)
        qf, kf = qf @ rot, kf @ rot
    k_mean = None
    if smooth_k:
        kf, k_mean = _smooth_keys(kf)
    descales = torch.stack([descale_per_head(x) for x in (qf, kf, vf)], dim=-1)  # (B, H, 3)
    _raise_if_nonfinite(descales)
    dq, dk, dv = descales.unbind(-1)
    q8 = quantize_per_head(qf, dq)[0].float()
    k8 = quantize_per_head(kf, dk)[0].float()
    qk_scale = (dq * dk * softmax_scale_log2)[:, :, None, None].expand(B, H, Sq, 1)
    return qf, q8, k8, qk_scale, dv, k_mean


def _attend(q8, k8, v8, qk_scale, pv_scale, acc_bits, acc_promote: bool, return_lse: bool):
    """The strip softmax in query chunks of at most ``_CHUNK_BYTES`` of fp32 output: normalised O (B, H, Sq, D)
    fp32 and the natural-log LSE (B, H, Sq) of the (smoothed) scores, or None."""
    B, H, Sq, D = q8.shape
    out = torch.empty((B, H, Sq, D), dtype=torch.float32, device=q8.device)
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q8.device) if return_lse else None
    chunk = max(1, _CHUNK_BYTES // (4 * B * H * D))
    for start in range(0, Sq, chunk):
        rows = slice(start, min(start + chunk, Sq))
        o, m, l = _strip_softmax(q8[:, :, rows], k8, v8, qk_scale[:, :, rows], acc_bits, acc_promote)
        out[:, :, rows] = o * (pv_scale[:, :, None] / l)[..., None]
        if lse is not None:
            lse[:, :, rows] = m / LOG2E + torch.log(l)
    return out, lse


# hadamard_rotation is re-exported from here: the one definition lives in rotation.py
_smooth_keys = smooth_k  # the function, under a name the `smooth_k` flag does not shadow


@register("fp8-emulated", description="FP8 kernel numerics emulated in torch (Q/K e4m3 or rotated INT8 as "
          "DITPROF_FP8_QK says, e4m3 V, P x256 per 32-key strip, fp32 accumulate); runs anywhere, slowly",
          numerics_only=True, qk_format=lambda head_dim: process_qk_format(head_dim=head_dim))
def fp8_emulated_backend(q, k, v, *, scale=None, key_mask=None):
    return fp8_attention_emulated(q, k, v, scale=scale, key_mask=key_mask,
                                  qk_format=process_qk_format(head_dim=q.shape[-1]))


__all__ = [
    "FP8_MAX",
    "P_SCALE",
    "STRIP",
    "check_inputs",
    "descale_per_head",
    "fp8_attention_emulated",
    "hadamard_rotation",
    "quantize_per_head",
    "truncate_mantissa",
    "smooth_k",
]
