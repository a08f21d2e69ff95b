"""CUDA-graph replay timing (``session.time_block_graph``): the host overhead per block call.

CPU (CI): the option and the report's fields/rows. GPU (marked ``gpu``): a capturable block is timed and its
replay output equals the eager output; a block with a host sync is reported as not capturable and the run goes
on (the CUDA context is not left broken); the fp8 swap (Triton prep + CuTe-DSL kernel) captures; a whole
``compare`` run reports both lines.
"""

import argparse
import json

import pytest
import torch

from ditprof.harness.cli import commands

from ditprof.harness.report import document
from ditprof.harness.report import summary as report
from ditprof.harness.run import session as S
from ditprof.harness.run.runner import execute, spec_from_args


def _spec(*argv):
    parser = argparse.ArgumentParser()
    commands.register(parser.add_subparsers())
    return spec_from_args(parser.parse_args(list(argv)), argv[0])


def test_cuda_graph_option_default_and_off():
    assert _spec("compare", "--device", "cpu").cuda_graph is True
    assert _spec("compare", "--device", "cpu", "--no-cuda-graph").cuda_graph is False


def test_graph_timing_is_off_on_cpu(tmp_path):
    x = torch.randn(64, 64)
    run = S.measure(lambda: x @ x, label="baseline", backend="t", device=torch.device("cpu"), workdir=tmp_path,
                    warmup=1, iters=2)
    assert run.graph_samples_ms is None and run.graph_block_ms is None and run.graph_note == "off"
    sec = document.run_section(run)
    assert sec["graph_block_ms"] is None and sec["graph_note"] == "off"
    samples, note, out = S.time_block_graph(lambda: x @ x, torch.device("cpu"), 2)
    assert samples is None and out is None and "CPU" in note


def _report(b_graph, s_graph, s_note=""):
    def sec(label, g, note):
        return {"label": label, "attention_backend": label, "block_ms": {"median": 10.0, "min": 9.0, "max": 11.0},
                "timing_source": "cuda_events", "profiled_block_ms": 10.1, "profiler_overhead_pct": 1.0,
                "split_mode": "cuda", "split_ms": {"attention": 4.0}, "split_total_ms": 9.0, "attention_share": 0.4,
                "peak_memory_bytes": 1 << 30, "graph_block_ms": g, "graph_note": note}

    ex = {"n_blocks": 2, "steps": 1, "cfg": False, "baseline_band_ms": {"median": 20.0, "min": 18.0, "max": 22.0},
          "swapped_band_ms": None, "speedup": None}
    return {"baseline": sec("sdpa", b_graph, "cuda_graph"), "swapped": sec("fp8", s_graph, s_note),
            "extrapolation": ex, "accuracy": None}


def test_report_rows_show_replay_and_host_overhead():
    rows = {r[0]: r for r in report.summary_rows(_report({"median": 6.0, "min": 5.5, "max": 7.0},
                                                          {"median": 4.0, "min": 3.9, "max": 4.2}))}
    replay = rows["block (CUDA graph replay) median [min–max]"]
    assert replay[1].startswith("6.0") and replay[2].startswith("4.0") and replay[3] == "1.50x"
    host = rows["host overhead per call (eager − replay)"]
    assert host[1].startswith("4.0") and host[2].startswith("6.0")  # 10 - 6, 10 - 4
    rows = {r[0]: r for r in report.summary_rows(_report({"median": 6.0, "min": 5.5, "max": 7.0}, None,
                                                          "not capturable: RuntimeError: x"))}
    assert "not capturable" in rows["block (CUDA graph replay) median [min–max]"][2]
    # no graph data at all (CPU, --no-cuda-graph): no rows
    assert not any("graph" in r[0] for r in report.summary_rows(_report(None, None, "off")))
    # a GPU-bound block whose replays ran a little slower than the eager calls: marked as noise
    rows = {r[0]: r for r in report.summary_rows(_report({"median": 10.5, "min": 10.0, "max": 11.0},
                                                          {"median": 4.0, "min": 3.9, "max": 4.2}))}
    assert "GPU-bound" in rows["host overhead per call (eager − replay)"][1]
    assert "GPU-bound" not in rows["host overhead per call (eager − replay)"][2]


# ---------------------------------------------------------------------------------------------------- GPU

def _need_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.mark.gpu
def test_graph_replay_matches_eager_and_is_timed():
    _need_cuda()
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 4, 512, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))

    def block():
        return torch.nn.functional.scaled_dot_product_attention(q, k, v) * 2.0 + 1.0

    eager = block().cpu()
    samples, note, out = S.time_block_graph(block, torch.device("cuda"), 5)
    assert note == "cuda_graph" and len(samples) == 5 and all(t > 0 for t in samples)
    assert torch.equal(out, eager)


@pytest.mark.gpu
def test_uncapturable_block_is_reported_and_the_context_survives(tmp_path):
    _need_cuda()
    x = torch.randn(256, 256, device="cuda")

    def host_sync_block():
        y = x @ x
        if y.sum().item() > 1e30:  # a CPU branch on GPU data: a sync, not allowed while capturing
            y = y * 0
        return y

    run = S.measure(host_sync_block, label="baseline", backend="t", device=torch.device("cuda"), workdir=tmp_path,
                    warmup=1, iters=2)
    assert run.graph_samples_ms is None and run.graph_note.startswith("not capturable"), run.graph_note
    assert run.samples_ms and run.split.total_ms > 0  # eager timing and the profiled window still ran
    samples, note, _ = S.time_block_graph(lambda: x @ x, torch.device("cuda"), 2)  # capture works again
    assert samples is not None, note


@pytest.mark.gpu
def test_fp8_attention_captures():
    _need_cuda()
    from ditprof.kernels.interface import fp8_attention

    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(1, 1000, 2, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    eager = fp8_attention(q, k, v).cpu()
    samples, note, out = S.time_block_graph(lambda: fp8_attention(q, k, v), torch.device("cuda"), 3)
    assert samples is not None, note
    assert torch.equal(out, eager)


@pytest.mark.gpu
def test_compare_reports_graph_replay(tmp_path):
    _need_cuda()
    out = tmp_path / "run"
    spec = _spec("compare", "--preset", "h3-mini", "--device", "cuda", "--iters", "3", "--warmup", "1",
                 "--attention", "fp8", "--out", str(out))
    rep, folder = execute(spec)
    for label in ("baseline", "swapped"):
        sec = rep[label]
        assert sec["graph_block_ms"] is not None, sec["graph_note"]
        assert sec["graph_block_ms"]["median"] > 0 and len(sec["graph_samples_ms"]) == 3
    saved = json.loads((folder / "report.json").read_text())
    assert saved["swapped"]["graph_note"].startswith("cuda_graph")
    assert "CUDA graph replay" in (folder / "report.md").read_text()
