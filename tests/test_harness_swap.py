"""Swap-in: diffusers dispatcher registration (real AttentionBackendName member) and processor replacement."""

import pytest
import torch
import torch.nn.functional as F

from ditprof.errors import DitprofError
from ditprof import dispatch as swap
from ditprof.harness.trace.categories import ATTENTION_RANGE
from ditprof.harness.trace.ranges import norm_ranges

from tiny_blocks import cog_block, wan_block


class Counting:
    def __init__(self):
        self.calls = 0

    def __call__(self, q, k, v, *, scale=None):
        self.calls += 1
        assert q.dim() == 4 and q.shape[0] == 1  # (B, S, H, D)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=scale)
        return o.transpose(1, 2)


def test_dispatcher_member_and_public_entry_points():
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry, attention_backend

    fn = Counting()
    member = swap.register_with_dispatcher("test-count", fn)
    assert member.value == "ditprof_test_count" and member.name == "DITPROF_TEST_COUNT"
    assert AttentionBackendName("ditprof_test_count") is member
    assert AttentionBackendName.DITPROF_TEST_COUNT is member
    assert "ditprof_test_count" in {m.value for m in AttentionBackendName.__members__.values()}
    assert swap.is_registered("test-count")
    assert swap.register_with_dispatcher("test-count", fn) is member  # idempotent

    blk, args = wan_block()
    with torch.no_grad():
        ref = blk(*args)
        before = _AttentionBackendRegistry._active_backend
        with attention_backend("ditprof_test_count"):  # diffusers' own context manager
            out = blk(*args)
        assert _AttentionBackendRegistry._active_backend == before
        assert fn.calls == 2  # self- and cross-attention
        torch.testing.assert_close(out, ref)
        blk.attn1.set_attention_backend("ditprof_test_count")  # diffusers' per-module entry point
        blk(*args)
        assert fn.calls == 3
        blk.attn1.processor._attention_backend = None


def test_swapped_dispatcher_route_restores_state():
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    blk, args = wan_block()
    fn = Counting()
    active = _AttentionBackendRegistry._active_backend
    with torch.no_grad():
        ref = blk(*args)
        with swap.swapped(blk, "test-count2", fn) as state:
            assert state.route == "dispatcher" and list(state.modules) == ["attn1", "attn2"]
            out = blk(*args)
        assert fn.calls == 2
        torch.testing.assert_close(out, ref)
        assert [m.processor._attention_backend for _, m in swap.attention_modules(blk)] == [None, None]
        assert _AttentionBackendRegistry._active_backend == active  # no global backend leaked
        blk(*args)
        assert fn.calls == 2  # restored: the swap is gone


def test_processor_route_for_cogvideox():
    blk, args = cog_block()
    fn = Counting()
    original = [m.processor for _, m in swap.attention_modules(blk)]
    sdpa = F.scaled_dot_product_attention
    with torch.no_grad():
        ref = blk(*args)
        with swap.swapped(blk, "test-cog", fn, uses_dispatcher=False) as state:
            assert state.route == "processor"
            out = blk(*args)
            assert fn.calls == 1
            # SDPA is routed while the swap is installed, but only our processors' calls reach the backend
            q = torch.randn(1, 2, 5, 8)
            assert torch.equal(F.scaled_dot_product_attention(q, q, q), sdpa(q, q, q)) and fn.calls == 1
        assert F.scaled_dot_product_attention is sdpa  # restored with the processors
        for a, b in zip(out, ref):
            torch.testing.assert_close(a, b)
    assert [m.processor for _, m in swap.attention_modules(blk)] == original


def test_attention_range_in_profile():
    blk, args = wan_block()
    with swap.swapped(blk, "test-range", Counting()), torch.no_grad():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            blk(*args)
    names = [e.name for e in prof.events()]
    assert names.count(ATTENTION_RANGE) == 2


def test_masks():
    fn = Counting()
    call = swap.wrap_backend("m", fn)
    q = torch.randn(1, 4, 2, 8)
    out = call(q, q, q, attn_mask=torch.ones(1, 1, 1, 4, dtype=torch.bool))
    out2 = call(q, q, q, attn_mask=torch.zeros(1, 2, 1, 4))
    torch.testing.assert_close(out, out2)
    assert call.masks == {"dropped_all_attend": 2}
    bad = torch.tensor([True, False, True, True]).view(1, 1, 1, 4)
    with pytest.raises(DitprofError, match="masks positions"):
        swap.wrap_backend("m2", fn)(q, q, q, attn_mask=bad)
    with pytest.raises(DitprofError, match="causal"):
        call(q, q, q, is_causal=True)

    seen = {}

    def masked(q, k, v, *, scale=None, attn_mask=None):
        seen["mask"] = attn_mask
        return q

    swap.wrap_backend("mm", masked)(q, q, q, attn_mask=torch.zeros(1, 1, 1, 4, dtype=torch.bool))
    assert seen["mask"] is not None  # a mask-aware backend gets the mask


def test_no_attention_module():
    with pytest.raises(DitprofError, match="no diffusers attention module"):
        swap.install(torch.nn.Linear(2, 2), "x", Counting())


def test_norm_ranges_count_decomposed_rmsnorm_as_norm(tmp_path):
    from diffusers.models.normalization import AdaLayerNormZero, RMSNorm

    from ditprof.harness.trace import categories as C

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rms = RMSNorm(32, eps=1e-6)  # pow / mean / rsqrt / mul: no aten norm op
            self.ada = AdaLayerNormZero(32)  # holds a Linear: not wrapped itself, its LayerNorm is

        def forward(self, x, emb):
            return self.ada(self.rms(x), emb=emb)[0]

    m = Tiny()
    x, emb = torch.randn(1, 8, 32), torch.randn(1, 32)
    with norm_ranges(m) as names:
        assert names == ["rms", "ada.norm"]
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            with torch.profiler.record_function(C.BLOCK_RANGE):
                m(x, emb)
    assert "forward" not in m.rms.__dict__ and "forward" not in m.ada.norm.__dict__  # restored
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    split = C.split_trace(C.load_trace(tmp_path / "t.json"))
    ops = {(o["op"], o["category"]) for o in split.top_ops}
    assert ("aten::pow", "norm") in ops or ("aten::rsqrt", "norm") in ops or ("aten::mean", "norm") in ops
    assert any(cat == "gemm" for _, cat in ops)  # the AdaLayerNorm projection stays a GEMM
