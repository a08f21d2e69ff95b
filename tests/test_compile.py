"""``--compile``: torch.compile of the block, its compile line, the split of a compiled trace (inductor kernels by
the ops they are named after, ``fused`` when those mix categories) and one-line errors when compiling fails."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import jsonschema
import pytest
import torch

from ditprof import cli
from ditprof.harness.trace import categories as C
from ditprof.harness.trace.inductor_kernels import FUSED, compiled_kernel_category, kernel_ops

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "ditprof/harness/report/report.schema.json").read_text())
PRESET = "h3-mini"  # the CPU default preset; 256 rows keep the compiled run to seconds
SMALL = ["--preset", PRESET, "--device", "cpu", "--tokens", "256", "--iters", "2", "--warmup", "1"]
# CPU inductor compiles C++ with $CXX (default g++)
COMPILER = shutil.which(os.environ.get("CXX", "g++"))
needs_compiler = pytest.mark.skipif(COMPILER is None, reason="no C++ compiler (g++ or $CXX): CPU inductor cannot "
                                                             "build kernels here")


# --------------------------------------------------------------------------- the kernel-name rule

@pytest.mark.parametrize("name, ops, category", [
    ("triton_poi_fused_add_mul_0", ("add", "mul"), "elementwise"),
    ("triton_per_fused_native_layer_norm_2", ("native_layer_norm",), "norm"),
    ("triton_red_fused__to_copy_native_layer_norm_3", ("_to_copy", "native_layer_norm"), "norm"),  # a cast: no say
    ("triton_tem_fused_addmm_0", ("addmm",), "gemm"),
    ("triton_poi_fused__scaled_dot_product_efficient_attention_1", ("_scaled_dot_product_efficient_attention",),
     "attention"),
    ("triton_poi_fused__to_copy_view_0", ("_to_copy", "view"), "elementwise"),  # only a copy: as eager's copies
    # a decomposed RMS norm (diffusers' RMSNorm) owns its pow / add / mul
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1", ("_to_copy", "add", "mean", "mul", "pow", "rsqrt"), "norm"),
    # mixed: norm + modulation, a GEMM template with a GELU epilogue, RoPE fused into the SDPA input copy
    ("graph_0_cpp_fused__to_copy_add_mul_native_layer_norm_split_0",
     ("_to_copy", "add", "mul", "native_layer_norm", "split"), FUSED),
    ("triton_tem_fused_addmm_gelu_1", ("addmm", "gelu"), FUSED),
    ("cpp_fused__scaled_dot_product_flash_attention_for_cpu_cat_mul_sub_4",
     ("_scaled_dot_product_flash_attention_for_cpu", "cat", "mul", "sub"), FUSED),
    ("triton_red_fused_add_mean_mul_pow_rsqrt_sub_2", ("add", "mean", "mul", "pow", "rsqrt", "sub"), FUSED),
    ("triton_poi_fused_0", (), "other"),  # no op names: nothing to go by
    ("triton_poi_fused_frobnicate_0", ("frobnicate",), "other"),  # an op of no known category
])
def test_compiled_kernel_category(name, ops, category):
    assert kernel_ops(name) == ops
    assert compiled_kernel_category(name) == category


def test_names_inductor_did_not_generate():
    assert kernel_ops("aten::add") is None and kernel_ops("_prep_stats_kernel") is None
    assert kernel_ops("ampere_bf16_s16816gemm_bf16_128x64") is None


def test_compiled_stacks():
    region = ["ditprof::block", "Torch-Compiled Region: 0/0", "## Call CompiledFxGraph abc ##"]
    assert C.category_for_stack(region + ["triton_poi_fused_add_mul_native_layer_norm_0", "cuLaunchKernelEx"]) \
        == FUSED
    assert C.category_for_stack(region + ["aten::addmm", "cudaLaunchKernel"]) == "gemm"  # an extern GEMM
    assert C.category_for_stack(region + ["aten::_scaled_dot_product_flash_attention", "cudaLaunchKernel"]) \
        == "attention"
    # our op, with its own Triton prep launched inside it: attention, whatever runs inside
    assert C.category_for_stack(region + ["ditprof::fp8_attention", "_prep_stats_kernel", "cuLaunchKernel"]) \
        == "attention"
    # eager stacks keep the eager rules: an SDPA op outside the ditprof::attention range is no attention there
    assert C.category_for_stack(["ditprof::block", "aten::_scaled_dot_product_flash_attention"]) == "other"


def _ev(name, ts, dur, cat="cpu_op", **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1, "args": args}


def _compiled_cpu_trace() -> dict:
    """Two block calls as CPU inductor's profiled code looks: runtime ranges around C++ kernels and extern ops."""
    events = []
    for t in (0.0, 1000.0):
        events += [
            _ev("ditprof::block", t, 900.0, cat="user_annotation"),
            _ev("TorchDynamo Cache Lookup", t + 1, 50.0),
            _ev("Torch-Compiled Region: 0/0", t + 60, 800.0),
            _ev("## Call CompiledFxGraph abc ##", t + 70, 780.0),
            _ev("graph_0_cpp_fused__to_copy_add_mul_native_layer_norm_0", t + 80, 100.0),
            _ev("aten::addmm", t + 200, 200.0),
            _ev("aten::_scaled_dot_product_flash_attention_for_cpu", t + 420, 300.0),
            _ev("graph_0_cpp_fused_gelu_1", t + 730, 50.0),
        ]
    return {"traceEvents": events}


def test_split_of_a_compiled_cpu_trace():
    s = C.split_trace(_compiled_cpu_trace(), mode="cpu")
    assert s.compiled and set(s.split_ms) == set(C.CATEGORIES) | {FUSED}
    ms = s.split_ms
    assert (ms["attention"], ms["gemm"], ms["fused"], ms["elementwise"]) == \
        pytest.approx((0.3, 0.2, 0.1, 0.05))
    # the runtime's guards and wrappers are host overhead, left out as eager's Python time is
    assert ms["other"] == 0.0 and s.total_ms == pytest.approx(0.65)
    assert s.attention_share == pytest.approx(0.3 / 0.65)


def test_eager_splits_have_no_fused_key():
    trace = {"traceEvents": [_ev("ditprof::block", 0, 100, cat="user_annotation"), _ev("aten::add", 1, 10)]}
    s = C.split_trace(trace, mode="cpu")
    assert not s.compiled and set(s.split_ms) == set(C.CATEGORIES)


# --------------------------------------------------------------------------- end to end on the CPU

@pytest.fixture(scope="module")
def compiled_profile(tmp_path_factory):
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # the CI box's 2 shared cores: oversubscribed OpenMP makes timings meaningless
    try:
        out = tmp_path_factory.mktemp("compiled") / "run"
        assert cli.main(["profile", *SMALL, "--compile", "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(n)
    return out, json.loads((out / "report.json").read_text())


@needs_compiler
def test_profile_compile_end_to_end(compiled_profile):
    out, rep = compiled_profile
    jsonschema.validate(rep, SCHEMA, cls=jsonschema.Draft202012Validator)
    assert rep["settings"]["execution"] == "compile:default"
    sec = rep["baseline"]
    c = sec["compile"]
    assert c["mode"] == "default" and c["fullgraph"] is True
    assert c["first_call_s"] > 0 and c["graphs"] >= 1 and c["recompiles"] >= 0 and c["warmup_calls"] >= 2
    assert set(sec["split_ms"]) == set(C.CATEGORIES) | {FUSED}
    assert all(v >= 0 for v in sec["split_ms"].values())
    assert sum(sec["split_ms"].values()) == pytest.approx(sec["split_total_ms"], rel=1e-9)
    assert 0 < sec["attention_share"] < 1  # SDPA found by its op name inside the compiled graph
    assert sec["split_ms"]["gemm"] > 0  # extern GEMMs keep their aten op
    # the inductor kernels were seen (named ranges: cpp.enable_kernel_profile) and not left to "other"
    kernels = [r for r in sec["top_ops"] if "cpp_fused" in r["op"]]
    assert kernels and all(r["category"] != "other" for r in kernels)
    md = (out / "report.md").read_text()
    assert "compile:default" in md and "compile: first call" in md
    with gzip.open(out / "baseline.trace.json.gz", "rt") as f:
        names = {e.get("name", "") for e in json.load(f)["traceEvents"]}
    assert any(n.startswith("Torch-Compiled Region") for n in names)


@needs_compiler
def test_legacy_processor_block_compiles_swapped(tmp_path):
    """CogVideoX's processor calls F.scaled_dot_product_attention itself; the swap routes that call through a
    plain object torch.compile traces, so baseline and swap both compile with fullgraph and the swap is used."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = tmp_path / "cog"
        argv = ["compare", "--preset", "cogvideox-tiny", "--device", "cpu", "--iters", "2", "--warmup", "1",
                "--compile", "--out", str(out)]
        assert cli.main(argv) == 0
    finally:
        torch.set_num_threads(n)
    rep = json.loads((out / "report.json").read_text())
    for run in ("baseline", "swapped"):
        assert rep[run]["compile"]["fullgraph"] is True and rep[run]["attention_share"] > 0, run
    assert rep["swapped"]["route"] == "processor"
    assert 0 < rep["accuracy"]["block_output_rel_rms"] < 0.05  # the emulated FP8 attention ran, not SDPA


# --------------------------------------------------------------------------- bad input: one line, no folder

def _one_line_error(capsys, argv, out: Path) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ditprof: error: "), err
    assert not out.exists()  # nothing written, nothing staged beside it
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]
    return err[0]


def test_failing_compile_is_one_line_and_no_eager_fallback(tmp_path, capsys, monkeypatch):
    def broken(model, **kwargs):
        def call(*args, **kw):
            raise RuntimeError("InvalidCxxCompiler: No working C compiler detected\nmore detail")
        return call

    monkeypatch.setattr(torch, "compile", broken)
    out = tmp_path / "run"
    line = _one_line_error(capsys, ["profile", *SMALL, "--compile", "--out", str(out)], out)
    assert "--compile default: torch.compile of the block with sdpa attention failed" in line
    assert "No working C compiler" in line


def test_graph_break_is_an_error_naming_it(tmp_path, capsys, monkeypatch):
    from ditprof.kernels import registry

    def breaking(q, k, v, *, scale=None):
        torch._dynamo.graph_break()
        return torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=scale).transpose(1, 2)

    registry.all_backends()  # the built-ins first: the test entry must not be replaced by their import
    monkeypatch.setitem(registry._BACKENDS, "test-graph-break",
                        registry.Backend("test-graph-break", breaking, "breaks the graph", lambda d: (True, "")))
    out = tmp_path / "run"
    line = _one_line_error(capsys, ["profile", *SMALL, "--attention", "test-graph-break", "--compile",
                                    "--out", str(out)], out)
    assert "graph break (fullgraph=True)" in line and "test_compile.py" in line


def test_compile_with_sp_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    line = _one_line_error(capsys, ["compare", *SMALL, "--compile", "--sp", "2", "--out", str(out)], out)
    assert "--compile does not run with --sp" in line
