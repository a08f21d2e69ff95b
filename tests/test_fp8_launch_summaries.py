"""What a report says about our FP8 kernel's launches (CPU: launch records built by hand, no GPU): each record's
summary (shapes, kernel, Q/K format, grid and the stream-K plan), only the records called since a snapshot, the
report.json schema of the field, and report.md's table and backend cell."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ditprof.harness.report import summary as R
from ditprof.kernels import launch_record as L
from ditprof.kernels.compile_cache import KernelSpec
from ditprof.kernels.launch_graphs import LaunchGraphs

jsonschema = pytest.importorskip("jsonschema")  # a test extra; the GPU host collects this file without it

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "ditprof/harness/report/report.schema.json").read_text())
ITEM = {**SCHEMA["$defs"]["run"]["properties"]["fp8_launches"]["items"], "$defs": SCHEMA.get("$defs", {})}


def _record(shape, sk, qk_int8, streamk, tvm_ffi=True, q_rot=False):
    rec = object.__new__(L.Fp8Launch)  # the fields a summary reads; building one needs a GPU
    rec.out_shape, rec.Sk, rec.dtype, rec.streamk, rec.calls = shape, sk, torch.bfloat16, streamk, 0
    rec.graphs = None  # no graph replays (a test sets its own)
    rec.spec = KernelSpec("fp8-sm90", "sm_90a", shape[3], "bfloat16", True, False, tvm_ffi, qk_int8,
                            streamk=streamk is not None, q_rot=q_rot)
    return rec


@pytest.fixture
def records(monkeypatch):
    recs = {"flux": _record((1, 4608, 24, 128), 4608, True, (528, 48, 132, 29)),
            "h3": _record((1, 30272, 56, 128), 30272, False, None, tvm_ffi=False),
            "cogvideox": _record((1, 17776, 48, 64), 17776, True, None, q_rot=True)}
    monkeypatch.setattr(L, "_RECORDS", dict(recs))
    return recs


def test_summaries_of_the_records_called_since_a_snapshot(records):
    records["h3"].calls = 5  # before the snapshot
    records["flux"].graphs = LaunchGraphs(capture=None)
    records["flux"].graphs.hits = 7  # replays before the snapshot
    before = L.call_counts()
    assert L.launch_summaries(since=before) == []
    records["flux"].calls += 3
    records["flux"].graphs.hits += 2
    records["h3"].calls += 1
    got = {tuple(s["q_shape"]): s for s in L.launch_summaries(since=before)}
    flux, h3 = got[(1, 4608, 24, 128)], got[(1, 30272, 56, 128)]
    assert (flux["calls"], h3["calls"]) == (3, 1)
    assert (flux["graph_replays"], h3["graph_replays"]) == (2, 0)  # h3's record has no graphs
    assert flux["grid"] == "stream-K" and flux["streamk"] == {"n_full": 528, "n_tail": 48, "tail_ctas": 132,
                                                              "key_tiles": 29}
    assert (flux["qk_format"], flux["launch"], flux["kernel"], flux["k_len"]) == ("int8", "tvm_ffi", "fp8-sm90", 4608)
    assert (h3["grid"], h3["streamk"], h3["qk_format"], h3["launch"]) == ("plain", None, "e4m3", "jit")
    assert (flux["q_in_kernel"], h3["q_in_kernel"]) == (False, False)
    assert len(L.launch_summaries()) == 2  # no snapshot: every record called so far
    records["cogvideox"].calls = 2
    cog = {tuple(s["q_shape"]): s for s in L.launch_summaries()}[(1, 17776, 48, 64)]
    assert (cog["q_in_kernel"], cog["grid"], cog["qk_format"]) == (True, "plain", "int8")
    got[(1, 17776, 48, 64)] = cog
    for s in got.values():
        jsonschema.validate(s, ITEM, cls=jsonschema.Draft202012Validator)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**flux, "grid": "split-KV"}, ITEM, cls=jsonschema.Draft202012Validator)


def test_report_shows_the_grid(records):
    assert R.fp8_launch_lines({"baseline": {"label": "baseline"}, "swapped": None}) == []
    records["flux"].calls = 4
    swapped = {"label": "swapped", "attention_backend": "fp8", "qk_format": "int8",
               "fp8_launches": L.launch_summaries()}
    rep = {"environment": {"fp8_qk_format": "int8"}, "swapped": swapped, "baseline": {"label": "baseline"}}
    table = R.fp8_launch_lines(rep)
    assert any("stream-K (528 whole + 48 spread over 132 CTAs)" in row and "| 4 |" in row for row in table)
    swapped["fp8_launches"][0]["graph_replays"] = 3
    table = R.fp8_launch_lines(rep)
    assert any("| tvm_ffi, 3 graph replays | 4 |" in row for row in table)
    assert R.backend_cell(rep, swapped) == "fp8 (Q/K int8, stream-K grid)"
    records["cogvideox"].calls = 1
    table = R.fp8_launch_lines({**rep, "swapped": {**swapped, "fp8_launches": L.launch_summaries()}})
    assert any("(1, 17776, 48, 64)" in row and "int8, Q quantized in the kernel | plain" in row for row in table)
    assert R.backend_cell(rep, {"attention_backend": "sdpa"}) == "sdpa"
