"""fp8-sm120's native schedule on the GPU we have.  On sm_89 / sm_120 the kernel loads V early and issues its P V
mmas in waves ordered through ``_after`` (two-level accumulation, issue 18); on Hopper it compiles with early V off,
which has no waves, so the GPU tests of test_fp8_kernel_gpu.py never run that code.  Here the native choice is
forced on whatever GPU runs the tests (``default_early_v`` -> True: on sm_90a it spills, which only costs time)
and the outputs are compared with float64 and the emulation: biased V over 32768 keys, Gaussian with LSE (head_dim
64 and 128, a partial last strip), and key masks (the masked last strip has a wave per chunk).  Marked ``gpu``."""

import pytest
import torch

from ditprof.kernels.fp8_config import Fp8Options
from fp8_gpu_cases import GAUSSIAN_REL_RMS, biased_v_inputs, gaussian_inputs, rel_rms

pytestmark = pytest.mark.gpu
SM120 = Fp8Options(kernel="fp8-sm120")  # forced on whatever GPU runs the tests


@pytest.fixture(autouse=True)
def _native_schedule(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from ditprof.kernels import fp8_fwd_sm120, launch_record

    monkeypatch.setattr(fp8_fwd_sm120, "default_early_v", lambda arch: True)
    launch_record.clear_cache()  # compile the forced schedule, not a cached default one
    yield
    launch_record.clear_cache()


def test_biased_v_long_keys():
    from ditprof.kernels.fp8_emulation import fp8_attention_emulated
    from ditprof.kernels.interface import fp8_attention
    from ditprof.kernels.reference import attention_reference

    q, k, v = biased_v_inputs(1, 2, 512, 32768, 128)
    o = fp8_attention(q, k, v, options=SM120)
    err = rel_rms(o, attention_reference(q, k, v))
    print(f"\nbiased V, 32768 keys: rel-RMS vs float64 {err:.4%}")
    assert err < 1e-2, err
    assert rel_rms(o, fp8_attention_emulated(q, k, v)) < 1e-2


@pytest.mark.parametrize("D", [64, 128])
def test_gaussian_with_lse(D):
    from ditprof.kernels.fp8_emulation import fp8_attention_emulated
    from ditprof.kernels.interface import fp8_attention
    from ditprof.kernels.reference import attention_reference

    q, k, v = gaussian_inputs(2, 3, 300, 1000, D, seed=3)  # 1000 keys: the last strip holds 8
    o, lse = fp8_attention(q, k, v, return_lse=True, options=SM120)
    ref = attention_reference(q, k, v)
    emu, emu_lse = fp8_attention_emulated(q, k, v, return_lse=True)
    print(f"\nD={D}: rel-RMS vs float64 {rel_rms(o, ref):.4%}, vs emulation {rel_rms(o, emu):.4%}")
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()
    assert rel_rms(o, ref) <= GAUSSIAN_REL_RMS
    assert rel_rms(o, emu) < 1e-2
    assert (lse - emu_lse).abs().max().item() < 1e-3


def test_key_mask():
    from ditprof.kernels.fp8_emulation import fp8_attention_emulated
    from ditprof.kernels.op import fp8_attention

    q, k, v = gaussian_inputs(3, 4, 200, 480, 128, seed=4)
    lengths = [480, 301, 97]  # all keys; a partial last strip; one valid key in the last strip
    key_mask = torch.arange(480, device="cuda")[None, :] < torch.tensor(lengths, device="cuda")[:, None]
    o = fp8_attention(q, k, v, key_mask=key_mask, options=SM120)
    emu = fp8_attention_emulated(q, k, v, key_mask=key_mask)
    for b in range(3):
        assert torch.isfinite(o[b]).all(), b
        assert rel_rms(o[b], emu[b]) < 1e-2, b
