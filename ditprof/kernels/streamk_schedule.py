"""The stream-K tail's schedule (``fp8_fwd_sm90_streamk``), in plain Python: the kernel runs ``segments`` on its
Int32s (with cutlass.min / max), the host builds the merge's table and decides where the tail is used with the same
formula. No GPU or CuTe DSL needed (tests run it on the CPU)."""

from __future__ import annotations

TILE_M = 192  # query rows per work tile (fp8-sm90's 3 consumer warpgroups x 64)
MIN_ROUNDS, MAX_ROUNDS = 1, 16  # full rounds outside which the plain grid is kept (streamk_plan)


def plan(n_tiles: int, n_sms: int, n_kt: int) -> tuple[int, int, int]:
    """(n_full, n_tail, T) for ``n_tiles`` work tiles of ``n_kt`` key tiles on ``n_sms`` SMs: the last, partial
    round's n_tail tiles spread over T = n_sms tail CTAs (at most one unit each: T <= n_tail n_kt). Whole rounds,
    or one tile per SM at most: no tail (n_full = n_tiles, n_tail = 0, T = 0)."""
    if n_tiles < 1 or n_sms < 1 or n_kt < 1:
        raise ValueError(f"n_tiles, n_sms and n_kt must be >= 1, got {n_tiles}, {n_sms}, {n_kt}")
    n_tail = n_tiles % n_sms
    if n_tail == 0 or n_kt == 1:
        return n_tiles, 0, 0
    return n_tiles - n_tail, n_tail, min(n_sms, n_tail * n_kt)


def segments(cta, n_full, n_tail, n_ctas_tail, n_kt, mn=min, mx=max):
    """(tile, begin0, end0, end1) of CTA ``cta``: the first segment is key tiles [begin0, end0) of work tile
    ``tile``; the second (when end1 > 0) key tiles [0, end1) of tile + 1. Branch-free; ``mn`` / ``mx`` are
    ``cutlass.min`` / ``cutlass.max`` in the kernel and the builtins in the host model."""
    rel = mx(cta - n_full, 0)  # the tail index (0 for every full CTA)
    is_tail = mn(mx(cta + 1 - n_full, 0), 1)
    units = n_tail * n_kt
    t_div = mx(n_ctas_tail, 1)
    lo_tail = n_full * n_kt + rel * units // t_div
    hi_tail = n_full * n_kt + (rel + 1) * units // t_div
    lo = cta * n_kt + is_tail * (lo_tail - cta * n_kt)
    hi = lo + n_kt + is_tail * (hi_tail - lo_tail - n_kt)
    tile = lo // n_kt
    begin0 = lo - tile * n_kt
    end0 = mn(hi - tile * n_kt, n_kt)
    end1 = mx(hi - (tile + 1) * n_kt, 0)
    return tile, begin0, end0, end1


def host_segments(cta: int, n_full: int, n_tail: int, n_ctas_tail: int, n_kt: int) -> list[tuple[int, int, int]]:
    """The (tile, begin, end) segments of CTA ``cta`` (host model of the kernel's schedule)."""
    tile, b0, e0, e1 = segments(cta, n_full, n_tail, n_ctas_tail, n_kt)
    return [(tile, b0, e0)] + ([(tile + 1, 0, e1)] if e1 > 0 else [])


def piece_table(n_full: int, n_tail: int, n_ctas_tail: int, n_kt: int) -> list[list[int]]:
    """For each tail tile u (work tile n_full + u): the workspace slots 2 c' + segment of its pieces, in key order."""
    table: list[list[int]] = [[] for _ in range(n_tail)]
    for c in range(n_ctas_tail):
        for s, (tile, b, e) in enumerate(host_segments(n_full + c, n_full, n_tail, n_ctas_tail, n_kt)):
            if not (b == 0 and e == n_kt):  # a whole tile is written to O directly (never in a tail: T > n_tail)
                table[tile - n_full].append(2 * c + s)
    return table


def work_coords(t, n_m, heads):
    """(m_block, head, batch) of work tile t in the shipped grid's order: m_block fastest, then head, then batch."""
    rest = t // n_m
    return t - rest * n_m, rest % heads, rest // heads


def streamk_plan(batch: int, heads: int, sq: int, sk: int, tile_n: int, n_sms: int) -> tuple[int, int, int, int] | None:
    """(n_full, n_tail, T, n_kt) of an attention problem (``tile_n`` keys per key tile) on ``n_sms`` SMs, or None
    where the plain grid is kept: no partial round; more than ``MAX_ROUNDS`` full rounds (the partial round is then
    a few per cent of the kernel at most; the H3 shape, 67 rounds, measured within noise either way); or fewer than
    ``MIN_ROUNDS`` (a problem smaller than the GPU: all of it split, never measured, and its host cost is the merge
    launch on top of the call's few microseconds of GPU work)."""
    n_kt = -(-sk // tile_n)
    n_tiles = -(-sq // TILE_M) * heads * batch
    n_full, n_tail, n_ctas_tail = plan(n_tiles, n_sms, n_kt)
    if n_tail == 0 or not MIN_ROUNDS <= n_full // n_sms <= MAX_ROUNDS:
        return None
    return n_full, n_tail, n_ctas_tail, n_kt


__all__ = ["MAX_ROUNDS", "MIN_ROUNDS", "TILE_M", "host_segments", "piece_table", "plan", "segments", "streamk_plan",
           "work_coords"]
