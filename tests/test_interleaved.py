"""`ditprof compare --interleave N`: the baseline and the swap timed in turns after both phases (CPU, CI)."""

from __future__ import annotations

import contextlib
import json
import statistics

import pytest
import torch

from ditprof import cli
from ditprof.harness.run import noise
from ditprof.harness.run.session import INTERLEAVED_CALLS_PER_ROUND, time_interleaved


def test_turns_reverse_every_round_and_time_each_call_inside_its_context():
    log = []

    def setup(name):
        @contextlib.contextmanager
        def enter():
            log.append(f"enter {name}")
            yield
            log.append(f"leave {name}")

        return enter, lambda: log.append(f"call {name}")

    got = time_interleaved({"a": setup("a"), "b": setup("b")}, torch.device("cpu"), rounds=3, calls=2)
    turn = ["enter {0}", "call {0}", "call {0}", "call {0}", "leave {0}"]  # one untimed call, then the timed ones
    want = []
    for order in ("ab", "ba", "ab"):
        for n in order:
            want += [t.format(n) for t in turn]
    assert log == want
    assert [len(r) for r in got["a"]] == [2, 2, 2] and [len(r) for r in got["b"]] == [2, 2, 2]
    assert all(x >= 0 for r in got["a"] + got["b"] for x in r)


def test_paired_verdicts():
    faster = noise.paired([[2.0, 2.1], [2.2, 2.0], [2.0, 2.0]], [[1.0, 1.1], [1.0, 1.0], [1.1, 1.0]])
    assert faster["verdict"] == "faster" and faster["ratio"] == pytest.approx(2.0, rel=0.1)
    assert len(faster["round_ratios"]) == 3 and faster["ratio_iqr"][0] > 1
    slower = noise.paired([[1.0], [1.0], [1.0]], [[2.0], [2.5], [3.0]])
    assert slower["verdict"] == "slower" and slower["ratio"] == pytest.approx(0.4)
    mixed = noise.paired([[1.0], [1.0], [1.0], [1.0]], [[0.9], [1.1], [0.95], [1.05]])
    assert mixed["verdict"] == "within noise" and "contains 1" in mixed["why"]


def test_compare_with_rounds_in_turns(one_thread, tmp_path):
    out = tmp_path / "run"
    assert cli.main(["compare", "--preset", "wan-tiny", "--device", "cpu", "--attention", "sdpa-math",
                     "--iters", "2", "--warmup", "1", "--interleave", "3", "--out", str(out)]) == 0
    rep = json.loads((out / "report.json").read_text())
    inter = rep["interleaved"]
    c = inter["calls_per_round"]
    assert (inter["rounds"], c, inter["timing_source"]) == (3, INTERLEAVED_CALLS_PER_ROUND, "host_clock")
    base, new = inter["baseline_samples_ms"], inter["swapped_samples_ms"]
    assert len(base) == len(new) == 3 * c and min(base + new) > 0
    # the ratio is the median over rounds of the rounds' median ratios, recomputed from the samples
    ratios = [statistics.median(base[c * i:c * i + c]) / statistics.median(new[c * i:c * i + c]) for i in range(3)]
    assert inter["round_ratios"] == pytest.approx(ratios)
    assert inter["ratio"] == pytest.approx(statistics.median(ratios))
    assert inter["baseline_ms"]["min"] == min(base) and inter["swapped_ms"]["max"] == max(new)
    assert inter["verdict"] in ("faster", "slower", "within noise")
    md = (out / "report.md").read_text()
    assert "baseline and swap in turns (3 rounds)" in md and f"{inter['ratio']:.2f}x" in md
    # the plan counted the rounds' calls: 2 backends x 3 rounds x (1 untimed + c timed) on top of the phases'
    plain = cli.main(["compare", "--preset", "wan-tiny", "--device", "cpu", "--attention", "sdpa-math",
                      "--iters", "2", "--warmup", "1", "--interleave", "0", "--out", str(tmp_path / "plain")])
    assert plain == 0
    calls0 = json.loads((tmp_path / "plain" / "report.json").read_text())["plan"]["calls"]
    assert rep["plan"]["calls"] == calls0 + 2 * 3 * (1 + c)


def test_no_rounds_by_default_on_the_cpu_nor_for_an_emulation(one_thread, tmp_path):
    out = tmp_path / "run"
    assert cli.main(["compare", "--preset", "wan-tiny", "--device", "cpu", "--iters", "2", "--warmup", "1",
                     "--out", str(out)]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["interleaved"] is None
    out2 = tmp_path / "emu"
    assert cli.main(["compare", "--preset", "wan-tiny", "--device", "cpu", "--iters", "2", "--warmup", "1",
                     "--attention", "fp8-emulated", "--interleave", "2", "--tokens", "64", "--out", str(out2)]) == 0
    rep2 = json.loads((out2 / "report.json").read_text())
    assert rep2["interleaved"] is None  # numerics only: no speed
    assert rep2["plan"]["calls"] == rep["plan"]["calls"]  # and the plan counts no rounds for it


@pytest.mark.parametrize("argv, words", [
    (["compare", "--interleave", "-1"], "--interleave must be >= 0 rounds"),
    (["profile", "--interleave", "2"], "it is for ditprof compare"),
])
def test_bad_interleave_is_one_line(argv, words, capsys, tmp_path):
    assert cli.main([*argv, "--preset", "wan-tiny", "--device", "cpu", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert not (tmp_path / "x").exists()
