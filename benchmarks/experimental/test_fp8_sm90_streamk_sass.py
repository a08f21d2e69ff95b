"""CPU checks of the stream-K tail variant of fp8-sm90 (``fp8_fwd_sm90_streamk.py``):

- the schedule (``segments`` / ``plan`` / ``piece_table``, the kernel's own formula run on Python ints): full CTAs
  run whole work tiles in the shipped grid's order; the tail's (tile, key tile) units are each covered exactly once,
  every tail CTA gets floor or ceil of U / T units in one or two non-empty segments; each tail tile's pieces are
  listed in key order (none for a tail tile one CTA ran whole);
- compile-only (sm_90a; INT8 and e4m3; head_dim 128 and 64): no local memory, two key-tile loops (whole tiles and
  tail segments) within 10 instructions of the shipped loop;
- the merge (Triton interpreter, own process): merged rows against the float64 formula, other rows untouched.

    python -m pytest -q benchmarks/experimental/test_fp8_sm90_streamk_sass.py
"""

from __future__ import annotations

import functools

import pytest

pytest.importorskip("cutlass")

import fp8_fwd_sm90_streamk as SK
from sass_helpers import compile_sass, key_tile_loops

from ditprof.kernels import fp8_fwd_sm90 as K


@pytest.mark.parametrize("n_tiles,n_sms,n_kt", [(576, 132, 29), (8848, 132, 190), (1248, 132, 47), (12, 5, 7),
                                                (7, 3, 2), (131, 132, 5), (10, 4, 1), (264, 132, 9)])
def test_schedule_covers_the_tail_once(n_tiles, n_sms, n_kt):
    n_full, n_tail, T = SK.plan(n_tiles, n_sms, n_kt)
    assert n_full + n_tail == n_tiles
    if n_tiles % n_sms == 0 or n_kt == 1:
        assert (n_tail, T) == (0, 0)
    else:
        assert n_tail == n_tiles % n_sms and T == min(n_sms, n_tail * n_kt) and T > n_tail
    for c in range(n_full):
        assert SK.host_segments(c, n_full, n_tail, T, n_kt) == [(c, 0, n_kt)]
    seen = {}
    sizes = []
    for c in range(n_full, n_full + T):
        segs = SK.host_segments(c, n_full, n_tail, T, n_kt)
        assert 1 <= len(segs) <= 2
        sizes.append(sum(e - b for _, b, e in segs))
        for tile, b, e in segs:
            assert n_full <= tile < n_tiles and 0 <= b < e <= n_kt
            for j in range(b, e):
                assert (tile, j) not in seen
                seen[(tile, j)] = c
    assert len(seen) == n_tail * n_kt
    if T:
        U = n_tail * n_kt
        assert set(sizes) <= {U // T, -(-U // T)}
        table = SK.piece_table(n_full, n_tail, T, n_kt)
        for u, slots in enumerate(table):
            if not slots:  # a tail tile one CTA ran whole (U / T close to n_kt): written to O, not merged
                assert seen[(n_full + u, 0)] == seen[(n_full + u, n_kt - 1)]
                continue
            starts = []
            for slot in slots:
                tile, b, e = SK.host_segments(n_full + slot // 2, n_full, n_tail, T, n_kt)[slot % 2]
                assert tile == n_full + u
                starts.append((b, e))
            assert starts[0][0] == 0 and starts[-1][1] == n_kt
            assert all(starts[i][1] == starts[i + 1][0] for i in range(len(starts) - 1))


def _loops(sass: str) -> list[int]:
    return sorted(len(x) for x in key_tile_loops(sass))


@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("qk_int8", [True, False], ids=["int8", "e4m3"])
def test_streamk_sass(tmp_path_factory, qk_int8, head_dim):
    r = compile_sass(tmp_path_factory, f"streamk_{qk_int8}_{head_dim}",
                     lambda extra: SK.compile_streamk(head_dim, "bfloat16", fake=True, qk_int8=qk_int8,
                                                      options_extra=extra))
    shipped = compile_sass(tmp_path_factory, f"shipped_{qk_int8}_{head_dim}",
                           lambda extra: functools.partial(K.compile_sm90, qk_int8=qk_int8)(
                               head_dim, "bfloat16", fake=True, options_extra=extra))
    res = r["res"]
    assert res["stack_frame_bytes"] == 0 and res["stack_bytes"] == 0, res
    loops, (ship,) = _loops(r["sass"]), _loops(shipped["sass"])
    print(f"key loops: stream-K {loops}, shipped {ship}")
    assert len(loops) == 2 and all(abs(n - ship) <= 20 for n in loops), (loops, ship)
    assert min(loops) - ship <= 10


def test_merge_under_the_triton_interpreter():
    """``streamk_merge`` on the CPU (its own process: TRITON_INTERPRET is read when triton is imported)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent / "streamk_merge_check.py"
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "TRITON_INTERPRET": "1"})
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert "other rows untouched: True" in r.stdout
