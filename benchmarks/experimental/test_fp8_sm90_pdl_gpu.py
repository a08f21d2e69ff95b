"""GPU checks of the PDL build of fp8-sm90 (``fp8_fwd_sm90_pdl.py``) in the real call path: the launch record of
``torch.ops.ditprof.fp8_attention`` with its kernel swapped for the PDL build gives the shipped outputs bit for bit,
call after call back to back on changing inputs (a missing or late wait would read a prep that is still being
written), inside a CUDA graph too; INT8 and e4m3 Q/K.

    python -m pytest -q -m gpu benchmarks/experimental/test_fp8_sm90_pdl_gpu.py
"""

from __future__ import annotations

import pytest
import torch

from sm90_gpu_cases import need_sm90

pytestmark = pytest.mark.gpu


def _inputs(n, B=1, S=1000, H=4, D=128, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [tuple(torch.randn((B, S, H, D), generator=g, device="cuda").to(torch.bfloat16) for _ in range(3))
            for _ in range(n)]


@pytest.mark.parametrize("fmt", ["int8", "e4m3"])
def test_pdl_record_equals_shipped_back_to_back_and_in_a_graph(fmt, monkeypatch):
    need_sm90()
    from fp8_fwd_sm90_pdl import compile_for_spec

    from ditprof.kernels.launch import record_for
    from ditprof.kernels.op import fp8_attention

    monkeypatch.setenv("DITPROF_FP8_QK", fmt)
    monkeypatch.setenv("DITPROF_FP8_STREAMK", "0")  # the PDL build is the plain grid's
    sets = _inputs(6, seed=1 if fmt == "int8" else 2)
    ref = [fp8_attention(*x) for x in sets]  # the shipped kernel
    torch.cuda.synchronize()
    rec = record_for(*sets[0], False)
    shipped_fn = rec.fn
    rec.fn = compile_for_spec(rec.spec)
    try:
        for _ in range(5):  # back to back, no sync between calls
            outs = [fp8_attention(*x) for x in sets]
        torch.cuda.synchronize()
        assert rec.fn is not shipped_fn  # no fallback to the shipped build
        for o, r in zip(outs, ref):
            assert torch.equal(o, r)
        # captured: the graph's kernel nodes keep the programmatic dependency
        static = [tuple(t.clone() for t in x) for x in sets[:2]]
        fp8_attention(*static[0])
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            g_out = [fp8_attention(*x) for x in static]
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        for o, r in zip(g_out, ref[:2]):
            assert torch.equal(o, r)
    finally:
        rec.fn = shipped_fn
