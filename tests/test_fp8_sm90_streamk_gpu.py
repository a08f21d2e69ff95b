"""fp8-sm90's stream-K grid on the GPU (``fp8_fwd_sm90_streamk`` + ``streamk_merge``): fresh Gaussian inputs, INT8
and e4m3 Q/K, head_dim 128 and 64; SM counts forced small so that small shapes have full rounds and a tail
(segments crossing tile boundaries, a tail tile one CTA runs whole, cross-attention), and the Flux shape on the
device's own SM count. Outputs NaN-poisoned (every element written); the rows of whole work tiles equal the plain
grid's bit for bit; the tail rows close to the plain grid's (P re-quantized per piece); everything against float64;
the op's launch record (no LSE) takes the same plan and gives the same bits as the record returning the LSE, eager,
replayed from a CUDA graph, and through cute's JIT launch (``Fp8Options(tvm_ffi=False)``) with fp16. The plain grid
to compare with is ``Fp8Options(streamk=False, q_in_kernel=False)`` (the prep's Q, as on the stream-K grid).

    python -m pytest -q -s -m gpu tests/test_fp8_sm90_streamk_gpu.py
"""

from __future__ import annotations

import math

import pytest
import torch
from fp8_gpu_cases import gaussian_inputs, poisoned_outputs, rel_rms

from ditprof.kernels.fp8_config import Fp8Options

pytestmark = pytest.mark.gpu

FLOAT64_REL_RMS = 0.06  # Gaussian inputs, both Q/K formats (the plain kernel's bound in the sm90 GPU tests)

CASES = [  # (B, H, Sq, Sk, D), forced SM count (None: the device's)
    ((1, 2, 1000, 1000, 128), 5),
    ((2, 3, 777, 1200, 64), 7),
    ((1, 1, 1300, 300, 128), 4),  # tail tile 2 is run whole by one CTA
    ((2, 3, 300, 333, 128), 5),  # cross-attention, 12 tiles: 2 rounds + 2 tiles over 5 CTAs
    ((1, 24, 4608, 4608, 128), None),  # Flux 1024^2
]


def _need_sm90():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU (H100/H200)")


def _nan(shape, dtype):
    return torch.full(shape, math.nan, dtype=dtype, device="cuda")


def _whole_rows(shape, n_full):
    """(B, Sq, H) bool: rows of work tiles < n_full (m_block fastest, then head, then batch)."""
    from ditprof.kernels.streamk_schedule import TILE_M

    B, H, Sq, _, _ = shape
    n_m = -(-Sq // TILE_M)
    mask = torch.zeros((B, Sq, H), dtype=torch.bool)
    for t in range(n_full):
        m, h, b = t % n_m, (t // n_m) % H, t // (n_m * H)
        mask[b, m * TILE_M:(m + 1) * TILE_M, h] = True
    return mask.cuda()


@pytest.fixture
def forced(monkeypatch):
    """Set the SM count the plan sees; returns (stream-K options, plain-grid options) of the Q/K format (and any
    other ``Fp8Options`` fields). Launch records made under them are dropped after."""
    from ditprof.kernels import launch_choice, launch_record

    def apply(n_sms, fmt, **fields):
        if n_sms is not None:
            monkeypatch.setattr(launch_choice, "sm_count", lambda index: n_sms)
        launch_record._RECORDS.clear()
        return (Fp8Options(qk_format=fmt, **fields),
                Fp8Options(qk_format=fmt, streamk=False, q_in_kernel=False, **fields))

    yield apply
    launch_record._RECORDS.clear()


def _plan(shape, options, device_index):
    """The stream-K plan ``choose_launch`` picks for a (B, H, Sq, Sk, D) bf16 call under ``options`` (None: plain)."""
    from ditprof.kernels.launch_choice import choose_launch

    return choose_launch("sm_90a", shape, "bfloat16", options, key_lens=False, write_lse=True, q_in_kernel_ok=True,
                         device_index=device_index).streamk


@pytest.mark.parametrize("fmt", ["int8", "e4m3"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_streamk_vs_plain_grid_and_float64(case, fmt, forced):
    _need_sm90()
    from ditprof.kernels.finite_checks import finish_finite_checks
    from ditprof.kernels.launch_record import fp8_call, record_for
    from ditprof.kernels.reference import attention_reference

    shape, n_sms = CASES[case]
    streamk, plain = forced(n_sms, fmt)
    B, H, Sq, Sk, D = shape
    q, k, v = gaussian_inputs(B, H, Sq, Sk, D, seed=500 + case)
    scale = 1.0 / math.sqrt(D)
    plan = _plan(shape, streamk, q.device.index)
    assert plan is not None and plan[1] > 0 and plan[2] > plan[1], plan
    assert _plan(shape, plain, q.device.index) is None
    outs = (((B, Sq, H, D), torch.bfloat16), ((B, H, Sq), torch.float32))
    with poisoned_outputs(*outs) as hits:  # the LSE comes back with the smoothing shift added
        o, lse = fp8_call(q, k, v, scale, return_lse=True, options=streamk)
        o_ref, lse_ref = fp8_call(q, k, v, scale, return_lse=True, options=plain)
    finish_finite_checks()
    torch.cuda.synchronize()
    assert hits["n"] >= 4
    assert record_for(q, k, v, False, plain, return_lse=True).streamk is None
    assert o.isfinite().all() and lse.isfinite().all()  # every element written (kernel + merge)
    whole = _whole_rows(shape, plan[0])
    assert torch.equal(o[whole], o_ref[whole])
    assert torch.equal(lse.transpose(1, 2)[whole], lse_ref.transpose(1, 2)[whole])
    tail = ~whole
    gap = rel_rms(o[tail], o_ref[tail])
    lse_gap = (lse - lse_ref).abs().max().item()
    ref, ref_lse = attention_reference(q, k, v, scale, return_lse=True)
    err = rel_rms(o, ref)
    lse_err = (lse.double() - ref_lse).abs().max().item()
    print(f"{shape} {fmt} plan {plan}: tail rows vs plain {gap:.3%}, LSE max {lse_gap:.1e}; vs float64 {err:.3%}, "
          f"LSE {lse_err:.1e}")
    assert gap < 0.05, gap
    assert err <= FLOAT64_REL_RMS, err
    assert lse_err < 0.1, lse_err
    # the op's launch record (no LSE): the same plan, the same bits (O only), from NaN-poisoned outputs
    rec = record_for(q, k, v, False, streamk)
    assert rec.streamk == plan and rec.spec.streamk
    with poisoned_outputs(outs[0]) as hits:
        out = fp8_call(q, k, v, scale, options=streamk)
    finish_finite_checks()
    torch.cuda.synchronize()
    assert hits["n"] >= 1
    assert torch.equal(out, o)


def test_streamk_record_replays_in_a_cuda_graph(forced):
    """A stream-K call (kernel + merge, per-call workspace under capture) captured and replayed on new inputs."""
    _need_sm90()
    from ditprof.kernels.finite_checks import finish_finite_checks
    from ditprof.kernels.launch_record import fp8_call, record_for

    opts, _ = forced(None, "int8")
    B, H, S, D = 1, 24, 4608, 128
    q, k, v = gaussian_inputs(B, H, S, S, D, seed=41)
    scale = D ** -0.5
    assert record_for(q, k, v, False, opts).streamk is not None
    eager = fp8_call(q, k, v, scale, options=opts)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fp8_call(q, k, v, scale, options=opts)  # warm on the capture stream
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fp8_call(q, k, v, scale, options=opts)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    q2, k2, v2 = gaussian_inputs(B, H, S, S, D, seed=42)
    want = fp8_call(q2, k2, v2, scale, options=opts)
    q.copy_(q2), k.copy_(k2), v.copy_(v2)
    graph.replay()
    finish_finite_checks()
    torch.cuda.synchronize()
    assert torch.equal(out, want) and not torch.equal(out, eager)


def test_streamk_through_the_jit_launch_with_fp16(forced):
    """Without TVM-FFI (``Fp8Options(tvm_ffi=False)``: cute's JIT executor launches the stream-K build) and with
    fp16 inputs: the record returning the LSE and the op's record give the same bits, whole-tile rows equal the
    plain grid's."""
    _need_sm90()
    from ditprof.kernels.finite_checks import finish_finite_checks
    from ditprof.kernels.kernel_args import LAUNCH_INFO
    from ditprof.kernels.launch_record import fp8_call, record_for

    opts, plain_opts = forced(5, "int8", tvm_ffi=False)
    shape = (2, 3, 700, 700, 128)
    B, H, Sq, Sk, D = shape
    q, k, v = gaussian_inputs(B, H, Sq, Sk, D, dtype=torch.float16, seed=77)
    scale = D ** -0.5
    rec = record_for(q, k, v, False, opts)
    assert rec.streamk is not None and rec.spec.streamk and not rec.spec.tvm_ffi
    general, _ = fp8_call(q, k, v, scale, return_lse=True, options=opts)
    with poisoned_outputs(((B, Sq, H, D), torch.float16)):
        out = fp8_call(q, k, v, scale, options=opts)
    plain = fp8_call(q, k, v, scale, options=plain_opts)
    finish_finite_checks()
    torch.cuda.synchronize()
    assert not record_for(q, k, v, False, plain_opts).spec.tvm_ffi
    assert out.dtype == torch.float16 and out.isfinite().all()
    assert torch.equal(out, general)
    whole = _whole_rows(shape, rec.streamk[0])
    assert torch.equal(out[whole], plain[whole])
    assert rel_rms(out[~whole], plain[~whole]) < 0.05
    assert LAUNCH_INFO["last_launch"] == "jit"
