"""`ditprof compare --device cpu` and `ditprof profile` end to end on a tiny preset (CPU, CI)."""

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ditprof import cli
from ditprof.harness.trace.categories import ATTENTION_RANGE, BLOCK_RANGE, CATEGORIES

PRESET = "wan-tiny"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


ACTIVE_BEFORE = {}


@pytest.fixture(scope="module")
def compare_run(one_thread, tmp_path_factory):
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    ACTIVE_BEFORE["backend"] = _AttentionBackendRegistry._active_backend
    out = tmp_path_factory.mktemp("cmp") / "run"
    rc = cli.main(["compare", "--preset", PRESET, "--device", "cpu", "--out", str(out), "--iters", "3",
                   "--warmup", "1", "--steps", "4", "--cfg"])
    assert rc == 0
    return out, json.loads((out / "report.json").read_text())


def test_compare_files(compare_run):
    out, rep = compare_run
    for name in ("report.json", "report.md", "split.png", "baseline.trace.json.gz", "swapped.trace.json.gz"):
        assert (out / name).is_file(), name
    assert (out / "split.png").read_bytes()[:8] == PNG_MAGIC
    assert "ditprof compare" in (out / "report.md").read_text()
    tb = sorted((out / "tb").glob("*/*.pt.trace.json"))
    assert [p.parent.name for p in tb] == ["baseline", "swapped"]
    # nothing half-written or staged next to the run folder
    assert not [p for p in out.parent.iterdir() if p.name != out.name]
    assert not [p for p in out.rglob(".*")]


def test_compare_report_fields(compare_run):
    _, rep = compare_run
    assert rep["schema"] == "ditprof.report/1"
    m = rep["model"]
    for key in ("preset", "checkpoint", "family", "block_index", "n_blocks", "heads", "head_dim", "tokens",
                "block_params", "block_bytes"):
        assert key in m, key
    assert m["preset"] == PRESET and m["family"] == "wan" and m["block_index"] == 0
    assert m["heads"] * m["head_dim"] > 0 and m["tokens"] > 0 and m["block_params"] > 0 and m["block_bytes"] > 0
    env = rep["environment"]
    for key in ("torch", "cuda", "cudnn", "gpu", "nvidia_cutlass_dsl"):
        assert key in env, key
    assert env["torch"] == torch.__version__
    for label, backend in (("baseline", "sdpa"), ("swapped", "fp8-emulated")):
        sec = rep[label]
        assert sec["attention_backend"] == backend
        assert sec["route"] == "dispatcher"
        assert sec["timing_source"] == "host_clock"
        bm = sec["block_ms"]
        assert 0 < bm["min"] <= bm["median"] <= bm["max"]
        assert set(sec["split_ms"]) == set(CATEGORIES)
        assert all(v >= 0 for v in sec["split_ms"].values())
        assert sum(sec["split_ms"].values()) == pytest.approx(sec["split_total_ms"], rel=1e-9)
        assert 0 < sec["attention_share"] < 1
        assert sec["attention_share"] == pytest.approx(sec["split_ms"]["attention"] / sec["split_total_ms"])
        assert sec["peak_memory_bytes"] > 0
        assert 1 <= sec["split_iterations_used"] <= sec["split_iterations"] == rep["settings"]["iters"]
        assert sec["profiled_block_ms"] > 0
    ex = rep["extrapolation"]
    for key in ("n_blocks", "baseline_ms", "swapped_ms", "measured_swapped_block_ms"):
        assert ex[key] is not None, key
    assert ex["n_blocks"] == m["n_blocks"] == 2
    assert ex["factor"] == 2 * 4 * 2
    assert ex["baseline_ms"] == pytest.approx(rep["baseline"]["block_ms"]["median"] * 16)
    assert ex["swapped_ms"] == pytest.approx(rep["swapped"]["block_ms"]["median"] * 16)
    # fp8-emulated is a numerics emulation: its time is no speed, so no ratio is quoted (the summary's "numerics only")
    for key in ("speedup", "attention_speedup", "amdahl_predicted_speedup", "amdahl_predicted_swapped_block_ms"):
        assert ex[key] is None, key
    assert ex["speedup_note"].startswith("numerics only")
    acc = rep["accuracy"]
    assert 0 < acc["block_output_rel_rms"] < 0.1  # fp8 numerics: small but non-zero error
    assert 0.99 < acc["block_output_cosine"] <= 1.0 + 1e-12


def test_compare_traces(compare_run):
    out, rep = compare_run
    for label in ("baseline", "swapped"):
        with gzip.open(out / f"{label}.trace.json.gz", "rt") as f:
            trace = json.load(f)
        names = {e.get("name") for e in trace["traceEvents"]}
        assert ATTENTION_RANGE in names and BLOCK_RANGE in names
        blocks = [e for e in trace["traceEvents"] if e.get("name") == BLOCK_RANGE and e.get("ph") == "X"]
        assert len(blocks) == rep["settings"]["iters"]


def test_diffusers_state_restored(compare_run):
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    assert _AttentionBackendRegistry._active_backend == ACTIVE_BEFORE["backend"]  # no global backend leaked
    assert AttentionBackendName("ditprof_fp8_emulated") in _AttentionBackendRegistry._backends


def test_profile_single_backend(one_thread, tmp_path):
    out = tmp_path / "prof"
    rc = cli.main(["profile", "--preset", PRESET, "--device", "cpu", "--out", str(out), "--iters", "2",
                   "--warmup", "1", "--attention", "sdpa-math", "--tokens", "64", "--blocks", "30"])
    assert rc == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["command"] == "profile" and rep["swapped"] is None and rep["accuracy"] is None
    assert rep["baseline"]["attention_backend"] == "sdpa-math"
    assert rep["model"]["tokens"] == 64
    assert rep["extrapolation"]["n_blocks"] == 30 and rep["extrapolation"]["swapped_ms"] is None
    assert (out / "baseline.trace.json.gz").is_file() and not (out / "swapped.trace.json.gz").exists()
    assert (out / "split.png").read_bytes()[:8] == PNG_MAGIC


def test_compare_says_which_qk_format_the_swap_ran(one_thread, tmp_path, monkeypatch):
    """DITPROF_FP8_QK picks the fp8 backends' Q/K format; the report records it and the table names it."""
    outs = {}
    for fmt in ("e4m3", "int8"):
        monkeypatch.setenv("DITPROF_FP8_QK", fmt)
        out = tmp_path / fmt
        # h3-mini: INT8 needs a power-of-two head_dim (the Hadamard rotation; wan-tiny's is 12)
        assert cli.main(["compare", "--preset", "h3-mini", "--device", "cpu", "--out", str(out), "--iters", "2",
                         "--warmup", "1", "--tokens", "64"]) == 0
        rep = json.loads((out / "report.json").read_text())
        assert rep["environment"]["fp8_qk_format"] == fmt
        assert f"fp8-emulated (Q/K {fmt})" in (out / "report.md").read_text()
        outs[fmt] = rep["accuracy"]["block_output_rel_rms"]
    assert outs["e4m3"] != outs["int8"]  # the swap did run in the other format
    # no format named: INT8 where the rotation applies (h3-mini: head_dim 128), e4m3 elsewhere (wan-tiny: 12)
    monkeypatch.delenv("DITPROF_FP8_QK")
    for preset, fmt in (("h3-mini", "int8"), ("wan-tiny", "e4m3")):
        out = tmp_path / f"default-{preset}"
        assert cli.main(["compare", "--preset", preset, "--device", "cpu", "--out", str(out), "--iters", "2",
                         "--warmup", "1", "--tokens", "64"]) == 0
        rep = json.loads((out / "report.json").read_text())
        assert rep["environment"]["fp8_qk_format"] == fmt, preset
        assert f"fp8-emulated (Q/K {fmt})" in (out / "report.md").read_text()
    assert rep["accuracy"]["block_output_rel_rms"] > 0


def test_tb_loads_in_hta(compare_run):
    """tb/<run>/ is one HTA job per measurement: one trace, no made-up distributed info (a before/after pair is
    two runs, not two ranks of one job)."""
    hta = pytest.importorskip("hta.trace_analysis")
    out, _ = compare_run
    assert sorted(p.name for p in (out / "tb").iterdir()) == ["baseline", "swapped"]
    for run in ("baseline", "swapped"):
        (trace_file,) = (out / "tb" / run).glob("*.pt.trace.json")
        assert "distributedInfo" not in json.loads(trace_file.read_text())
        analysis = hta.TraceAnalysis(trace_dir=str(out / "tb" / run))
        assert sorted(analysis.t.traces) == [0]
        df = analysis.t.get_trace(0)
        names = set(analysis.t.symbol_table.get_sym_table()[i] for i in df["name"].unique())
        assert ATTENTION_RANGE in names and BLOCK_RANGE in names


_TB_SCRIPT = """
import sys, tempfile
from torch_tb_profiler import io
from torch_tb_profiler.profiler.loader import RunLoader
if __name__ == "__main__":
    run = RunLoader("tb", sys.argv[1], io.Cache(tempfile.mkdtemp())).load()
    print(sorted(w for w, _ in run.profiles))
"""


def test_tb_loads_in_torch_tb_profiler(compare_run, tmp_path):
    """`tensorboard --logdir tb` sees one run per measurement; the plugin parses each and its loader finds the
    profile of that run's worker."""
    pytest.importorskip("torch_tb_profiler")
    from torch_tb_profiler import consts
    from torch_tb_profiler.profiler.data import RunProfileData
    from torch_tb_profiler.profiler.run_generator import RunGenerator

    out, _ = compare_run
    script = tmp_path / "tbload.py"
    script.write_text(_TB_SCRIPT)
    for run in ("baseline", "swapped"):
        folder = out / "tb" / run
        (f,) = os.listdir(folder)
        m = consts.WORKER_PATTERN.match(f)
        assert m and m.group(1) == run, f
        data = RunProfileData.parse(m.group(1), m.group(2), str(folder / f), str(tmp_path))
        profile = RunGenerator(m.group(1), m.group(2), data).generate_run_profile()
        assert "Operator" in [v.display_name for v in profile.views]
        # the plugin's own loader (spawned worker processes), as TensorBoard runs it on this run folder
        res = subprocess.run([sys.executable, str(script), str(folder)], capture_output=True, text=True,
                             timeout=300)
        assert res.returncode == 0, res.stderr[-2000:]
        assert f"['{run}']" in res.stdout


def test_cli_subprocess(tmp_path):
    """The real entry point, as a user types it: rich summary table on stdout, run folder written."""
    out = tmp_path / "cli"
    repo = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, OMP_NUM_THREADS="1", COLUMNS="160",
               PYTHONPATH=os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p))
    res = subprocess.run([sys.executable, "-m", "ditprof", "compare", "--preset", PRESET, "--device", "cpu",
                          "--iters", "2", "--warmup", "1", "--out", str(out)],
                         capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    # fp8-emulated is a numerics emulation: its time is labelled, never a speedup (no Amdahl prediction either)
    for text in ("attention share", "fp8-emulated", "sdpa", "model time (2 blocks)", "numerics only", str(out)):
        assert text in res.stdout, text
    assert "Amdahl" not in res.stdout
    # stdout is a pipe here: progress comes as lines with elapsed times, one per phase
    assert "baseline (sdpa): warm-up 1/1, done in" in res.stdout and "swapped (fp8-emulated): profiling" in res.stdout
    assert (out / "report.json").is_file()


def test_one_run_per_folder(one_thread, tmp_path):
    """A profile into a compare's folder leaves none of the compare's files (its swapped trace, tb runs) beside
    its own; a file ditprof did not write stays; a folder from before manifests is cleaned by its report's list."""
    out = tmp_path / "run"
    common = ["--preset", PRESET, "--device", "cpu", "--out", str(out), "--iters", "1", "--warmup", "1"]
    assert cli.main(["compare", *common]) == 0
    assert (out / "swapped.trace.json.gz").is_file()
    (out / "notes.txt").write_text("mine")
    assert cli.main(["profile", *common]) == 0
    names = {p.name for p in out.iterdir()}
    assert "swapped.trace.json.gz" not in names and "notes.txt" in names
    assert [p.name for p in (out / "tb").iterdir()] == ["baseline"]
    written = json.loads((out / "ditprof-files.json").read_text())["entries"]
    assert set(written) == names - {"notes.txt", "ditprof-files.json"}
    # an older run (no manifest): its report's file list says what it wrote
    assert cli.main(["compare", *common]) == 0
    (out / "ditprof-files.json").unlink()
    assert cli.main(["profile", *common]) == 0
    assert not (out / "swapped.trace.json.gz").exists() and (out / "notes.txt").read_text() == "mine"
