"""fp8-sm120's ``qk_int8`` kernel (int8 Q and K with per-row Q descales, e4m3 V; issue 18) on whatever GPU runs the
tests, compiled and launched directly (no prep: the int8 inputs are built here).  On Hopper the kernel compiles for
sm_90a: the int8 mma.sync is native there, the FP8 P V one emulated.  Three schedules: the sm_90 one (early V off),
and the native ones forced (early V, P V waves of 128 columns as on sm_120 and of 64 as on sm_89).  Checked against
float64 over the dequantized int8 scores: the output against a strip-by-strip model of the kernel's P rounding
(online softmax, P * 256 to e4m3) and against plain softmax, the LSE (no P rounding in it) tightly; outputs and LSE
poisoned with NaN before the launch, every element checked written.  Rows of very different magnitudes (per-row Q
scales from 0.05 to 20) and an all-zero Q row whose q_scale is 0.  H200, 2026-12-02 (sm_90a, all three schedules
alike): rel-RMS vs the model 1.8e-3 (its floor is the bf16 output rounding, ~1.1e-3, plus e4m3 ties flipped by fp32
rounding), vs float64 softmax 3.7e-3, LSE max abs error 7e-6 (head_dim 64) / 1.1e-5 (128).  Marked ``gpu``."""

import math

import pytest
import torch

pytestmark = pytest.mark.gpu

M_BLOCK, N_BLOCK = 128, 32
E4M3_MAX = 448.0

_ARCHS = {(8, 9): "sm_89", (9, 0): "sm_90a", (10, 0): "sm_100a", (10, 3): "sm_103a", (12, 0): "sm_120a",
          (12, 1): "sm_121a"}
_COMPILED: dict = {}


@pytest.fixture(autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


def _compiled(D, write_lse, key_lens, schedule):
    """The int8 kernel for this GPU; ``schedule``: ``"default"`` (the arch's own), ``"w128"`` / ``"w64"`` (early V
    with P V waves of that many columns: sm_120's and sm_89's)."""
    from ditprof.kernels import fp8_fwd_sm120 as K
    from ditprof.kernels.cute_arch import cute_dsl_arch

    arch = _ARCHS[torch.cuda.get_device_capability()]
    key = (arch, D, write_lse, key_lens, schedule)
    if key not in _COMPILED:
        if schedule == "default":
            _COMPILED[key] = K.compile_fp8_fwd(arch, D, "bfloat16", write_lse=write_lse, key_lens=key_lens,
                                               qk_int8=True)
        else:
            from cutlass import cute

            op = K.Fp8FlashAttentionSm120(D, K._DTYPES["bfloat16"], write_lse, True, key_lens, True,
                                          int(schedule[1:]))
            with cute_dsl_arch(arch):
                _COMPILED[key] = cute.compile(op, *_fake_args(K), options=f"--gpu-arch {arch}")
    return _COMPILED[key]


def _fake_args(K):
    import cutlass
    from cutlass import cute

    gm = cute.AddressSpace.gmem
    F32, I32 = cutlass.Float32, cutlass.Int32
    return (
        cute.runtime.make_ptr(cutlass.Int8, 0, gm, assumed_align=16),
        cute.runtime.make_ptr(cutlass.Int8, 0, gm, assumed_align=16),
        cute.runtime.make_ptr(K.FP8, 0, gm, assumed_align=16),
        cute.runtime.make_ptr(cutlass.BFloat16, 0, gm, assumed_align=16),
        cute.runtime.make_ptr(F32, 0, gm, assumed_align=4),
        cute.runtime.make_ptr(F32, 0, gm, assumed_align=4),
        cute.runtime.make_ptr(F32, 0, gm, assumed_align=4),
        cute.runtime.make_ptr(I32, 0, gm, assumed_align=4),
        I32(1), I32(1), I32(1), I32(1), cutlass.Int64(0), cutlass.Int64(0), I32(0), F32(1.0),
        cute.runtime.make_fake_stream(),
    )


def _inputs(B, H, Sq, Sk, D, seed, lengths=None):
    """int8 Q (per-row descales, rows of magnitudes 0.05..20, one all-zero row with descale 0), int8 K (one descale
    per head over its item's keys), e4m3 V (one per head), padded and V key-permuted as the kernel reads them."""
    from ditprof.kernels.key_order import key_order_for_positions

    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    q = torch.randn((B, H, Sq, D), generator=g, device=dev)
    q = q * torch.exp(torch.empty((B, H, Sq, 1), device=dev).uniform_(math.log(0.05), math.log(20.0), generator=g))
    q[0, 0, 5] = 0.0
    k = torch.randn((B, H, Sk, D), generator=g, device=dev)
    v = torch.randn((B, H, Sk, D), generator=g, device=dev) + 1.0
    n = torch.tensor(lengths if lengths is not None else [Sk] * B, device=dev)
    keep = (torch.arange(Sk, device=dev)[None, :] < n[:, None])[:, None, :, None]  # (B, 1, Sk, 1)
    sq_pad = -(-Sq // M_BLOCK) * M_BLOCK
    sk_pad = -(-Sk // N_BLOCK) * N_BLOCK

    q_ds = q.abs().amax(dim=3) / 127.0  # 0 for the zero row: the kernel floors its scale
    q8 = torch.zeros((B, H, sq_pad, D), dtype=torch.int8, device=dev)
    q8[:, :, :Sq] = torch.round(q / torch.where(q_ds == 0, 1.0, q_ds)[..., None]).clamp(-127, 127).to(torch.int8)
    q_scales = torch.full((B, H, sq_pad), float("nan"), device=dev)  # padded rows: read, never stored
    q_scales[:, :, :Sq] = q_ds
    k_ds = torch.where(keep, k.abs(), 0.0).amax(dim=(2, 3)) / 127.0  # (B, H)
    k8 = torch.zeros((B, H, sk_pad, D), dtype=torch.int8, device=dev)
    k8[:, :, :Sk] = torch.round(k / k_ds[..., None, None]).clamp(-127, 127).to(torch.int8)
    v_ds = torch.where(keep, v.abs(), 0.0).amax(dim=(2, 3)) / E4M3_MAX
    v8 = torch.zeros((B, H, sk_pad, D), dtype=torch.float8_e4m3fn, device=dev)
    v8[:, :, :Sk] = (v / v_ds[..., None, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    perm = key_order_for_positions(torch.arange(sk_pad, device=dev))
    v8t = v8.view(torch.uint8)[:, :, perm].transpose(2, 3).contiguous()
    scales = torch.stack([torch.ones_like(k_ds), k_ds, v_ds], dim=-1).contiguous()
    return {"q8": q8, "k8": k8, "v8": v8, "v8t": v8t, "q_scales": q_scales, "scales": scales,
            "key_lens": n.to(torch.int32), "Sq": Sq, "Sk": Sk}


def _launch(fn, x, softmax_scale, write_lse):
    import cuda.bindings.driver as cuda
    import cutlass
    from cutlass import cute

    B, H, _, D = x["q8"].shape
    Sq, Sk = x["Sq"], x["Sk"]
    out = torch.full((B, Sq, H, D), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((B, H, Sq), float("nan"), device="cuda")
    gm = cute.AddressSpace.gmem

    def ptr(ty, t, align):
        return cute.runtime.make_ptr(ty, t.data_ptr(), gm, assumed_align=align)

    I32, F32 = cutlass.Int32, cutlass.Float32
    fn(ptr(cutlass.Int8, x["q8"], 16), ptr(cutlass.Int8, x["k8"], 16), ptr(cutlass.Float8E4M3FN, x["v8t"], 16),
       ptr(cutlass.BFloat16, out, 16), ptr(F32, lse, 4), ptr(F32, x["scales"], 4), ptr(F32, x["q_scales"], 4),
       ptr(I32, x["key_lens"], 4), I32(B), I32(H), I32(Sq), I32(Sk),
       cutlass.Int64(Sq * H * D), cutlass.Int64(D), I32(H * D), F32(softmax_scale),
       cuda.CUstream(torch.cuda.current_stream().cuda_stream))
    torch.cuda.synchronize()
    return out, (lse if write_lse else None)


def _reference(x, softmax_scale):
    """float64 over the dequantized inputs, (B, Sq, H, D) outputs and (B, H, Sq) LSE: the plain softmax, and the
    kernel's P rounding modelled strip by strip (running max, P * 256 rounded to e4m3, O rescaled by alpha)."""
    B, H, _, D = x["q8"].shape
    Sq, Sk = x["Sq"], x["Sk"]
    q_ds = x["q_scales"][:, :, :Sq].double()
    k_ds, v_ds = x["scales"][..., 1].double(), x["scales"][..., 2].double()
    s_int = torch.matmul(x["q8"][:, :, :Sq].double(), x["k8"][:, :, :Sk].double().transpose(2, 3))
    s = s_int * q_ds[..., None] * k_ds[..., None, None] * softmax_scale  # natural-log domain
    valid = torch.arange(Sk, device="cuda")[None, :] < x["key_lens"].long()[:, None]  # (B, Sk)
    s = s.masked_fill(~valid[:, None, None, :], float("-inf"))
    v = x["v8"][:, :, :Sk].double() * v_ds[..., None, None]
    lse = torch.logsumexp(s, dim=-1)
    plain = torch.matmul(torch.softmax(s, dim=-1), v)
    # strip model (exp2 domain as the kernel): P of each strip against the running max, rounded like the kernel's
    s2 = s / math.log(2.0)
    o = torch.zeros((B, H, Sq, D), dtype=torch.float64, device="cuda")
    l_sum = torch.zeros((B, H, Sq), dtype=torch.float64, device="cuda")
    m = torch.full((B, H, Sq), float("-inf"), dtype=torch.float64, device="cuda")
    for k0 in range(0, Sk, N_BLOCK):
        blk = s2[..., k0:k0 + N_BLOCK]
        m_new = torch.maximum(m, blk.amax(dim=-1))
        alpha = torch.exp2(m - m_new)
        p = torch.exp2(blk - m_new[..., None])
        p8 = (p * 256.0).float().to(torch.float8_e4m3fn).double()
        o = o * alpha[..., None] + torch.matmul(p8, v[:, :, k0:k0 + N_BLOCK])
        l_sum = l_sum * alpha + p.sum(dim=-1)
        m = m_new
    model = o / 256.0 / l_sum[..., None]
    return plain.transpose(1, 2), model.transpose(1, 2), lse


def _rel_rms(a, b):
    a, b = a.double(), b.double()
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()).item()


SCHEDULES = ["default", "w128", "w64"]


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("D", [64, 128])
def test_int8_qk_against_float64(D, schedule):
    x = _inputs(2, 3, 300, 1000, D, seed=11)  # 1000 keys: the last strip holds 8; 300 rows: a partial last CTA
    scale = 1.0 / math.sqrt(D)
    out, lse = _launch(_compiled(D, True, False, schedule), x, scale, True)
    plain, model, ref_lse = _reference(x, scale)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()  # every element written
    err_model, err_plain = _rel_rms(out, model), _rel_rms(out, plain)
    lse_err = (lse.double() - ref_lse).abs().max().item()
    print(f"\nD={D} {schedule}: rel-RMS vs P-rounding model {err_model:.2e}, vs float64 softmax {err_plain:.2e}, "
          f"LSE max abs err {lse_err:.2e}")
    assert err_model < 3e-3, err_model
    assert err_plain < 1e-2, err_plain
    assert lse_err < 1e-4, lse_err
    # the all-zero Q row (q_scale 0) attends uniformly
    assert _rel_rms(out[0, 5, 0], plain[0, 5, 0]) < 1e-2


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("write_lse", [True, False])
def test_int8_qk_key_lens(write_lse, schedule):
    lengths = [480, 301, 97]  # all keys; a partial last strip; one valid key in the last strip
    x = _inputs(3, 4, 200, 480, 128, seed=12, lengths=lengths)
    scale = 0.1
    out, lse = _launch(_compiled(128, write_lse, True, schedule), x, scale, write_lse)
    plain, model, ref_lse = _reference(x, scale)
    assert torch.isfinite(out).all()
    for b in range(3):
        err = _rel_rms(out[b], model[b])
        assert err < 3e-3, (b, err)
        assert _rel_rms(out[b], plain[b]) < 1e-2, b
    if write_lse:
        assert torch.isfinite(lse).all()
        assert (lse.double() - ref_lse).abs().max().item() < 1e-4
