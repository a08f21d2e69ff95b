"""``compare --each-swap``: every prefix of the swap list measured as its own configuration (issue 42): the report's
``configurations`` (each with its accuracy, model time and change against the previous one), the summary's one
column per configuration, split.png's one bar each, and ``ditprof diff`` on such a report. CPU, tiny presets."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from ditprof.cli import main
from ditprof.harness.report import document, plots
from ditprof.harness.report import summary
from ditprof.harness.run.extrapolate import NUMERICS_ONLY_NOTE, scale_factor
from ditprof.harness.run.runner import configurations
from ditprof.harness.swaps.base import Swap

jsonschema = pytest.importorskip("jsonschema")
SCHEMA = json.loads(resources.files("ditprof.harness.report").joinpath("report.schema.json").read_text())
COMMON = ["--preset", "flux-tiny", "--device", "cpu", "--iters", "2", "--warmup", "1"]
# sdpa-math is a real backend on the CPU (a speed ratio against sdpa); the FP8 linears are emulated (numerics only)
EACH = ["compare", *COMMON, "--attention", "sdpa-math", "--linears", "rowwise", "--each-swap"]
EXTRA = ("accuracy", "extrapolation", "model_ms", "model_band_ms", "change_vs_previous", "limits")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, one_thread):
    root = tmp_path_factory.mktemp("configs")
    assert main([*EACH, "--out", str(root / "each")]) == 0
    assert main(["compare", *COMMON, "--attention", "sdpa-math", "--out", str(root / "two")]) == 0
    return root


def _report(folder) -> dict:
    rep = json.loads((folder / "report.json").read_text())
    jsonschema.validate(rep, SCHEMA, cls=jsonschema.Draft202012Validator)
    return rep


def _section(entry: dict) -> dict:
    """A configuration entry without the keys it adds to the run section (and the limits both carry)."""
    return {k: v for k, v in entry.items() if k not in EXTRA}


def test_each_swap_measures_every_prefix_of_the_swaps(runs):
    rep = _report(runs / "each")
    confs = rep["configurations"]
    assert [c["label"] for c in confs] == ["baseline", "step1", "swapped"]
    assert [c["configuration"] for c in confs] == ["sdpa", "sdpa-math", "sdpa-math + fp8-linears-rowwise"]
    assert "linears" not in confs[1] and confs[2]["linears"]["granularity"] == "rowwise"
    # the ends are the report's baseline and swapped, as every reader and `ditprof diff` know them
    assert _section(confs[0]) == _section(rep["baseline"]) and _section(confs[-1]) == _section(rep["swapped"])
    assert confs[-1]["accuracy"] == rep["accuracy"] and confs[-1]["extrapolation"] == rep["extrapolation"]
    assert confs[0]["accuracy"] is None and confs[0]["extrapolation"] is None
    # each later configuration's output against the baseline's: sdpa-math is sdpa's math, the FP8 linears are not
    step, last = confs[1]["accuracy"], confs[2]["accuracy"]
    assert step["block_output_rel_rms"] < last["block_output_rel_rms"] < 0.1 and last["block_output_cosine"] > 0.99
    factor = scale_factor(rep["extrapolation"]["n_blocks"], rep["extrapolation"]["steps"], rep["extrapolation"]["cfg"])
    for c in confs:
        assert c["model_ms"] == pytest.approx(c["block_ms"]["median"] * factor) and c["limits"]
    assert confs[1]["extrapolation"]["swapped_ms"] == pytest.approx(confs[1]["model_ms"])
    ch1, ch2 = confs[1]["change_vs_previous"], confs[2]["change_vs_previous"]
    assert confs[0]["change_vs_previous"] is None
    assert ch1["previous"] == "baseline" and ch1["speedup_note"] is None
    assert ch1["speedup"] == pytest.approx(confs[0]["block_ms"]["median"] / confs[1]["block_ms"]["median"])
    assert ch1["block"]["verdict"] in ("faster", "slower", "within noise")
    # the emulated linears: their time is no speed, as the extrapolation says of a numerics-only swap
    assert ch2["previous"] == "step1" and ch2["speedup"] is None and ch2["speedup_note"] == NUMERICS_ONLY_NOTE
    assert ch2["block"]["verdict"] == "numerics only"
    assert {"step1.trace.json.gz", confs[1]["tb_trace"]} <= set(rep["files"])
    assert (runs / "each" / "step1.trace.json.gz").is_file()


def test_summary_and_report_md_have_one_column_per_configuration(runs):
    rep = _report(runs / "each")
    names = summary.column_names(rep["configurations"])
    assert names == ["baseline (sdpa)", "step1 (sdpa-math)", "change vs baseline",
                     "swapped (sdpa-math + fp8-linears-rowwise)", "change vs step1"]
    rows = {r[0]: r for r in summary.summary_rows(rep)}
    assert all(len(r) == 6 for r in rows.values())
    block = rows["block (host clock) median [min–max]"]
    assert block[3].startswith(f"{rep['configurations'][1]['change_vs_previous']['speedup']:.2f}x")
    assert block[5] == "numerics only"
    acc = rows["output vs baseline: rel-RMS / cosine"]
    assert acc[1] == "" and acc[2].startswith(f"{rep['configurations'][1]['accuracy']['block_output_rel_rms']:.2e}")
    assert acc[4].startswith(f"{rep['accuracy']['block_output_rel_rms']:.2e}")
    assert rows["linears"][2] == "bf16" and rows["linears"][4].startswith("fp8 rowwise")
    md = (runs / "each" / "report.md").read_text()
    assert "| metric | " + " | ".join(names) + " |" in md and "|---|" + "---:|" * 5 in md
    assert "`--each-swap`" in md and "## Heaviest ops — step1 (sdpa-math)" in md


def test_split_png_has_one_bar_per_configuration(runs):
    rep = _report(runs / "each")
    fig = plots.split_figure(document.configurations_of(rep), "t", note=plots.speedup_note(rep))
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert ticks == ["baseline\nsdpa", "step1\nsdpa-math", "swapped\nsdpa-math\n+ fp8-linears-rowwise"]
    assert "step1" in plots.speedup_note(rep) and "swapped numerics only" in plots.speedup_note(rep)


def test_without_each_swap_the_configurations_are_baseline_and_swapped(runs):
    rep = _report(runs / "two")
    confs = rep["configurations"]
    assert [c["label"] for c in confs] == ["baseline", "swapped"]
    assert _section(confs[0]) == _section(rep["baseline"]) and _section(confs[1]) == _section(rep["swapped"])
    assert confs[1]["change_vs_previous"]["speedup"] == pytest.approx(rep["extrapolation"]["speedup"])
    assert confs[1]["change_vs_previous"]["block"] == rep["noise"]["block"]
    assert summary.column_names(confs) == ["baseline", "swapped", "change"]
    assert "| metric | baseline | swapped | change |" in (runs / "two" / "report.md").read_text()


def test_profile_has_its_one_configuration(tmp_path, one_thread):
    assert main(["profile", *COMMON, "--out", str(tmp_path / "p")]) == 0
    rep = _report(tmp_path / "p")
    assert [c["label"] for c in rep["configurations"]] == ["baseline"]
    assert rep["configurations"][0]["model_ms"] == pytest.approx(rep["extrapolation"]["baseline_ms"])
    assert all(len(r) == 2 for r in summary.summary_rows(rep))


def test_each_swap_without_a_second_swap_is_one_line(tmp_path, capsys):
    rc = main(["compare", *COMMON, "--each-swap", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and len(err) == 1 and "--each-swap" in err[0] and "--linears" in err[0]
    assert not (tmp_path / "x").exists()


def test_diff_reads_every_configuration(runs, capsys):
    each = str(runs / "each")
    assert main(["diff", each + ":step1", each, "--json", "--out", str(runs / "d")]) == 0
    d = json.loads(capsys.readouterr().out)
    rep = _report(runs / "each")
    assert d["a"]["section"] == "step1" and d["b"]["section"] == "swapped"
    assert d["block_ms"]["a"] == rep["configurations"][1]["block_ms"]
    assert d["block_ms"]["b"] == rep["swapped"]["block_ms"] and d["block_ms"]["verdict"]["verdict"] == "numerics only"
    assert main(["diff", each + ":baseline", str(runs / "two"), "--out", str(runs / "d2")]) == 0
    capsys.readouterr()
    assert main(["diff", each + ":step7", each, "--out", str(runs / "d3")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "must be baseline or swapped or a configuration of this run (step1)" in err[0]


def test_configurations_are_the_prefixes_of_the_swaps():
    a, b, c = Swap(), Swap(), Swap()
    assert configurations([a, b, c], each=False) == [("swapped", [a, b, c])]
    assert configurations([a, b, c], each=True) == [("step1", [a]), ("step2", [a, b]), ("swapped", [a, b, c])]
    assert configurations([a], each=True) == [("swapped", [a])]


def test_row_puts_each_change_after_its_configuration():
    assert summary.row("m", ["1", "2", "3"], ["x", "y"]) == ("m", "1", "2", "x", "3", "y")
    assert summary.row("m", ["1", "2"]) == ("m", "1", "2", "")
    assert summary.row("m", ["1"]) == ("m", "1")
