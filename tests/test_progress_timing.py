"""The timing phases report every timed call (issue 41 item 6): a line at least every ~10 s with an ETA, not only
``timing 0/N`` and ``N/N``."""

from __future__ import annotations

import io

import torch
from rich.console import Console

from ditprof import progress as P
from ditprof.harness.run import session
from ditprof.harness.run.parts import Phases


class _Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_time_block_reports_each_call():
    seen = []
    samples, source = session.time_block(lambda: None, torch.device("cpu"), 4, on_call=seen.append)
    assert seen == [1, 2, 3, 4] and len(samples) == 4 and source == "host_clock"


def test_measure_reports_every_timed_call_through_on_phase(tmp_path):
    calls = []
    x = torch.randn(8, 8)
    run = session.measure(lambda: x @ x, label="baseline", backend="sdpa", device=torch.device("cpu"),
                          workdir=tmp_path, warmup=2, iters=5, on_phase=lambda *a: calls.append(a))
    assert len(run.samples_ms) == 5
    timing = [done for phase, done, total in calls if phase == "timing"]
    assert timing == [0, 1, 2, 3, 4, 5]
    assert all(total == 5 for phase, _, total in calls if phase == "timing")
    assert [done for phase, done, _ in calls if phase == "warm-up"] == [1, 2]
    assert [done for phase, done, _ in calls if phase == "profiling"] == [1, 2, 3, 4, 5, 6]


def test_slow_timing_prints_lines_with_a_right_eta():
    """Five 12 s calls (the issue's 60 s phase): a line after each, with the ETA the rate so far gives."""
    buf, clock = io.StringIO(), _Clock()
    prog = P.LineProgress(Console(file=buf, width=200), clock=clock, heartbeat=False)
    phases = Phases(prog, "baseline (sdpa)")

    def slow_call():
        clock.t += 12.0

    phases("timing", 0, 5)
    session.time_block(slow_call, torch.device("cpu"), 5, on_call=lambda n: phases("timing", n, 5))
    lines = buf.getvalue().splitlines()
    assert lines[0] == "[   0.0 s] baseline (sdpa): timing 0/5"
    assert lines[1] == "[  12.0 s] baseline (sdpa): timing 1/5, ETA 48.0 s"  # 4 calls left at 12 s each
    assert lines[-1] == "[  60.0 s] baseline (sdpa): timing 5/5, done in 60.0 s"
    assert len(lines) == 6  # every call 12 s after the last line: each one printed


def test_warm_up_reported_at_its_end_is_dated_from_the_previous_report():
    """A warm-up whose first report is its end says how long it took, not 'done in 0.0 s'."""
    buf, clock = io.StringIO(), _Clock()
    prog = P.LineProgress(Console(file=buf, width=200), clock=clock, heartbeat=False)
    phases = Phases(prog, "swapped (fp8)")
    clock.t += 7.5  # one warm-up call (a compile, say)
    phases("warm-up", 1, 1)
    assert buf.getvalue().splitlines() == ["[   7.5 s] swapped (fp8): warm-up 1/1, done in 7.5 s"]  # no 0/1 after it


def test_interleaved_rounds_are_reported():
    from contextlib import nullcontext

    seen = []
    runs = {"baseline": (nullcontext, lambda: None), "swapped": (nullcontext, lambda: None)}
    out = session.time_interleaved(runs, torch.device("cpu"), 3, calls=2, on_round=seen.append)
    assert seen == [1, 2, 3] and [len(r) for r in out["swapped"]] == [2, 2, 2]
