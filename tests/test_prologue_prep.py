"""The fused attention prologue in the INT8 Q/K prep (``prep.fp8_prepare_prologue``): the reference numerics
(``prologue_torch``) against a float64 derivation of norm + RoPE, the torch backend against its own definition
(``prologue_torch`` then the INT8 torch chain, bit for bit), input errors, and the Triton kernels (the prologue
applied to each Q/K tile as it is loaded) against the torch backend under the Triton interpreter on CPU and natively
on CUDA (marked gpu).

Tolerance of Triton vs torch (``assert_close_pro``): the INT8 mode's (tests/test_prep_int8.py) widened for the
prologue, whose fp32 value may round to the other neighbouring 16-bit value now and then (another order of the
norm's sum of squares, fused multiply-adds), which moves that row's rotated values: at most 0.5 % of the int8 codes
off by exactly 1, none by more; q_scales and the K descale within 1e-5 relative on all but 0.5 % of the rows, within
1e-3 on every row; k_mean within 1e-5 of each head's max |k_mean| plus four 16-bit ulps of the head's max |K| / S
(a K value rounded the other way moves its channel's mean by its ulp / S); V (e4m3), its descale and scales[..., 0]
bit for bit; pad rows zero (codes) and 1.0 (q_scales).
"""

from __future__ import annotations

import re

import pytest
import torch
from test_prep_int8 import assert_close_int8, poisoned_like
from triton_interpreter import inner_only, run_under_interpreter

from ditprof.errors import DitprofError
from ditprof.kernels.prep import Fp8Prepared, fp8_prepare_prologue, fp8_prepare_torch
from ditprof.kernels.prologue import PrologueSpec, pair_tables, prologue_tensors, prologue_torch

CODE_OFF_BY_ONE_MAX = 5e-3
SCALE_RTOL = 1e-5
SCALE_RTOL_ROWS = 5e-3  # fraction of rows (q_scales) whose descale may be off by more than SCALE_RTOL
SCALE_RTOL_MAX = 1e-3

# name -> (PrologueSpec keywords, weight rows G, RoPE over D / 2 channels only): the forms the fused prep must match
# ("across": Wan's norm over all heads, weights (H, D), G unused)
FORMS = {
    "half": (dict(rope="half"), 1, False),
    "half-R/2": (dict(rope="half"), 1, True),
    "interleaved": (dict(rope="interleaved"), 1, False),
    "interleaved-R/2": (dict(rope="interleaved"), 1, True),
    "norm-only": (dict(rope=None), 1, False),
    "rope-only": (dict(norm=None, rope="half"), 1, False),
    "G2": (dict(rope="half", eps=1e-5), 2, False),
    "across": (dict(norm="rms_across", rope="interleaved"), 1, False),
}


def make_spec(form: str, D: int) -> tuple[PrologueSpec, int]:
    kw, G, half_r = FORMS[form]
    return PrologueSpec(**kw, rope_dim=D // 2 if half_r else 0), G


def rope_table(S: int, R: int, form: str, base: float = 10000.0):
    """A rotary table (S, R) float32 laid out for ``form`` (each channel pair's angle in both of its slots)."""
    pos = torch.arange(S, dtype=torch.float64)[:, None]
    ang = pos * base ** (-torch.arange(0, R, 2, dtype=torch.float64) / R)[None, :]
    ang = torch.cat((ang, ang), dim=-1) if form == "half" else ang.repeat_interleave(2, dim=-1)
    return ang.cos().float(), ang.sin().float()


def make_case(form: str, B, S, H, D, dtype=torch.bfloat16, seed=0, device="cpu", w_dtype=torch.bfloat16):
    """spec and the arguments of fp8_prepare_prologue after it: raw q, k (K with a per-channel offset, so the
    smoothing matters), v, the weights (None without a norm), the table (None without RoPE), text_rows."""
    spec, G = make_spec(form, D)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, S, H, D, generator=g) * 3.0 + 0.5
    k = torch.randn(B, S, H, D, generator=g) + torch.randn(1, 1, H, D, generator=g) * 4.0
    v = torch.randn(B, S, H, D, generator=g) * 0.7
    if spec.across:  # heads of unlike scales: a row's factor is not any one head's
        q = q * torch.linspace(0.5, 2.0, H)[:, None]
    rows = H if spec.across else G
    wq, wk = ((1.0 + 0.3 * torch.randn(rows, D, generator=g)).to(w_dtype) for _ in range(2))
    R = spec.rotated(D)
    cos, sin = rope_table(S, R, spec.rope) if R else (None, None)
    if spec.norm is None:
        wq = wk = None
    args = [x.to(dtype=dtype) for x in (q, k, v)] + [wq, wk, cos, sin]
    args = [None if x is None else x.to(device) for x in args]
    return spec, (*args, S // 3 if G == 2 else 0)


def float64_prologue(spec: PrologueSpec, x, w, cos, sin, text_rows):
    """norm + RoPE written out in float64 from the formulas (prologue.py's module docstring), no rounding."""
    n = x.double()
    D = x.shape[-1]
    if spec.across:  # over all heads of the row; head h takes weight row h
        n = n / torch.sqrt((n * n).mean(dim=(-2, -1), keepdim=True) + spec.eps) * w.double()
    elif spec.norm is not None:
        n = n / torch.sqrt((n * n).sum(-1, keepdim=True) / D + spec.eps)
        rows = torch.arange(x.shape[1]) < text_rows
        wr = w.double()[torch.where(rows, 0, w.shape[0] - 1)]  # (S, D): row 0 for text rows when G == 2
        n = n * wr[None, :, None, :]
    R = spec.rotated(D)
    if R:
        c, s = cos.double()[None, :, None, :], sin.double()[None, :, None, :]
        h = n[..., :R]
        if spec.rope == "half":
            rot = torch.cat((-h[..., R // 2:], h[..., :R // 2]), dim=-1)
        else:
            rot = torch.empty_like(h)
            rot[..., 0::2], rot[..., 1::2] = -h[..., 1::2], h[..., 0::2]
        n = torch.cat((h * c + rot * s, n[..., R:]), dim=-1)
    return n


# ------------------------------------------------------------------ CPU: the reference numerics and the torch backend

@pytest.mark.parametrize("form", list(FORMS))
def test_prologue_torch_matches_float64(form):
    """prologue_torch (fp32, one rounding) is the float64 formula to one bf16 rounding: relative error at most
    bf16's unit roundoff 2^-8 (~3.9e-3; +1 % for the fp32 steps, and an absolute floor of 1e-6 x the row's scale for
    RoPE values that cancel to near zero), and the correctly rounded bf16 value on all but 0.1 % of the elements."""
    spec, (q, k, v, wq, wk, cos, sin, text_rows) = make_case(form, 2, 50, 2, 64, seed=1)
    for x, w in ((q, wq), (k, wk)):
        got = prologue_torch(spec, x, w, cos, sin, text_rows)
        ref = float64_prologue(spec, x, w, cos, sin, text_rows)
        scale = ref.abs().amax(-1, keepdim=True)
        err = (got.double() - ref).abs()
        assert bool((err <= 2.0 ** -8 * 1.01 * ref.abs() + 1e-6 * scale).all()), form
        assert float((got != ref.to(got.dtype)).float().mean()) <= 1e-3, form


@pytest.mark.parametrize("form", ["half", "interleaved-R/2", "G2", "rope-only", "across"])
def test_torch_backend_is_prologue_then_the_int8_chain(form):
    spec, (q, k, v, wq, wk, cos, sin, text_rows) = make_case(form, 2, 70, 2, 64, seed=2)
    ref = fp8_prepare_torch(prologue_torch(spec, q, wq, cos, sin, text_rows),
                            prologue_torch(spec, k, wk, cos, sin, text_rows), v, qk_int8=True)
    out = poisoned_like(ref)
    res = fp8_prepare_prologue(q, k, v, spec, wq, wk, cos, sin, text_rows, backend="torch", out=out)
    assert res.q8 is out.q8 and res.q_scales is out.q_scales
    assert_close_int8(res, ref, exact=True)
    raw = fp8_prepare_torch(q, k, v, qk_int8=True)  # the prologue changed what was quantized
    assert not torch.equal(raw.q8, res.q8) and not torch.equal(raw.k8, res.k8)


def test_bad_inputs_are_one_line_errors():
    spec, (q, k, v, wq, wk, cos, sin, text_rows) = make_case("half", 1, 40, 2, 64)
    call = lambda *a, **kw: fp8_prepare_prologue(*a, backend="torch", **kw)  # noqa: E731
    cases = [
        ((q, k, v, spec, wq[:, :32], wk, cos, sin), "norm weight of q"),
        ((q, k, v, spec, wq, torch.ones(3, 64), cos, sin), "norm weight of k"),
        ((q, k, v, spec, wq, wk, cos[:, :32], sin), "cos must be"),
        ((q, k, v, spec, wq, wk, cos, sin[:-1]), "sin must be"),
        ((q, k, v, spec, wq, wk, None, sin), "cos must be"),
        ((q, k, v, "half", wq, wk, cos, sin), "PrologueSpec"),
        ((q, k[:, :20], v[:, :20], spec, wq, wk, cos, sin), "one sequence length"),
        ((q, k, v, PrologueSpec(rope="half", rope_dim=128), wq, wk, cos, sin), "exceeds head_dim"),
        ((q, k, v, spec, wq.repeat(2, 1), wk, cos, sin, 10), "same rows"),
        ((q, k, v, spec, wq.repeat(2, 1), wk.repeat(2, 1), cos, sin, 41), "text_rows"),
    ]
    for args, word in cases:
        with pytest.raises(DitprofError, match=word) as err:
            call(*args)
        assert "\n" not in str(err.value)
    with pytest.raises(DitprofError, match="rope must be one of"):
        PrologueSpec(rope="rotate")
    with pytest.raises(DitprofError, match="backend"):
        fp8_prepare_prologue(q, k, v, spec, wq, wk, cos, sin, backend="cuda")


def test_across_bad_inputs_are_one_line_errors():
    """rms_across: weights (H, D), row factors float32 (B, S) and only with that norm; the FA3 peer has none."""
    from ditprof.kernels.fa3_prologue import fa3_prologue_inputs
    from ditprof.kernels.prologue import check_prologue_call, row_factors

    spec, (q, k, v, wq, wk, cos, sin, _) = make_case("across", 1, 40, 2, 64)
    rs = row_factors(q, spec.eps)
    cases = [
        (lambda: fp8_prepare_prologue(q, k, v, spec, wq[:1], wk, cos, sin, backend="torch"),
         r"norm weight of q must be \(2, 64\)"),
        (lambda: check_prologue_call(spec, q, k, wq, wk, cos, sin, 0, rs[:, :20], rs), "row factors of q"),
        (lambda: check_prologue_call(spec, q, k, wq, wk, cos, sin, 0, rs, rs.double()), "row factors of k"),
        (lambda: check_prologue_call(PrologueSpec(rope="interleaved"), q, k, wq[:1], wk[:1], cos, sin, 0, rs, rs),
         "rms_across' only"),
        (lambda: fa3_prologue_inputs(q, k, v, spec, wq=wq, wk=wk, cos=cos, sin=sin), "rms_across"),
    ]
    for call, word in cases:
        with pytest.raises(DitprofError, match=word) as err:
            call()
        assert "\n" not in str(err.value)


def test_row_factors_are_the_float64_ones():
    """rs = 1/sqrt(mean over (H, D) of x^2 + eps) to a few fp32 ulps (the norm's square)."""
    from ditprof.kernels.prologue import row_factors

    x = (torch.randn(2, 30, 3, 64, generator=torch.Generator().manual_seed(4)) * 5).to(torch.bfloat16)
    x[0, 3] = 0  # an all-zero row: 1 / sqrt(eps)
    got = row_factors(x, 1e-6)
    ref = 1 / torch.sqrt(x.double().pow(2).mean(dim=(-2, -1)) + 1e-6)
    assert got.dtype == torch.float32 and got.shape == (2, 30)
    torch.testing.assert_close(got.double(), ref, rtol=1e-6, atol=0)


@pytest.mark.parametrize("form", ["half", "interleaved"])
def test_pair_tables(form):
    """The kernels' rotary tables: one (cos, sin) per rotated pair, taken from the processor's table (interleaved:
    even channels; half: the first half), the same tensor again for the same table object (the launch graphs'
    keys), rebuilt after the table changes in place, and a table whose pair channels differ is refused."""
    spec = PrologueSpec(rope=form)
    cos, sin = rope_table(40, 16, form)
    pc, ps = pair_tables(spec, cos, sin)
    ang = torch.arange(40, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)[None, :]
    assert pc.shape == (40, 8) and pc.dtype == torch.float32 and pc.is_contiguous()
    torch.testing.assert_close(pc, ang.cos().float(), rtol=0, atol=0)
    torch.testing.assert_close(ps, ang.sin().float(), rtol=0, atol=0)
    assert pc.data_ptr() != cos.data_ptr()
    assert pair_tables(spec, cos, sin)[0] is pc
    cos.mul_(0.5)
    again = pair_tables(spec, cos, sin)[0]
    assert again is not pc and torch.equal(again, pc * 0.5)
    bad = cos.clone()
    bad[3, 1] += 1.0  # channel 1 of a row: its partner is channel 0 (interleaved) or 9 (half)
    with pytest.raises(DitprofError, match="one angle per pair"):
        pair_tables(spec, bad, sin)
    assert pair_tables(PrologueSpec(rope=None), None, None) == (None, None)


def test_plan_rejects_prologue_misuse():
    """PrepPlan: a prologue needs INT8 Q/K, the prep's Q and one sequence length; pro is required iff there is a
    prologue (GPU-free: meta tensors)."""
    pytest.importorskip("triton")
    from ditprof.kernels import prep_triton as P

    spec = PrologueSpec()
    q = torch.empty((1, 256, 2, 64), dtype=torch.bfloat16, device="meta")
    for kw, word in ((dict(), "qk_int8"), (dict(qk_int8=True, skip_q=True), "skip_q"),
                     (dict(qk_int8=True, pro_groups=3), "pro_groups")):
        with pytest.raises(ValueError, match=word):
            P.PrepPlan(q, q, q, True, prologue=spec, **kw)
    with pytest.raises(ValueError, match="one sequence length"):
        P.PrepPlan(q, q[:, :100], q[:, :100], True, qk_int8=True, prologue=spec)
    plan = P.PrepPlan(q, q, q, True, qk_int8=True, prologue=spec)
    assert plan.stats.slots[-5:] == tuple(plan.stats.names.index(n) for n in P._PRO_ARGS)
    bufs = plan.buffers("meta")
    with pytest.raises(ValueError, match="pass pro="):
        plan._arguments(q, q, q, bufs, None)
    plain = P.PrepPlan(q, q, q, True, qk_int8=True)
    with pytest.raises(ValueError, match="no prologue"):
        plain._arguments(q, q, q, plain.buffers("meta"), None, pro=(None,) * 4 + (0,))
    # without a prologue the kernels take no prologue tensor: the per-call tuples are what they were
    assert len(plain._arguments(q, q, q, plain.buffers("meta"), None)[0]) == len(P._STATS_ARGS)
    w = torch.ones((2, 64), device="meta")
    cos = torch.ones((256, 32), device="meta")  # a pair table: (S, R/2)
    with pytest.raises(ValueError, match=r"wq must be a contiguous float \(1, 64\)"):
        plan._arguments(q, q, q, bufs, None, pro=(w, w, cos, cos, 0))
    w1, full = w[:1], torch.ones((256, 64), device="meta")
    with pytest.raises(ValueError, match=r"cos must be a contiguous float32 \(256, 32\) pair table"):
        plan._arguments(q, q, q, bufs, None, pro=(w1, w1, full, full, 0))
    assert len(plan._arguments(q, q, q, bufs, None, pro=(w1, w1, cos, cos, 0))[0]) == len(P._STATS_ARGS) + 5
    # rms_across: one plan group, the row factors after text_rows (their slots last), (H, D) weights
    across = PrologueSpec("rms_across", rope="interleaved")
    with pytest.raises(ValueError, match="pro_groups"):
        P.PrepPlan(q, q, q, True, qk_int8=True, prologue=across, pro_groups=2)
    plan = P.PrepPlan(q, q, q, True, qk_int8=True, prologue=across)
    assert plan.stats.slots[-7:] == tuple(plan.stats.names.index(n) for n in P._PRO_ARGS + P._PRO_RS_ARGS)
    bufs, rs = plan.buffers("meta"), torch.ones((1, 256), device="meta")
    with pytest.raises(ValueError, match="rsq, rsk"):
        plan._arguments(q, q, q, bufs, None, pro=(w, w, cos, cos, 0))
    with pytest.raises(ValueError, match=r"rsk must be a contiguous float32 \(1, 256\)"):
        plan._arguments(q, q, q, bufs, None, pro=(w, w, cos, cos, 0, rs, rs[:, :100]))
    assert len(plan._arguments(q, q, q, bufs, None, pro=(w, w, cos, cos, 0, rs, rs))[0]) == len(P._STATS_ARGS) + 7


def test_prologue_kernels_compile_offline():
    """The fused builds compile for sm_90 with no spills, IEEE sqrt and division in the norm; without a prologue
    the prologue's arguments are not even parameters (constexpr None)."""
    pytest.importorskip("triton")
    from ditprof.kernels import prep_triton as P

    plain = P.compile_offline(90, head_dim=128, qk_int8=True)
    for spec, G in ((PrologueSpec(rope="half"), 2), (PrologueSpec(rope="interleaved", rope_dim=64), 1)):
        ks = P.compile_offline(90, head_dim=128, qk_int8=True, prologue=spec, pro_groups=G)
        for name in ("stats", "quant"):
            ptx = ks[name].asm["ptx"]
            assert ".local" not in ptx and "sqrt.rn.f32" in ptx and "mma" in ptx, name
            assert ptx.count(".param") > plain[name].asm["ptx"].count(".param"), name
        assert "sqrt.rn.f32" not in plain["stats"].asm["ptx"]
    # rms_across loads its row factors (two more pointers) instead of reducing each head's row
    per_head = P.compile_offline(90, head_dim=128, qk_int8=True, prologue=PrologueSpec(rope="interleaved"))
    across = P.compile_offline(90, head_dim=128, qk_int8=True, prologue=PrologueSpec("rms_across", rope="interleaved"))
    for name in ("stats", "quant"):
        ptx = across[name].asm["ptx"]
        assert ".local" not in ptx and "sqrt.rn.f32" not in ptx and "mma" in ptx, name
        params = (len(set(re.findall(r"\w+_param_\d+", k[name].asm["ptx"]))) for k in (across, per_head))
        assert next(params) == next(params) + 2, name


# ------------------------------------------------------------------ Triton vs the torch backend

def assert_close_pro(a: Fp8Prepared, b: Fp8Prepared, k_pro: torch.Tensor):
    """a (Triton) vs b (torch backend) within the tolerance of the module docstring; k_pro: the prologue's K
    (B, S, H, D), for the k_mean bound."""
    S = b.sq
    for name in ("q8", "k8"):
        x, y = getattr(a, name).cpu().int(), getattr(b, name).cpu().int()
        assert x.shape == y.shape, name
        d = (x - y).abs()
        assert int(d.max()) <= 1, f"{name}: a code off by {int(d.max())}"
        assert int((d > 0).sum()) <= CODE_OFF_BY_ONE_MAX * d.numel(), f"{name}: {int((d > 0).sum())} codes off"
        assert not bool(x[:, :, S:].any()), f"{name}: pad rows not zero"
    assert torch.equal(a.v8t.view(torch.uint8).cpu(), b.v8t.view(torch.uint8).cpu())
    sa, sb = a.scales.cpu(), b.scales.cpu()
    assert torch.equal(sa[..., [0, 2]], sb[..., [0, 2]])
    assert float(((sa[..., 1] - sb[..., 1]).abs() / sb[..., 1]).max()) <= SCALE_RTOL
    qa, qb = a.q_scales.cpu(), b.q_scales.cpu()
    rel = (qa - qb).abs() / qb
    assert float(rel.max()) <= SCALE_RTOL_MAX
    assert int((rel > SCALE_RTOL).sum()) <= SCALE_RTOL_ROWS * rel.numel(), int((rel > SCALE_RTOL).sum())
    assert bool((qa[:, :, S:] == 1.0).all())
    km_a, km_b = a.k_mean.cpu(), b.k_mean.cpu()
    ulps = 4 * 2.0 ** -7 * k_pro.float().abs().amax(dim=(1, 3)).cpu()[..., None] / k_pro.shape[1]  # (B, H, 1)
    tol = SCALE_RTOL * km_b.abs().amax(dim=-1, keepdim=True) + ulps
    assert bool(((km_a - km_b).abs() <= tol).all())


def run_prologue_checks(form: str, shape, device: str, dtype=torch.bfloat16, w_dtype=torch.bfloat16, seed=0):
    B, S, H, D = shape
    spec, args = make_case(form, B, S, H, D, dtype=dtype, seed=seed, device=device, w_dtype=w_dtype)
    ref = fp8_prepare_prologue(*args[:3], spec, *args[3:], backend="torch")
    out = poisoned_like(ref)
    res = fp8_prepare_prologue(*args[:3], spec, *args[3:], backend="triton", out=out)
    assert res.q8 is out.q8 and res.k8 is out.k8 and res.q_scales is out.q_scales
    k, wk, cos, sin, text_rows = args[1], args[4], args[5], args[6], args[7]
    assert_close_pro(res, ref, prologue_torch(spec, k, wk, cos, sin, text_rows))


def run_plan_reuse_checks(shape, device: str, stream=None):
    """One G == 2 plan launched twice with other text_rows (1, then a ragged count): text_rows is a per-call
    argument, never baked into the build; the arrival counters reset between launches."""
    from ditprof.kernels import prep_triton as P

    B, S, H, D = shape
    spec, (q, k, v, wq, wk, cos, sin, _) = make_case("G2", B, S, H, D, seed=5, device=device)
    plan = P.PrepPlan(q, k, v, True, qk_int8=True, prologue=spec, pro_groups=2)
    bufs = plan.buffers(q.device)
    for text_rows in (1, S // 2 + 3, 0):
        plan.launch(q, k, v, bufs, stream, pro=prologue_tensors(spec, wq, wk, cos, sin, text_rows))
        got = Fp8Prepared(bufs["q8"], bufs["k8"], bufs["v8t"], bufs["scales"], S, S, bufs["k_mean"],
                          q_scales=bufs["q_scales"])
        ref = fp8_prepare_prologue(q, k, v, spec, wq, wk, cos, sin, text_rows, backend="torch")
        assert_close_pro(got, ref, prologue_torch(spec, k, wk, cos, sin, text_rows))
    assert bufs["flags"].tolist() == [0, 0, 0]


INTERP_SHAPES = [(2, 200, 2, 64), (2, 200, 2, 128)]


def test_triton_interpreter_prologue_matches_torch():
    """Runs the inner test below in a subprocess with TRITON_INTERPRET=1 (set before triton is imported)."""
    run_under_interpreter(__file__, "test_interpreter_prologue_inner")


@inner_only()
@pytest.mark.parametrize("shape", INTERP_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("form", list(FORMS))
def test_interpreter_prologue_inner(form, shape):
    from ditprof.kernels import prep_triton

    assert prep_triton.INTERPRET
    run_prologue_checks(form, shape, "cpu", w_dtype=torch.float32 if form == "half" else torch.bfloat16)
    if form == "G2" and shape[-1] == 64:
        run_prologue_checks(form, shape, "cpu", dtype=torch.float16, seed=1)
        run_plan_reuse_checks(shape, "cpu")


GPU_SHAPE = (1, 4096 + 512, 24, 128)


@pytest.mark.gpu
@pytest.mark.parametrize("form", list(FORMS))
def test_gpu_prologue_matches_torch(form):
    run_prologue_checks(form, GPU_SHAPE, "cuda")
    run_prologue_checks(form, (2, 200, 2, 64), "cuda", dtype=torch.float16, w_dtype=torch.float32)


@pytest.mark.gpu
def test_gpu_prologue_plan_reuse_on_a_stream():
    """The plan's compiled launches (FixedLaunch on a raw stream) with text_rows 1, then others."""
    run_plan_reuse_checks(GPU_SHAPE, "cuda", torch.cuda.current_stream().cuda_stream)
    run_plan_reuse_checks((2, 200, 2, 64), "cuda", torch.cuda.current_stream().cuda_stream)
