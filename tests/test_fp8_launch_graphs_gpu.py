"""The launch record's graph replay (``kernels.launch_graphs``) on a GPU: a call whose arguments repeat is captured
once and replayed, with the direct launches' bits on fresh data written in place (plain and stream-K grids, INT8
and e4m3 Q/K, head_dim 128 and 64), every output element written (NaN-poisoned allocations), float64 close; a new
scale or address is not a replay; NaN written into a replayed input is still reported; the caller's own graph
capture still works; the profiler still puts the replayed kernels under the attention range. What a call runs is
the ``Fp8Options`` passed to the op (``graphs=False``: the direct launches).

    python -m pytest -q -s -m gpu tests/test_fp8_launch_graphs_gpu.py
"""

from __future__ import annotations

import math

import pytest
import torch
from fp8_gpu_cases import gaussian_inputs, poisoned_outputs, rel_rms

import ditprof.kernels.op  # noqa: F401 -- registers torch.ops.ditprof.fp8_attention
from ditprof.kernels.fp8_config import Fp8Options

pytestmark = pytest.mark.gpu

FLOAT64_REL_RMS = 0.06  # Gaussian inputs, both Q/K formats (the sm90 GPU tests' bound)

CASES = [  # (B, H, Sq, Sk, D), forced SM count (None: the device's), Q/K format
    ((2, 3, 300, 333, 128), None, "int8"),  # plain grid, Q in the kernel
    ((2, 3, 300, 333, 128), None, "e4m3"),
    ((1, 2, 1000, 1000, 128), 5, "int8"),  # stream-K grid: kernel + merge
    ((2, 3, 777, 1200, 64), 7, "int8"),
    ((1, 4, 640, 640, 64), None, "e4m3"),
]


def _need_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.fixture
def setting(monkeypatch):
    """Set the SM count the stream-K plan sees; returns the ``Fp8Options`` of the Q/K format and the graph
    switch (``graphs=False``: the direct launches). Launch records made meanwhile are dropped after."""
    from ditprof.kernels import launch_choice, launch_record
    from ditprof.kernels.finite_checks import finish_finite_checks

    def apply(n_sms=None, fmt=None, graphs=True, **fields):
        if n_sms is not None:
            monkeypatch.setattr(launch_choice, "sm_count", lambda index: n_sms)
        return Fp8Options(qk_format=fmt, graphs=graphs, **fields)

    launch_record._RECORDS.clear()
    yield apply
    finish_finite_checks()
    launch_record._RECORDS.clear()


def _call(q, k, v, scale, options: Fp8Options):
    from ditprof.kernels.op import options_key

    return torch.ops.ditprof.fp8_attention(q, k, v, scale, None, options_key(options))


@pytest.mark.parametrize("case", range(len(CASES)))
def test_replays_give_the_direct_launches_bits_on_new_data(case, setting):
    _need_cuda()
    from ditprof.kernels import launch_record
    from ditprof.kernels.reference import attention_reference

    (B, H, Sq, Sk, D), n_sms, fmt = CASES[case]
    scale = 1.0 / math.sqrt(D)
    data = [gaussian_inputs(B, H, Sq, Sk, D, seed=900 + 10 * case + i) for i in range(5)]
    no_graphs = setting(n_sms, fmt, graphs=False)
    want = [_call(*qkv, scale, no_graphs) for qkv in data]
    direct = launch_record.record_for(*data[0], False, no_graphs)
    assert direct.graphs is None
    if n_sms is not None:
        assert direct.streamk is not None, "the case must run on the stream-K grid"

    opts = setting(n_sms, fmt)
    q, k, v = (torch.empty_like(x) for x in data[0])  # fixed addresses, new data each call
    ptrs = []
    for i, qkv in enumerate(data):
        for dst, src in zip((q, k, v), qkv):
            dst.copy_(src)
        with poisoned_outputs(((B, Sq, H, D), torch.bfloat16)) as hits:
            o = _call(q, k, v, scale, opts)
        torch.cuda.synchronize()
        assert hits["n"] == 1
        assert o.isfinite().all(), f"call {i}: elements left unwritten"
        assert torch.equal(o, want[i]), f"call {i}: bits differ from the direct launches"
        ptrs.append(o.data_ptr())
        if i == 0:
            err = rel_rms(o, attention_reference(q, k, v, scale))
            assert err < FLOAT64_REL_RMS, err
        del o
    rec = launch_record.record_for(q, k, v, False, opts)
    assert rec.graphs is not None
    assert len(set(ptrs)) == 1, "the output's address moved: the test needs it to repeat"
    got = rec.graphs.summary()
    assert (got["direct_calls"], got["captures"], got["replays"], got["capture_failure"]) == (1, 1, 3, None), got
    assert any(s["graph_replays"] == 3 and s["calls"] == 5 for s in launch_record.launch_summaries())


def test_a_new_scale_or_address_is_not_a_replay(setting):
    _need_cuda()
    from ditprof.kernels import launch_record

    q, k, v = gaussian_inputs(1, 2, 256, 384, 128, seed=950)
    no_graphs = setting(graphs=False)
    want1, want2 = _call(q, k, v, 0.09, no_graphs), _call(q, k, v, 0.05, no_graphs)
    q2 = q.clone()
    opts = setting()
    for _ in range(3):  # direct, capture, replay (each output freed: the next one takes its address)
        o = _call(q, k, v, 0.09, opts)
        assert torch.equal(o, want1)
        del o
    o = _call(q, k, v, 0.05, opts)  # same addresses, another scale
    assert torch.equal(o, want2)
    del o
    o = _call(q2, k, v, 0.09, opts)  # another address, same data
    assert torch.equal(o, want1)
    got = launch_record.record_for(q, k, v, False, opts).graphs.summary()
    assert (got["captures"], got["replays"], got["direct_calls"]) == (1, 1, 3), got


def test_nan_written_into_a_replayed_input_is_reported(setting):
    _need_cuda()
    from ditprof.errors import DitprofError
    from ditprof.kernels.finite_checks import CHECK_EVERY, RING_DEPTH, finish_finite_checks, pending_queue
    from ditprof.kernels.launch_record import record_for

    opts = setting()
    q, k, v = gaussian_inputs(1, 2, 256, 256, 128, seed=960)
    for _ in range(4):
        _call(q, k, v, 0.1, opts)
    finish_finite_checks()
    assert record_for(q, k, v, False, opts).graphs.hits >= 2
    k[0, 3, 1, 5] = float("nan")
    with pytest.raises(DitprofError, match="^k contains NaN or Inf$"):
        for _ in range(CHECK_EVERY + 1):
            _call(q, k, v, 0.1, opts)
        finish_finite_checks()
    for _ in range(RING_DEPTH + 1):  # the flagged reads still queued raise too, one per read
        try:
            finish_finite_checks()
            break
        except DitprofError:
            pass
    assert not pending_queue()


def test_the_callers_own_capture_still_works(setting):
    _need_cuda()
    from ditprof.harness.run import session as S

    opts = setting()
    q, k, v = gaussian_inputs(2, 3, 300, 300, 128, seed=970)
    eager = [_call(q, k, v, 0.08, opts) for _ in range(3)][-1].cpu()  # the record holds a graph of its own now
    samples, note, out = S.time_block_graph(lambda: _call(q, k, v, 0.08, opts), torch.device("cuda"), 3)
    assert samples is not None, note
    assert torch.equal(out, eager)


def test_the_profiler_puts_replayed_kernels_under_attention(setting, tmp_path):
    _need_cuda()
    from torch.profiler import ProfilerActivity, profile, record_function

    from ditprof.harness.trace.categories import load_trace, split_trace
    from ditprof.kernels.launch_record import record_for

    opts = setting()
    q, k, v = gaussian_inputs(1, 4, 1024, 1024, 128, seed=980)
    x = torch.empty_like(q)
    for _ in range(3):  # direct, capture, replay
        torch.mul(q, 1.5, out=x)
        _call(x, k, v, 0.08, opts)
    torch.cuda.synchronize()
    hits = record_for(q, k, v, False, opts).graphs.hits
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            with record_function("ditprof::block"):
                torch.mul(q, 1.5, out=x)  # an elementwise kernel beside the attention
                with record_function("ditprof::attention"):
                    _call(x, k, v, 0.08, opts)
        torch.cuda.synchronize()
    assert record_for(q, k, v, False, opts).graphs.hits == hits + 3
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    split = split_trace(load_trace(path), mode="cuda")
    assert split.iterations == 3
    assert split.split_ms["attention"] > 0 and split.split_ms["elementwise"] > 0, split.split_ms
    assert split.split_ms.get("other", 0.0) == 0.0, split.split_ms


@pytest.mark.parametrize("case", [0, 2, 3])
def test_the_prep_branching_v_gives_the_chains_bits(case, setting):
    """``PrepPlan.launch(branch=...)`` (what a captured call does: V's quantize on a side stream beside the Q/K
    one), run directly here: every output byte the one-stream chain's, none left unwritten."""
    _need_cuda()
    from ditprof.kernels.launch_record import branch_stream, record_for

    (B, H, Sq, Sk, D), n_sms, fmt = CASES[case]
    opts = setting(n_sms, fmt)
    q, k, v = gaussian_inputs(B, H, Sq, Sk, D, seed=990 + case)
    rec = record_for(q, k, v, False, opts)
    assert len(rec.plan.quants) == 2, "an INT8 plan with V's own quantize launch"
    stream = torch.cuda.current_stream()
    got = {}
    for name, branch in (("chain", None), ("branch", branch_stream(q.device))):
        ws = rec._workspace()
        # with Q in the kernel, q8 is a placeholder and q_scales the shared rotation matrix: not outputs
        outs = [n for n in ("q8", "k8", "v8t", "scales", "q_scales")
                if ws[n].numel() > 1 and not (rec.q_rot and n == "q_scales")]
        for n in outs:
            ws[n].view(torch.uint8).fill_(0x7F)
        rec.plan.launch(q, k, v, ws, stream.cuda_stream, branch=branch)
        torch.cuda.synchronize()
        got[name] = {n: ws[n].clone() for n in outs}
    assert all(torch.equal(got["chain"][n], got["branch"][n]) for n in got["chain"])
    assert not got["branch"]["v8t"].float().isnan().any()  # 0x7F is e4m3's NaN: every V code written


@pytest.mark.parametrize("case", [0, 2, 4])
def test_records_without_a_reused_workspace_branch_directly(case, setting, monkeypatch):
    """A problem too large to reuse a workspace (forced here) has no graphs and branches its prep's V quantize on
    every direct call: the bits of a record with a reused workspace launched directly (``graphs=False``: the
    prep in one chain), every output element written."""
    _need_cuda()
    from ditprof.kernels import launch_record

    (B, H, Sq, Sk, D), n_sms, fmt = CASES[case]
    opts = setting(n_sms, fmt)
    q, k, v = gaussian_inputs(B, H, Sq, Sk, D, seed=995 + case)
    scale = 1.0 / math.sqrt(D)
    direct = setting(n_sms, fmt, graphs=False)
    want = _call(q, k, v, scale, direct)
    assert launch_record.record_for(q, k, v, False, direct).reuse
    launch_record._RECORDS.clear()  # the records below are built under the forced limit
    monkeypatch.setattr(launch_record, "WORKSPACE_REUSE_BYTES", 0)
    for _ in range(3):
        with poisoned_outputs(((B, Sq, H, D), torch.bfloat16)):
            o = _call(q, k, v, scale, opts)
        torch.cuda.synchronize()
        assert o.isfinite().all() and torch.equal(o, want)
        del o
    rec = launch_record.record_for(q, k, v, False, opts)
    assert not rec.reuse and rec.graphs is None and rec.branch


SLEEP_CYCLES = 40_000_000  # ~20 ms at ~2 GHz: far longer than the prep's launches at this size


@pytest.mark.parametrize("on_default_stream", [True, False])
@pytest.mark.parametrize("late", ["main", "branch"])
def test_a_branched_prep_is_ordered_on_any_stream(on_default_stream, late, setting, monkeypatch):
    """A record without a reused workspace (forced) branches V's quantize on every call: on the default stream
    (where eager PyTorch runs; a raw handle 0) as on a side stream, the branch must start after the stats and the
    kernel after the branch. ``late`` holds one stream back with a sleep before the call: "main" (the stats run
    late: a branch that does not wait reads scales not yet written), "branch" (V's codes land late: a kernel that
    does not wait reads the NaN-poisoned V codes). Fresh q/k/v every call; the chain's bits every time."""
    _need_cuda()
    from ditprof.kernels import launch_record

    (B, H, Sq, Sk, D), n_sms, fmt = CASES[0]
    opts = setting(n_sms, fmt)
    monkeypatch.setattr(launch_record, "WORKSPACE_REUSE_BYTES", 0)
    base = gaussian_inputs(B, H, Sq, Sk, D, seed=997)
    scale = 1.0 / math.sqrt(D)
    want = _call(*base, scale, setting(n_sms, fmt, branch=False))  # the prep in one chain
    rec = launch_record.record_for(*base, False, opts)
    assert not rec.reuse and rec.branch and len(rec.plan.quants) == 2
    stream = torch.cuda.current_stream() if on_default_stream else torch.cuda.Stream()
    if not on_default_stream:
        stream.wait_stream(torch.cuda.current_stream())
    v8t = ((B, H, D, rec.sk_pad), torch.float8_e4m3fn)
    outs = []
    with torch.cuda.stream(stream):
        for _ in range(3):
            q, k, v = (x * 1.0 for x in base)  # new allocations, as a block's processor hands them over
            held = launch_record.branch_stream(q.device) if late == "branch" else stream
            with torch.cuda.stream(held):
                torch.cuda._sleep(SLEEP_CYCLES)
            with poisoned_outputs(((B, Sq, H, D), torch.bfloat16), v8t) as hits:
                outs.append(_call(q, k, v, scale, opts))
            assert hits["n"] == 2, "the output and the V codes were poisoned"
            del q, k, v
    torch.cuda.synchronize()
    for o in outs:
        assert o.isfinite().all() and torch.equal(o, want)


@pytest.mark.parametrize("case", [0, 2])
def test_fresh_allocations_every_call_as_a_block_makes_them(case, setting):
    """A small problem (reused workspace, graphs on) called the way a block's processor calls it: q/k/v made fresh
    each call and freed after, the freed memory then filled with NaN by the next allocation's owner, a sleep ahead
    of each call, nothing synchronized in between. The caching allocator hands addresses back, so calls are
    captured and replayed; every output must have the direct launches' bits."""
    _need_cuda()
    from ditprof.kernels.launch_record import record_for

    (B, H, Sq, Sk, D), n_sms, fmt = CASES[case]
    base = gaussian_inputs(B, H, Sq, Sk, D, seed=1001 + case)
    scale = 1.0 / math.sqrt(D)
    want = _call(*base, scale, setting(n_sms, fmt, graphs=False))
    opts = setting(n_sms, fmt)
    outs = torch.full((6, *want.shape), float("nan"), dtype=want.dtype, device="cuda")
    for i in range(6):
        q, k, v = (x * 1.0 for x in base)
        torch.cuda._sleep(SLEEP_CYCLES // 4)
        o = _call(q, k, v, scale, opts)
        outs[i].copy_(o)  # on the stream; the output itself is freed, so its address comes back too
        del q, k, v, o
        junk = torch.empty(3 * base[0].numel(), dtype=base[0].dtype, device="cuda")  # takes the freed blocks
        junk.fill_(float("nan"))
        del junk
    torch.cuda.synchronize()
    rec = record_for(*base, False, opts)
    assert rec.reuse and rec.graphs is not None and rec.graphs.hits >= 1, rec.graphs.summary()
    for o in outs:
        assert o.isfinite().all() and torch.equal(o, want)
