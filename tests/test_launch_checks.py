"""CPU checks of ``kernels.kernel_args.launch_compiled``'s argument checks (they run before anything is launched)."""

from __future__ import annotations

import pytest
import torch

from ditprof.errors import DitprofError
from ditprof.kernels.compile_cache import KernelSpec
from ditprof.kernels.kernel_args import launch_compiled


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


class _Ptr:
    def __init__(self, p):
        self.p = p

    def data_ptr(self):
        return self.p


def _record(plan):
    """A launch record with only what ``_launch_kernel`` reads (building a real one needs a GPU); its kernel and
    merge record their arguments instead of launching."""
    from ditprof.kernels.launch_record import Fp8Launch

    rec = object.__new__(Fp8Launch)
    rec.streamk, rec.sizes, rec.q_rot = plan, (1, 2, 3, 4, 5, 6), False
    rec.spec = KernelSpec("fp8-sm90", "sm_90a", 128, "bfloat16", True, False, True, True, streamk=plan is not None)
    rec.calls, rec.merges = [], []
    rec.fn = lambda *a: rec.calls.append(a)
    rec.merge = (lambda *a: rec.merges.append(a)) if plan else None
    ws = {"ptrs": (10, 11, 12, 13, 14, 15), "streamk": None, "streamk_ptrs": ((), ())}
    if plan:
        ws["streamk"] = (_Ptr(100), _Ptr(101), plan[:3])
        ws["streamk_ptrs"] = ((100, 101), plan[:3])
    return rec, ws


def test_tvm_ffi_launch_arguments_of_both_grids():
    """The TVM-FFI call's argument order: q8, k8, v8t, scales, q_scales, key_lens (the scales stand in), out, lse,
    [o_part, lse_part], sizes, scale, [n_full, n_tail, T], stream; the stream-K grid then merges into out. With Q in
    the kernel (q_rot) the first pointer is the call's own 16-bit q (the workspace's q_scales slot then holds the
    rotation matrix)."""
    q = _Ptr(40)
    rec, ws = _record(None)
    rec._launch_kernel(ws, q, _Ptr(50), None, None, 0.5, 7)
    assert rec.calls == [(10, 11, 12, 13, 15, 13, 50, 14, 1, 2, 3, 4, 5, 6, 0.5, 7)]
    rec._launch_kernel(ws, q, _Ptr(50), None, _Ptr(60), 0.5, 7)
    assert rec.calls[1][5] == 60  # key_lens
    rec.q_rot = True
    rec._launch_kernel(ws, q, _Ptr(50), None, None, 0.5, 7)
    assert rec.calls[2] == (40, 11, 12, 13, 15, 13, 50, 14, 1, 2, 3, 4, 5, 6, 0.5, 7)
    rec, ws = _record((528, 48, 132, 29))
    rec._launch_kernel(ws, q, _Ptr(50), None, None, 0.5, 7)
    assert rec.calls == [(10, 11, 12, 13, 15, 13, 50, 14, 100, 101, 1, 2, 3, 4, 5, 6, 0.5, 528, 48, 132, 7)]
    (o_part, lse_part, out, stream, lse), = rec.merges
    assert (o_part.p, lse_part.p, out.p, stream, lse) == (100, 101, 50, 7, None)


def test_prep_plan_for_q_in_the_kernel():
    """``PrepPlan(skip_q=True)`` (fp8-sm90's q_rot records): no Q programs in the quantize launch, q8 and q_scales as
    1-element placeholders (nothing writes them), and the three flags right after the scales in memory, where the
    kernel sets Q's; INT8 only."""
    from ditprof.kernels.prep_triton import PrepPlan

    q, k, v = (torch.randn(2, n, 3, 64, dtype=torch.bfloat16) for n in (300, 777, 777))
    full, skip = PrepPlan(q, k, v, True, qk_int8=True), PrepPlan(q, k, v, True, qk_int8=True, skip_q=True)
    assert skip.quants[0].grid[0] < full.quants[0].grid[0] and skip.stats.grid == full.stats.grid
    b = skip.buffers("cpu")
    assert b["q8"].numel() == 1 and b["q_scales"].numel() == 1 and b["k8"].shape == (2, 3, skip.Sk_pad, 64)
    assert b["flags"].data_ptr() == b["scales"].data_ptr() + b["scales"].numel() * 4
    assert b["scales"].dtype == torch.float32 and b["flags"].dtype == torch.int32 and not b["flags"].any()
    assert full.buffers("cpu")["q8"].shape == (2, 3, full.Sq_pad, 64)
    with pytest.raises(ValueError, match="skip_q"):
        PrepPlan(q, k, v, True, skip_q=True)


def test_launch_compiled_with_q_in_the_kernel():
    """A q_rot build takes the 16-bit q (B, Sq, H, D) where others take q8, the rotation matrix in the q_scales slot
    (16-byte aligned for its TMA), and the padded query length from Sq (q's shape has none): the TVM-FFI call's
    integers and the JIT call's pointers."""
    import cutlass

    from ditprof.kernels.launch_record import rotation_t

    B, H, S, D = 1, 2, 300, 128
    q = torch.zeros((B, S, H, D), dtype=torch.bfloat16)
    k8 = torch.zeros((B, H, 320, D), dtype=torch.int8)
    v8t = torch.zeros((B, H, D, 320), dtype=torch.uint8)
    scales = torch.ones((B, H, 3))
    out, lse = torch.empty((B, S, H, D), dtype=torch.bfloat16), torch.empty((B, H, S))
    rot = rotation_t(D, torch.bfloat16, "cpu")
    assert rot.is_contiguous() and torch.equal(rot.t().double(), __import__(
        "ditprof.kernels.rotation", fromlist=["rotation_pm1"]).rotation_pm1(D, torch.float64))
    calls = []
    spec = KernelSpec("fp8-sm90", "sm_90a", D, "bfloat16", True, False, True, True, q_rot=True)
    launch_compiled(spec, lambda *a: calls.append(a), q, k8, v8t, scales, rot, None, out, lse, B, H, S, S, 0.1, 7)
    ints = calls[0]
    assert ints[0] == q.data_ptr() and ints[4] == rot.data_ptr()
    assert ints[8:14] == (B, H, S, S, 384, 320)  # Sq_pad from Sq (multiples of 128), Sk_pad from k8
    jit = KernelSpec("fp8-sm90", "sm_90a", D, "bfloat16", True, False, False, True, q_rot=True)
    launch_compiled(jit, lambda *a: calls.append(a), q, k8, v8t, scales, rot, None, out, lse, B, H, S, S, 0.1, 7)
    ptrs = calls[1]
    assert ptrs[0]._pointer == q.data_ptr() and ptrs[4]._pointer == rot.data_ptr()
    assert ptrs[4]._assumed_align == 16 and ptrs[3]._assumed_align == 4
    assert [int(x) for x in ptrs[8:14]] == [B, H, S, S, 384, 320]
    assert isinstance(ptrs[8], cutlass.Int32)


def test_which_records_quantize_q_in_the_kernel(monkeypatch):
    """``launch_choice.choose_launch``: Q in the kernel for fp8-sm90 INT8 with a q the q_rot build reads (contiguous,
    16-byte aligned), on the plain grid unless ``Fp8Options.q_in_kernel`` is off; never on the stream-K grid (its
    whole-tile CTAs quantizing Q was measured slower), never with e4m3 or on fp8-sm120."""
    from ditprof.kernels import launch_choice as C
    from ditprof.kernels.fp8_config import Fp8Options

    plan = (528, 48, 132, 29)
    monkeypatch.setattr("ditprof.kernels.streamk_schedule.streamk_plan", lambda *a: plan)
    monkeypatch.setattr(C, "sm_count", lambda index: 132)

    def q_rot(options, q_ok=True, arch="sm_90a"):
        return C.choose_launch(arch, (1, 2, 64, 64, 128), "bfloat16", options, key_lens=False, write_lse=False,
                               q_in_kernel_ok=q_ok).spec.q_rot

    for on, (plain, streamk) in {True: (True, False), False: (False, False)}.items():
        assert q_rot(Fp8Options(qk_format="int8", streamk=False, q_in_kernel=on)) is plain, on
        assert q_rot(Fp8Options(qk_format="int8", streamk=True, q_in_kernel=on)) is streamk, on
        assert not q_rot(Fp8Options(qk_format="e4m3", streamk=False, q_in_kernel=on))
        assert not q_rot(Fp8Options(qk_format="int8", streamk=False, q_in_kernel=on), arch="sm_120a")
        assert not q_rot(Fp8Options(qk_format="int8", streamk=False, q_in_kernel=on), q_ok=False)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)  # no CUDA here
    q = torch.zeros((1, 64, 2, 128), dtype=torch.bfloat16)
    assert C.q_in_kernel_ok(q)
    assert not C.q_in_kernel_ok(q.transpose(1, 2).contiguous().transpose(1, 2))  # not contiguous
    misaligned = torch.zeros(1 + q.numel(), dtype=torch.bfloat16)[1:].view(q.shape)  # contiguous, 2 bytes off
    assert misaligned.is_contiguous() and not C.q_in_kernel_ok(misaligned)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert not C.q_in_kernel_ok(q)  # a record first made inside a capture keeps the prep's Q
    with pytest.raises(DitprofError, match="unknown fp8 kernel 'fp9'"):
        C.check_options(Fp8Options(kernel="fp9"))
