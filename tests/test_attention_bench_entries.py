"""benchmarks/attention.py on CPU: the FlashAttention-3 entries and the named DiT shapes are registered and parse,
the FA3 per-(batch, head) FP8 quantization (``quantize_per_head``) matches a float64 computation, and the FA3
entries pass what fa3_fwd_interface.flash_attn_func expects (checked with a stand-in module; no GPU here)."""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "attention.py"
FA3_ENTRIES = ("fa3-bf16", "fa3-fp8", "fa3-fp8+quant")
DIT_SHAPES = {  # (B, H, S, D) of the table
    "flux": (1, 24, 4608, 128),
    "ltx": (1, 32, 7392, 64),
    "cogvideox": (1, 48, 17776, 64),
    "wan1.3b": (1, 12, 32760, 128),
    "wan14b": (1, 40, 75600, 128),
    "hunyuan": (1, 24, 119056, 128),
}
E4M3_MIN_NORMAL = 2.0**-6
E4M3_SUBNORMAL_STEP = 2.0**-9


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("ditprof_bench_attention", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fresh_generator() -> tuple[torch.Generator, int]:
    seed = int.from_bytes(os.urandom(4), "little")
    return torch.Generator().manual_seed(seed), seed


# ------------------------------------------------------------------------------------------ entries and shapes

def test_fa3_entries_listed_with_the_peers_before_ours(bench):
    names = bench.ALL_ENTRIES
    for n in FA3_ENTRIES:
        assert names.count(n) == 1, n
    first_ours = min(names.index(n) for n in ("prep-torch", "prep-triton", "fp8", "fp8-sm90", "fp8-sm120"))
    assert all(names.index(n) < first_ours for n in FA3_ENTRIES), names
    # our kernels still run last
    assert names[-7:] == ["fp8", "fp8-sm90", "fp8-sm120", "fp8-e4m3", "fp8-int8", "fp8+norm-rope", "fp8+prologue"]
    assert names.index("fa3-fp8+norm-rope+quant") < first_ours


def test_only_accepts_the_fa3_entries(bench, monkeypatch, capsys):
    # past the entry and shape checks, main() stops at cuda_ready(): stub it so the test is the same with a GPU
    monkeypatch.setattr(bench, "cuda_ready", lambda: (False, "stubbed"))
    assert bench.main(["--only", ",".join(FA3_ENTRIES), "--shapes", "flux,ltx", "--no-json"]) == 1
    assert "unknown entries" not in capsys.readouterr().err
    assert bench.main(["--only", "fa3-fp8-quant", "--no-json"]) == 2
    assert "unknown entries" in capsys.readouterr().err


def test_make_entries_has_the_fa3_entries(bench):
    q = k = v = torch.zeros((1, 4, 2, 8), dtype=torch.bfloat16)
    entries = bench.make_entries(q, k, v, 8**-0.5)
    entries.update(bench.make_prologue_entries(q, k, v, 8**-0.5, "interleaved"))
    assert set(entries) == set(bench.ALL_ENTRIES)
    for n in FA3_ENTRIES:
        make, kind, note = entries[n]
        assert callable(make) and kind == "attention" and note


@pytest.mark.parametrize("name", sorted(DIT_SHAPES))
def test_named_dit_shapes(bench, name):
    B, H, S, D = DIT_SHAPES[name]
    assert bench.parse_shape(name) == (name, dict(B=B, H=H, Sq=S, Sk=S, D=D))


def test_named_shapes_split_and_keep_h3(bench):
    text = ",".join(DIT_SHAPES) + ",h3,quick"
    assert bench.split_shapes(text) == text.split(",")
    assert bench.parse_shape("h3")[1] == dict(B=1, H=56, Sq=30272, Sk=30272, D=128)
    assert bench.split_shapes("1,24,4608,128") == ["1,24,4608,128"]  # a custom shape is still one shape
    shapes_help = next(a.help for a in bench.build_parser()._actions if "--shapes" in a.option_strings)
    assert all(name in shapes_help for name in DIT_SHAPES), shapes_help


# ------------------------------------------------------------------------------------------ quantize_per_head

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_quantize_per_head_vs_float64(bench, dtype):
    g, seed = _fresh_generator()
    B, S, H, D = 2, 97, 5, 64
    # heads of very different magnitudes, so a per-tensor scale would be visibly wrong
    head_scale = torch.pow(10.0, torch.empty((B, 1, H, 1), dtype=torch.float64).uniform_(-3, 3, generator=g))
    x = (torch.randn((B, S, H, D), dtype=torch.float64, generator=g) * head_scale).to(dtype)
    x[1, :, 3, :] = 0  # one all-zero (batch, head): descale 1, zeros out

    x8, descale = bench.quantize_per_head(x)

    msg = f"seed {seed}, {dtype}"
    assert x8.dtype == torch.float8_e4m3fn and x8.shape == x.shape, msg
    assert descale.dtype == torch.float32 and descale.shape == (B, H), msg
    assert descale.is_contiguous(), msg

    x64 = x.double()
    amax64 = x64.abs().amax(dim=(1, 3))
    ref = torch.where(amax64 > 0, amax64 / 448.0, torch.ones_like(amax64))
    torch.testing.assert_close(descale.double(), ref, rtol=2e-7, atol=0, msg=msg)
    assert descale[1, 3].item() == 1.0 and x8[1, :, 3, :].float().abs().max().item() == 0.0, msg

    scaled = x64 / ref[:, None, :, None]  # what e4m3 has to represent, float64
    assert scaled.abs().max().item() <= 448.0 * (1 + 1e-6), msg
    x8_64 = x8.double()
    assert torch.isfinite(x8_64).all(), msg
    # each head's largest element lands on +-448
    peak = x8_64.abs().amax(dim=(1, 3))
    assert torch.equal(peak[amax64 > 0], torch.full_like(peak[amax64 > 0], 448.0)), msg

    deq = x8_64 * descale.double()[:, None, :, None]
    err = (deq - x64).abs()
    normal = scaled.abs() >= E4M3_MIN_NORMAL
    assert normal.sum() > 0.9 * (x.numel() - S * D), msg  # all but the zero head's and a tail are normal
    rel = err[normal] / x64.abs()[normal]
    assert rel.max().item() <= 2.0**-4, f"{msg}: max rel error {rel.max().item():.4g} (e4m3: 2^-4 = 0.0625)"
    # subnormal e4m3: at most half a subnormal step, in the scaled units
    sub_err = (x8_64 - scaled).abs()[~normal]
    if sub_err.numel():
        assert sub_err.max().item() <= E4M3_SUBNORMAL_STEP / 2 * (1 + 1e-6), msg
    # nearest rounding, not truncation: the mean relative error is well under the bound
    assert rel.mean().item() < 2.0**-5, msg


def test_quantize_per_head_round_trip_exact_on_e4m3_grid(bench):
    g, seed = _fresh_generator()
    # values already on the e4m3 grid, times a power-of-two descale: the round trip is exact
    grid = torch.randn((1, 33, 3, 16), generator=g).to(torch.float8_e4m3fn).float()
    grid[0, 0, :, 0] = 448.0  # pin each head's amax to 448 so descale is exactly the power of two
    x = grid * torch.tensor([0.25, 1.0, 8.0]).view(1, 1, 3, 1)
    x8, descale = bench.quantize_per_head(x)
    assert torch.equal(descale, torch.tensor([[0.25, 1.0, 8.0]])), f"seed {seed}"
    assert torch.equal(x8.float() * descale[:, None, :, None], x), f"seed {seed}"


# ------------------------------------------------------------------------------------------ FA3 entries, no GPU

def test_fa3_entries_skip_when_fa3_fwd_is_missing(bench, monkeypatch):
    monkeypatch.setitem(sys.modules, "fa3_fwd_interface", None)  # import raises ImportError
    q = k = v = torch.randn((1, 8, 2, 16)).to(torch.bfloat16)
    entries = bench.make_entries(q, k, v, 0.25)
    for n in FA3_ENTRIES:
        with pytest.raises(bench.Skip, match="fa3_fwd not installed"):
            entries[n][0]()


def _fake_fa3(monkeypatch, calls, disable_fp16=False):
    def flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None,
                        v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                        pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False):
        calls.append(dict(q=q, k=k, v=v, softmax_scale=softmax_scale, causal=causal, q_descale=q_descale,
                          k_descale=k_descale, v_descale=v_descale))
        return torch.zeros(q.shape, dtype=torch.bfloat16)

    monkeypatch.setitem(sys.modules, "fa3_fwd_interface", types.SimpleNamespace(flash_attn_func=flash_attn_func))
    config = {"build_flags": {"FLASHATTENTION_DISABLE_FP16": disable_fp16, "FLASHATTENTION_DISABLE_FP8": False}}
    monkeypatch.setitem(sys.modules, "fa3_fwd_config", types.SimpleNamespace(CONFIG=config))


def test_fa3_entries_call_flash_attn_func_as_fa3_expects(bench, monkeypatch):
    calls = []
    _fake_fa3(monkeypatch, calls)
    g, seed = _fresh_generator()
    B, S, H, D = 2, 16, 3, 32
    q, k, v = (torch.randn((B, S, H, D), generator=g).to(torch.bfloat16) for _ in range(3))
    scale = D**-0.5
    entries = bench.make_entries(q, k, v, scale)

    fn = entries["fa3-bf16"][0]()
    fn()
    assert len(calls) == 2  # once in make (a failing backend raises there), once here
    c = calls[-1]
    assert c["q"] is q and c["k"] is k and c["v"] is v
    assert c["softmax_scale"] == scale and c["causal"] is False and c["q_descale"] is None

    for name, quant_timed in (("fa3-fp8", False), ("fa3-fp8+quant", True)):
        calls.clear()
        fn = entries[name][0]()
        fn()
        fn()
        assert len(calls) == 3
        for c in calls:
            assert c["softmax_scale"] == scale and c["causal"] is False
            for x, t8, ds in ((q, "q", "q_descale"), (k, "k", "k_descale"), (v, "v", "v_descale")):
                x8, d = bench.quantize_per_head(x)
                assert c[t8].dtype == torch.float8_e4m3fn and c[t8].shape == (B, S, H, D)
                assert c[ds].dtype == torch.float32 and c[ds].shape == (B, H)
                assert torch.equal(c[t8].view(torch.uint8), x8.view(torch.uint8)), f"{name} seed {seed}"
                assert torch.equal(c[ds], d), f"{name} seed {seed}"
        same = calls[1]["q"] is calls[2]["q"]
        # kernel only: the same pre-quantized tensors each call; +quant: quantized afresh inside each call
        assert same is (not quant_timed), name


def test_fa3_bf16_skips_fp16_when_the_wheel_has_no_fp16(bench, monkeypatch):
    _fake_fa3(monkeypatch, [], disable_fp16=True)
    q = k = v = torch.randn((1, 8, 2, 16)).to(torch.float16)
    entries = bench.make_entries(q, k, v, 0.25)
    with pytest.raises(bench.Skip, match="FP16"):
        entries["fa3-bf16"][0]()


# ------------------------------------------------------------------------------------------ FA3 fed by our prologue

FA3_PROLOGUE_ENTRIES = ("fa3-prologue-prep", "fa3-fp8+prologue")


def test_fa3_prologue_entries_beside_ours_in_the_prologue_group(bench):
    names = bench.ALL_ENTRIES
    q = k = v = torch.randn((1, 8, 2, 16)).to(torch.bfloat16)
    group = bench.make_prologue_entries(q, k, v, 0.25, "half")
    for n in FA3_PROLOGUE_ENTRIES:
        assert names.count(n) == 1 and n in group, n
        assert names.index("prep-triton-int8") < names.index(n) < names.index("fp8"), names
    assert group["fa3-prologue-prep"][1] == "prep" and group["fa3-fp8+prologue"][1] == "attention"
    assert "(half)" in group["fa3-fp8+prologue"][2]


def test_fa3_prologue_entries_skip_without_triton_kernels(bench, monkeypatch):
    """On CPU (no interpreter) both entries are a Skip with the reason, whether or not FA3 is there."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") or torch.cuda.is_available():
        pytest.skip("the Triton kernels can run here")
    q = k = v = torch.randn((1, 8, 2, 16)).to(torch.bfloat16)
    for fa3 in (False, True):
        if fa3:
            _fake_fa3(monkeypatch, [])
        else:
            monkeypatch.setitem(sys.modules, "fa3_fwd_interface", None)
        group = bench.make_prologue_entries(q, k, v, 0.25, "interleaved")
        for n in FA3_PROLOGUE_ENTRIES:
            with pytest.raises(bench.Skip, match="CUDA tensors|triton unavailable"):
                group[n][0]()


def test_triton_interpreter_fa3_prologue_entries():
    """Runs the inner test below in a subprocess with TRITON_INTERPRET=1 (set before triton is imported)."""
    from triton_interpreter import run_under_interpreter

    run_under_interpreter(__file__, "test_interpreter_fa3_prologue_entries_inner")


@pytest.mark.skipif(os.environ.get("DITPROF_PREP_INTERP_INNER") != "1", reason="run by the interpreter test")
@pytest.mark.parametrize("form", ["half", "interleaved"])
def test_interpreter_fa3_prologue_entries_inner(bench, monkeypatch, form):
    """fa3-fp8+prologue passes FA3 what fa3_prologue_inputs makes of the raw projections (fresh each call: the prep
    is timed), the entry's norm + RoPE applied (the codes differ from the raw q's); fa3-prologue-prep returns it."""
    calls = []
    _fake_fa3(monkeypatch, calls)
    g, seed = _fresh_generator()
    B, S, H, D = 1, 24, 2, 32
    q, k, v = (torch.randn((B, S, H, D), generator=g).to(torch.bfloat16) for _ in range(3))
    group = bench.make_prologue_entries(q, k, v, D**-0.5, form)
    prep = group["fa3-prologue-prep"][0]()
    got = prep()
    fn = group["fa3-fp8+prologue"][0]()
    fn()
    assert len(calls) == 2 and calls[0]["q"] is not calls[1]["q"], f"seed {seed}"
    c = calls[-1]
    assert c["softmax_scale"] == D**-0.5 and c["causal"] is False
    for i, (name, ds) in enumerate((("q", "q_descale"), ("k", "k_descale"), ("v", "v_descale"))):
        assert torch.equal(c[name].view(torch.uint8), got[i].view(torch.uint8)), f"{name} seed {seed}"
        assert torch.equal(c[ds], got[3 + i]) and c[ds].shape == (B, H), f"{name} seed {seed}"
    assert not torch.equal(c["q"].view(torch.uint8), bench.quantize_per_head(q)[0].view(torch.uint8)), f"seed {seed}"
    assert torch.equal(c["v"].view(torch.uint8), bench.quantize_per_head(v)[0].view(torch.uint8)), f"seed {seed}"
