"""FP8 linears (``--linears``): the emulation's numerics against float64 and torchao's own quantization, the swap's
install/undo and its choice of linears, the CLI end to end on the CPU, and torchao's float8 on a GPU."""

import copy
import json

import pytest
import torch

from ditprof import cli
from ditprof.errors import DitprofError
from ditprof.harness.swaps import linears as linears_mod
from ditprof.harness.swaps.linears import LinearsSwap
from ditprof.kernels import fp8_linear
from ditprof.kernels.fp8_linear import EmulatedFp8Linear, Fp8LinearConfig, emulated_linear, fp8_scale, quantize_e4m3

CPU = torch.device("cpu")


def _rel_rms(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("granularity", ["rowwise", "tensorwise"])
def test_emulated_linear_is_the_scaled_fp8_product(granularity):
    """The emulation's output is (X8 sx)(W8 sw)^T + b of its own e4m3 operands, in float64 up to the one rounding
    to bf16 -- and the e4m3 operands are what the recipe says (scale = amax/448 per row or tensor)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 48, 128, generator=g).to(torch.bfloat16)
    w = (torch.randn(96, 128, generator=g) * 0.05).to(torch.bfloat16)
    b = torch.randn(96, generator=g).to(torch.bfloat16)
    ws = fp8_scale(w, granularity)
    w8 = quantize_e4m3(w, ws)
    y = emulated_linear(x, w8, ws, b, granularity)
    assert y.dtype == torch.bfloat16 and y.shape == (2, 48, 96)
    xs = fp8_scale(x, granularity)
    x8 = quantize_e4m3(x, xs)
    ref = (x8.double() * xs.double()) @ (w8.double() * ws.double().reshape(-1, 1) if granularity == "rowwise"
                                         else w8.double() * ws.double()).t() + b.double()
    # one bf16 rounding of an fp32 sum: <= 2^-8 relative per element (plus fp32 summation, far below)
    assert ((y.double() - ref).abs() <= ref.abs() * 2 ** -8 + 1e-6).all()
    # the scales: amax / 448 (per row: over the last dim); every quantized value within e4m3's range
    amax = w.abs().amax(dim=-1, keepdim=True) if granularity == "rowwise" else w.abs().amax()
    assert torch.equal(ws, (amax / 448.0).float())
    assert w8.float().abs().max().item() <= 448.0
    assert w8.float().abs().max().item() >= 240.0  # the largest element lands near the top of the range


@pytest.mark.parametrize("granularity", ["rowwise", "tensorwise"])
def test_emulated_fp8_linear_accuracy_against_float64(granularity):
    """Fresh random inputs, a real-sized linear: FP8's error against the float64 product stays at e4m3's level."""
    g = torch.Generator().manual_seed(2)
    lin = torch.nn.Linear(512, 384).to(torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(384, 512, generator=g) * 0.04)
        lin.bias.copy_(torch.randn(384, generator=g) * 0.1)
    x = torch.randn(4, 100, 512, generator=g).to(torch.bfloat16)
    ref = x.double() @ lin.weight.double().t() + lin.bias.double()
    out = EmulatedFp8Linear(lin, Fp8LinearConfig(granularity))(x)
    err = _rel_rms(out, ref)
    bf16_err = _rel_rms(lin(x), ref)
    # e4m3 keeps 3 mantissa bits: ~2-3 % per product, averaged over K=512 terms; bf16 alone is ~0.3 %
    assert 0.005 < err < 0.05, err
    assert bf16_err < err


def test_all_zero_rows_give_nan_as_torchao():
    """torchao's scale of an all-zero row is 0 and its quantization 0/0: the emulation says so too (no hidden eps)."""
    x = torch.zeros(2, 32, dtype=torch.bfloat16)
    x[1] = 1.0
    lin = torch.nn.Linear(32, 16).to(torch.bfloat16)
    y = EmulatedFp8Linear(lin, Fp8LinearConfig("rowwise"))(x)
    assert torch.isnan(y[0]).all() and torch.isfinite(y[1]).all()


@pytest.mark.parametrize("granularity", ["rowwise", "tensorwise"])
def test_quantization_bits_match_torchao(granularity):
    """Where torchao is installed (the GPU host; CI's CPU install has none): its Float8Tensor's scales and e4m3
    data are bit for bit the emulation's, for a weight and an activation."""
    pytest.importorskip("torchao")
    from torchao.quantization import PerRow, PerTensor
    from torchao.quantization.quantize_.workflows.float8.float8_tensor import Float8Tensor

    g = torch.Generator().manual_seed(3)
    gran = PerRow() if granularity == "rowwise" else PerTensor()
    for t in (torch.randn(256, 512, generator=g) * 0.03, torch.randn(64, 512, generator=g) * 5):
        t = t.to(torch.bfloat16)
        ref = Float8Tensor.from_hp(t, granularity=gran)
        s = fp8_scale(t, granularity)
        assert torch.equal(ref.scale.reshape(-1), s.reshape(-1))
        assert torch.equal(ref.qdata.view(torch.uint8), quantize_e4m3(t, s).view(torch.uint8))


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = torch.nn.Module()
        self.norm1.linear = torch.nn.Linear(64, 384)  # a modulation projection the family keeps
        self.attn = torch.nn.Module()
        self.attn.to_q = torch.nn.Linear(64, 64)
        self.attn.to_out = torch.nn.ModuleList([torch.nn.Linear(64, 64), torch.nn.Dropout(0.0)])
        self.odd = torch.nn.Linear(64, 40)  # 40: not a multiple of 16
        self.ff = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
        self.to(torch.bfloat16)
        self.fp32 = torch.nn.Linear(64, 64)  # kept in fp32, as diffusers keeps some modules

    def forward(self, x):
        h = self.attn.to_out[0](self.attn.to_q(x)) + self.ff(x)
        return h + self.odd(x).sum(-1, keepdim=True) + self.norm1.linear(x)[..., :64] \
            + self.fp32(x.float()).to(x.dtype)


KEEP = (("norm1.linear", "modulation"),)


def test_swap_installs_fp8_where_allowed_and_undoes_exactly():
    torch.manual_seed(4)
    block = _Block()
    x = torch.randn(3, 10, 64, dtype=torch.bfloat16)
    before = block(x)
    state = {k: v.clone() for k, v in block.state_dict().items()}
    originals = {n: m for n, m in block.named_modules() if isinstance(m, torch.nn.Linear)}
    swap = LinearsSwap(Fp8LinearConfig("rowwise"), CPU, keep=KEEP)
    assert swap.numerics_only and swap.name == "fp8-linears-rowwise"
    with swap.applied(block) as inst:
        rec = inst.record()["linears"]
        assert sorted(rec["swapped"]) == ["attn.to_out.0", "attn.to_q", "ff.0", "ff.2"]
        assert rec["kept"]["norm1.linear"] == "modulation"
        assert "not a multiple of 16" in rec["kept"]["odd"] and "float32" in rec["kept"]["fp32"]
        assert rec["numerics_only"] and "emulation" in rec["path"]
        assert 0 < rec["swapped_weight_share"] < 1
        for name in rec["swapped"]:
            assert isinstance(block.get_submodule(name), EmulatedFp8Linear)
        for name in rec["kept"]:
            assert block.get_submodule(name) is originals[name]
        during = block(x)
        assert not torch.equal(during, before)
        assert _rel_rms(during, before.double()) < 0.05
    for name, m in originals.items():
        assert block.get_submodule(name) is m
    assert all(torch.equal(v, state[k]) for k, v in block.state_dict().items())
    assert torch.equal(block(x), before)


def test_install_failing_half_way_puts_everything_back(monkeypatch):
    block = _Block()
    originals = {n: m for n, m in block.named_modules() if isinstance(m, torch.nn.Linear)}
    calls = []

    def flaky(linear, config):
        calls.append(linear)
        if len(calls) == 3:
            raise RuntimeError("boom")
        return EmulatedFp8Linear(linear, config)

    monkeypatch.setattr(fp8_linear, "EmulatedFp8Linear", flaky)
    with pytest.raises(RuntimeError, match="boom"):
        LinearsSwap(Fp8LinearConfig("tensorwise"), CPU).install(block)
    assert len(calls) == 3
    assert all(block.get_submodule(n) is m for n, m in originals.items())


def test_fp8_gpu_without_torchao_is_one_line(monkeypatch):
    monkeypatch.setattr(linears_mod.fp8_linear, "fp8_tensor_cores", lambda device: True)
    monkeypatch.setattr(linears_mod.fp8_linear, "torchao_version", lambda: None)
    monkeypatch.setattr(LinearsSwap, "_device_name", lambda self: "a GPU")
    with pytest.raises(DitprofError, match=r"needs torchao==0\.18\.0") as exc:
        LinearsSwap(Fp8LinearConfig("rowwise"), torch.device("cuda"))
    assert "\n" not in str(exc.value)


def test_bad_granularity_is_one_line():
    with pytest.raises(DitprofError, match="granularity 'blockwise' is not one of: rowwise, tensorwise"):
        Fp8LinearConfig("blockwise")


def test_families_name_their_modulation_projections():
    """Each pattern a family keeps names a linear of that family's block (a typo would keep nothing)."""
    from ditprof.model_blocks import get_preset
    from ditprof.model_blocks.families import get_family
    from ditprof.model_blocks.presets import block_on_meta

    checked = 0
    for preset in ("h3", "flux.1-dev", "hunyuan-video", "hunyuan-video-1.5", "cogvideox-5b", "qwen-image"):
        p = get_preset(preset)
        fam = get_family(p.family)
        assert fam.fp8_keep_linears, preset
        names = set()
        for kind in fam.kinds:
            names |= {n for n, m in block_on_meta(fam, p.config, kind.name).named_modules()
                      if isinstance(m, torch.nn.Linear)}
        for pattern, why in fam.fp8_keep_linears:
            assert pattern in names, (preset, pattern)
            assert why
            checked += 1
    assert checked >= 12


def test_compare_with_fp8_linears_on_cpu(one_thread, tmp_path, capsys):
    """``compare --linears rowwise``: the swapped run has FP8 attention and FP8 linears (emulated, numerics only),
    the report lists them, the output is close to the baseline's and the report is valid."""
    jsonschema = pytest.importorskip("jsonschema")
    from ditprof.harness.report.document import SCHEMA  # noqa: F401
    from importlib import resources

    out = tmp_path / "run"
    assert cli.main(["compare", "--preset", "flux-tiny", "--device", "cpu", "--out", str(out), "--iters", "2",
                     "--warmup", "1", "--linears", "rowwise"]) == 0
    rep = json.loads((out / "report.json").read_text())
    schema = json.loads(resources.files("ditprof.harness.report").joinpath("report.schema.json").read_text())
    jsonschema.validate(rep, schema, cls=jsonschema.Draft202012Validator)
    base, sw = rep["baseline"], rep["swapped"]
    assert "linears" not in base and base["configuration"] == "sdpa" and not base["numerics_only"]
    lin = sw["linears"]
    assert sw["configuration"] == "fp8-emulated + fp8-linears-rowwise" and sw["numerics_only"]
    assert lin["swapped"] and lin["numerics_only"]
    assert {"norm1.linear", "norm1_context.linear"} <= set(lin["kept"]) or "norm.linear" in lin["kept"]
    assert rep["noise"]["numerics_only"]
    assert 0 < rep["accuracy"]["block_output_rel_rms"] < 0.1 and rep["accuracy"]["block_output_cosine"] > 0.99
    md = (out / "report.md").read_text()
    assert "## FP8 linears — swapped" in md and "kept bf16" in md
    assert "linears kept bf16 (swapped)" in capsys.readouterr().out


def test_profile_of_a_block_torchao_cannot_take_keeps_bf16_and_says_why(one_thread, tmp_path, capsys):
    """wan-tiny's linears are 24 wide: torchao takes none; the run keeps them bf16 and names each with the reason."""
    out = tmp_path / "run"
    assert cli.main(["profile", "--preset", "wan-tiny", "--device", "cpu", "--out", str(out), "--iters", "1",
                     "--warmup", "0", "--linears", "tensorwise"]) == 0
    rep = json.loads((out / "report.json").read_text())
    lin = rep["baseline"]["linears"]
    assert rep["baseline"]["configuration"] == "sdpa + fp8-linears-tensorwise"
    assert lin["granularity"] == "tensorwise" and lin["swapped"] == [] and lin["swapped_weight_share"] == 0
    assert len(lin["kept"]) == 10 and all("not a multiple of 16" in why for why in lin["kept"].values())
    printed = " ".join(capsys.readouterr().out.split())
    assert "no linear of this block runs in FP8" in printed and "ffn.net.2 (out_features 24" in printed


def test_linears_with_sp_is_one_line(tmp_path, capsys):
    rc = cli.main(["compare", "--preset", "wan-tiny", "--device", "cpu", "--sp", "2", "--linears", "rowwise",
                   "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and len(err) == 1 and "--linears with --sp" in err[0]
    assert not (tmp_path / "x").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("granularity", ["rowwise", "tensorwise"])
def test_torchao_linear_on_gpu_matches_the_emulation(granularity):
    """On an FP8 GPU: torchao's float8 linear, poisoned output buffer aside, agrees with the emulation to the
    summation order (the same e4m3 operands and scales), and both are FP8-accurate against float64."""
    pytest.importorskip("torchao")
    dev = torch.device("cuda")
    if not fp8_linear.fp8_tensor_cores(dev):
        pytest.skip("no FP8 tensor cores")
    g = torch.Generator(device=dev).manual_seed(5)
    lin = torch.nn.Linear(1024, 3072, device=dev, dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(3072, 1024, generator=g, device=dev) * 0.03)
    x = torch.randn(2, 777, 1024, generator=g, device=dev).to(torch.bfloat16)
    ref = x.double() @ lin.weight.double().t() + lin.bias.double()
    weight_before = lin.weight.detach().clone()
    real = fp8_linear.torchao_linear(lin, Fp8LinearConfig(granularity))
    assert torch.equal(lin.weight, weight_before)  # the original is untouched
    out = real(x)
    emu = EmulatedFp8Linear(copy.deepcopy(lin), Fp8LinearConfig(granularity))(x)
    assert torch.isfinite(out).all()
    assert _rel_rms(out, emu.double()) < 4e-3
    assert _rel_rms(out, ref) < 0.05 and abs(_rel_rms(out, ref) - _rel_rms(emu, ref)) < 2e-3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_each_linear_compiled_gives_torchaos_numbers_and_undoes():
    """compile_each: the swapped linears are compiled torchao linears, as accurate against float64 as the eager
    torchao ones, and undo restores the block. Not held equal to them: inductor fuses the activation quantization
    into the code around it and need not round the same way, so e4m3 codes may differ and both are measured
    against float64."""
    pytest.importorskip("torchao")
    dev = torch.device("cuda")
    if not fp8_linear.fp8_tensor_cores(dev):
        pytest.skip("no FP8 tensor cores")
    torch.manual_seed(6)
    block = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512)).to(
        dev, torch.bfloat16)
    x = torch.randn(300, 512, device=dev, dtype=torch.bfloat16)
    originals = list(block)
    outs = {}
    for each in (False, True):
        swap = LinearsSwap(Fp8LinearConfig("rowwise"), dev, compile_each=each)
        with torch.no_grad(), swap.applied(block) as inst:
            rec = inst.record()["linears"]
            assert rec["swapped"] == ["0", "2"] and ("compiled" in rec["execution"]) == each
            y = torch.full((300, 512), float("nan"), device=dev, dtype=torch.bfloat16)
            y.copy_(block(x))
            outs[each] = y
        assert all(a is b for a, b in zip(block, originals))
    with torch.no_grad():
        ref = copy.deepcopy(block).double()(x.double())
    errs = {each: _rel_rms(outs[each], ref) for each in outs}
    assert torch.isfinite(outs[True]).all()
    assert errs[True] < 0.08 and errs[True] < errs[False] + 5e-3, errs  # two e4m3 linears and a GELU (one linear above: < 0.05)


def test_linears_flags_reach_the_swap():
    """--linears G picks the granularity; eager runs compile each FP8 linear unless --linears-eager; --compile runs
    never do (the block's compile fuses the quantization itself). On the CPU the swap is the emulation: no compile."""
    import argparse

    from ditprof.harness.cli import commands
    from ditprof.harness.run.runner import linears_swap, spec_from_args

    parser = argparse.ArgumentParser()
    commands.register(parser.add_subparsers())
    base = ["compare", "--preset", "flux-tiny", "--device", "cpu", "--linears", "tensorwise"]
    cases = {(): True, ("--linears-eager",): False, ("--compile",): True}
    for extra, compile_flag in cases.items():
        spec = spec_from_args(parser.parse_args(base + list(extra)), "compare")
        assert spec.linears == "tensorwise" and spec.linears_compile is compile_flag
        (swap,) = linears_swap(spec, None)
        assert swap.config.granularity == "tensorwise" and swap.compile_each is False  # emulated on the CPU
    assert spec_from_args(parser.parse_args(base[:-2]), "compare").linears is None
    assert linears_swap(spec_from_args(parser.parse_args(base[:-2]), "compare"), None) == []


def test_compiled_alone_keeps_one_cache_per_linear():
    """CompiledAlone: twelve linears of distinct shapes, each compiled fullgraph alone, all run -- one shared
    code object (torch.compile(module)) would hit dynamo's recompile limit (8) and fail -- and each gives its
    linear's output; the caches are per instance, so a second set of the same shapes compiles again cleanly."""
    from ditprof.harness.swaps.linears import CompiledAlone

    torch._dynamo.reset()
    torch.manual_seed(3)
    for round_ in range(2):
        for i in range(12):
            lin = torch.nn.Linear(16 + i, 8 + i)
            x = torch.randn(5, 16 + i)
            alone = CompiledAlone(lin, f"l{round_}_{i}", backend="eager")
            assert alone.weight is lin.weight and alone.bias is lin.bias
            torch.testing.assert_close(alone(x), lin(x), rtol=0, atol=0)
