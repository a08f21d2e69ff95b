"""The fused prologue on the GPU (marked gpu): the op (norm + RoPE in the Triton prep, then our kernel) against
float64 and against the unfused path, in a block as a swap, under a CUDA graph and torch.compile."""

import math

import pytest
import torch

from ditprof.kernels import op
from ditprof.kernels.prologue import PrologueSpec, prologue_torch

pytestmark = pytest.mark.gpu
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def _case(S, H, D, form, R, g2, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn((1, S, H, D), device="cuda", generator=g).bfloat16() * 2 for _ in range(3))
    k = k + 1.0
    G = 2 if g2 else 1
    wq, wk = (torch.rand((G, D), device="cuda", generator=g).bfloat16() + 0.5 for _ in range(2))
    ang = torch.rand((S, R // 2), device="cuda", generator=g) * 6
    cos = (torch.cos(ang).repeat_interleave(2, -1) if form == "interleaved" else torch.cos(ang).repeat(1, 2))
    sin = (torch.sin(ang).repeat_interleave(2, -1) if form == "interleaved" else torch.sin(ang).repeat(1, 2))
    return q, k, v, wq, wk, cos, sin, (S // 7 if g2 else 0)


def _f64_attention(q, k, v, scale):
    p = torch.softmax(torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) * scale, -1)
    return torch.einsum("bhqk,bkhd->bqhd", p, v.double())


@cuda
@pytest.mark.parametrize("S,H,D,form,R,g2", [(4608, 4, 128, "interleaved", 128, True),
                                            (2000, 3, 128, "half", 64, False),
                                            (1100, 2, 64, "half", 64, False)])
def test_op_vs_float64_and_the_unfused_kernel(S, H, D, form, R, g2):
    from ditprof.kernels.interface import fp8_attention

    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    q, k, v, wq, wk, cos, sin, T = _case(S, H, D, form, R, g2, seed)
    spec = PrologueSpec("rms", 1e-6, form, R)
    scale = 1 / math.sqrt(D)
    out = op.fp8_attention_prologue(q, k, v, spec, wq=wq, wk=wk, cos=cos, sin=sin, text_rows=T)
    torch.cuda.synchronize()
    qp, kp = (prologue_torch(spec, x, w, cos, sin, T) for x, w in ((q, wq), (k, wk)))
    ref = _f64_attention(qp, kp, v, scale)
    unfused = fp8_attention(qp, kp, v, layout="BSHD", scale=scale)
    assert out.shape == q.shape and torch.isfinite(out).all()
    assert _rel(out, ref) < 0.055, (seed, _rel(out, ref))
    assert _rel(out, unfused) < 1e-2, (seed, _rel(out, unfused))


@cuda
def test_op_rms_across_vs_float64_the_unfused_kernel_and_a_graph_replay():
    """Wan's norm across heads: the row factors (computed by the op's entry) loaded by the prep, then our kernel;
    a CUDA graph replays it bit for bit (the row factors' addresses are part of the replay key)."""
    from ditprof.kernels.interface import fp8_attention

    S, H, D = 4608, 4, 128
    q, k, v, _, _, cos, sin, _ = _case(S, H, D, "interleaved", D, False, 11)
    q = q * torch.tensor([0.5, 1.0, 2.0, 4.0], device="cuda")[:, None].bfloat16()  # unlike head scales
    g = torch.Generator(device="cuda").manual_seed(12)
    wq, wk = (torch.rand((H, D), device="cuda", generator=g).bfloat16() + 0.5 for _ in range(2))
    spec = PrologueSpec("rms_across", 1e-6, "interleaved", 0)
    scale = 1 / math.sqrt(D)

    def f(q, k):
        return op.fp8_attention_prologue(q, k, v, spec, wq=wq, wk=wk, cos=cos, sin=sin)

    out = f(q, k).clone()
    qp, kp = (prologue_torch(spec, x, w, cos, sin) for x, w in ((q, wq), (k, wk)))
    assert torch.isfinite(out).all()
    assert _rel(out, _f64_attention(qp, kp, v, scale)) < 0.055
    assert _rel(out, fp8_attention(qp, kp, v, layout="BSHD", scale=scale)) < 1e-2
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = f(q, k)
    replayed.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(replayed, out, rtol=0, atol=0)


@cuda
def test_op_replays_in_a_cuda_graph_and_compiles():
    q, k, v, wq, wk, cos, sin, _ = _case(1024, 2, 128, "interleaved", 128, False, 5)
    spec = PrologueSpec("rms", 1e-6, "interleaved", 128)

    def f(q, k):
        return op.fp8_attention_prologue(q, k, v, spec, wq=wq, wk=wk, cos=cos, sin=sin)

    eager = f(q, k).clone()
    graph = torch.cuda.CUDAGraph()
    f(q, k)
    with torch.cuda.graph(graph):
        out = f(q, k)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, eager, rtol=0, atol=0)
    compiled = torch.compile(f, fullgraph=True)
    torch.testing.assert_close(compiled(q, k), eager, rtol=0, atol=0)


def _assert_fused_block_matches_the_unfused(loaded, inputs):
    """The block with the fused prologue vs the unfused FP8 block (rel-RMS < 1.5e-2) and no further from SDPA."""
    from ditprof.harness.swaps.attention import AttentionSwap
    from ditprof.harness.swaps.prologue import PrologueSwap
    from ditprof.kernels import registry

    fam, fp8 = loaded.family, registry.get("fp8")
    outs = {}
    for name, swap in (("unfused", AttentionSwap(fp8, uses_dispatcher=fam.uses_dispatcher)),
                       ("fused", PrologueSwap(fp8, fam, uses_dispatcher=fam.uses_dispatcher)),
                       ("sdpa", AttentionSwap(registry.get("sdpa"), uses_dispatcher=fam.uses_dispatcher))):
        with torch.no_grad(), swap.applied(loaded.module):
            outs[name] = inputs.run(loaded.module).clone()
    assert torch.isfinite(outs["fused"]).all()
    assert _rel(outs["fused"], outs["unfused"]) < 1.5e-2
    assert _rel(outs["fused"], outs["sdpa"]) < 1.5 * _rel(outs["unfused"], outs["sdpa"]) + 2e-3


@cuda
def test_swap_in_the_h3_mini_block_matches_the_unfused_fp8_block():
    from ditprof.model_blocks import make_inputs
    from ditprof.model_blocks.synthetic import synthetic_block

    loaded = synthetic_block("h3-mini", 0, device="cuda")
    inputs = make_inputs(loaded, tokens=2048)
    _assert_fused_block_matches_the_unfused(loaded, inputs)


@cuda
def test_op_with_key_lens_and_identity_rows_vs_float64_and_the_unfused_kernel():
    """HunyuanVideo's shape of the problem: [video, prompt] rows, the prompt's own norm weights (the G = 2 split at
    the video rows), no RoPE on the prompt (cos = 1, sin = 0 rows) and a padded prompt (key counts per item)."""
    from ditprof.kernels.interface import fp8_attention
    from ditprof.model_blocks.families.base import PrologueTables

    S, T, H, D = 3000, 256, 3, 128
    q, k, v, wq, wk, cos, sin, _ = _case(S + T, H, D, "interleaved", D, True, 11)
    q, k, v = (torch.cat([x, x[:1]]) for x in (q, k, v))  # two batch items
    cos, sin = PrologueTables()(cos[:S], sin[:S], T)
    lens = torch.tensor([S + T, S + 100], dtype=torch.int32, device="cuda")
    spec = PrologueSpec("rms", 1e-6, "interleaved", D)
    scale = 1 / math.sqrt(D)
    out = op.fp8_attention_prologue(q, k, v, spec, wq=wq, wk=wk, cos=cos, sin=sin, text_rows=S, key_lens=lens)
    qp, kp = (prologue_torch(spec, x, w, cos, sin, S) for x, w in ((q, wq), (k, wk)))
    keep = torch.arange(S + T, device="cuda")[None, :] < lens[:, None].long()
    unfused = fp8_attention(qp, kp, v, layout="BSHD", scale=scale, key_mask=keep)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
    for b in range(2):
        n = int(lens[b])
        ref = _f64_attention(qp[b:b + 1], kp[b:b + 1, :n], v[b:b + 1, :n], scale)
        assert _rel(out[b:b + 1], ref) < 0.055, (b, _rel(out[b:b + 1], ref))
        assert _rel(out[b:b + 1], unfused[b:b + 1]) < 1e-2, (b, _rel(out[b:b + 1], unfused[b:b + 1]))


@cuda
@pytest.mark.parametrize("kind", ["double", "single"])
def test_swap_in_a_padded_hunyuan_video_block_matches_the_unfused_fp8_block(kind):
    from ditprof.model_blocks import make_inputs
    from ditprof.model_blocks.synthetic import synthetic_block

    loaded = synthetic_block("hunyuan-video", 0, kind=kind, device="cuda")
    inputs = make_inputs(loaded, tokens=1536, batch=2, text_tokens=128)
    inputs.kwargs["attention_mask"][1, ..., -40:] = False
    _assert_fused_block_matches_the_unfused(loaded, inputs)
