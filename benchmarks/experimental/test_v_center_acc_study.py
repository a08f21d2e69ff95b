"""``v_center_acc_study``'s model on a small biased-V case (CPU): the centring is exact where nothing is quantized
(mu back in the output), a narrow accumulator across tiles loses accuracy on biased V, and with V centred it does
not (the study's claim, at a size a test can run)."""

from __future__ import annotations

import torch
from v_center_acc_study import centred, run

from ditprof.kernels.accuracy import compare, make_inputs
from ditprof.kernels.reference import attention_reference


def test_centring_removes_the_mean_exactly():
    _, _, v = make_inputs("v_bias", (1, 2, 16, 64), kv_len=300, seed=3)
    vc, mu = centred(v)
    assert vc.double().mean(dim=1).abs().max().item() < 1e-5
    assert torch.equal((vc + mu).to(v.dtype), v)


def test_centred_v_keeps_a_narrow_accumulator_accurate():
    q, k, v = make_inputs("v_bias", (1, 2, 64, 128), kv_len=4096, seed=0)
    ref = attention_reference(q, k, v)
    err = {(c, p): compare(run(q, k, v, c, p, 13, 32), ref)["rel_rms"] for c in (False, True) for p in (False, True)}
    assert err[(False, False)] > 1.3 * err[(False, True)]  # across tiles, not centred: worse than two-level
    assert abs(err[(True, False)] - err[(True, True)]) < 1e-4  # centred: across tiles = two-level
    assert err[(True, False)] < err[(False, True)]  # and better than today's two-level on biased V
