"""bench_helpers' two-record A/B table on hand-made rows (CPU): the columns, the IQR of the round ratios, a row
that was not timed, and the exit status when a pair's outputs differ."""

from __future__ import annotations

import bench_helpers as BH

ROWS = {
    "a": {"shape": "a", "grid": "plain", "ms": {"x": 1.0, "y": 2.0}, "ratio": 0.5,
          "ratios_per_round": [0.6, 0.4, 0.5, 0.7], "bit_identical": True},
    "b": {"shape": "b", "grid": "stream-K"},
}


def _main(rows, shapes, capsys):
    rc = BH.records_ab_main(["--shapes", shapes], "doc", rows, "a", lambda n, r: dict(rows[n]), ("x", "y"),
                            "not timed here")
    return rc, capsys.readouterr().out.splitlines()


def test_the_table(capsys):
    rc, lines = _main(ROWS, "a,b", capsys)
    assert rc == 0
    assert lines[0].split() == ["shape", "grid", "x", "y", "ratio", "round", "ratios", "IQR", "bits"]
    assert lines[1].split() == ["a", "plain", "1.0000", "2.0000", "0.5000", "0.5000-0.7000", "same"]
    assert lines[2].split() == ["b", "stream-K", "(not", "timed", "here)"]


def test_differing_outputs_fail_the_run(capsys):
    rows = {"a": {**ROWS["a"], "bit_identical": False}}
    rc, lines = _main(rows, "a", capsys)
    assert rc == 1 and lines[1].endswith("DIFFER")


def test_an_unknown_shape_is_a_one_line_error(capsys):
    assert BH.records_ab_main(["--shapes", "zz"], "doc", ROWS, "a", None, ("x", "y"), "") == 2
    assert "unknown shape(s) ['zz']" in capsys.readouterr().err
