"""split.png: the value labels never overlap the dashed block-time line, a compare says its speedup, an --sp run
says which rank it shows."""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")

from ditprof.cli import main
from ditprof.harness.report import plots


def _run(label, backend, split, block):
    return {"label": label, "attention_backend": backend, "split_ms": split,
            "attention_share": split["attention"] / sum(split.values()), "block_ms": {"median": block}}


def test_value_labels_clear_the_block_time_line():
    """The case that used to strike through: the clean block time a little above the stacked bar."""
    split = {"attention": 4.0, "gemm": 3.0, "norm": 1.0, "elementwise": 1.0, "other": 0.5}
    runs = [_run("baseline", "sdpa", split, 9.9), _run("swapped", "fp8", dict(split, attention=2.0), 7.4)]
    fig = plots.split_figure(runs, "t", note="block 1.34x faster with fp8")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    lines = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    texts = [t for t in ax.texts]
    assert len(lines) == 2 and len(texts) == 2
    for ln, tx in zip(lines, texts):
        box = tx.get_window_extent(renderer)
        (_, y_line), = ax.transData.transform([(0, ln.get_ydata()[0])])[:1]
        assert y_line < box.y0, "the dashed block-time line runs through the value label"
    assert "block 1.34x faster with fp8" in ax.get_title()
    matplotlib.pyplot.close(fig)


def test_speedup_note_says_noise_and_numerics_only():
    base = {"block_ms": {"median": 10.0}, "attention_backend": "sdpa"}
    sw = {"block_ms": {"median": 8.0}, "attention_backend": "fp8"}
    assert plots.speedup_note({"baseline": base, "swapped": None}) == ""
    assert plots.speedup_note({"baseline": base, "swapped": sw, "noise": {"block": {"verdict": "faster"}}}) == \
        "block 1.25x faster with fp8"
    assert plots.speedup_note({"baseline": base, "swapped": sw,
                               "noise": {"block": {"verdict": "within noise"}}}).endswith("(within noise)")
    emu = dict(sw, attention_backend="fp8-emulated")
    assert "not a speed result" in plots.speedup_note({"baseline": base, "swapped": emu,
                                                       "noise": {"block": {"verdict": "numerics only"}}})


def test_sp_plot_title_names_the_rank(tmp_path):
    from ditprof.harness.run.runner import plot_title

    out = tmp_path / "sp"
    assert main(["profile", "--preset", "wan-tiny", "--device", "cpu", "--sp", "2", "--iters", "1", "--warmup", "1",
                 "--out", str(out)]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert f"rank {rep['baseline']['rank']} of 2 (the slowest), 24 tokens per rank" in plot_title(rep)
    single = dict(rep)
    single.pop("sp")
    assert "rank" not in plot_title(single)


def test_limits_panel_shows_each_categorys_share_of_peak():
    split = {"attention": 4.0, "gemm": 3.0, "norm": 1.0, "elementwise": 1.0, "other": 0.5}

    def lim(share, kind="datasheet"):
        return {"share_of_peak": share, "peak_kind": kind}

    base = dict(_run("baseline", "sdpa", split, 9.9),
                limits={"attention": lim(0.42), "gemm": lim(0.61), "norm": lim(0.30), "elementwise": lim(0.25)})
    sw = dict(_run("swapped", "fp8-emulated", split, 9.0),
              limits={"attention": lim(None), "gemm": lim(0.60), "norm": lim(0.31), "elementwise": lim(0.26)})
    fig = plots.split_figure([base, sw], "t")
    assert len(fig.axes) >= 2 and len(fig.axes[0].texts) == 2  # the split's value labels stay as they were
    panel = fig.axes[1]
    heights = sorted(round(p.get_height(), 6) for p in panel.patches)
    want = sorted(round((e["share_of_peak"] or 0.0) * 100, 6) for r in (base, sw) for e in r["limits"].values())
    assert heights == want
    assert [t.get_text() for t in panel.get_xticklabels()] == ["attention", "gemm", "norm", "elementwise"]
    assert "n/a" in [t.get_text() for t in panel.texts]  # the emulation's attention: no share
    assert "% of peak" in panel.get_ylabel()
    matplotlib.pyplot.close(fig)
    plain = plots.split_figure([_run("baseline", "sdpa", split, 9.9)], "t")
    assert len(plain.axes) == 1  # no limits (an --sp report): the split alone
    matplotlib.pyplot.close(plain)
