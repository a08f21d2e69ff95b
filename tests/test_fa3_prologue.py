"""FA3 FP8's inputs made by our fused prologue (``kernels.fa3_prologue.fa3_prologue_inputs``) against the torch
chain: ``prologue_torch`` on q and k, then per-(batch, head) e4m3 quantization (descale = amax / 448, 1 where the
amax is 0; codes e4m3(x / descale)), under the Triton interpreter on CPU and natively on CUDA (marked gpu).

Tolerance: the fused prologue's fp32 value (another order of the norm's sum of squares, fused multiply-adds on the
GPU) may round to the other neighbouring 16-bit value. So Q's and K's descales are bit for bit under the
interpreter and within one 16-bit ulp of the torch chain's on the GPU (the head's largest value may be that
neighbour), and their codes are checked against the torch chain's values quantized with the descales the kernel
wrote: bit for bit but for rare ones one code apart (``CODE_OFF_MAX`` of them at most), where a neighbouring 16-bit
value lands on the other side of an e4m3 rounding boundary. V (no prologue) bit for bit, descales included.
"""

from __future__ import annotations

import pytest
import torch
from test_prologue_prep import FORMS, make_case
from triton_interpreter import inner_only, run_under_interpreter

from ditprof.errors import DitprofError
from ditprof.kernels.fp8_config import Fa3PrologueConfig
from ditprof.kernels.prologue import PrologueSpec, prologue_torch

# the prep's forms but rms_across (Wan's norm across heads): the FA3 peer normalizes per head only
FA3_FORMS = [f for f, (kw, _, _) in FORMS.items() if kw.get("norm") != "rms_across"]

CODE_OFF_MAX = 1e-4  # fraction of q / k codes that may be one code off
POISON_CODE = 0x7F  # e4m3fn NaN
SMALL = Fa3PrologueConfig(stats_chunk=48, quant_rows=64)  # several chunks and tiles, ragged ends, at tiny S


def per_head_e4m3(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference quantization: x (B, S, H, D) -> (e4m3 codes, descales float32 (B, H))."""
    amax = x.abs().amax(dim=(1, 3)).float()
    ds = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    return (x.float() / ds[:, None, :, None]).to(torch.float8_e4m3fn), ds


def reference(spec, q, k, v, wq, wk, cos, sin, text_rows):
    """The torch chain: (q8, k8, v8, dq, dk, dv, the three tensors it quantized)."""
    xs = (prologue_torch(spec, q, wq, cos, sin, text_rows), prologue_torch(spec, k, wk, cos, sin, text_rows), v)
    (q8, dq), (k8, dk), (v8, dv) = (per_head_e4m3(x) for x in xs)
    return q8, k8, v8, dq, dk, dv, xs


def poisoned_out(B, S, H, D, device):
    codes = [torch.full((B, S, H, D), POISON_CODE, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
             for _ in range(3)]
    return (*codes, torch.full((3, B, H), float("nan"), device=device))


def assert_matches(got, ref, what: str):
    """got / ref: (q8, k8, v8, dq, dk, dv); returns the count of one-code-off q / k codes."""
    off = 0
    for i, name in enumerate(("q", "k", "v")):
        x, ds, ref_ds = ref[6][i], got[3 + i], ref[3 + i]
        exact = name == "v" or x.device.type == "cpu"
        if exact:
            assert torch.equal(ds.cpu(), ref_ds.cpu()), f"{what}: descale of {name}"
        else:
            ulp = 2.0 ** -7 if x.dtype == torch.bfloat16 else 2.0 ** -10
            assert bool(((ds - ref_ds).abs() <= ref_ds * ulp).all()), f"{what}: descale of {name} off by > 1 ulp"
        b8 = (x.float() / ds[:, None, :, None]).to(torch.float8_e4m3fn)  # the chain's values, the kernel's descales
        a, b = got[i].view(torch.uint8).cpu().int(), b8.view(torch.uint8).cpu().int()
        assert a.shape == b.shape and got[i].is_contiguous(), f"{what} {name}"
        diff = a != b
        n = int(diff.sum())
        if name == "v":
            assert n == 0, f"{what}: {n} v codes differ"
            continue
        # one code apart: same sign bit, magnitudes neighbours on the e4m3 grid (adjacent codes)
        assert bool(((a[diff] - b[diff]).abs() == 1).all()), f"{what}: a {name} code off by more than one"
        assert n <= CODE_OFF_MAX * a.numel(), f"{what}: {n} {name} codes off"
        off += n
    return off


def packed_qkv(q, k, v):
    """q, k, v as strided views of one (B, S, 3, H, D) projection output (the strides a fused QKV linear gives)."""
    qkv = torch.stack((q, k, v), dim=2).contiguous()
    return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]


def run_checks(form: str, shape, device: str, *, dtype=torch.bfloat16, config=SMALL, seed=0, strided=False):
    from ditprof.kernels.fa3_prologue import fa3_prologue_inputs

    B, S, H, D = shape
    spec, (q, k, v, wq, wk, cos, sin, text_rows) = make_case(form, B, S, H, D, dtype=dtype, seed=seed,
                                                              device=device)
    if strided:
        q, k, v = packed_qkv(q, k, v)
        assert not q.is_contiguous()
    ref = reference(spec, q, k, v, wq, wk, cos, sin, text_rows)
    out = poisoned_out(B, S, H, D, device)
    got = fa3_prologue_inputs(q, k, v, spec, wq=wq, wk=wk, cos=cos, sin=sin, text_rows=text_rows, config=config,
                              out=out)
    assert all(g.data_ptr() == o.data_ptr() for g, o in zip(got[:3], out[:3])) and got[3].data_ptr() == \
        out[3].data_ptr()
    assert_matches(got, ref, f"{form} {shape} {dtype}")
    raw = per_head_e4m3(q)[0].view(torch.uint8)  # the prologue changed what was quantized
    assert not torch.equal(raw.cpu(), got[0].view(torch.uint8).cpu())
    return spec, (q, k, v, wq, wk, cos, sin)


def run_text_rows_reuse(shape, device: str):
    """One G == 2 call signature twice with other text_rows: the cached plan takes text_rows per call."""
    from ditprof.kernels.fa3_prologue import fa3_prologue_inputs

    spec, (q, k, v, wq, wk, cos, sin) = run_checks("G2", shape, device, seed=4)
    for text_rows in (1, shape[1] // 2 + 3):
        got = fa3_prologue_inputs(q, k, v, spec, wq=wq, wk=wk, cos=cos, sin=sin, text_rows=text_rows, config=SMALL)
        assert_matches(got, reference(spec, q, k, v, wq, wk, cos, sin, text_rows), f"G2 text_rows={text_rows}")


# ------------------------------------------------------------------ CPU: input errors (no kernel runs)

def test_bad_inputs_are_one_line_errors():
    pytest.importorskip("triton")
    from ditprof.kernels.fa3_prologue import fa3_prologue_inputs

    spec, (q, k, v, wq, wk, cos, sin, _) = make_case("half", 1, 40, 2, 64)
    good = dict(wq=wq, wk=wk, cos=cos, sin=sin)
    out = poisoned_out(1, 40, 2, 64, "cpu")
    cases = [
        ((q, k, v, "half"), good, "PrologueSpec"),
        ((q, k, v, spec), dict(good, wq=wq[:, :32]), "norm weight of q"),
        ((q, k, v, spec), dict(good, wk=torch.ones(3, 64)), "norm weight of k"),
        ((q, k, v, spec), dict(good, cos=cos[:, :32]), "cos must be"),
        ((q, k, v, spec), dict(good, sin=None), "sin must be"),
        ((q, k[:, :20], v[:, :20], spec), good, "one sequence length"),
        ((q, k, v, PrologueSpec(rope="half", rope_dim=128)), good, "exceeds head_dim"),
        ((q, k, v, spec), dict(good, wq=wq.repeat(2, 1)), "same rows"),
        ((q, k, v, spec), dict(good, wq=wq.repeat(2, 1), wk=wk.repeat(2, 1), text_rows=41), "text_rows"),
        ((q.float(), k, v, spec), good, "q must be"),
        ((q[..., :48], k[..., :48], v[..., :48], spec), dict(good, wq=wq[:, :48], wk=wk[:, :48]), "power of two"),
        ((q, k, v[:, :, :1], spec), good, "same shape"),
        ((q, k, v, spec), dict(good, config=Fa3PrologueConfig(quant_rows=100)), "quant_rows"),
        ((q, k, v, spec), dict(good, config=PrologueSpec()), "Fa3PrologueConfig"),
        ((q, k, v, spec), dict(good, out=out[:3]), "out must be"),
        ((q, k, v, spec), dict(good, out=(*out[:3], out[3][:2])), "out descales"),
        ((q, k, v, spec), dict(good, out=(out[0].view(torch.uint8), *out[1:])), "out q8"),
        ((q, k, v, spec), dict(good, out=(*out[:3], torch.empty(3 * 2 + 1)[1:].view(3, 1, 2))), "aligned"),
    ]
    for args, kw, word in cases:
        with pytest.raises(DitprofError, match=word) as err:
            fa3_prologue_inputs(*args, **kw)
        assert "\n" not in str(err.value), word


def test_cpu_tensors_need_the_interpreter():
    P = pytest.importorskip("ditprof.kernels.fa3_prologue")
    if P.INTERPRET:
        pytest.skip("TRITON_INTERPRET=1: CPU tensors run interpreted")
    spec, (q, k, v, wq, wk, cos, sin, _) = make_case("half", 1, 40, 2, 64)
    with pytest.raises(DitprofError, match="needs CUDA tensors") as err:
        P.fa3_prologue_inputs(q, k, v, spec, wq=wq, wk=wk, cos=cos, sin=sin)
    assert "\n" not in str(err.value)


def test_kernels_compile_offline():
    """Both launches compile for sm_90 with no spills, 16-byte loads and stores, the e4m3 cvt in the quantize pass
    and IEEE sqrt in the norm (GPU-free: triton.compile with the wheel's ptxas)."""
    P = pytest.importorskip("ditprof.kernels.fa3_prologue")
    for spec, G, D in ((PrologueSpec(rope="half"), 2, 128), (PrologueSpec(rope="interleaved", rope_dim=32), 1, 64)):
        ks = P.compile_offline(90, head_dim=D, spec=spec, groups=G)
        for name, k in ks.items():
            ptx = k.asm["ptx"]
            assert ".local" not in ptx and "sqrt.rn.f32" in ptx and "ld.global.v4" in ptx, (name, D)
        assert "cvt.rn.satfinite.e4m3x2.f32" in ks["quant"].asm["ptx"] and "st.global.v4" in ks["quant"].asm["ptx"]


# ------------------------------------------------------------------ Triton vs the torch chain

def test_triton_interpreter_fa3_prologue_matches_torch():
    """Runs the inner test below in a subprocess with TRITON_INTERPRET=1 (set before triton is imported)."""
    run_under_interpreter(__file__, "test_interpreter_fa3_prologue_inner")


@inner_only()
@pytest.mark.parametrize("form", FA3_FORMS)
def test_interpreter_fa3_prologue_inner(form):
    from ditprof.kernels import fa3_prologue

    assert fa3_prologue.INTERPRET
    run_checks(form, (2, 150, 2, 64), "cpu")
    if form == "half":
        run_checks(form, (1, 70, 2, 128), "cpu", config=Fa3PrologueConfig())  # one chunk, one ragged tile
    if form == "interleaved-R/2":
        run_checks(form, (1, 100, 3, 64), "cpu", strided=True, seed=2)
    if form == "G2":
        run_checks(form, (2, 90, 2, 64), "cpu", dtype=torch.float16, seed=1)
        run_text_rows_reuse((1, 90, 2, 64), "cpu")


GPU_SHAPE = (1, 4096 + 512, 24, 128)


@pytest.mark.gpu
@pytest.mark.parametrize("form", FA3_FORMS)
def test_gpu_fa3_prologue_matches_torch(form):
    run_checks(form, GPU_SHAPE, "cuda", config=Fa3PrologueConfig())
    run_checks(form, (2, 200, 2, 64), "cuda", dtype=torch.float16)
    run_checks(form, (2, 1000, 3, 128), "cuda", strided=True, seed=3, config=Fa3PrologueConfig())


@pytest.mark.gpu
def test_gpu_fa3_prologue_text_rows_reuse():
    run_text_rows_reuse((1, 1000, 4, 128), "cuda")
