"""Noise checks on timings: within-noise verdicts, numerics-only backends, the likely cause, the report rows."""

import os


from ditprof.harness.run import noise


from ditprof.harness.report import document
from ditprof.harness.report import summary as report


def test_change_verdicts():
    base = [10.0, 10.1, 10.2, 10.1, 10.0]
    fast = [5.0, 5.1, 5.0, 5.2, 5.1]
    assert noise.change(base, fast)["verdict"] == "faster"
    assert noise.change(fast, base)["verdict"] == "slower"
    overlap = [9.9, 10.1, 10.3, 10.0, 10.2]
    v = noise.change(base, overlap)
    assert v["verdict"] == "within noise" and v["why"] == "the interquartile ranges overlap"
    # a 55x spread (a busy machine): even a 2x median ratio is not claimed
    wild = [1.8, 5.0, 40.0, 96.6, 20.0]
    v = noise.change(wild, [4.0, 4.1, 4.2, 4.0, 4.1])
    assert v["verdict"] == "within noise" and "spread" in v["why"]
    assert noise.change(base, fast, numerics_only=True)["verdict"] == "numerics only"
    assert noise.change(base, None) is None
    assert noise.quartiles([3.0]) == (3.0, 3.0, 3.0)


def test_likely_cause_names_a_busy_cpu(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (7.5, 7.0, 6.0))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert noise.likely_causes("cpu") == ["busy CPU: load average 7.5 on 2 cores"]
    monkeypatch.setattr(os, "getloadavg", lambda: (0.2, 0.2, 0.2))
    assert noise.likely_causes("cpu") == []


def _section(samples, overhead=5.0, backend="sdpa"):
    med = sorted(samples)[len(samples) // 2]
    band = {"median": med, "min": min(samples), "max": max(samples)}
    split = {"attention": 1.0, "gemm": 2.0, "norm": 0.5, "elementwise": 0.3, "other": 0.1}
    return {"label": "x", "attention_backend": backend, "block_ms": band, "samples_ms": samples,
            "profiled_block_ms": med, "profiler_overhead_pct": overhead, "timing_source": "host_clock",
            "split_mode": "cpu", "split_ms": split, "split_total_ms": sum(split.values()), "attention_share": 0.25,
            "peak_memory_bytes": 1, "split_iterations_used": 3, "split_iterations": 3, "top_ops": []}


def _report(base, sw, device="cpu"):
    ex = {"n_blocks": 2, "steps": 1, "cfg": False, "baseline_band_ms": base["block_ms"],
          "swapped_band_ms": sw["block_ms"] if sw else None,
          "speedup": base["block_ms"]["median"] / sw["block_ms"]["median"] if sw else None}
    return document.build(command="compare", model={}, environment={}, settings={"device": device}, baseline=base,
                        swapped=sw, extrapolation=ex, accuracy_section=None, files=[], created="now")


def test_report_rows_say_within_noise_numerics_only_and_negative_overhead(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    rep = _report(_section([1.8, 5.0, 40.0, 96.6, 20.0], overhead=-22.0), _section([4.0, 4.1, 4.2, 4.0, 4.1]))
    rows = {r[0]: r for r in report.summary_rows(rep)}
    block = rows["block (host clock) median [min–max]"]
    assert block[3].endswith("(within noise)")
    assert rows["profiler overhead"][1] == "-22.0% (noise)"
    assert "busy CPU: load average 9.0 on 2 cores" in rows["timing noise"][1]
    assert rep["noise"]["negative_profiler_overhead"] == ["baseline"]
    emu = _report(_section([10.0, 10.1, 10.2]), _section([3.0, 3.1, 3.2], backend="fp8-emulated"))
    rows = {r[0]: r for r in report.summary_rows(emu)}
    assert rows["block (host clock) median [min–max]"][3] == "numerics only"
    assert rows["model time (2 blocks)"][3] == "numerics only" and emu["noise"]["numerics_only"]
    # the report's own form: the ratios None with the note; the rows still say "numerics only" and do not crash
    emu["extrapolation"].update(speedup=None, attention_speedup=None, amdahl_predicted_speedup=None,
                                speedup_note="numerics only: emulated")
    rows = {r[0]: r for r in report.summary_rows(emu)}
    assert rows["model time (2 blocks)"][3] == "numerics only" and not any(k.startswith("Amdahl") for k in rows)
    clean = _report(_section([10.0, 10.1, 10.2]), _section([5.0, 5.1, 5.2]))
    assert {r[0]: r for r in report.summary_rows(clean)}["block (host clock) median [min–max]"][3] == "1.98x"
    assert clean["noise"]["warning"] is None
