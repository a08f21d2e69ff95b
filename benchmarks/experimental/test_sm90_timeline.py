"""benchmarks/sm90_timeline.py's parsing of the sm90 kernel's clock trace (CPU: synthetic stamps)."""

import sys
from pathlib import Path

import pytest

pytest.importorskip("cutlass")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import sm90_timeline as T  # noqa: E402
import fp8_fwd_sm90_variants as K  # noqa: E402


def _stamps(pv, qk, soft, stagger, n_wg=3, tiles=40):
    """Trace buffer of n_wg warpgroups (4 warps each) that repeat pv, qk, softmax phases back to back, warpgroup g
    starting g * stagger cycles late; the producer issues K and V of tile j at 100 j and 100 j + 50."""
    st = [float("nan")] * K.TRACE_FLOATS
    period = pv + qk + soft
    for w in range(4 * n_wg):
        g = w // 4
        for j in range(tiles):
            t = j * period + g * stagger
            for e, v in enumerate((t, t + pv, t + pv + qk, t + period)):
                st[(w * K.TRACE_TILES + j) * 4 + e] = float(v)
    for j in range(tiles):
        st[K.TRACE_PRODUCER + 2 * j] = 100.0 * j
        st[K.TRACE_PRODUCER + 2 * j + 1] = 100.0 * j + 50
    return st


def test_phases_from_stamps_reads_every_warp_and_tile():
    per_warp, producer = T.phases_from_stamps(_stamps(300, 200, 500, 0), n_warps=12, n_tiles=40,
                                              tiles=K.TRACE_TILES)
    assert len(per_warp) == 12 and all(len(rows) == 3 * 39 for rows in per_warp)  # tiles 1..39, 3 phases each
    durations = {ph: {round(b - a) for j, p, a, b in per_warp[5] if p == ph} for ph in T.PHASES}
    assert durations == {"pv": {300}, "qk": {200}, "softmax": {500}}
    assert producer[3] == (3, 300.0, 350.0)


def test_concurrency_in_phase_vs_staggered():
    # in phase: all three warpgroups in their softmax together, never one softmax under another's GEMM
    same = T.concurrency(T.phases_from_stamps(_stamps(300, 200, 500, 0), 12, 40, K.TRACE_TILES)[0])
    assert same["two_plus_in_softmax"] == pytest.approx(0.5, abs=0.02)  # softmax is half of each period
    assert same["softmax_while_gemm"] == pytest.approx(0.0, abs=0.02)
    # staggered by a third of the period: at most 2 of 3 in the softmax, and a GEMM phase always beside it
    stag = T.concurrency(T.phases_from_stamps(_stamps(300, 200, 500, 333), 12, 40, K.TRACE_TILES)[0])
    assert stag["softmax_while_gemm"] > 0.95  # (the first and last tiles of the window are not staggered)
    assert 0.4 < stag["two_plus_in_softmax"] < 0.6


def test_parse_opts():
    assert T.parse_opts("sum_mma=True,tile_n=128,pin_wait=sts") == {"sum_mma": True, "tile_n": 128, "pin_wait": "sts"}
    assert T.parse_opts("") == {}


def test_chrome_events_and_gantt_png(tmp_path):
    per_warp, producer = T.phases_from_stamps(_stamps(300, 200, 500, 333), 12, 40, K.TRACE_TILES)
    ev = T.chrome_events(per_warp, producer, head=0)
    phases = [e for e in ev if e["ph"] == "X"]
    assert len(phases) == 12 * 39 * 3 and {e["tid"] for e in phases} == set(range(4, 16))
    assert sum(e["ph"] == "i" for e in ev) == 2 * 40
    assert {round(e["dur"] * 1000) for e in phases if e["name"] == "softmax"} == {500}
    png = T.plot_gantt([("synthetic", ev)], tmp_path / "g.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    with pytest.raises(ValueError, match="no events"):
        T.plot_gantt([("empty", [])], tmp_path / "e.png")
