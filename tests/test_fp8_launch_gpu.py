"""The launch record (``kernels.launch_record``) on a GPU: a reused workspace never leaks one call's data into the
next (the same bits as a fresh record's first call), the op with a key mask is CUDA-graph capturable and replays the
eager result, and the prep's direct Triton launches are used."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


def _qkv(seed, B=2, Sq=300, Sk=333, H=3, D=128):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(B, s, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for s in (Sq, Sk, Sk)]


@pytest.mark.parametrize("D", [64, 128])
def test_a_reused_workspace_gives_a_fresh_records_bits(D):
    _cuda()
    from ditprof.kernels import launch_record as L
    from ditprof.kernels.finite_checks import finish_finite_checks

    a, b = _qkv(1, D=D), _qkv(2, D=D)
    scale = D ** -0.5
    want = []
    for x in (a, b):  # each the first call of a fresh record on a fresh workspace
        L.clear_cache()
        want.append(L.fp8_call(*x, scale))
        finish_finite_checks()
    L.clear_cache()
    out_a = L.fp8_call(*a, scale)
    out_b = L.fp8_call(*b, scale)  # same configuration: same record, same workspace
    finish_finite_checks()
    torch.cuda.synchronize()
    assert L.record_for(*a, False).reuse
    assert torch.isfinite(out_a).all() and torch.isfinite(out_b).all()
    assert torch.equal(out_a, want[0]) and torch.equal(out_b, want[1])
    assert not torch.equal(out_a, out_b)
    rec = L.record_for(*a, False)
    assert all(step.compiled is not None for step in rec.plan.launches)


def test_op_with_a_key_mask_captures_in_a_cuda_graph():
    _cuda()
    from ditprof.harness.run import session as S
    from ditprof.kernels.op import fp8_attention

    q, k, v = _qkv(3, B=3, Sq=256, Sk=480)
    g = torch.Generator(device="cuda").manual_seed(4)
    keep = torch.rand(3, 480, device="cuda", generator=g) < 0.7
    eager = fp8_attention(q, k, v, key_mask=keep).cpu()
    samples, note, out = S.time_block_graph(lambda: fp8_attention(q, k, v, key_mask=keep), torch.device("cuda"), 3)
    assert samples is not None, note
    assert torch.equal(out, eager)


def test_records_made_in_inference_mode_serve_calls_outside_it():
    """The harness measures under torch.inference_mode; a later call (or finish_finite_checks) outside it zeroes
    the workspace's flags and copies into the pinned ring in place: those must be normal tensors."""
    _cuda()
    from ditprof.kernels.finite_checks import CHECK_EVERY, finish_finite_checks
    from ditprof.kernels.launch_record import fp8_call

    q, k, v = _qkv(5, B=1, Sq=96, Sk=96, H=2)
    with torch.inference_mode():
        inside = fp8_call(q, k, v, 0.1)
    outside = [fp8_call(q, k, v, 0.1) for _ in range(CHECK_EVERY + 1)]
    finish_finite_checks()
    with torch.inference_mode():
        fp8_call(q, k, v, 0.1)
        finish_finite_checks()
    assert all(torch.equal(o, inside) for o in outside)


@pytest.mark.parametrize("D", [64, 128])
def test_q_in_the_kernel_gives_the_prep_path_bits(D):
    """fp8-sm90 INT8 on the plain grid rotates and quantizes Q in the kernel (``q_rot``: the prep skips Q): the same
    output bits as the prep's Q (``Fp8Options(q_in_kernel=False)``); a non-contiguous q keeps the prep's Q."""
    _cuda()
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("q_rot is fp8-sm90's")
    from ditprof.kernels.finite_checks import finish_finite_checks
    from ditprof.kernels.fp8_config import Fp8Options
    from ditprof.kernels.launch_record import fp8_call, record_for

    q, k, v = _qkv(11, B=2, Sq=1000, Sk=777, H=3, D=D)
    scale = D ** -0.5
    rec = record_for(q, k, v, False)
    assert rec.q_rot and rec.summary()["q_in_kernel"] and rec.streamk is None
    out = torch.full_like(q, float("nan"))
    out.copy_(fp8_call(q, k, v, scale))
    prep_q = Fp8Options(q_in_kernel=False)
    assert not record_for(q, k, v, False, prep_q).q_rot
    want = fp8_call(q, k, v, scale, options=prep_q)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # the same values, strided
    assert not record_for(qt, k, v, False).q_rot
    strided = fp8_call(qt, k, v, scale)
    finish_finite_checks()
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
    assert torch.equal(out, want) and torch.equal(strided, want)


def test_q_in_the_kernel_flags_inf_and_nan_rows():
    """With Q quantized in the kernel, a row holding Inf or NaN still raises the one-line error (the kernel sets Q's
    sticky flag), and a clean call after it does not."""
    _cuda()
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("q_rot is fp8-sm90's")
    from ditprof.errors import DitprofError
    from ditprof.kernels.finite_checks import finish_finite_checks
    from ditprof.kernels.launch_record import fp8_call, record_for

    finish_finite_checks()
    q, k, v = _qkv(12, B=1, Sq=700, Sk=300, H=2)
    assert record_for(q, k, v, False).q_rot
    for bad in (float("inf"), float("-inf"), float("nan")):
        q[0, 699, 1, 3] = bad  # the last row of the last, partial query block
        with pytest.raises(DitprofError, match="^q contains NaN or Inf$"):
            fp8_call(q, k, v, 0.1)
            finish_finite_checks()
        q[0, 699, 1, 3] = 0.5
    out = fp8_call(q, k, v, 0.1)
    finish_finite_checks()
    assert torch.isfinite(out).all()
