"""The op on CUDA (our kernel): vs a float64 reference with prefix key masks of random length per batch item
(padded keys poisoned, a fully masked tail tile), the output poisoned before the run; compiled with inductor."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.mark.parametrize("Sk", [300, 1000])
def test_op_key_masks_vs_float64(Sk):
    _cuda()
    from ditprof.kernels.op import fp8_attention
    from ditprof.kernels.reference import attention_reference

    g = torch.Generator().manual_seed(Sk)
    B, Sq, H, D = 3, 200, 4, 128
    q, k, v = (torch.randn(B, s, H, D, generator=g).to(torch.bfloat16).cuda() for s in (Sq, Sk, Sk))
    lengths = torch.randint(1, Sk, (B,), generator=g)
    lengths[0] = Sk - 150  # the last 128-key tile holds no valid key
    keys = (torch.arange(Sk)[None, :] < lengths[:, None]).cuda()
    k[~keys], v[~keys] = float("nan"), 1e4  # padding can hold anything
    out = torch.full_like(q, float("nan"))
    out.copy_(fp8_attention(q, k, v, key_mask=keys))
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
    for b in range(B):
        n = int(lengths[b])
        ref = attention_reference(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n])
        rel = float((out[b:b + 1].double() - ref).norm() / ref.norm())
        assert rel <= 0.056, (b, n, rel)


def test_op_compiles_with_inductor():
    _cuda()
    from ditprof.kernels.op import fp8_attention

    q, k, v = (torch.randn(1, 1000, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    w = torch.randn(128, 128, device="cuda", dtype=torch.bfloat16) * 0.1

    def f(q, k, v):
        return fp8_attention(q @ w, k, v) * 2

    torch.testing.assert_close(torch.compile(f, fullgraph=True)(q, k, v), f(q, k, v), rtol=0, atol=0)
