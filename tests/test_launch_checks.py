"""CPU checks of ``kernels.launch.launch_compiled``'s argument checks (they run before anything is launched)."""

from __future__ import annotations

import pytest
import torch

from ditprof.errors import DitprofError
from ditprof.kernels.launch import KernelSpec, launch_compiled


def _never_called(*args, **kwargs):
    raise AssertionError("the kernel must not be called")


def _args(out):
    B, H, S, D = 1, 2, 64, 128
    q8 = torch.zeros((B, H, 128, D), dtype=torch.uint8)
    k8 = torch.zeros((B, H, 64, D), dtype=torch.uint8)
    v8t = torch.zeros((B, H, D, 64), dtype=torch.uint8)
    scales = torch.ones((B, H, 3))
    lse = torch.empty((B, H, S))
    return (q8, k8, v8t, scales, None, None, out, lse, B, H, S, S, 0.1, 0)


def test_fp8_sm90_rejects_a_misaligned_out():
    spec = KernelSpec("fp8-sm90", "sm_90a", 128, "bfloat16", True, False, False, False)
    buf = torch.empty(1 * 64 * 2 * 128 + 1, dtype=torch.bfloat16)
    out = buf[1:].view(1, 64, 2, 128)  # 2 bytes past an aligned allocation
    assert out.data_ptr() % 16 == 2
    with pytest.raises(DitprofError, match="16-byte aligned"):
        launch_compiled(spec, _never_called, *_args(out))


def test_int8_spec_needs_q_scales():
    spec = KernelSpec("fp8-sm90", "sm_90a", 128, "bfloat16", True, False, False, True)
    out = torch.empty((1, 64, 2, 128), dtype=torch.bfloat16)
    with pytest.raises(DitprofError, match="q_scales"):
        launch_compiled(spec, _never_called, *_args(out))
