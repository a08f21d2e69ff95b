"""HTA's analyses give the right answers on ditprof's traces: a GPU trace recorded on the H200 (checked in, so CI
on a CPU machine runs the GPU analyses) and, on a GPU machine, a fresh run."""

from __future__ import annotations

from pathlib import Path

import pytest

from hta_checks import check_hta

RECORDED = Path(__file__).parent / "data" / "hta"


@pytest.mark.skipif(not any(RECORDED.glob("*/*.pt.trace.json.gz")), reason="no recorded GPU trace")
def test_hta_on_a_recorded_gpu_trace():
    pytest.importorskip("hta.trace_analysis")
    for folder in sorted(p for p in RECORDED.iterdir() if p.is_dir()):
        out = check_hta(folder)
        assert out["by_kernel_rows"] >= 1


@pytest.mark.gpu
def test_hta_on_a_fresh_gpu_run(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("hta.trace_analysis")
    from ditprof.cli import main

    out = tmp_path / "run"
    assert main(["compare", "--preset", "h3-mini", "--tokens", "1024", "--device", "cuda", "--iters", "3", "--warmup", "1",
                 "--no-cuda-graph", "--out", str(out)]) == 0
    for run in ("baseline", "swapped"):
        check_hta(out / "tb" / run)
