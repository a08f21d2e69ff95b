"""`ditprof diff RUN_A RUN_B`: per-category and per-op deltas of two saved runs, table + PNG + JSON."""

from __future__ import annotations

import json

import pytest

from ditprof.cli import main

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("diff")
    common = ["--preset", "wan-tiny", "--device", "cpu", "--iters", "2", "--warmup", "1"]
    assert main(["compare", *common, "--out", str(root / "cmp")]) == 0
    assert main(["profile", *common, "--attention", "sdpa-math", "--out", str(root / "prof")]) == 0
    return root


def test_diff_outputs_and_sums(two_runs, capsys):
    out = two_runs / "d"
    assert main(["diff", str(two_runs / "cmp") + ":baseline", str(two_runs / "prof"), "--top", "1000",
                 "--json", "--out", str(out)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d == json.loads((out / "diff.json").read_text()) and d["schema"] == "ditprof.diff/1"
    assert (out / "diff.png").read_bytes()[:8] == PNG and "| attention |" in (out / "diff.md").read_text()
    a = json.loads((two_runs / "cmp" / "report.json").read_text())["baseline"]
    b = json.loads((two_runs / "prof" / "report.json").read_text())["baseline"]
    for row in d["categories"]:
        assert row["a_ms"] == pytest.approx(a["split_ms"][row["category"]])
        assert row["b_ms"] == pytest.approx(b["split_ms"][row["category"]])
        # every op of the re-split traces: the ops of a category add up to the report's category time
        ops = [o for o in d["ops"] if o["category"] == row["category"]]
        assert sum(o["a_ms"] for o in ops) == pytest.approx(row["a_ms"], rel=1e-6, abs=1e-9)
        assert sum(o["b_ms"] for o in ops) == pytest.approx(row["b_ms"], rel=1e-6, abs=1e-9)
    assert d["ops_compared"] == len(d["ops"])
    assert d["a"]["section"] == "baseline" and d["b"]["section"] == "baseline"
    try:
        import hta.trace_diff  # noqa: F401 -- in the test install; the GPU host's bundle has no HTA
    except ImportError:
        assert "not installed" in d["hta_trace_diff"]
    else:
        assert isinstance(d["hta_trace_diff"], list) and d["hta_trace_diff"]
        assert {"name", "control_counts", "test_counts", "diff_us"} <= set(d["hta_trace_diff"][0])


def test_diff_default_section_and_numerics_only(two_runs, capsys):
    """A compare's default side is its swapped measurement; fp8-emulated is never a speed result."""
    assert main(["diff", str(two_runs / "cmp"), str(two_runs / "prof"), "--json",
                 "--out", str(two_runs / "d2")]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["a"]["section"] == "swapped" and d["block_ms"]["verdict"]["verdict"] == "numerics only"


def test_diff_bad_input_is_one_line(two_runs, tmp_path, capsys):
    (tmp_path / "notrun").mkdir()
    (tmp_path / "val").mkdir()
    (tmp_path / "val" / "report.json").write_text(json.dumps({"schema": "ditprof.validate/1"}))
    cases = [
        ([str(tmp_path / "notrun"), str(two_runs / "prof")], "is not a ditprof run folder"),
        ([str(tmp_path / "val"), str(two_runs / "prof")], "is not a ditprof profile/compare report"),
        ([str(two_runs / "prof") + ":swapped", str(two_runs / "cmp")], "this run has no swapped measurement"),
        ([str(two_runs / "prof") + ":nope", str(two_runs / "cmp")], "must be baseline or swapped"),
    ]
    for argv, words in cases:
        out = tmp_path / "out"
        assert main(["diff", *argv, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
        assert not out.exists()


def test_terminal_table_names_each_ops_category():
    """One op name in two categories (an aten::copy_ inside attention and outside) gives two distinguishable rows,
    as in diff.md (issue 41)."""
    import io

    from rich.console import Console

    from ditprof.harness.trace.diff import terminal_table

    band = {"median": 2.0, "min": 2.0, "max": 2.0}
    d = {"a": {"name": "A"}, "b": {"name": "B"},
         "block_ms": {"a": band, "b": {**band, "median": 1.5}, "verdict": None},
         "categories": [{"category": c, "a_ms": 1.0, "b_ms": 0.75, "delta_ms": -0.25}
                        for c in ("attention", "elementwise")],
         "ops": [{"op": "aten::copy_", "category": c, "a_ms": 0.5, "b_ms": 0.25, "delta_ms": -0.25}
                 for c in ("attention", "elementwise")]}
    buf = io.StringIO()
    Console(file=buf, width=200).print(terminal_table(d))
    rows = [ln for ln in buf.getvalue().splitlines() if "aten::copy_" in ln]
    cells = [[c.strip() for c in ln.split("│")[1:3]] for ln in rows]
    assert cells == [["aten::copy_", "attention"], ["aten::copy_", "elementwise"]]
    header = next(ln for ln in buf.getvalue().splitlines() if "A ms" in ln)
    assert "category" in header


def test_diff_cli_table_has_the_category_column(two_runs, capsys):
    assert main(["diff", str(two_runs / "cmp") + ":baseline", str(two_runs / "prof"),
                 "--out", str(two_runs / "d3")]) == 0
    d = json.loads((two_runs / "d3" / "diff.json").read_text())
    printed = capsys.readouterr().out
    for r in d["ops"][:8]:  # every op row of the table carries its category next to its name
        assert any(r["op"][:60] in ln and f"│ {r['category']}" in ln for ln in printed.splitlines()), r
