"""FP8 prep: the torch chain against a direct float64 computation of the contract, the Triton kernels against the
torch chain (bit for bit) under the Triton interpreter on CPU and natively on CUDA (marked gpu)."""

from __future__ import annotations

import os

import pytest
import torch
from triton_interpreter import inner_only, run_under_interpreter

from ditprof.errors import DitprofError
from ditprof.kernels.fp8_config import PrepConfig
from ditprof.kernels.prep import (
    Fp8Prepared,
    fp8_prepare,
    fp8_prepare_torch,
    key_order_for_positions,
    padded_lengths,
    quantize_v_e4m3,
)

F8 = torch.float8_e4m3fn


def make_qkv(B, Sq, Sk, H, D, dtype=torch.bfloat16, seed=0, device="cpu", k_bias=4.0):
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(B, Sq, H, D, generator=g, device=device) * 2.5
    k = torch.randn(B, Sk, H, D, generator=g, device=device) + torch.randn(1, 1, H, D, generator=g,
                                                                           device=device) * k_bias
    v = torch.randn(B, Sk, H, D, generator=g, device=device) * 0.7
    return tuple(x.to(dtype=dtype) for x in (q, k, v))


def with_signed_zeros(*xs):
    """Copies with a few exact +0 and -0 elements (the quantized sign of zero must survive: 0x00 vs 0x80)."""
    out = []
    for i, x in enumerate(xs):
        x = x.clone()
        flat = x.view(-1)
        n = flat.numel()
        flat[(7 * i) % n] = -0.0
        flat[(7 * i + 3) % n] = 0.0
        flat[n // 2] = -0.0
        out.append(x)
    return tuple(out)


# ------------------------------------------------------------------ direct float64 computation of the contract

def e4m3_rne_f64(y: torch.Tensor) -> torch.Tensor:
    """Round float64 values (|y| <= 448) to the e4m3fn grid, half to even, without torch's fp8 cast."""
    a = y.abs()
    _, ex = torch.frexp(a)  # a = m * 2**ex, m in [0.5, 1)
    e = (ex - 1).clamp(min=-6).to(torch.float64)  # floor(log2 a), subnormals share 2**-6's spacing
    ulp = torch.pow(2.0, e - 3)
    r = torch.round(a / ulp)  # round half to even
    out = (r * ulp).clamp(max=448.0)
    return torch.where(y < 0, -out, out)


def contract_f64(q, k, v, smooth_k):
    """Expected values (float64) of q8, k8, v8 (natural key order, unpadded), scales, mean; (B,H,S,D)."""
    q64, k64, v64 = (x.transpose(1, 2).double() for x in (q, k, v))
    Sk = k64.shape[2]
    mean32 = None
    if smooth_k:
        mean32 = (k64.sum(dim=2) / Sk).float()  # fp32 mean of an (exact) float64 sum
        k64 = (k64 - mean32.double()[:, :, None, :]).float().double()  # fp32 subtraction
    out, scales = [], []
    for x in (q64, k64, v64):
        amax = x.abs().amax(dim=(2, 3))
        ds = (amax / 448.0).float().double()  # float64 division then rounding = the fp32 IEEE division
        ds = torch.where(amax == 0, torch.ones_like(ds), ds)[:, :, None, None]
        if x is v64:  # V by the reciprocal: fp32(1 / ds), then the fp32 product (exact in float64, then rounded)
            y = (x * (1.0 / ds).float().double()).float().double()
        else:
            y = (x / ds).float().double()
        out.append(e4m3_rne_f64(y.clamp(-448.0, 448.0)))
        scales.append(ds[:, :, 0, 0])
    return out[0], out[1], out[2], torch.stack(scales, dim=-1).float(), mean32


def natural_v(v8t: torch.Tensor, sk_pad: int) -> torch.Tensor:
    """(B,H,D,Sk_pad) permuted feature-major -> (B,H,Sk_pad,D) natural key order, via the inverse permutation."""
    perm = key_order_for_positions(torch.arange(sk_pad))
    inv = torch.argsort(perm)
    return v8t.view(torch.uint8).transpose(2, 3)[:, :, inv].view(F8)


def check_against_contract(res: Fp8Prepared, q, k, v, smooth_k):
    B, Sq, H, D = q.shape
    Sk = k.shape[1]
    Sq_pad, Sk_pad = padded_lengths(Sq, Sk)
    eq, ek, ev, escales, emean = contract_f64(q.cpu(), k.cpu(), v.cpu(), smooth_k)
    assert res.sq == Sq and res.sk == Sk
    assert res.q8.shape == (B, H, Sq_pad, D) and res.q8.dtype == F8
    assert res.k8.shape == (B, H, Sk_pad, D) and res.k8.dtype == F8
    assert res.v8t.shape == (B, H, D, Sk_pad) and res.v8t.dtype == F8
    assert res.scales.shape == (B, H, 3) and res.scales.dtype == torch.float32
    assert Sq_pad % 128 == 0 and Sk_pad % 32 == 0
    assert torch.equal(res.scales.cpu(), escales)
    if smooth_k:
        assert torch.equal(res.k_mean.cpu(), emean)
    q8, k8 = res.q8.cpu(), res.k8.cpu()
    v8 = natural_v(res.v8t.cpu(), Sk_pad)
    assert torch.equal(q8[:, :, :Sq].double(), eq)
    assert torch.equal(k8[:, :, :Sk].double(), ek)
    assert torch.equal(v8[:, :, :Sk].double(), ev)
    for t, n in ((q8, Sq), (k8, Sk), (v8, Sk)):
        assert not t.view(torch.uint8)[:, :, n:].any(), "padding must be zero bytes"


SHAPES = [  # B, Sq, Sk, H, D
    (1, 1, 1, 1, 128),
    (1, 77, 77, 2, 128),
    (2, 300, 77, 3, 64),
    (2, 77, 300, 2, 128),
    (1, 129, 33, 1, 32),
]


# ------------------------------------------------------------------ CPU: the torch chain vs float64


def test_key_order_formula_matches_the_writeup():
    # lane 0 holds keys 0, 1, 8, 9 at positions 0..3, lane 1 keys 2, 3, 10, 11 at positions 4..7
    got = key_order_for_positions(torch.arange(32)).tolist()
    assert got[:8] == [0, 1, 8, 9, 2, 3, 10, 11]
    assert got[8:16] == [4, 5, 12, 13, 6, 7, 14, 15]
    assert got[16:24] == [16, 17, 24, 25, 18, 19, 26, 27]
    assert sorted(got) == list(range(32))  # a permutation within each group


def test_key_order_agrees_with_key_order_module():
    mod = pytest.importorskip("ditprof.kernels.key_order")
    p = torch.arange(256)
    assert torch.equal(torch.as_tensor(mod.key_order_for_positions(p)), key_order_for_positions(p))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("smooth_k", [True, False], ids=["smooth", "raw"])
def test_torch_prep_matches_float64_contract(shape, smooth_k):
    B, Sq, Sk, H, D = shape
    q, k, v = make_qkv(B, Sq, Sk, H, D, seed=hash(shape) % 1000)
    check_against_contract(fp8_prepare_torch(q, k, v, smooth_k=smooth_k), q, k, v, smooth_k)


def test_torch_prep_fp16_and_saturation_edges():
    q, k, v = make_qkv(1, 77, 50, 2, 64, dtype=torch.float16, seed=3)
    q[0, 5, 1, 7] = -300.0  # the amax element maps to exactly -448
    check_against_contract(fp8_prepare_torch(q, k, v), q, k, v, True)
    res = fp8_prepare_torch(q, k, v)
    assert res.q8[0, 1, 5, 7].float().item() == -448.0


def test_layout_bhsd_and_noncontiguous_give_the_same_bytes():
    q, k, v = make_qkv(2, 77, 40, 3, 64, seed=5)
    ref = fp8_prepare_torch(q, k, v)
    bhsd = fp8_prepare_torch(*(x.transpose(1, 2).contiguous() for x in (q, k, v)), layout="BHSD")
    packed = torch.cat([q[:, :40], k, v], dim=-1)  # (B, 40, H, 3D): slices are non-contiguous
    res_nc = fp8_prepare_torch(q[:, :40], packed[..., 64:128], packed[..., 128:])
    ref_nc = fp8_prepare_torch(q[:, :40].contiguous(), k, v)
    for a, b in ((bhsd, ref), (res_nc, ref_nc)):
        for name in ("q8", "k8", "v8t"):
            assert torch.equal(getattr(a, name).view(torch.uint8), getattr(b, name).view(torch.uint8))
        assert torch.equal(a.scales, b.scales)


def test_zero_inputs_give_unit_scales_and_zero_bytes():
    z = torch.zeros(1, 20, 2, 64, dtype=torch.bfloat16)
    res = fp8_prepare_torch(z, z, z)
    assert torch.equal(res.scales, torch.ones(1, 2, 3))
    for t in (res.q8, res.k8, res.v8t):
        assert not t.view(torch.uint8).any()


def test_smoothing_removes_channel_bias():
    q, k, v = make_qkv(1, 64, 256, 2, 64, seed=7, k_bias=30.0)
    with_s = fp8_prepare_torch(q, k, v, smooth_k=True)
    without = fp8_prepare_torch(q, k, v, smooth_k=False)
    assert (with_s.scales[..., 1] < without.scales[..., 1] / 5).all()
    # q and v are untouched by smoothing
    assert torch.equal(with_s.scales[..., [0, 2]], without.scales[..., [0, 2]])
    assert without.k_mean is None


@pytest.mark.parametrize("which", ["q", "k", "v"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("smooth_k", [True, False], ids=["smooth", "raw"])
def test_nonfinite_input_is_an_error(which, bad, smooth_k):
    q, k, v = make_qkv(1, 33, 20, 2, 64, seed=1)
    t = {"q": q, "k": k, "v": v}[which]
    t[0, 3, 1, 5] = bad
    with pytest.raises(DitprofError, match=f"^{which} contains NaN or Inf$"):
        fp8_prepare_torch(q, k, v, smooth_k=smooth_k)
    with pytest.raises(DitprofError, match=f"^{which} contains NaN or Inf$"):
        fp8_prepare(q, k, v, smooth_k=smooth_k)  # auto backend: torch on CPU


@pytest.mark.parametrize(
    "case, match",
    [
        ("dtype", "bfloat16 or float16"),
        ("dims", "must be 4-D"),
        ("kv", "same shape"),
        ("heads", "must agree"),
        ("hd", "power of two"),
        ("layout", "layout must be"),
        ("empty", "empty input"),
    ],
)
def test_bad_input_is_a_clear_error(case, match):
    q, k, v = make_qkv(1, 16, 16, 2, 64)
    kwargs = {}
    if case == "dtype":
        q = q.float()
    elif case == "dims":
        q = q[0]
    elif case == "kv":
        v = v[:, :8]
    elif case == "heads":
        q = torch.cat([q, q], dim=2)
    elif case == "hd":
        q, k, v = (x[..., :48] for x in (q, k, v))
    elif case == "layout":
        kwargs["layout"] = "SBHD"
    elif case == "empty":
        q = q[:, :0]
    with pytest.raises(DitprofError, match=match):
        fp8_prepare_torch(q, k, v, **kwargs)
    with pytest.raises(DitprofError, match=match):
        fp8_prepare(q, k, v, **kwargs)


def test_triton_backend_on_cpu_without_interpreter_is_a_clear_error():
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("interpreter active")
    q, k, v = make_qkv(1, 16, 16, 2, 64)
    with pytest.raises(DitprofError, match="backend='triton'"):
        fp8_prepare(q, k, v, backend="triton")


def test_out_buffers_are_written_in_place_torch_backend():
    q, k, v = make_qkv(1, 50, 40, 2, 64, seed=9)
    ref = fp8_prepare_torch(q, k, v)
    out = _poisoned_like(ref)
    res = fp8_prepare(q, k, v, backend="torch", out=out)
    assert res.q8 is out.q8 and res.v8t is out.v8t
    _assert_same_bytes(res, ref)
    bad = Fp8Prepared(out.q8[:, :, :64], out.k8, out.v8t, out.scales, 50, 40)
    with pytest.raises(DitprofError, match="out.q8"):
        fp8_prepare(q, k, v, backend="torch", out=bad)


def _poisoned_like(ref: Fp8Prepared) -> Fp8Prepared:
    """Buffers full of 0x7F (e4m3 NaN, never produced: the clamp stops at 0x7E) and NaN scales."""
    bufs = [torch.full(t.shape, 0x7F, dtype=torch.uint8, device=t.device).view(F8) for t in (ref.q8, ref.k8, ref.v8t)]
    scales = torch.full(ref.scales.shape, float("nan"), device=ref.scales.device)
    return Fp8Prepared(*bufs, scales, ref.sq, ref.sk)


def _assert_same_bytes(a: Fp8Prepared, b: Fp8Prepared):
    for name in ("q8", "k8", "v8t"):
        x, y = getattr(a, name).view(torch.uint8), getattr(b, name).view(torch.uint8)
        assert x.shape == y.shape, name
        diff = (x != y).sum().item()
        assert diff == 0, f"{name}: {diff} bytes differ"
    assert torch.equal(a.scales, b.scales)
    if b.k_mean is not None:
        assert torch.equal(a.k_mean, b.k_mean)


# ------------------------------------------------------------------ CPU: Triton kernels under the interpreter

INTERP_SHAPES = [(1, 1, 1, 1, 128), (2, 77, 77, 2, 128), (1, 300, 33, 2, 64), (2, 33, 300, 1, 128), (1, 129, 64, 1, 16)]


def test_triton_interpreter_matches_torch_bit_exactly():
    """Runs the inner test below in a subprocess with TRITON_INTERPRET=1 (set before triton is imported)."""
    run_under_interpreter(__file__, "test_interpreter_inner")


@inner_only()
@pytest.mark.parametrize("shape", INTERP_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_interpreter_inner(shape):
    from ditprof.kernels import prep_triton

    assert prep_triton.INTERPRET
    B, Sq, Sk, H, D = shape
    for smooth_k in (True, False):
        q, k, v = make_qkv(B, Sq, Sk, H, D, seed=Sq + Sk)
        ref = fp8_prepare_torch(q, k, v, smooth_k=smooth_k)
        out = _poisoned_like(ref)
        res = fp8_prepare(q, k, v, smooth_k=smooth_k, backend="triton", out=out)
        _assert_same_bytes(res, ref)
        check_against_contract(res, q, k, v, smooth_k)
    # BHSD input, non-contiguous K/V, fp16, signed zeros, non-finite detection
    q, k, v = with_signed_zeros(*make_qkv(B, Sq, Sk, H, D, dtype=torch.float16, seed=2))
    res = fp8_prepare(*(x.transpose(1, 2) for x in (q, k, v)), layout="BHSD", backend="triton")
    _assert_same_bytes(res, fp8_prepare_torch(q, k, v))
    # several stats chunks, each with full tiles and a ragged tail (chunk 40 rows, tiles of 2 * W rows)
    q, k, v = with_signed_zeros(*make_qkv(B, Sq, Sk, H, D, seed=3))
    ref = fp8_prepare_torch(q, k, v)
    got = prep_triton.prepare_triton(q, k, v, True, config=PrepConfig(stats_chunk=40, stats_r=2, quant_block=16))
    _assert_same_bytes(Fp8Prepared(*got[:4], Sq, Sk, got[4]), ref)
    # per-batch key counts: the K mean and the K/V descales from each item's first n keys (B > 1 shapes; 0 and
    # more than Sk included), identical to the torch chain and, on the rows kept, to a prep of those keys alone
    if B > 1:
        lens = torch.tensor([0, Sk // 2 + 1][:B], dtype=torch.int32) if Sk > 2 else torch.ones(B, dtype=torch.int32)
        lens[-1] = max(1, Sk // 2 + 1)
        ref = fp8_prepare_torch(q, k, v, key_lens=lens)
        res = fp8_prepare(q, k, v, backend="triton", key_lens=lens)
        _assert_same_bytes(res, ref)
        assert torch.equal(res.k_mean, ref.k_mean)
        for b in range(B):
            n = int(lens[b])
            if n == 0:
                assert torch.equal(ref.scales[b, :, 1:], torch.ones_like(ref.scales[b, :, 1:]))
                continue
            one = fp8_prepare_torch(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n])
            assert torch.equal(ref.scales[b:b + 1], one.scales) and torch.equal(ref.k_mean[b:b + 1], one.k_mean)
            assert torch.equal(ref.k8[b:b + 1, :, :n].view(torch.uint8), one.k8[:, :, :n].view(torch.uint8))
    if shape != INTERP_SHAPES[0]:
        return
    for which in "qkv":
        for bad in (float("nan"), float("inf"), float("-inf")):
            for smooth_k in (True, False):
                qq, kk, vv = (x.clone() for x in (q, k, v))
                {"q": qq, "k": kk, "v": vv}[which][0, -1, 0, 0] = bad
                with pytest.raises(DitprofError, match=f"^{which} contains NaN or Inf$"):
                    fp8_prepare(qq, kk, vv, smooth_k=smooth_k, backend="triton")
                # the sticky flags a launch record reads instead of the descales: exactly this input's flag
                plan = prep_triton.PrepPlan(qq, kk, vv, smooth_k)
                bufs = plan.buffers(qq.device)
                plan.launch(qq, kk, vv, bufs)
                assert bufs["flags"].tolist() == [int(n == which) for n in "qkv"]
    plan = prep_triton.PrepPlan(q, k, v, True)
    bufs = plan.buffers(q.device)
    plan.launch(q, k, v, bufs)
    assert bufs["flags"].tolist() == [0, 0, 0]


# ------------------------------------------------------------------ GPU: Triton kernels vs the torch chain

GPU_SHAPES = [
    (1, 30272, 30272, 56, 128),  # H3
    (2, 77, 77, 3, 128),
    (1, 1, 1, 1, 128),
    (1, 4096, 512, 8, 128),  # cross-attention
    (1, 300, 33, 2, 64),
    (3, 1000, 1000, 5, 128),
]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("smooth_k", [True, False], ids=["smooth", "raw"])
def test_gpu_triton_matches_torch_bit_exactly(shape, smooth_k):
    B, Sq, Sk, H, D = shape
    q, k, v = with_signed_zeros(*make_qkv(B, Sq, Sk, H, D, seed=Sq % 97, device="cuda"))
    ref = fp8_prepare_torch(q, k, v, smooth_k=smooth_k)
    out = _poisoned_like(ref)
    res = fp8_prepare(q, k, v, smooth_k=smooth_k, backend="triton", out=out)
    torch.cuda.synchronize()
    _assert_same_bytes(res, ref)
    if B * H * Sq <= 1 << 20:
        check_against_contract(res, q, k, v, smooth_k)
    again = fp8_prepare(q, k, v, smooth_k=smooth_k, backend="triton")
    _assert_same_bytes(again, res)  # deterministic: no atomics


@pytest.mark.gpu
def test_gpu_layouts_dtypes_and_errors():
    q, k, v = make_qkv(2, 333, 129, 3, 128, dtype=torch.float16, seed=4, device="cuda")
    ref = fp8_prepare_torch(q, k, v)
    _assert_same_bytes(fp8_prepare(q, k, v), ref)  # auto picks triton on CUDA
    bhsd = [x.transpose(1, 2).contiguous() for x in (q, k, v)]
    _assert_same_bytes(fp8_prepare(*bhsd, layout="BHSD"), ref)
    packed = torch.cat([k, v], dim=-1)
    _assert_same_bytes(fp8_prepare(q, packed[..., :128], packed[..., 128:]), ref)
    for which in "qkv":
        for bad in (float("nan"), float("inf"), float("-inf")):
            for smooth_k in (True, False):
                qq, kk, vv = (x.clone() for x in (q, k, v))
                {"q": qq, "k": kk, "v": vv}[which][1, 100, 2, 3] = bad
                with pytest.raises(DitprofError, match=f"^{which} contains NaN or Inf$"):
                    fp8_prepare(qq, kk, vv, smooth_k=smooth_k)


@pytest.mark.gpu
def test_gpu_deferred_finite_check():
    q, k, v = make_qkv(1, 300, 200, 3, 128, seed=6, device="cuda")
    ref = fp8_prepare_torch(q, k, v)
    res = fp8_prepare(q, k, v, check_finite="defer")
    res.check_finite()  # finite: no error
    res.check_finite()  # nothing pending any more: a no-op
    _assert_same_bytes(res, ref)
    for which in "qkv":
        qq, kk, vv = (x.clone() for x in (q, k, v))
        {"q": qq, "k": kk, "v": vv}[which][0, 150, 1, 3] = float("nan")
        res = fp8_prepare(qq, kk, vv, check_finite="defer")  # returns without waiting
        with pytest.raises(DitprofError, match=f"^{which} contains NaN or Inf$"):
            res.check_finite()


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [dict(stats_chunk=40, stats_r=2), dict(stats_r=16, stats_warps=8),
                                 dict(quant_block=64, quant_warps=8), dict(fast_div=False)], ids=str)
def test_gpu_launch_configs_give_the_same_bytes(cfg):
    from ditprof.kernels import prep_triton

    q, k, v = with_signed_zeros(*make_qkv(2, 1000, 777, 3, 128, seed=8, device="cuda"))
    ref = fp8_prepare_torch(q, k, v)
    got = prep_triton.prepare_triton(q, k, v, True, config=PrepConfig(**cfg))
    _assert_same_bytes(Fp8Prepared(*got[:4], 1000, 777, got[4]), ref)


def test_check_finite_argument():
    q, k, v = make_qkv(1, 16, 16, 2, 64)
    with pytest.raises(DitprofError, match="check_finite"):
        fp8_prepare(q, k, v, check_finite="later")
    q[0, 3, 1, 5] = float("nan")
    with pytest.raises(DitprofError, match="^q contains NaN or Inf$"):  # CPU: "defer" checks at once
        fp8_prepare(q, k, v, check_finite="defer")


# ------------------------------------------------------------------ CPU: the division without a divide


def _fma32(a, b, c):
    """RN32(a * b + c) for float32 arrays, exactly: the float64 product is exact, the float64 sum is corrected by
    its TwoSum error where it lands exactly on a float32 midpoint (elsewhere RN32(RN64(s)) = RN32(s))."""
    import numpy as np

    a, b, c = (np.asarray(t, np.float32).astype(np.float64) for t in (a, b, c))
    p = a * b
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)
    mid = (s.view(np.uint64) & np.uint64((1 << 29) - 1)) == np.uint64(1 << 28)
    s = np.where(mid & (err != 0), np.nextafter(s, s + err), s)
    return s.astype(np.float32)


def test_markstein_division_is_the_ieee_quotient():
    """prep_triton._div_by_descale's sequence (inv = RN(1/ds), q = RN(x*inv), two fma corrections, sign of x) equals
    RN32(x / ds) on every finite bf16 and fp16 value and on random fp32 values (K - mean), for varied descales
    (the kernel takes this path for ds >= 1e-26)."""
    import numpy as np

    rng = np.random.default_rng(1)
    bf = (np.arange(65536, dtype=np.uint32) << 16).view(np.float32)
    fp = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    allx = np.concatenate([bf, fp])
    allx = allx[np.isfinite(allx)]
    for i in range(60):
        m = [rng.uniform(1, 2), 2 - rng.integers(1, 64) * 2.0**-23, 1 + rng.integers(0, 64) * 2.0**-23][i % 3]
        ds = np.float32(m * 2.0 ** rng.integers(-86, 40))
        x = allx[np.abs(allx) <= np.float32(ds) * np.float32(448.5)]
        x = np.concatenate([x, (rng.uniform(-448, 448, 50000) * np.float64(ds)).astype(np.float32),
                            np.array([0.0, -0.0], np.float32)])
        inv = (np.float64(1.0) / np.float64(ds)).astype(np.float32)
        q = (x.astype(np.float64) * np.float64(inv)).astype(np.float32)
        for _ in range(2):
            q = _fma32(_fma32(-q, ds, x), inv, q)
        q = (q.view(np.uint32) | (x.view(np.uint32) & np.uint32(0x80000000))).view(np.float32)
        want = (x.astype(np.float64) / np.float64(ds)).astype(np.float32)  # 53 >= 2*24+2: innocuous
        # exact where the e4m3 value can depend on it (|quotient| >= 2^-11; below, the remainder may underflow for
        # tiny x, but every such quotient rounds to a signed e4m3 zero either way)
        big = np.abs(want) >= 2.0**-11
        assert np.array_equal(q[big].view(np.uint32), want[big].view(np.uint32)), f"ds={ds!r}"
        assert (np.abs(q[~big]) < 2.0**-10).all() and np.array_equal(np.signbit(q), np.signbit(want))
        e4 = [torch.from_numpy(t).clamp(-448, 448).to(F8).view(torch.uint8) for t in (q, want)]
        assert torch.equal(*e4), f"ds={ds!r}"


def test_v_by_reciprocal_differs_from_the_quotient_only_at_midpoints():
    """quantize_v_e4m3 on every finite bf16 and fp16 value within range, for varied descales: its code is the
    correctly rounded quotient's except where x / ds is an e4m3 midpoint (in float64, exactly), and there the two
    codes are the midpoint's neighbours; the tiny-descale branch is the quotient itself. Some midpoints must occur
    (else this test would check nothing)."""
    rng = torch.Generator().manual_seed(2)
    bf = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    fp = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    allx = torch.cat([bf, fp])
    allx = allx[torch.isfinite(allx)]
    ties = 0
    for i in range(40):
        # descales of few significant bits (what amax / 448 gives for many bf16 amaxes) put x / ds on midpoints
        m = (1.5, 1.25, 1.75, 1.375, float(torch.rand((), generator=rng)) + 1.0)[i % 5]
        ds = torch.tensor(m * 2.0 ** int(torch.randint(-40, 20, (), generator=rng)), dtype=torch.float32)
        x = allx[allx.abs() <= ds * 448.0]
        got = quantize_v_e4m3(x, ds).view(torch.uint8)
        want = (x / ds).clamp(-448, 448).to(F8).view(torch.uint8)
        diff = got != want
        y = x.double() / ds.double()
        lo = e4m3_rne_f64(y).double()
        # a midpoint: y is exactly half-way between its two e4m3 neighbours
        a, b = got[diff].view(F8).double(), want[diff].view(F8).double()
        assert torch.equal((a + b) / 2, y[diff]), f"ds={float(ds)!r}: a code differs away from a midpoint"
        assert torch.equal(want.view(F8).double(), lo)  # the quotient's code is RNE of the exact value
        ties += int(diff.sum())
    assert ties > 0
    tiny = torch.tensor(3e-27, dtype=torch.float32)  # below RECIP_MIN_DESCALE: the exact quotient
    x = (torch.randn(4096, generator=rng) * 3e-27 * 100).float()
    assert torch.equal(quantize_v_e4m3(x, tiny).view(torch.uint8),
                       (x / tiny).clamp(-448, 448).to(F8).view(torch.uint8))


# ------------------------------------------------------------------ CPU: the kernels compile for real GPUs


@pytest.mark.parametrize("arch", [90, 89, 120])
def test_triton_kernels_compile_offline(arch):
    """The compiled path checks what the interpreter does not (e.g. branch-local variable types); the PTX must
    use IEEE division, the hardware e4m3 cvt, and 16-byte global loads/stores (no byte stores for V^T)."""
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
    ks = prep_triton.compile_offline(arch)
    ptx = {name: k.asm["ptx"] for name, k in ks.items()}
    assert "div.full.f32" not in ptx["quant"] and "div.rn.f32" in ptx["quant"]
    assert "fma.rn.f32" in ptx["quant"]  # the Markstein corrections
    assert "div.rn.f32" in ptx["stats"]  # the finalize, run by the last program of each (b, h)
    assert "cvt.rn.satfinite.e4m3x2.f32" in ptx["quant"]
    assert "st.global.b8" not in ptx["quant"], "V^T / q8 / k8 stores must be vectorized"
    assert "ld.global.v4" in ptx["stats"] and "ld.global.v4" in ptx["quant"]
    assert ".local" not in "".join(ptx.values())


def test_torch_prep_matches_the_emulation_quantizer():
    """The prep and fp8-emulated must quantize identically (docs/ARCHITECTURE.md "FP8 numerics")."""
    emu = pytest.importorskip("ditprof.kernels.fp8_emulation")
    if not all(hasattr(emu, n) for n in ("smooth_k", "quantize_per_head")):
        pytest.skip("fp8_emulation has no smooth_k / quantize_per_head helpers")
    q, k, v = make_qkv(2, 77, 130, 3, 128, seed=11, k_bias=10.0)
    res = fp8_prepare_torch(q, k, v)
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
    ks, mean = emu.smooth_k(kh)
    assert torch.equal(res.k_mean, mean)
    Sk_pad = padded_lengths(77, 130)[1]
    for got, x, i in ((res.q8[:, :, :77], qh, 0), (res.k8[:, :, :130], ks, 1),
                      (natural_v(res.v8t, Sk_pad)[:, :, :130], vh, 2)):
        x8, descale = emu.quantize_per_head(x)
        if i == 2:  # V: the emulation quantizes it with prep.quantize_v_e4m3 (the reciprocal)
            x8 = quantize_v_e4m3(x, descale[:, :, None, None])
        assert torch.equal(descale, res.scales[..., i])
        assert torch.equal(got.view(torch.uint8), x8.view(torch.uint8))
