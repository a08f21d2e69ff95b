"""Issue 20 lever 1 end to end: the single-pass prep (``prep_single_pass.py``) feeding the tile-scales kernel
(``fp8_fwd_sm90_tile_scales.py``).

CPU: the two experiments were written against one contract; their torch references must give the same bytes (the
prep's ``prepare_single_pass_torch`` and the kernel tests' ``make_tile_scaled_inputs``), so the kernel's tests on
the latter hold for the prep's outputs.
GPU (marked ``gpu``, sm_90 only): the Triton prep's outputs through the kernel, output poisoned with NaN first: every
element written and finite, within issue 18's goals against float64, and against the kernel's torch model on the
same codes within that model's stated tolerance.
"""

from __future__ import annotations

import pytest
import torch

from fp8_fwd_sm90_tile_scales import make_tile_scaled_inputs
from prep_single_pass import prepare_single_pass_torch

CONTRACT = ("q8", "k8", "v8t", "q_scales", "k_tile_scales", "v_tile_scales", "k_mean")


def _inputs(B, Sq, Sk, H, D, seed, k_bias=0.0, v_bias=0.0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Sq, H, D, generator=g)
    k = torch.randn(B, Sk, H, D, generator=g) + k_bias * torch.randn(1, 1, H, D, generator=g)
    v = torch.randn(B, Sk, H, D, generator=g) + v_bias
    return tuple(x.to(torch.bfloat16).to(device) for x in (q, k, v))


@pytest.mark.parametrize("shape,k_bias,v_bias", [((2, 333, 401, 3, 128), 4.0, 0.0), ((1, 100, 1000, 2, 64), 0.0, 8.0),
                                                 ((1, 1, 1, 1, 128), 0.0, 0.0)], ids=["kbias", "vbias-d64", "one"])
def test_the_two_torch_references_agree(shape, k_bias, v_bias):
    q, k, v = _inputs(*shape, seed=sum(shape), k_bias=k_bias, v_bias=v_bias)
    a = prepare_single_pass_torch(q, k, v)
    b = make_tile_scaled_inputs(q, k, v)
    for name in CONTRACT:
        x, y = a[name], b[name]
        assert x.dtype == y.dtype and x.shape == y.shape, (name, x.dtype, x.shape, y.dtype, y.shape)
        assert torch.equal(x.view(torch.uint8) if x.dtype == torch.float8_e4m3fn else x,
                           y.view(torch.uint8) if y.dtype == torch.float8_e4m3fn else y), name


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["gaussian", "k_bias", "v_bias"])
@pytest.mark.parametrize("shape", [(1, 3001, 3001, 4, 128), (2, 1000, 777, 3, 64)], ids=["s3001", "b2d64"])
def test_gpu_prep_through_the_kernel(shape, kind):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU (H100/H200)")
    from fp8_fwd_sm90_tile_scales import run_tile_scales, tile_scales_model
    from prep_single_pass import prepare_single_pass

    from ditprof.kernels.reference import attention_reference
    from fp8_gpu_cases import rel_rms

    B, Sq, Sk, H, D = shape
    q, k, v = _inputs(*shape, seed=7, k_bias=4.0 if kind == "k_bias" else 0.0,
                      v_bias=8.0 if kind == "v_bias" else 0.0, device="cuda")
    scale = D ** -0.5
    p = prepare_single_pass(q, k, v)
    o = torch.full_like(q, float("nan"))
    lse = torch.full((B, H, Sq), float("nan"), dtype=torch.float32, device="cuda")
    run_tile_scales(p["q8"], p["k8"], p["v8t"], p["q_scales"], p["k_tile_scales"], p["v_tile_scales"], Sq, Sk,
                    scale, o, lse)
    torch.cuda.synchronize()
    assert torch.isfinite(o).all() and torch.isfinite(lse).all(), "output or LSE not fully written"
    goal = {"gaussian": 0.055, "k_bias": 0.06, "v_bias": 0.005}[kind]
    err = rel_rms(o, attention_reference(q, k, v, scale=scale))
    print(f"{kind} {shape}: rel-RMS vs float64 {err:.4%}")
    assert err <= goal, (kind, err)
    model_o, _model_lse = tile_scales_model(p["q8"], p["q_scales"], p["k8"], p["k_tile_scales"], p["v8t"],
                                            p["v_tile_scales"], scale, sq=Sq, sk=Sk)
    assert rel_rms(o, model_o) <= 2e-3  # the kernel tests' MODEL_REL_RMS: flipped e4m3 P roundings only
