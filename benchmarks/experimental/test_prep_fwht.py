"""``prep_fwht.quantize_qk_fwht`` against the shipped INT8 prep (same stats launch, same buffers): the Q descales
equal to a few ulps, the codes within one step (fp32 butterfly sums vs the dot's order), rows past S zero; under the
Triton interpreter on the CPU, and on the GPU.

    python -m pytest -q benchmarks/experimental/test_prep_fwht.py
"""

from __future__ import annotations

import pytest
import torch
from triton_interpreter import inner_only, run_under_interpreter

SHAPES = [(1, 300, 2, 64), (2, 77, 3, 128), (1, 129, 1, 16)]


def _check(shape, device, rows, block):
    from prep_fwht import quantize_qk_fwht

    from ditprof.kernels.prep_triton import PrepPlan

    B, S, H, D = shape
    g = torch.Generator(device="cpu").manual_seed(S + D)
    q, k, v = ((torch.randn((B, S, H, D), generator=g) * 2 + (1.5 if i == 1 else 0.0)).to(torch.bfloat16).to(device)
               for i in range(3))
    plan = PrepPlan(q, k, v, True, qk_int8=True)
    ref = plan.buffers(device)
    plan.launch(q, k, v, ref, None)
    ours = dict(ref)
    ours["q8"] = torch.full_like(ref["q8"], 99)
    ours["k8"] = torch.full_like(ref["k8"], 99)
    ours["q_scales"] = torch.full_like(ref["q_scales"], float("nan"))
    quantize_qk_fwht(plan, q, k, ours, rows=rows, block=block)
    if device != "cpu":
        torch.cuda.synchronize()
    assert torch.isfinite(ours["q_scales"]).all()
    assert torch.allclose(ours["q_scales"], ref["q_scales"], rtol=1e-5, atol=0)
    for name in ("q8", "k8"):
        diff = (ours[name].int() - ref[name].int()).abs()
        assert diff.max().item() <= 1, (name, diff.max().item())
        assert diff.float().mean().item() < 0.02, (name, diff.float().mean().item())
        assert (ours[name][:, :, S:] == 0).all()  # pad rows


def test_fwht_under_the_interpreter():
    run_under_interpreter(__file__, "test_fwht_inner")


@inner_only()
@pytest.mark.parametrize("shape", SHAPES, ids=[str(s) for s in SHAPES])
def test_fwht_inner(shape):
    _check(shape, "cpu", rows=64, block=32)


@pytest.mark.gpu
@pytest.mark.parametrize("rows,block", [(256, 32), (512, 64), (128, 16)])
@pytest.mark.parametrize("shape", SHAPES + [(1, 4608, 24, 128)], ids=[str(s) for s in SHAPES] + ["flux"])
def test_fwht_gpu(shape, rows, block):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    _check(shape, "cuda", rows=rows, block=block)
