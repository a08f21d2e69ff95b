"""How close to the limit: the peak table by device name, bytes from a trace's recorded shapes, the rates and
shares of a run section, and a real CPU run's ``limits`` against the report schema."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jsonschema
import pytest

from ditprof.cli import main
from ditprof.harness.report import limits, summary
from ditprof.harness.trace.op_bytes import category_bytes, op_bytes

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "ditprof/harness/report/report.schema.json").read_text())
PLAN = {"attention_flops": 4 * 10 ** 12, "gemm_flops": 6 * 10 ** 12, "matmul_flops_per_s": 5e14,
        "copy_bytes_per_s": 2e12}


@pytest.mark.parametrize("name", ["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H200", "NVIDIA L40S",
                                  "NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 5090", "NVIDIA A100-SXM4-80GB",
                                  "NVIDIA RTX 6000 Ada Generation"])
def test_every_named_device_is_in_the_table_with_its_source(name):
    p = limits.peaks_for(name)
    assert p is not None and p.name == name and "NVIDIA" in p.source
    assert limits.peaks_for(f"  {name.upper()} ") is p  # case and spacing as a driver may print them
    for v in (p.bf16_tflops, p.fp8_tflops, p.memory_gbs):
        assert v is None or v > 0


def test_unknown_device_and_cpu_have_no_entry():
    assert limits.peaks_for("NVIDIA Imaginary 9000") is None
    assert limits.peaks_for(None) is None
    assert limits.peaks_for("") is None


def _section(split_ms, **extra):
    return {"label": "baseline", "attention_backend": "sdpa", "split_ms": split_ms, **extra}


def test_rates_and_shares_against_the_datasheet_peak():
    sec = _section({"attention": 8.0, "gemm": 12.0, "norm": 1.0, "elementwise": 2.0},
                   split_bytes={"bytes": {"norm": 3e9, "elementwise": 5e9}, "note": ""})
    got = limits.run_limits(sec, PLAN, "NVIDIA H100 80GB HBM3", "bfloat16")
    h100 = limits.peaks_for("NVIDIA H100 80GB HBM3")
    att = got["attention"]
    assert att["rate"] == pytest.approx(PLAN["attention_flops"] / 8e-3 / 1e12)
    assert (att["precision"], att["peak"], att["peak_kind"]) == ("bf16", h100.bf16_tflops, "datasheet")
    assert att["share_of_peak"] == pytest.approx(att["rate"] / h100.bf16_tflops)
    assert got["gemm"]["rate"] == pytest.approx(PLAN["gemm_flops"] / 12e-3 / 1e12)
    norm = got["norm"]
    assert (norm["unit"], norm["peak"], norm["peak_kind"]) == ("GB/s", h100.memory_gbs, "datasheet")
    assert norm["rate"] == pytest.approx(3e9 / 1e-3 / 1e9)
    assert got["elementwise"]["share_of_peak"] == pytest.approx(5e9 / 2e-3 / 1e9 / h100.memory_gbs)


def test_fp8_attention_and_fp8_linears_compare_with_the_fp8_peak():
    sec = _section({"attention": 4.0, "gemm": 6.0, "norm": 0.0, "elementwise": 0.0}, attention_backend="fp8",
                   qk_format="int8", linears={"swapped": ["ff.proj"], "numerics_only": False,
                                              "swapped_weight_share": 0.5})
    got = limits.run_limits(sec, PLAN, "NVIDIA H200", "bfloat16")
    fp8 = limits.peaks_for("NVIDIA H200").fp8_tflops
    for cat in ("attention", "gemm"):
        assert (got[cat]["precision"], got[cat]["peak"]) == ("fp8", fp8)
    assert "50% of the linears' weights in FP8" in got["gemm"]["note"]
    assert got["norm"]["rate"] is None and "bytes unknown" in got["norm"]["note"]  # no split_bytes at all
    # no linears section: the GEMMs ran in the run's dtype
    plain = limits.run_limits(_section({"attention": 4.0, "gemm": 6.0}), PLAN, "NVIDIA H200", "float16")
    assert plain["gemm"]["precision"] == "fp16" and plain["gemm"]["peak"] == limits.peaks_for("NVIDIA H200").bf16_tflops


def test_unknown_device_or_missing_figure_falls_back_to_the_measured_rates():
    sec = _section({"attention": 4.0, "gemm": 6.0, "norm": 1.0, "elementwise": 1.0},
                   split_bytes={"bytes": {"norm": 1e9, "elementwise": 1e9}, "note": ""}, qk_format="e4m3")
    for name in (None, "NVIDIA Imaginary 9000", "NVIDIA A100-SXM4-80GB"):  # A100: no FP8 figure
        att = limits.run_limits(sec, PLAN, name, "bfloat16")["attention"]
        assert att["peak_kind"] == "measured" and att["peak_source"].startswith("measured matmul rate")
        assert att["peak"] == pytest.approx(PLAN["matmul_flops_per_s"] / 1e12)
    norm = limits.run_limits(sec, PLAN, None, "bfloat16")["norm"]
    assert norm["peak_source"].startswith("measured copy rate") and norm["peak"] == pytest.approx(2000.0)
    # the A100 has a memory figure: its datasheet, not the measured copy
    assert limits.run_limits(sec, PLAN, "NVIDIA A100-SXM4-80GB", "bfloat16")["norm"]["peak_kind"] == "datasheet"


def test_numerics_only_attention_and_linears_get_a_rate_but_no_share():
    sec = _section({"attention": 40.0, "gemm": 60.0}, attention_backend="fp8-emulated", qk_format="e4m3",
                   linears={"swapped": ["ff.proj"], "numerics_only": True, "swapped_weight_share": 1.0})
    got = limits.run_limits(sec, PLAN, None, "bfloat16")
    for cat in ("attention", "gemm"):
        assert got[cat]["rate"] > 0 and got[cat]["share_of_peak"] is None
        assert got[cat]["note"].startswith("numerics only")
    row = next(r for r in summary.limit_rows({"baseline": {**sec, "limits": got}, "swapped": None})
               if r[1].startswith("attention"))
    assert row[-1] == "n/a (numerics only)"


def test_a_rate_above_the_measured_rate_says_so():
    """The measured rate is the plan's probe, not a ceiling: a share above it is marked, a datasheet share is not."""
    sec = _section({"attention": 4.0, "gemm": 6.0}, qk_format="e4m3")
    for device, marked in ((None, True), ("NVIDIA H100 80GB HBM3", False)):
        got = limits.run_limits(sec, PLAN, device, "bfloat16")
        got["gemm"] = {**got["gemm"], "share_of_peak": 4.25}
        row = next(r for r in summary.limit_rows({"baseline": {**sec, "limits": got}, "swapped": None})
                   if r[1].startswith("gemm"))
        assert row[-1] == "425.0%" + (" (above the measured rate)" if marked else "")


# ----------------------------------------------------------------------------------------- bytes from a trace

def _op(name, ts, dur, dims, types, strides=None, tid=1):
    strides = strides or [[*(math.prod(d[i + 1:]) for i in range(len(d)))] if isinstance(d, list) and d
                          and isinstance(d[0], int) else [] for d in dims]
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid,
            "args": {"Input Dims": dims, "Input type": types, "Input Strides": strides}}


def _range(name, ts, dur):
    return {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1,
            "args": {}}


BF = "c10::BFloat16"


def _block_events(t0):
    """One block call: an add with a broadcast bias, a layer_norm over its native op, a cast through copy_, an
    in-place mul, a cat, an op inside the attention range and one inside a linear (neither counts)."""
    return [
        _range("ditprof::block", t0, 100),
        _op("aten::add", t0 + 1, 5, [[4, 8], [8], []], [BF, BF, "Scalar"]),
        _op("aten::layer_norm", t0 + 10, 10, [[4, 8], [], [8], [8]], [BF, "ScalarList", BF, BF]),
        _op("aten::native_layer_norm", t0 + 11, 8, [[4, 8], [], [8], [8]], [BF, "ScalarList", BF, BF]),
        _op("aten::to", t0 + 25, 6, [[4, 8], []], [BF, "Scalar"]),
        _op("aten::_to_copy", t0 + 26, 4, [[4, 8], []], [BF, "Scalar"]),
        _op("aten::empty_strided", t0 + 26.5, 0.5, [[], []], ["ScalarList", "ScalarList"]),
        _op("aten::copy_", t0 + 27.5, 2, [[4, 8], [4, 8], []], ["float", BF, "Scalar"]),
        _op("aten::mul_", t0 + 35, 3, [[4, 8], []], [BF, "Scalar"]),
        _op("aten::cat", t0 + 40, 3, [[[4, 8], [4, 8]], []], ["TensorList", "Scalar"],
            strides=[[[8, 1], [8, 1]], []]),
        _range("ditprof::attention", t0 + 50, 20),
        _op("aten::mul", t0 + 51, 5, [[4, 8], [4, 8]], [BF, BF]),
        _op("aten::linear", t0 + 75, 10, [[4, 8], [8, 8]], [BF, BF]),
        _op("aten::copy_", t0 + 76, 2, [[4, 8], [4, 8], []], [BF, BF, "Scalar"]),
    ]


def test_bytes_from_recorded_shapes():
    trace = {"traceEvents": _block_events(0.0) + _block_events(1000.0)}
    got = category_bytes(trace, list_itemsize=2)
    n = 4 * 8
    add = n * 2 + 8 * 2 + n * 2  # x, the bias (read once), the broadcast output
    cast = n * 2 + n * 4  # copy_: reads the bf16 source, writes the float32 copy
    mul_ = n * 2 + n * 2  # in place: read and write x
    cat = 2 * n * 2 + 2 * n * 2
    assert got.bytes["elementwise"] == pytest.approx(add + cast + mul_ + cat)  # per call: the mean of the two
    assert got.bytes["norm"] == pytest.approx(n * 2 + 8 * 2 + 8 * 2 + n * 2)  # layer_norm once, not its native op
    assert got.ops == {"norm": 1, "elementwise": 4}
    assert op_bytes("gt", [([4, 8], [8, 1], 2), ([], [], 8)]) == n * 2 + 8 + n  # a comparison writes bools
    assert op_bytes("mean", [([4, 8], [8, 1], 4)]) == n * 4  # a reduction: its input


def test_trace_without_shapes_says_bytes_unknown():
    events = _block_events(0.0)
    for ev in events:
        ev["args"] = {}
    got = category_bytes({"traceEvents": events})
    assert got.bytes is None and "no shapes" in got.note
    lim = limits.run_limits(_section({"norm": 1.0, "elementwise": 1.0}, split_bytes=got.to_dict()), PLAN, None,
                            "bfloat16")
    assert lim["norm"]["rate"] is None and lim["norm"]["note"].startswith("bytes unknown")


# ------------------------------------------------------------------------------------------- a real CPU run

def test_cpu_compare_report_has_limits_valid_against_the_schema(one_thread, tmp_path):
    out = tmp_path / "run"
    assert main(["compare", "--preset", "wan-tiny", "--device", "cpu", "--iters", "2", "--warmup", "1",
                 "--out", str(out)]) == 0
    rep = json.loads((out / "report.json").read_text())
    jsonschema.validate(rep, SCHEMA, cls=jsonschema.Draft202012Validator)
    plan = rep["plan"]
    assert plan["copy_bytes_per_s"] > 0
    base, sw = rep["baseline"]["limits"], rep["swapped"]["limits"]
    assert base["attention"]["rate"] == pytest.approx(
        plan["attention_flops"] / (rep["baseline"]["split_ms"]["attention"] / 1e3) / 1e12)
    for e in base.values():  # the CPU: no datasheet, the plan's measured rates
        assert e["peak_kind"] == "measured" and e["share_of_peak"] > 0
    for cat in ("norm", "elementwise"):
        assert rep["baseline"]["split_bytes"]["bytes"][cat] > 0
    assert sw["attention"]["share_of_peak"] is None and sw["attention"]["precision"] == "fp8"
    assert "numerics only" in sw["attention"]["note"]
    md = (out / "report.md").read_text()
    assert "## How close to the limit" in md and "n/a (numerics only)" in md
