"""call_anatomy's trace reading on a hand-built chrome trace (CPU)."""

from __future__ import annotations

import pytest
from call_anatomy import anatomy, kernel_events, split_calls, typical_call


def _trace(rows):
    evs = [{"cat": "kernel", "name": n, "ts": t, "dur": d} for n, t, d in rows]
    return {"traceEvents": evs + [{"cat": "cpu_op", "name": "host", "ts": 1, "dur": 100}]}


def test_slots_gaps_and_span():
    # two calls of three kernels (listed out of order), one call with an extra kernel (left out), one cut short
    ev = kernel_events(_trace([("c", 20, 30), ("a", 0, 10), ("b", 12, 5), ("a", 60, 10), ("b", 71, 5),
                               ("c", 80, 30), ("a", 120, 10), ("b", 131, 5), ("c", 140, 30), ("x", 171, 1),
                               ("a", 200, 1)]))
    assert [e["name"] for e in ev[:3]] == ["a", "b", "c"]
    calls, left_out = split_calls(ev, ["a", "b", "c"])
    assert left_out == 2
    r = anatomy(calls)
    assert r["calls"] == 2
    assert [s["name"] for s in r["slots"]] == ["a", "b", "c"]
    assert r["slots"][0]["gap_before_us"] == 10.0  # call 2's first kernel starts 10 us after call 1's last ends
    assert r["slots"][1]["gap_before_us"] == 1.5  # median of 2 and 1
    assert r["slots"][2]["gap_before_us"] == 3.5  # median of 3 and 4
    assert r["span_us"] == 50.0 and r["kernel_sum_us"] == 45.0


def test_no_complete_call_is_an_error():
    with pytest.raises(ValueError, match="no complete call"):
        anatomy(split_calls(kernel_events(_trace([("a", 0, 1)])), ["a", "b", "c"])[0])


def test_the_typical_call_is_the_reference():
    # every third call copies/zeroes its flags ("f" after the call's kernels): the modal call is the reference
    rows, t = [], 0
    for i in range(7):
        for n in ("a", "b") + (("f",) if i % 3 == 2 else ()):
            rows.append((n, t, 1))
            t += 2
    ev = kernel_events(_trace(rows))
    assert typical_call(ev) == ["a", "b"]
    calls, left_out = split_calls(ev, typical_call(ev))
    assert (len(calls), left_out) == (5, 2)
    assert typical_call([]) == []


def test_a_call_that_starts_the_trace_with_a_kernel_it_repeats():
    # session 20 (CogVideoX / h3): the trace's first kernel was a 1 us fill that each call runs twice; splitting at
    # the first kernel gave one-kernel "calls" -- the split that covers the most events is the call
    call = ("stats", "quant", "v", "kernel", "fill", "fill")
    rows, t = [("fill", 0, 1)], 2
    for _ in range(6):
        for n in call:
            rows.append((n, t, 1))
            t += 2
    ev = kernel_events(_trace(rows))
    assert typical_call(ev) == list(call)
    calls, left_out = split_calls(ev, typical_call(ev))
    assert (len(calls), left_out) == (6, 1)
