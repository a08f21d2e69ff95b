"""The prep in one launch (``prep_triton.ONE_LAUNCH``): stats and quantize programs in one grid, each quantize
program waiting on its (b, h)'s ready flag. The outputs must be the two-pass prep's (e4m3: bit for bit vs the torch
chain; INT8: within the INT8 prep's stated tolerance), the counters and flags must be back at 0 after every launch
(the next launch, and a CUDA-graph replay, start from them), and the quantize programs must not start before the
stats they read are final.

CPU: under the Triton interpreter (programs run one after the other, so the flags are always up when read).
GPU (marked ``gpu``): the compiled kernel, where programs of both passes run at the same time, at shapes with
many (b, h) so quantize programs do start while stats programs of later (b, h) still run, repeated launches on one
workspace, and a CUDA-graph replay.
"""

from __future__ import annotations

import pytest
import torch

from test_prep_int8 import make_qkv
from triton_interpreter import inner_only, run_under_interpreter

pytest.importorskip("triton")


def _one_launch(monkeypatch):
    from ditprof.kernels import prep_triton

    monkeypatch.setattr(prep_triton, "ONE_LAUNCH", True)
    return prep_triton


def test_triton_interpreter_one_launch_matches_torch():
    run_under_interpreter(__file__, "test_interpreter_one_launch_inner")


@inner_only()
@pytest.mark.parametrize("shape", [(2, 77, 77, 2, 128), (1, 300, 33, 2, 64), (2, 33, 300, 1, 128)],
                         ids=lambda s: "x".join(map(str, s)))
def test_interpreter_one_launch_inner(shape, monkeypatch):
    import test_prep
    import test_prep_int8

    prep_triton = _one_launch(monkeypatch)
    plan = prep_triton.PrepPlan(*make_qkv(*shape, seed=0), True, qk_int8=True)
    assert len(plan.launches) == 1 and plan.one_launch
    with pytest.raises(ValueError, match="one launch"):
        plan.launch_stats(*make_qkv(*shape, seed=0), plan.buffers("cpu"))
    # the two-pass tests' own checks, unchanged, through the one-launch plan
    test_prep.test_interpreter_inner(shape)
    test_prep_int8.run_triton_int8_checks(shape, "cpu", prep_triton)
    _check_counters_reset(prep_triton, shape, "cpu")


def _check_counters_reset(prep_triton, shape, device, launches=3):
    """Launches on one workspace: same outputs each time, and the ticket/finish counters, the ready flags and
    the per-(b, h) arrival counts back at 0 after each."""
    for qk_int8 in (False, True):
        q, k, v = make_qkv(*shape, seed=5, device=device)
        plan = prep_triton.PrepPlan(q, k, v, True, qk_int8=qk_int8)
        bufs = plan.buffers(q.device)
        first = None
        for _ in range(launches):
            for name in ("q8", "k8", "v8t", "scales"):
                bufs[name].view(torch.uint8).fill_(0xFF)  # poison: NaN in e4m3 and float32, -1 in int8
            plan.launch(q, k, v, bufs, None)
            got = {n: bufs[n].view(torch.uint8).clone() for n in ("q8", "k8", "v8t", "scales")}
            for name in ("ticket", "ready", "count"):
                assert int(bufs[name].abs().sum()) == 0, (name, bufs[name].tolist())
            if first is None:
                first = got
            else:
                for n in got:
                    assert torch.equal(got[n], first[n]), n


# ------------------------------------------------------------------ GPU

def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.mark.gpu
@pytest.mark.parametrize("qk_int8", [False, True], ids=["e4m3", "int8"])
@pytest.mark.parametrize("shape", [(1, 4608, 4608, 24, 128), (2, 1000, 777, 40, 64), (1, 30272, 30272, 56, 128)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gpu_one_launch_matches_two_passes(shape, qk_int8, monkeypatch):
    """The compiled one-launch prep against the two-pass prep on the same inputs (V bit for bit; e4m3 Q/K bit for
    bit; INT8 codes within the INT8 prep's tolerance), several launches on one workspace."""
    _cuda()
    from ditprof.kernels import prep_triton

    q, k, v = make_qkv(*shape, seed=9, device="cuda")
    two = prep_triton.PrepPlan(q, k, v, True, qk_int8=qk_int8)
    ref = two.buffers(q.device)
    two.launch(q, k, v, ref, torch.cuda.current_stream().cuda_stream)
    monkeypatch.setattr(prep_triton, "ONE_LAUNCH", True)
    one = prep_triton.PrepPlan(q, k, v, True, qk_int8=qk_int8)
    assert len(one.launches) == 1
    bufs = one.buffers(q.device)
    stream = torch.cuda.current_stream().cuda_stream
    for i in range(4):
        for name in ("q8", "k8", "v8t", "scales"):
            bufs[name].view(torch.uint8).fill_(0xFF)
        one.launch(q, k, v, bufs, None if i == 0 else stream)  # the first through the JIT, then direct
        torch.cuda.synchronize()
        for name in ("ticket", "ready", "count"):
            assert int(bufs[name].abs().sum()) == 0, (i, name)
        assert torch.equal(bufs["v8t"].view(torch.uint8), ref["v8t"].view(torch.uint8)), i
        assert torch.equal(bufs["scales"], ref["scales"]), (i, (bufs["scales"] - ref["scales"]).abs().max())
        if qk_int8:
            for name in ("q8", "k8"):
                d = (bufs[name].int() - ref[name].int()).abs()
                assert int(d.max()) <= 1 and int((d > 0).sum()) <= 1e-3 * d.numel(), (i, name)
            assert torch.equal(bufs["q_scales"], ref["q_scales"]), i
        else:
            for name in ("q8", "k8"):
                assert torch.equal(bufs[name].view(torch.uint8), ref[name].view(torch.uint8)), (i, name)
    assert bufs["flags"].tolist() == [0, 0, 0]


@pytest.mark.gpu
def test_gpu_one_launch_in_a_cuda_graph(monkeypatch):
    """Captured once, replayed on new inputs copied into the captured ones: the outputs follow the inputs (the
    counters the replay starts from were left at 0 by the capture's warm-up and by each replay)."""
    _cuda()
    from ditprof.kernels import prep_triton

    monkeypatch.setattr(prep_triton, "ONE_LAUNCH", True)
    shape = (1, 2048, 2048, 16, 128)
    q, k, v = make_qkv(*shape, seed=1, device="cuda")
    plan = prep_triton.PrepPlan(q, k, v, True, qk_int8=True)
    bufs = plan.buffers(q.device)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        plan.launch(q, k, v, bufs, s.cuda_stream)  # compile + warm-up outside the capture
        plan.launch(q, k, v, bufs, s.cuda_stream)
    s.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        plan.launch(q, k, v, bufs, s.cuda_stream)
    for seed in (2, 3):
        q2, k2, v2 = make_qkv(*shape, seed=seed, device="cuda")
        q.copy_(q2), k.copy_(k2), v.copy_(v2)
        for name in ("q8", "k8", "v8t"):
            bufs[name].view(torch.uint8).fill_(0xFF)
        graph.replay()
        torch.cuda.synchronize()
        monkeypatch.setattr(prep_triton, "ONE_LAUNCH", False)
        ref_plan = prep_triton.PrepPlan(q2, k2, v2, True, qk_int8=True)
        ref = ref_plan.buffers(q.device)
        ref_plan.launch(q2, k2, v2, ref, None)
        monkeypatch.setattr(prep_triton, "ONE_LAUNCH", True)
        torch.cuda.synchronize()
        assert torch.equal(bufs["v8t"].view(torch.uint8), ref["v8t"].view(torch.uint8)), seed
        assert torch.equal(bufs["scales"], ref["scales"]), seed
        for name in ("ticket", "ready", "count"):
            assert int(bufs[name].abs().sum()) == 0, (seed, name)
