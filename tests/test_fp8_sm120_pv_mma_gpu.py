"""fp8-sm120's ``pv_mma="block_scaled"`` build against the ``"f32"`` one, output and LSE bit for bit, on an sm_120a /
sm_121a GPU (int8 Q/K inputs of test_fp8_sm120_int8_gpu, compiled and launched directly): with unit scales the
block-scaled mma is to give the same products and FP32 result.  Skipped on other GPUs (the instruction is
arch-specific; its register plumbing is checked on the CPU by test_fp8_sm120_pv_mma_sass).  Marked ``gpu``."""

import pytest
import torch

from test_fp8_sm120_int8_gpu import _ARCHS, _inputs, _launch

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _sm12x():
    from ditprof.kernels.fp8_fwd_sm120 import BLOCK_SCALED_ARCHS

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if _ARCHS.get(torch.cuda.get_device_capability()) not in BLOCK_SCALED_ARCHS:
        pytest.skip("the block-scaled mma runs on sm_120a / sm_121a only")


@pytest.mark.parametrize("D", [64, 128])
def test_block_scaled_matches_f32_bitwise(D):
    from ditprof.kernels import fp8_fwd_sm120 as K

    arch = _ARCHS[torch.cuda.get_device_capability()]
    f32, bs = (K.compile_fp8_fwd(arch, D, "bfloat16", write_lse=True, qk_int8=True, pv_mma=p)
               for p in ("f32", "block_scaled"))
    x = _inputs(2, 3, 200, 333, D, seed=D)
    out_f32, lse_f32 = _launch(f32, x, D ** -0.5, True)
    out_bs, lse_bs = _launch(bs, x, D ** -0.5, True)
    assert not out_f32.isnan().any() and not lse_f32.isnan().any()
    assert torch.equal(out_bs.view(torch.int16), out_f32.view(torch.int16))
    assert torch.equal(lse_bs.view(torch.int32), lse_f32.view(torch.int32))
