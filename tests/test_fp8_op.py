"""torch.ops.ditprof.fp8_attention: a custom op with a fake implementation, so a block with the swap compiles
with fullgraph=True; bad input is the same one-line error under compile. On CPU the op runs the emulation."""

from __future__ import annotations

import pytest
import torch

import ditprof.kernels.op  # noqa: F401 -- registers the op
from ditprof.errors import DitprofError
from ditprof.kernels.fp8_emulation import fp8_attention_emulated
from ditprof.kernels.op import fp8_attention


def _qkv(seed=0, B=2, Sq=40, Sk=70, H=2, D=64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, s, H, D, generator=g).to(torch.bfloat16) for s in (Sq, Sk, Sk)]


def test_op_is_registered_with_a_fake_and_matches_the_emulation():
    q, k, v = _qkv()
    torch.library.opcheck(torch.ops.ditprof.fp8_attention.default, (q, k, v, 0.125, None),
                          test_utils=("test_schema", "test_faketensor"))
    out = fp8_attention(q, k, v)
    assert torch.equal(out, fp8_attention_emulated(q, k, v))
    keys = torch.arange(70)[None, :] < torch.tensor([[33], [70]])
    assert torch.equal(fp8_attention(q, k, v, key_mask=keys), fp8_attention_emulated(q, k, v, key_mask=keys))


def test_compiles_fullgraph_with_the_op_as_one_node():
    q, k, v = _qkv(1)
    w = torch.randn(64, 64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)

    def block(q, k, v):
        return fp8_attention(q @ w, k, v).sum(dim=-1)

    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v), block(q, k, v))
    explained = torch._dynamo.explain(block)(q, k, v)
    assert explained.graph_break_count == 0 and explained.graph_count == 1


def test_bad_input_is_one_line_eager_and_under_compile():
    q, k, v = _qkv()
    with pytest.raises(DitprofError, match=r"supports head_dim \(64, 128\), got 32"):
        fp8_attention(q[..., :32], k[..., :32], v[..., :32])
    with pytest.raises(DitprofError, match="bfloat16 or float16"):
        fp8_attention(q.float(), k.float(), v.float())
    with pytest.raises(DitprofError, match="scale must be a positive finite number"):
        fp8_attention(q, k, v, scale=-1.0)
    compiled = torch.compile(lambda q, k, v: fp8_attention(q, k, v), fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception) as e:  # dynamo wraps errors raised while tracing; ours is the cause
        compiled(q[..., :32], k[..., :32], v[..., :32])
    chain = [e.value] + [x for x in (e.value.__cause__, e.value.__context__) if x is not None]
    assert any(isinstance(x, DitprofError) and "head_dim" in str(x) for x in chain) or \
        "supports head_dim (64, 128), got 32" in str(e.value)


def test_a_block_with_the_swap_compiles_fullgraph():
    """The real MiniMax-H3 block class (h3-mini) with the op swapped in through diffusers' dispatcher: one graph,
    no breaks, the eager output."""
    from ditprof import dispatch as swap
    from ditprof.model_blocks import load_block, make_inputs

    lb = load_block("h3-mini", 0, dtype=torch.bfloat16, progress=False)
    inp = make_inputs(lb, tokens=256)

    def backend(q, k, v, *, scale=None, key_mask=None):
        return fp8_attention(q, k, v, scale=scale, key_mask=key_mask)

    with torch.no_grad(), swap.swapped(lb.module, "fp8-op-test", backend, uses_dispatcher=lb.family.uses_dispatcher):
        ref = inp.run(lb.module)
        explained = torch._dynamo.explain(lb.module)(**inp.kwargs)
        assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
        out = torch.compile(lb.module, fullgraph=True, backend="aot_eager")(**inp.kwargs)
    assert torch.equal(out, ref)


def test_default_options_follow_os_environ(monkeypatch):
    """A call without options takes ``fp8_config.default_options()``: DITPROF_FP8_QK and DITPROF_FP8_CHECK as
    os.environ / monkeypatch set and unset them, one options object per pair of values (the launch records are
    keyed on it)."""
    from ditprof.kernels.fp8_config import default_options

    monkeypatch.delenv("DITPROF_FP8_QK", raising=False)
    monkeypatch.delenv("DITPROF_FP8_CHECK", raising=False)
    assert default_options().qk_format is None and default_options().check == "defer"
    monkeypatch.setenv("DITPROF_FP8_QK", "int8")
    assert default_options().qk_format == "int8"
    monkeypatch.setenv("DITPROF_FP8_CHECK", "sync")
    assert default_options().check == "sync" and default_options() is default_options()
    monkeypatch.delenv("DITPROF_FP8_CHECK")
    assert default_options().check == "defer"


def test_qk_format_switch(monkeypatch):
    from ditprof.errors import DitprofError
    from ditprof.kernels.qk_format import DEFAULT_QK_FORMAT, qk_format

    monkeypatch.delenv("DITPROF_FP8_QK", raising=False)
    assert qk_format() == DEFAULT_QK_FORMAT
    monkeypatch.setenv("DITPROF_FP8_QK", "int8")
    assert qk_format() == "int8" and qk_format("e4m3") == "e4m3"
    with pytest.raises(DitprofError, match="unknown fp8 Q/K format 'fp4'; known: e4m3, int8"):
        qk_format("fp4")


def test_cpu_op_follows_the_qk_format(monkeypatch):
    """On the CPU the op runs the emulation of the Q/K format the GPU path would take (DITPROF_FP8_QK)."""
    from ditprof.kernels.accuracy import make_inputs
    from ditprof.kernels.fp8_config import Fp8Options
    from ditprof.kernels.op import options_key

    q, k, v = make_inputs("outlier", (1, 2, 256, 64), seed=4)
    outs = {}
    for fmt in ("int8", "e4m3"):
        monkeypatch.setenv("DITPROF_FP8_QK", fmt)
        outs[fmt] = torch.ops.ditprof.fp8_attention(q, k, v, 0.125, None)
        assert torch.equal(outs[fmt], fp8_attention_emulated(q, k, v, scale=0.125, qk_format=fmt)), fmt
        # the same format named by the call's options instead of the process's
        by_options = torch.ops.ditprof.fp8_attention(q, k, v, 0.125, None, options_key(Fp8Options(qk_format=fmt)))
        assert torch.equal(by_options, outs[fmt]), fmt
    assert not torch.equal(outs["int8"], outs["e4m3"])
