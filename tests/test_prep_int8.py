"""The prep's INT8 Q/K mode (issue 18: Hadamard rotation, per-token Q, per-head K): the rotation's definition, the
torch chain against a direct float64 re-derivation of the contract (bit for bit), and the Triton kernels against
the torch chain under the Triton interpreter on CPU (and natively on CUDA, marked gpu) with a stated tolerance:
tensor-core (or numpy) fp32 sums of the rotation are not the torch chain's float64 sums, so a code may be one off
where Q' or K' lands next to a rounding boundary.

Tolerance of Triton vs torch (``assert_close_int8``): at most 0.1 % of the int8 codes (q8, k8) off by exactly 1,
none by more; q_scales and the K descale within 1e-5 relative; k_mean within 1e-5 of each head's max |k_mean|;
V (e4m3) and the V descale bit for bit.
"""

from __future__ import annotations

import collections
import dataclasses
import math

import pytest
import torch
from triton_interpreter import inner_only, run_under_interpreter

from ditprof.errors import DitprofError
from ditprof.kernels.fp8_config import PrepConfig
from ditprof.kernels.prep import (
    Fp8Prepared,
    fp8_prepare,
    fp8_prepare_torch,
    padded_lengths,
)
from ditprof.kernels.rotation import (
    hadamard_rotation,
    hadamard_signs,
    rotation_pm1,
    sylvester,
)

F8 = torch.float8_e4m3fn
CODE_OFF_BY_ONE_MAX = 1e-3  # fraction of int8 codes that may differ by exactly 1 (Triton vs torch)
SCALE_RTOL = 1e-5


def make_qkv(B, Sq, Sk, H, D, dtype=torch.bfloat16, seed=0, device="cpu", k_bias=4.0, outlier=True):
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(B, Sq, H, D, generator=g, device=device) * 2.5
    k = torch.randn(B, Sk, H, D, generator=g, device=device) + torch.randn(1, 1, H, D, generator=g,
                                                                           device=device) * k_bias
    v = torch.randn(B, Sk, H, D, generator=g, device=device) * 0.7
    if outlier:  # a few large channels (what the rotation is for)
        ch = torch.randperm(D, generator=torch.Generator().manual_seed(seed))[:3].to(device)
        q[..., ch] *= 20
        k[..., ch] *= 20
    return tuple(x.to(dtype=dtype) for x in (q, k, v))


# ------------------------------------------------------------------ the rotation

def test_rotation_definition():
    for D in (1, 2, 16, 64, 128, 256):
        signs = hadamard_signs(D)
        gen = torch.Generator().manual_seed(0)
        assert torch.equal(signs, torch.randint(0, 2, (D,), generator=gen).double() * 2 - 1)
        h = sylvester(D)
        i = torch.arange(D)
        popc = torch.zeros(D, D, dtype=torch.long)
        x = i[:, None] & i[None, :]
        while bool(x.any()):
            popc += x & 1
            x = x >> 1
        assert torch.equal(h, (1 - 2 * (popc % 2)).double())
        r = rotation_pm1(D, torch.float64)
        assert torch.equal(r, signs[:, None] * h)
        assert torch.equal(r @ r.T, D * torch.eye(D, dtype=torch.float64))
        assert torch.equal(rotation_pm1(D, torch.bfloat16).double(), r)  # +-1: exact in bf16
        torch.testing.assert_close(hadamard_rotation(D).double(), r / math.sqrt(D), rtol=0, atol=1e-7)
    for bad in (0, 3, 96):
        with pytest.raises(DitprofError, match="^the Hadamard rotation needs a power-of-two head_dim, got"):
            rotation_pm1(bad)
    from ditprof.kernels import fp8_emulation

    assert fp8_emulation.hadamard_rotation is hadamard_rotation


# ------------------------------------------------------------------ direct float64 re-derivation of the contract

def contract_int8_f64(q, k, v, smooth_k=True, key_lens=None):
    """Expected (q8, q_scales, k8, descale_k, k_mean, v descale) of the INT8 mode, unpadded, (B,H,S,D) order, from
    float64 arithmetic (an fp32 IEEE quotient is the float64 quotient rounded: 53 >= 2*24 + 2)."""
    q64, k64, v64 = (x.transpose(1, 2).double() for x in (q, k, v))
    B, _, Sk, D = k64.shape
    i = torch.arange(D)
    x = i[:, None] & i[None, :]
    parity = torch.zeros(D, D, dtype=torch.long)
    while bool(x.any()):
        parity ^= x & 1
        x = x >> 1
    signs = torch.randint(0, 2, (D,), generator=torch.Generator().manual_seed(0)).double() * 2 - 1
    R = signs[:, None] * (1 - 2 * parity).double()
    qr = (q64 @ R).float().double() / D
    kr = (k64 @ R).float().double()
    n = torch.full((B,), Sk) if key_lens is None else key_lens.long().clamp(0, Sk)
    keep = (torch.arange(Sk)[None, :] < n[:, None])[:, None, :, None]
    k_mean = None
    if smooth_k:
        mu = (torch.where(keep, kr, 0.0).sum(2) / n.clamp(min=1).double()[:, None, None]).float().double()
        kr = (kr - mu[:, :, None, :]).float().double()
        k_mean = (mu @ R.T / D).float()

    def ds(amax):
        d = (amax / 127.0).float().double()
        return torch.where(amax == 0, torch.ones_like(d), d)

    def codes(x, d):
        return torch.round((x / d).float().double()).clamp(-127, 127).to(torch.int8)

    q_scales = ds(qr.abs().amax(dim=3))
    q8 = codes(qr, q_scales[..., None])
    dk = ds(torch.where(keep, kr.abs(), 0.0).amax(dim=(2, 3)))
    k8 = codes(kr, dk[:, :, None, None])
    av = torch.where(keep, v64.abs(), 0.0).amax(dim=(2, 3))
    dv = torch.where(av == 0, torch.ones_like(av), (av / 448.0).float().double())
    return q8, q_scales.float(), k8, dk.float(), k_mean, dv.float()


def check_int8_against_contract(res: Fp8Prepared, q, k, v, smooth_k=True, key_lens=None):
    B, Sq, H, D = q.shape
    Sk = k.shape[1]
    Sq_pad, Sk_pad = padded_lengths(Sq, Sk)
    q8, q_scales, k8, dk, k_mean, dv = contract_int8_f64(q, k, v, smooth_k, key_lens)
    assert res.q8.dtype == torch.int8 and res.q8.shape == (B, H, Sq_pad, D)
    assert res.k8.dtype == torch.int8 and res.k8.shape == (B, H, Sk_pad, D)
    assert res.q_scales.dtype == torch.float32 and res.q_scales.shape == (B, H, Sq_pad)
    assert res.q_scales.is_contiguous() and res.v8t.dtype == F8
    assert torch.equal(res.q8[:, :, :Sq].cpu(), q8)
    assert not res.q8[:, :, Sq:].any() and not res.k8[:, :, Sk:].any()
    assert torch.equal(res.q_scales[:, :, :Sq].cpu(), q_scales)
    assert bool((res.q_scales[:, :, Sq:] == 1).all())
    assert torch.equal(res.k8[:, :, :Sk].cpu(), k8)
    sc = res.scales.cpu()
    assert torch.equal(sc[..., 0], torch.ones(B, H)) and torch.equal(sc[..., 1], dk) and torch.equal(sc[..., 2], dv)
    if smooth_k:
        assert torch.equal(res.k_mean.cpu(), k_mean)
    else:
        assert res.k_mean is None
    # V is the e4m3 mode's, byte for byte
    e4 = fp8_prepare_torch(q, k, v, smooth_k=smooth_k, key_lens=key_lens)
    assert torch.equal(res.v8t.view(torch.uint8).cpu(), e4.v8t.view(torch.uint8).cpu())
    assert torch.equal(sc[..., 2], e4.scales[..., 2].cpu())


@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 128), (2, 77, 130, 3, 128), (1, 300, 33, 2, 64), (1, 129, 64, 1, 16)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("smooth_k", [True, False], ids=["smooth", "raw"])
def test_torch_prep_int8_matches_float64_contract(shape, smooth_k):
    B, Sq, Sk, H, D = shape
    for dtype in (torch.bfloat16, torch.float16):
        q, k, v = make_qkv(B, Sq, Sk, H, D, dtype=dtype, seed=Sq + Sk)
        res = fp8_prepare_torch(q, k, v, smooth_k=smooth_k, qk_int8=True)
        check_int8_against_contract(res, q, k, v, smooth_k)
        # the default stays e4m3, and its output has no q_scales
        e4 = fp8_prepare_torch(q, k, v, smooth_k=smooth_k)
        assert e4.q8.dtype == F8 and e4.q_scales is None


def test_torch_prep_int8_key_lens_and_zero_rows():
    q, k, v = make_qkv(3, 70, 90, 2, 64, seed=5)
    q[0, 5] = 0  # a zero query row: scale 1.0, codes 0
    lens = torch.tensor([0, 41, 500], dtype=torch.int32)
    res = fp8_prepare_torch(q, k, v, key_lens=lens, qk_int8=True)
    check_int8_against_contract(res, q, k, v, True, lens)
    assert bool((res.q_scales[0, :, 5] == 1).all()) and not res.q8[0, :, 5].any()
    assert torch.equal(res.scales[0, :, 1:], torch.ones(2, 2))  # no keys: unit descales
    one = fp8_prepare_torch(q[1:2], k[1:2, :41], v[1:2, :41], qk_int8=True)
    assert torch.equal(res.scales[1:2], one.scales) and torch.equal(res.k_mean[1:2], one.k_mean)
    assert torch.equal(res.k8[1:2, :, :41], one.k8[:, :, :41])


def test_rotation_keeps_the_scores_and_the_lse_correction():
    """Q' K'^T = Q K^T and the smoothed scores differ from them by exactly q . k_mean (original basis)."""
    q, k, v = make_qkv(1, 40, 50, 2, 128, seed=3)
    res = fp8_prepare_torch(q, k, v, qk_int8=True)
    qh, kh = (x.transpose(1, 2).double() for x in (q, k))
    deq_q = res.q8[:, :, :40].double() * res.q_scales[:, :, :40, None].double()
    deq_k = res.k8[:, :, :50].double() * res.scales[:, :, 1, None, None].double()
    s = deq_q @ deq_k.transpose(-1, -2) + (qh @ res.k_mean.double()[..., None])
    ref = qh @ kh.transpose(-1, -2)
    assert float((s - ref).norm() / ref.norm()) < 0.01


@pytest.mark.parametrize("which", ["q", "k", "v"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
def test_nonfinite_input_is_an_error_int8(which, bad):
    q, k, v = make_qkv(1, 33, 20, 2, 64, seed=1)
    {"q": q, "k": k, "v": v}[which][0, 3, 1, 5] = bad
    for smooth_k in (True, False):
        with pytest.raises(DitprofError, match=f"^{which} contains NaN or Inf$"):
            fp8_prepare_torch(q, k, v, smooth_k=smooth_k, qk_int8=True)
        with pytest.raises(DitprofError, match=f"^{which} contains NaN or Inf$"):
            fp8_prepare(q, k, v, smooth_k=smooth_k, qk_int8=True)
    res = fp8_prepare_torch(q, k, v, qk_int8=True, check_finite=False)
    assert not bool(torch.isfinite(res.scales[0, 1, "qkv".index(which)]))  # the head's signal


def test_out_buffers_int8_torch_backend():
    q, k, v = make_qkv(1, 50, 40, 2, 64, seed=9)
    ref = fp8_prepare_torch(q, k, v, qk_int8=True)
    out = poisoned_like(ref)
    res = fp8_prepare(q, k, v, backend="torch", out=out, qk_int8=True)
    assert res.q8 is out.q8 and res.q_scales is out.q_scales
    assert_close_int8(res, ref, exact=True)
    with pytest.raises(DitprofError, match="out.q_scales"):
        fp8_prepare(q, k, v, backend="torch", out=Fp8Prepared(out.q8, out.k8, out.v8t, out.scales, 50, 40),
                    qk_int8=True)
    with pytest.raises(DitprofError, match="out.q8"):  # e4m3 buffers for the int8 mode
        fp8_prepare(q, k, v, backend="torch", out=poisoned_like(fp8_prepare_torch(q, k, v)), qk_int8=True)


def poisoned_like(ref: Fp8Prepared) -> Fp8Prepared:
    """Buffers the prep must overwrite: int8 codes -128 (never produced), e4m3 0x7F (NaN), NaN scales."""
    def fill(t):
        if t.dtype == torch.int8:
            return torch.full(t.shape, -128, dtype=torch.int8, device=t.device)
        if t.dtype == F8:
            return torch.full(t.shape, 0x7F, dtype=torch.uint8, device=t.device).view(F8)
        return torch.full(t.shape, float("nan"), dtype=t.dtype, device=t.device)

    return Fp8Prepared(fill(ref.q8), fill(ref.k8), fill(ref.v8t), fill(ref.scales), ref.sq, ref.sk,
                       q_scales=None if ref.q_scales is None else fill(ref.q_scales))


def assert_close_int8(a: Fp8Prepared, b: Fp8Prepared, exact: bool = False):
    """a (Triton) vs b (torch chain) within the tolerance of the module docstring (``exact``: bit for bit)."""
    for name in ("q8", "k8"):
        x, y = getattr(a, name).cpu(), getattr(b, name).cpu()
        assert x.dtype == y.dtype == torch.int8 and x.shape == y.shape, name
        d = (x.int() - y.int()).abs()
        off = int((d > 0).sum())
        assert int(d.max()) <= (0 if exact else 1), f"{name}: a code off by {int(d.max())}"
        assert off <= CODE_OFF_BY_ONE_MAX * d.numel(), f"{name}: {off} of {d.numel()} codes off by one"
    assert torch.equal(a.v8t.view(torch.uint8).cpu(), b.v8t.view(torch.uint8).cpu())
    sa, sb = a.scales.cpu(), b.scales.cpu()
    assert torch.equal(sa[..., [0, 2]], sb[..., [0, 2]])
    for x, y in ((sa[..., 1], sb[..., 1]), (a.q_scales.cpu(), b.q_scales.cpu())):
        if exact:
            assert torch.equal(x, y)
        else:
            assert float(((x - y).abs() / y).max()) <= SCALE_RTOL
    if b.k_mean is not None:
        km_a, km_b = a.k_mean.cpu(), b.k_mean.cpu()
        if exact:
            assert torch.equal(km_a, km_b)
        else:
            tol = SCALE_RTOL * km_b.abs().amax(dim=-1, keepdim=True).clamp(min=1e-30)
            assert bool(((km_a - km_b).abs() <= tol).all())
    else:
        assert a.k_mean is None


# ------------------------------------------------------------------ CPU: Triton kernels under the interpreter

INTERP_SHAPES = [(1, 1, 1, 1, 128), (2, 77, 77, 2, 128), (1, 300, 33, 2, 64), (2, 33, 300, 1, 128),
                 (3, 130, 45, 2, 64)]


def test_triton_interpreter_int8_matches_torch():
    """Runs the inner test below in a subprocess with TRITON_INTERPRET=1 (set before triton is imported)."""
    run_under_interpreter(__file__, "test_interpreter_int8_inner")


@inner_only()
@pytest.mark.parametrize("shape", INTERP_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_interpreter_int8_inner(shape):
    from ditprof.kernels import prep_triton

    assert prep_triton.INTERPRET
    run_triton_int8_checks(shape, "cpu", prep_triton)


# the INT8 work layouts (PrepConfig fields) besides the default: each must give the same outputs
LAYOUTS = [{"split_v": False, "qk_prefetch": False}, {"split_v": False}, {"qk_prefetch": False},
           {"qk_recip": False}, {"stats_rot_rows": 16}, {"stats_rot_rows": 32}, {"stats_v_mult": 4},
           {"stats_v_mult": 2, "stats_v_first": True}, {"stats_rot_tail": False},
           {"stats_rot_tail": False, "qk_prefetch": False}, {"stats_rot_tail": False, "stats_rot_rows": 32}]


def test_triton_interpreter_int8_layouts_match_torch():
    run_under_interpreter(__file__, "test_interpreter_int8_layouts_inner")


@inner_only()
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda d: "+".join(d))
@pytest.mark.parametrize("shape", INTERP_SHAPES[1:3], ids=lambda s: "x".join(map(str, s)))
def test_interpreter_int8_layouts_inner(shape, layout):
    from ditprof.kernels import prep_triton

    config = PrepConfig(**layout)
    plan = prep_triton.PrepPlan(*make_qkv(*shape, seed=0), True, qk_int8=True, config=config)
    assert len(plan.launches) == 2 + bool(config.split_v)
    run_triton_int8_checks(shape, "cpu", prep_triton, config)


def run_triton_int8_checks(shape, device, prep_triton, config=PrepConfig()):
    B, Sq, Sk, H, D = shape
    for smooth_k, dtype in ((True, torch.bfloat16), (False, torch.bfloat16), (True, torch.float16)):
        q, k, v = make_qkv(B, Sq, Sk, H, D, dtype=dtype, seed=Sq + Sk, device=device)
        ref = fp8_prepare_torch(q, k, v, smooth_k=smooth_k, qk_int8=True)
        out = poisoned_like(ref)
        res = fp8_prepare(q, k, v, smooth_k=smooth_k, backend="triton", out=out, qk_int8=True, config=config)
        assert res.q8 is out.q8 and res.q_scales is out.q_scales
        assert_close_int8(res, ref)
    # BHSD input, non-contiguous, several stats chunks with ragged tails
    q, k, v = make_qkv(B, Sq, Sk, H, D, seed=3, device=device)
    ref = fp8_prepare_torch(q, k, v, qk_int8=True)
    res = fp8_prepare(*(x.transpose(1, 2) for x in (q, k, v)), layout="BHSD", backend="triton", qk_int8=True,
                      config=config)
    assert_close_int8(res, ref)
    got = prep_triton.prepare_triton(q, k, v, True, qk_int8=True,
                                     config=dataclasses.replace(config, stats_chunk=40, stats_r=2, quant_block=16))
    assert_close_int8(Fp8Prepared(*got[:4], Sq, Sk, got[4], q_scales=got[5]), ref)
    # per-batch key counts (random per item, 0 and more than Sk included)
    g = torch.Generator().manual_seed(Sq * 7 + Sk)
    lens = torch.randint(0, Sk + 2, (B,), generator=g, dtype=torch.int32)
    if B > 1:
        lens[0] = 0
    lens = lens.to(device)
    ref = fp8_prepare_torch(q, k, v, key_lens=lens, qk_int8=True)
    res = fp8_prepare(q, k, v, backend="triton", key_lens=lens, qk_int8=True, config=config)
    assert_close_int8(res, ref)
    if shape != INTERP_SHAPES[1] and device == "cpu":
        return
    for which in "qkv":
        for bad in (float("nan"), float("inf"), float("-inf")):
            qq, kk, vv = (x.clone() for x in (q, k, v))
            {"q": qq, "k": kk, "v": vv}[which][B - 1, -1, 0, 0] = bad
            with pytest.raises(DitprofError, match=f"^{which} contains NaN or Inf$"):
                fp8_prepare(qq, kk, vv, backend="triton", qk_int8=True, config=config)
            # the sticky flags a launch record reads: exactly this input's flag
            plan = prep_triton.PrepPlan(qq, kk, vv, True, qk_int8=True, config=config)
            bufs = plan.buffers(qq.device)
            plan.launch(qq, kk, vv, bufs)
            assert bufs["flags"].tolist() == [int(n == which) for n in "qkv"], which
    plan = prep_triton.PrepPlan(q, k, v, True, qk_int8=True, config=config)
    bufs = plan.buffers(q.device)
    assert bufs["q8"].dtype == torch.int8 and bufs["q_scales"].shape == (B, H, plan.Sq_pad)
    plan.launch(q, k, v, bufs)
    assert bufs["flags"].tolist() == [0, 0, 0]
    plan.launch(q, k, v, bufs)  # the arrival counters were reset: a second launch gives the same bytes
    ref = fp8_prepare_torch(q, k, v, qk_int8=True)
    assert_close_int8(Fp8Prepared(bufs["q8"], bufs["k8"], bufs["v8t"], bufs["scales"], Sq, Sk, bufs["k_mean"],
                                  q_scales=bufs["q_scales"]), ref)


# ------------------------------------------------------------------ GPU: compiled Triton kernels vs the torch chain

GPU_SHAPES = [(1, 30272, 30272, 56, 128), (2, 77, 77, 3, 128), (1, 1, 1, 1, 128), (1, 4096, 512, 8, 128),
              (1, 300, 33, 2, 64), (3, 1000, 1000, 5, 128)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gpu_triton_int8_matches_torch(shape):
    from ditprof.kernels import prep_triton

    B, Sq, Sk, H, D = shape
    if B * H * Sq > 1 << 22:  # the full H3 shape: the default-mode comparison only (the float64 chain is large)
        q, k, v = make_qkv(B, Sq, Sk, H, D, seed=1, device="cuda")
        ref = fp8_prepare_torch(q, k, v, qk_int8=True)
        assert_close_int8(fp8_prepare(q, k, v, backend="triton", qk_int8=True), ref)
        return
    run_triton_int8_checks(shape, "cuda", prep_triton)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda d: "+".join(d))
@pytest.mark.parametrize("shape", [GPU_SHAPES[1], GPU_SHAPES[3]], ids=lambda s: "x".join(map(str, s)))
def test_gpu_triton_int8_layouts_match_torch(shape, layout):
    from ditprof.kernels import prep_triton

    run_triton_int8_checks(shape, "cuda", prep_triton, PrepConfig(**layout))


@pytest.mark.parametrize("arch", [90, 89, 120])
def test_triton_int8_kernels_compile_offline(arch):
    """The compiled INT8 path: tensor-core rotation (wgmma on sm_90, mma.sync elsewhere), IEEE divisions, no local
    memory (spills), 16-byte loads, no byte stores; the e4m3 build is the same as before (test_prep.py)."""
    pytest.importorskip("triton")
    from ditprof.kernels import prep_triton

    if prep_triton.INTERPRET:
        pytest.skip("TRITON_INTERPRET=1: triton.jit gives interpreted functions")
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the gpu tests compile and run the kernels for real")
    try:
        from triton.backends.compiler import GPUTarget  # noqa: F401
    except ImportError:
        pytest.skip("this triton has no offline GPUTarget compile")
    for dtype, D in (("bf16", 128), ("fp16", 64)):
        ks = prep_triton.compile_offline(arch, dtype=dtype, head_dim=D, qk_int8=True)
        ptx = {name: k.asm["ptx"] for name, k in ks.items()}
        mma = "wgmma.mma_async" if arch == 90 else "mma.sync"
        assert mma in ptx["quant"] and "mma.sync" in ptx["stats"], arch
        assert "div.full.f32" not in ptx["quant"] and "div.rn.f32" in ptx["quant"]
        assert "div.rn.f32" in ptx["stats"]
        v_ptx = ptx.get("quant_v", ptx["quant"])
        assert "cvt.rn.satfinite.e4m3x2.f32" in v_ptx  # V
        assert "st.global.b8" not in ptx["quant"]
        assert "ld.global.v4" in ptx["stats"] and "ld.global.v4" in ptx["quant"] and "ld.global.v4" in v_ptx
        if PrepConfig().split_v:  # V's own launch: no rotation, so no rotation matrix in shared memory
            assert "mma" not in v_ptx and ks["quant_v"].metadata.shared <= 8192, ks["quant_v"].metadata.shared
        assert ".local" not in "".join(ptx.values())


def _rotating_loop_opcodes(cubin: bytes) -> collections.Counter:
    """SASS opcodes of the loop (a backward branch's body) that holds the stats pass's mma.sync rotation."""
    import re
    import subprocess
    import tempfile

    from ditprof.kernels.inspect_sass import find_nvdisasm

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        lines = subprocess.run([find_nvdisasm(), "-c", f.name], capture_output=True, text=True,
                               check=True).stdout.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) for m in [re.match(r"^\.(L_x_\d+):", line)] if m}
    loops = []
    for i, line in enumerate(lines):
        m = re.search(r"BRA `\(\.(L_x_\d+)\)", line)
        if m and labels.get(m.group(1), i) < i:
            ops = collections.Counter(mm.group(1) for body in lines[labels[m.group(1)]:i + 1]
                                      for mm in [re.match(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", body)]
                                      if mm)
            if ops["HMMA"]:
                loops.append(ops)
    assert len(loops) == 1, loops
    return loops[0]


def test_stats_rotating_loop_without_row_masks_sass():
    """stats_rot_tail: the stats pass's rotating K loop (sm_90, 16-row tiles, D 128) folds whole tiles with no
    select per element (the ragged last tile is masked outside the loop); the masked build has two per element.
    The quantize launches do not depend on the knob."""
    pytest.importorskip("triton")
    from ditprof.kernels import prep_triton

    if prep_triton.INTERPRET:
        pytest.skip("TRITON_INTERPRET=1: triton.jit gives interpreted functions")
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the gpu tests compile and run the kernels for real")
    builds = {}
    for tail in (True, False):
        builds[tail] = prep_triton.compile_offline(90, head_dim=128, qk_int8=True,
                                                   config=PrepConfig(stats_rot_rows=16, stats_rot_tail=tail))
    unmasked = _rotating_loop_opcodes(builds[True]["stats"].asm["cubin"])
    masked = _rotating_loop_opcodes(builds[False]["stats"].asm["cubin"])
    assert unmasked["FSEL"] == 0 and masked["FSEL"] == 32, (unmasked, masked)  # 16 elements a thread, max and min
    assert unmasked["HMMA"] == masked["HMMA"] == 32 and unmasked["FMNMX"] == masked["FMNMX"] == 32
    assert sum(unmasked.values()) < sum(masked.values())
    for name in ("quant", "quant_v"):
        assert builds[True][name].asm["ptx"] == builds[False][name].asm["ptx"], name


def test_plan_rejects_small_head_dim_for_int8():
    pytest.importorskip("triton")
    from ditprof.kernels import prep_triton

    q, k, v = make_qkv(1, 8, 8, 1, 8, outlier=False)
    with pytest.raises(ValueError, match="head_dim >= 16"):
        prep_triton.PrepPlan(q, k, v, True, qk_int8=True)


def test_int8_workspaces_share_one_device_rotation():
    """Every workspace of an INT8 plan reads the same rotation matrix, made once per (D, dtype, device): a host
    copy per workspace would break CUDA-graph capture (workspaces are made per call while capturing)."""
    from ditprof.kernels.prep_triton import PrepPlan
    from ditprof.kernels.rotation import rotation_pm1

    q = torch.randn(1, 64, 2, 64, dtype=torch.bfloat16)
    plan = PrepPlan(q, q, q, True, qk_int8=True)
    a, b = plan.buffers("cpu"), plan.buffers("cpu")
    assert a["rot"] is b["rot"] and a["q8"] is not b["q8"]
    assert torch.equal(a["rot"], rotation_pm1(64, torch.bfloat16))
    assert plan.buffers("meta")["rot"].device.type == "meta"


def test_prep_int8_sweep_settings():
    """benchmarks/experimental/prep_int8_sweep.py: the default first, each layout combination once, tiling steps
    from a layout, and the knobs it sets are fields of the prep's ``PrepConfig`` (a renamed field would make the
    sweep fail, not time the default only); a setting becomes the shipped config with those fields changed."""
    import dataclasses
    import importlib.util
    from pathlib import Path

    from ditprof.kernels.fp8_config import PrepConfig

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "experimental" / "prep_int8_sweep.py"
    if not path.exists():
        pytest.skip("no benchmarks/experimental/prep_int8_sweep.py")
    spec = importlib.util.spec_from_file_location("prep_int8_sweep", path)
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    assert set(sweep.KNOBS) <= {f.name for f in dataclasses.fields(PrepConfig)}
    grid = sweep.layout_settings()
    assert grid[0] == {k: getattr(PrepConfig(), k) for k in sweep.KNOBS}
    assert len({tuple(sorted(s.items())) for s in grid}) == len(grid) == 2 ** len(sweep.LAYOUT_KNOBS)
    assert not set(sweep.LAYOUT_KNOBS) & set(sweep.TILING_KNOBS)
    steps = sweep.tiling_settings(grid[-1])
    assert all(sum(s[k] != grid[-1][k] for k in sweep.KNOBS) == 1 for s in steps)
    assert len(steps) == sum(len(v) - 1 for v in sweep.TILING_KNOBS.values())
    config = sweep.config_of({"qk_block": 32, "split_v": True})
    assert config == dataclasses.replace(PrepConfig(), qk_block=32, split_v=True)
    assert sweep.config_of({}) == PrepConfig()


def test_stats_chunk_rule(monkeypatch):
    """INT8 mode on a GPU: the stats chunk halves (512 -> 256 -> 128) until the K and V stats grid has
    stats_programs_per_sm programs per SM; e4m3, the CPU and the field at 0 keep stats_chunk; a plan built on such a
    shape uses the chunk (a GPU-free check with a 132-SM device)."""
    from ditprof.kernels import prep_triton as P
    from ditprof.kernels import triton_launch

    monkeypatch.setitem(triton_launch._SMS, 0, 132)
    cuda = torch.device("cuda", 0)
    assert P.stats_chunk_for(24, 4608, True, cuda) == 256  # flux: 432 programs at 512 (< 792), 864 at 256
    assert P.stats_chunk_for(32, 7392, True, cuda) == 512  # ltx: 960 at 512
    assert P.stats_chunk_for(56, 30272, True, cuda) == 512
    assert P.stats_chunk_for(6, 77, True, cuda) == 128  # never below 128
    assert P.stats_chunk_for(24, 4608, False, cuda) == 512  # e4m3: not measured, unchanged
    assert P.stats_chunk_for(24, 4608, True, "cpu") == 512
    assert P.stats_chunk_for(24, 4608, True, cuda, PrepConfig(stats_programs_per_sm=0)) == 512
    # the config's chunk is where the rule starts, its target what it aims for
    assert P.stats_chunk_for(24, 4608, True, cuda, PrepConfig(stats_chunk=1024)) == 256
    assert P.stats_chunk_for(24, 4608, True, cuda, PrepConfig(stats_programs_per_sm=3)) == 512
    q, k, v = (torch.empty((1, 4608, 24, 128), dtype=torch.bfloat16, device="meta") for _ in range(3))
    assert P.PrepPlan(q, k, v, True, qk_int8=True).nck == 9  # not a GPU: stats_chunk (4608 / 512)
    assert P.PrepPlan(q, k, v, True, qk_int8=True, config=PrepConfig(stats_chunk=1024)).nck == 5
    seen = []

    def rule(BH, Sk, qk_int8, device, config):  # what a 132-SM GPU picks
        seen.append(config)
        return 256

    monkeypatch.setattr(P, "stats_chunk_for", rule)
    assert P.PrepPlan(q, k, v, True, qk_int8=True).nck == 18
    config = PrepConfig(stats_programs_per_sm=3)
    P.PrepPlan(q, k, v, True, qk_int8=True, config=config)
    assert seen[-1] is config  # the plan asks the rule with its own config


def test_stats_rot_rows_rule(monkeypatch):
    """The stats pass's rotated K tiles: 16 rows at head_dim >= 128 on a GPU whose stats grid has
    stats_rot16_programs_per_sm programs per SM or more (h3, Wan 14B), else 32 (flux, head_dim 64, the CPU); the
    field stats_rot_rows forces either; a plan passes the rule's value to the stats launch (a GPU-free check, 132
    SMs)."""
    pytest.importorskip("triton")
    from ditprof.kernels import prep_triton as P
    from ditprof.kernels import triton_launch

    monkeypatch.setitem(triton_launch._SMS, 0, 132)
    cuda = torch.device("cuda", 0)
    per_sm = PrepConfig().stats_rot16_programs_per_sm
    assert P.stats_rot_rows_for(128, 2 * 60 * 56, cuda) == 16  # h3: 6720 programs, 51 per SM
    assert P.stats_rot_rows_for(128, 2 * 18 * 24, cuda) == 32  # flux: 864, 6.5 per SM
    assert P.stats_rot_rows_for(128, per_sm * 132, cuda) == 16
    assert P.stats_rot_rows_for(128, per_sm * 132 - 1, cuda) == 32
    assert P.stats_rot_rows_for(64, 2 * 35 * 48, cuda) == 32  # CogVideoX: head_dim 64
    assert P.stats_rot_rows_for(128, 2 * 60 * 56, "cpu") == 32
    assert P.stats_rot_rows_for(128, 2 * 18 * 24, cuda, PrepConfig(stats_rot16_programs_per_sm=6)) == 16
    for forced in (16, 32):
        config = PrepConfig(stats_rot_rows=forced)
        assert P.stats_rot_rows_for(128, 2 * 18 * 24, cuda, config) == forced
        assert P.stats_rot_rows_for(64, 10, "cpu", config) == forced
    q, k, v = (torch.empty((1, 30272, 56, 128), dtype=torch.bfloat16, device="meta") for _ in range(3))
    monkeypatch.setattr(P, "stats_rot_rows_for",
                        lambda D, programs, device, config: 16 if programs == 2 * 60 * 56 else -1)
    stats = P.PrepPlan(q, k, v, True, qk_int8=True).stats
    assert stats.template[stats.names.index("RT")] == 16


def _constexpr(launch, name):
    return launch.template[launch.names.index(name)]


def test_prep_config_reaches_the_launches():
    """Every PrepConfig field lands where the module constant it replaced did: in the launches' constexpr
    arguments, grids and warps (a GPU-free check on meta tensors); the environment is not read."""
    pytest.importorskip("triton")
    from ditprof.kernels import prep_triton as P

    assert not hasattr(P, "parse_env_knobs") and not hasattr(P, "ENV_KNOBS") and not hasattr(P, "QK_ROWS")
    q, k, v = (torch.empty((2, 4096, 3, 128), dtype=torch.bfloat16, device="meta") for _ in range(3))
    base = P.PrepPlan(q, k, v, True, qk_int8=True)
    assert len(base.quants) == 2 and _constexpr(base.quants[0], "QK_ROWS") == 512
    assert base.quants[0].grid == (2 * 4096 // 512, 6, 1) and base.quants[1].grid == (4096 // 32, 6, 1)
    assert base.stats.options == {"num_warps": 4} and base.quants[0].options == {"num_warps": 4}
    config = PrepConfig(stats_chunk=256, stats_r=4, stats_warps=8, quant_block=64, quant_warps=8, finalize_cb=32,
                        qk_rows=256, qk_block=32, stats_rot_rows=16, qk_stages=2, split_v=False, qk_prefetch=False,
                        fast_div=False, qk_recip=False, stats_v_mult=4, stats_v_first=True, stats_rot_tail=False)
    plan = P.PrepPlan(q, k, v, True, qk_int8=True, config=config)
    stats, (quant,) = plan.stats, plan.quants  # split_v=False: one quantize launch
    want_stats = dict(CHUNK=256, R=4, W=8 * 2, CB=32, RT=16, QK_STAGES=2, PREFETCH=False, V_MULT=4, V_FIRST=True,
                      TAIL=False)
    assert {n: _constexpr(stats, n) for n in want_stats} == want_stats
    want_quant = dict(BLOCK=64, QK_ROWS=256, QK_BLOCK=32, QK_STAGES=2, PREFETCH=False, FAST=False, RECIP=False,
                      DO_QK=True, DO_V=True)
    assert {n: _constexpr(quant, n) for n in want_quant} == want_quant
    assert stats.options == {"num_warps": 8} and quant.options == {"num_warps": 8}
    # grids: K chunks of 256 rows, V chunks of 4 * 256, Q/K programs of 256 rows, V programs of 64 positions
    assert (plan.ncq, plan.nck, plan.ncv) == (0, 16, 4) and stats.grid == (20, 6, 1)
    assert quant.grid == (2 * 16 + 4096 // 64, 6, 1)
    e4m3 = P.PrepPlan(q, k, v, True, config=PrepConfig(quant_block=16, stats_chunk=1024))
    assert (e4m3.ncq, e4m3.nck, e4m3.ncv) == (4, 4, 4) and e4m3.quants[0].grid == (3 * 4096 // 16, 6, 1)
    # prepare_triton, fp8_prepare and compile_offline take the same config
    import inspect

    from ditprof.kernels.prep import fp8_prepare as prepare

    for fn in (P.prepare_triton, prepare, P.compile_offline):
        assert inspect.signature(fn).parameters["config"].default == PrepConfig()


@pytest.mark.parametrize("bad, word", [(dict(quant_block=48), "quant_block"), (dict(quant_block=256), "quant_block"),
                                       (dict(stats_r=3), "stats_r"), (dict(stats_warps=0), "stats_warps"),
                                       (dict(stats_chunk=0), "stats_chunk"), (dict(stats_v_mult=0), "stats_v_mult")])
def test_prep_config_checked(bad, word):
    """A launch configuration the kernels cannot take is a ValueError naming the field."""
    pytest.importorskip("triton")
    from ditprof.kernels import prep_triton as P

    q = torch.empty((1, 64, 2, 64), dtype=torch.bfloat16, device="meta")
    with pytest.raises(ValueError, match=word):
        P.PrepPlan(q, q, q, True, qk_int8=True, config=PrepConfig(**bad))
