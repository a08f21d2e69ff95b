"""fp8-sm90 INT8 with Q rotated and quantized in the kernel (``q_rot``: the prep skips Q) on an sm_90 GPU, launched
through ``launch_compiled`` (both launch paths: TVM-FFI and cute's JIT), on fresh random inputs (never zeros),
outputs and LSE poisoned with NaN before each run (every element must be written, and be finite):

- against float64 within issue 18's goals (gaussian, a K bias, a V bias);
- against the shipped INT8 kernel on the shipped prep of the same inputs: the K and V codes are the same (the prep
  with ``skip_q`` runs the same K and V programs: checked bit for bit); Q's codes come from the tensor cores' fp32
  sum in another order than the prep's ``tl.dot``, so a code may be one off where Q'/descale is within an ulp of a
  half-integer -- the outputs agree to fp32 / one-code level, not bit for bit.

Shapes: a partial last query block (rows >= Sq read as zeros), ragged Sk, head_dim 64 and 128, B = 2, cross-attention,
bf16 and fp16. Marked ``gpu``; skipped without CUDA and on GPUs other than sm_90.

    python -m pytest -q -s -m gpu tests/test_fp8_sm90_qrot_gpu.py
"""

from __future__ import annotations

import math

import pytest
import torch

pytestmark = pytest.mark.gpu

# (B, H, Sq, Sk, D)
SHAPES = {
    "s3001": (1, 4, 3001, 3001, 128),  # ragged: the last query block and the last key tile partial
    "b2d64": (2, 3, 1000, 777, 64),
    "cross4096x333": (1, 8, 4096, 333, 128),
    "cross200x5000d64": (1, 4, 200, 5000, 64),  # one query block, 200 of its 192 * 3 rows real
}
GOALS = {"gaussian": 0.055, "k_bias": 0.06, "v_bias": 0.005}  # issue 18, rel-RMS vs float64
VS_SHIPPED = 5e-3  # rel-RMS between the variant and the shipped kernel (one-off Q codes, flipped P roundings)
LSE_VS_SHIPPED = 5e-3  # median |LSE difference|


def _need_sm90():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU (H100/H200)")


def _inputs(kind: str, B, H, sq, sk, D, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn((B, sq, H, D), generator=g, device="cuda")
    k = torch.randn((B, sk, H, D), generator=g, device="cuda")
    v = torch.randn((B, sk, H, D), generator=g, device="cuda")
    if kind == "k_bias":
        k = k + 3.0 * torch.randn((1, 1, H, D), generator=g, device="cuda")
    if kind == "v_bias":
        v = v + 4.0
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _prep(q, k, v, skip_q: bool):
    from ditprof.kernels.prep_triton import PrepPlan

    plan = PrepPlan(q, k, v, True, qk_int8=True, skip_q=skip_q)
    bufs = plan.buffers(q.device)
    plan.launch(q, k, v, bufs)
    return plan, bufs


def _outputs(B, H, sq, D, dtype):
    o = torch.full((B, sq, H, D), float("nan"), dtype=dtype, device="cuda")
    lse = torch.full((B, H, sq), float("nan"), dtype=torch.float32, device="cuda")
    return o, lse


def _run_shipped(q, k, v, scale):
    from ditprof.kernels.compile_cache import DTYPE_NAMES, KernelSpec, compiled
    from ditprof.kernels.kernel_args import launch_compiled, tvm_ffi_launch_enabled

    B, sq, H, D = q.shape
    sk = k.shape[1]
    _, b = _prep(q, k, v, skip_q=False)
    o, lse = _outputs(B, H, sq, D, q.dtype)
    # the shipped INT8 build with the prep's Q (fp8-sm90 always writes its LSE and launches through TVM-FFI
    # where it can)
    spec = KernelSpec("fp8-sm90", "sm_90a", D, DTYPE_NAMES[q.dtype], True, False, tvm_ffi_launch_enabled(), True)
    launch_compiled(spec, compiled(spec), b["q8"], b["k8"], b["v8t"], b["scales"], b["q_scales"], None, o, lse,
                    B, H, sq, sk, scale, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    return o, lse, b


def _run_variant(q, k, v, scale, tvm_ffi=None):
    from ditprof.kernels.compile_cache import DTYPE_NAMES, KernelSpec, compiled
    from ditprof.kernels.kernel_args import launch_compiled
    from ditprof.kernels.launch_record import rotation_t

    B, sq, H, D = q.shape
    sk = k.shape[1]
    _, b = _prep(q, k, v, skip_q=True)
    o, lse = _outputs(B, H, sq, D, q.dtype)
    spec = KernelSpec("fp8-sm90", "sm_90a", D, DTYPE_NAMES[q.dtype], True, False, bool(tvm_ffi), True, q_rot=True)
    launch_compiled(spec, compiled(spec), q, b["k8"], b["v8t"], b["scales"], rotation_t(D, q.dtype, q.device), None,
                    o, lse, B, H, sq, sk, scale, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    return o, lse, b


def _rel_rms(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("kind", list(GOALS))
def test_qrot_vs_float64_and_shipped(shape, kind):
    _need_sm90()
    from ditprof.kernels.reference import attention_reference

    B, H, sq, sk, D = SHAPES[shape]
    q, k, v = _inputs(kind, B, H, sq, sk, D, torch.bfloat16, seed=hash((shape, kind)) % 1000)
    scale = 1.0 / math.sqrt(D)
    o, lse, bv = _run_variant(q, k, v, scale)
    assert torch.isfinite(o).all() and torch.isfinite(lse).all(), "an output element was not written"
    ref, ref_lse = attention_reference(q, k, v, scale, return_lse=True)
    err = _rel_rms(o, ref)
    assert err < GOALS[kind], (shape, kind, err)
    # the kernel's LSE is that of the smoothed scores (K - mean): add scale * q . mean back
    corr = scale * torch.einsum("bshd,bhd->bhs", q.double(), bv["k_mean"].double())
    assert (lse.double() + corr - ref_lse).abs().median().item() < 0.02
    o2, lse2, bs = _run_shipped(q, k, v, scale)
    # the same K and V codes and descales (skip_q leaves the K/V programs as they are)
    assert torch.equal(bv["k8"], bs["k8"]) and torch.equal(bv["v8t"].view(torch.uint8), bs["v8t"].view(torch.uint8))
    assert torch.equal(bv["scales"][..., 1:], bs["scales"][..., 1:])
    d = _rel_rms(o, o2)
    assert d < VS_SHIPPED, (shape, kind, d, err)
    assert (lse - lse2).abs().median().item() < LSE_VS_SHIPPED
    print(f"{shape} {kind}: vs float64 {err:.4%} (shipped {_rel_rms(o2, ref):.4%}), vs shipped {d:.2e}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_qrot_fp16_and_jit_launch(dtype):
    _need_sm90()
    from ditprof.kernels.reference import attention_reference

    q, k, v = _inputs("gaussian", 1, 4, 777, 1500, 128, dtype, seed=7)
    scale = 0.1
    from ditprof.kernels.kernel_args import tvm_ffi_launch_enabled

    for tvm_ffi in (False, True) if tvm_ffi_launch_enabled() else (False,):
        o, lse, _ = _run_variant(q, k, v, scale, tvm_ffi=tvm_ffi)
        assert torch.isfinite(o).all() and torch.isfinite(lse).all()
        assert _rel_rms(o, attention_reference(q, k, v, scale)) < GOALS["gaussian"]
