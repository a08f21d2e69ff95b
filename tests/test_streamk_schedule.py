"""The stream-K tail's schedule (``ditprof.kernels.streamk_schedule``, the formula the kernel runs on its Int32s):
full CTAs run whole work tiles in the plain grid's order; the tail's (tile, key tile) units are each covered exactly
once, every tail CTA gets floor or ceil of U / T units in one or two non-empty segments; each tail tile's pieces are
listed in key order (none for a tail tile one CTA ran whole); ``streamk_plan`` takes only few-round grids."""

from __future__ import annotations

import pytest

from ditprof.kernels import streamk_schedule as S


@pytest.mark.parametrize("n_tiles,n_sms,n_kt", [(576, 132, 29), (8848, 132, 190), (1248, 132, 39), (12, 5, 7),
                                                (7, 3, 2), (131, 132, 5), (10, 4, 1), (264, 132, 9), (6, 132, 7)])
def test_schedule_covers_the_tail_once(n_tiles, n_sms, n_kt):
    n_full, n_tail, T = S.plan(n_tiles, n_sms, n_kt)
    assert n_full + n_tail == n_tiles
    if n_tiles % n_sms == 0 or n_kt == 1:
        assert (n_tail, T) == (0, 0)
    else:
        assert n_tail == n_tiles % n_sms and T == min(n_sms, n_tail * n_kt) and T > n_tail
    for c in range(n_full):
        assert S.host_segments(c, n_full, n_tail, T, n_kt) == [(c, 0, n_kt)]
    seen = {}
    sizes = []
    for c in range(n_full, n_full + T):
        segs = S.host_segments(c, n_full, n_tail, T, n_kt)
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
        table = S.piece_table(n_full, n_tail, T, n_kt)
        for u, slots in enumerate(table):
            if not slots:  # a tail tile one CTA ran whole (U / T close to n_kt): written to O, not merged
                assert seen[(n_full + u, 0)] == seen[(n_full + u, n_kt - 1)]
                continue
            starts = []
            for slot in slots:
                tile, b, e = S.host_segments(n_full + slot // 2, n_full, n_tail, T, n_kt)[slot % 2]
                assert tile == n_full + u
                starts.append((b, e))
            assert starts[0][0] == 0 and starts[-1][1] == n_kt
            assert all(starts[i][1] == starts[i + 1][0] for i in range(len(starts) - 1))


def test_plan_rejects_empty_problems():
    with pytest.raises(ValueError, match="must be >= 1"):
        S.plan(0, 132, 5)


def test_streamk_plan_takes_few_round_grids_only():
    # Flux 1024^2 (1,24,4608,128), 160-key tiles, H200: 576 tiles = 4 rounds + 48
    assert S.streamk_plan(1, 24, 4608, 4608, 160, 132) == (528, 48, 132, 29)
    # LTX (1,32,7392,64), 192-key tiles: 1248 tiles = 9 rounds + 60
    assert S.streamk_plan(1, 32, 7392, 7392, 192, 132) == (1188, 60, 132, 39)
    # H3 (1,56,30272,128): 8848 tiles = 67 rounds + 4: the plain grid
    assert S.streamk_plan(1, 56, 30272, 30272, 160, 132) is None
    # whole rounds: nothing to spread
    assert S.streamk_plan(1, 22, 4608, 4608, 160, 132) is None  # 24 x 22 = 528 = 4 x 132
    # fewer tiles than SMs (6 tiles of 192 rows per head): the plain grid; with 5 SMs, 2 rounds and a tail
    assert S.streamk_plan(1, 2, 1000, 1000, 160, 132) is None
    assert S.streamk_plan(1, 2, 1000, 1000, 160, 5) == (10, 2, 5, 7)
    # the round limit itself: MAX_ROUNDS full rounds still take the tail, one more does not
    per_round = 132 * S.TILE_M
    assert S.streamk_plan(1, 1, S.MAX_ROUNDS * per_round + 1, 4608, 160, 132) is not None
    assert S.streamk_plan(1, 1, (S.MAX_ROUNDS + 1) * per_round + 1, 4608, 160, 132) is None
