"""CPU checks of the O store in fp8-sm90's epilogue (the shipped 16-byte stores; ``fp8_fwd_sm90_store.py``'s
``u16`` and ``b32`` for comparison):

- the quad transpose, simulated on four lanes (select and butterfly shuffle replaced by numpy): lane q ends with
  the words of column block q of every lane, in lane order;
- compile-only (sm_90a; INT8 and e4m3 Q/K; head_dim 128 and 64): ``store="b128"`` is the shipped kernel byte for
  byte, which stores O in head_dim / 16 ``STG.E.128`` per thread; ``u16`` / ``b32`` in head_dim / 2 16-bit /
  head_dim / 4 32-bit stores; the key-tile loop has the same opcodes as often, no local memory.

    python -m pytest -q benchmarks/experimental/test_fp8_sm90_store_sass.py
"""

from __future__ import annotations

import functools
import re
from collections import Counter

import numpy as np
import pytest

pytest.importorskip("cutlass")

import fp8_fwd_sm90_store as ST
from sass_helpers import compile_sass, key_tile_loop

from ditprof.kernels import fp8_fwd_sm90 as K

_CACHE: dict = {}


def test_quad_transpose_simulated(monkeypatch):
    lanes = np.arange(4)
    rng = np.random.default_rng(0)
    x = [rng.integers(0, 2**31, size=4) for _ in range(4)]  # x[p][q]: word p of lane q
    monkeypatch.setattr(K.cutlass, "select_", lambda c, a, b: np.where(c, a, b))
    monkeypatch.setattr(K.cute.arch, "shuffle_sync_bfly", lambda v, offset: v[lanes ^ offset])
    y = K.quad_transpose(x, lanes)
    for p in range(4):
        for q in range(4):
            assert y[p][q] == x[q][p], (p, q)


def _compiled(tmp_path_factory, store: str, qk_int8: bool, head_dim: int) -> dict:
    key = (store, qk_int8, head_dim)
    if key not in _CACHE:
        if store == "shipped":
            fn = functools.partial(K.compile_sm90, qk_int8=qk_int8)
        else:
            fn = functools.partial(ST.compile_store, store=store, qk_int8=qk_int8)
        r = compile_sass(tmp_path_factory, f"{store}_{qk_int8}_{head_dim}",
                         lambda extra: fn(head_dim, "bfloat16", fake=True, options_extra=extra))
        tile_n = K.config_for("sm_90a", head_dim).tile_n
        _CACHE[key] = {**r, "loop": key_tile_loop(r["sass"], rf"[QI]GMMA\.64x{tile_n}")}
    return _CACHE[key]


def _code(sass: str) -> list[str]:
    """The instructions of a dump, without addresses, encodings or the kernel's (class-dependent) name."""
    return [m.group(1).strip() for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", sass)]


@pytest.mark.parametrize("qk_int8", [True, False], ids=["int8", "e4m3"])
def test_b128_is_the_shipped_kernel(tmp_path_factory, qk_int8):
    a = _compiled(tmp_path_factory, "b128", qk_int8, 128)
    b = _compiled(tmp_path_factory, "shipped", qk_int8, 128)
    assert _code(a["sass"]) == _code(b["sass"])


@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("qk_int8", [True, False], ids=["int8", "e4m3"])
def test_shipped_stores_o_in_16_bytes(tmp_path_factory, qk_int8, head_dim):
    r = _compiled(tmp_path_factory, "shipped", qk_int8, head_dim)
    full, res = r["full"], r["res"]
    assert res["stack_frame_bytes"] == 0 and res["stack_bytes"] == 0, res
    assert full.get("STG.E.128", 0) == head_dim // 16, full
    assert full.get("STG.E.U16", 0) == 0 and full.get("STG.E", 0) == 2, full  # 2: the LSE stores (2 rows)


@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("qk_int8", [True, False], ids=["int8", "e4m3"])
@pytest.mark.parametrize("store", ["u16", "b32"])
def test_narrow_store_sass(tmp_path_factory, store, qk_int8, head_dim):
    r = _compiled(tmp_path_factory, store, qk_int8, head_dim)
    shipped = _compiled(tmp_path_factory, "shipped", qk_int8, head_dim)
    full, res = r["full"], r["res"]
    assert res["stack_frame_bytes"] == 0 and res["stack_bytes"] == 0, res
    assert full.get("STG.E.128", 0) == 0, full
    if store == "u16":
        assert full.get("STG.E.U16", 0) == head_dim // 2 and full.get("STG.E", 0) == 2, full
    else:
        assert full.get("STG.E.U16", 0) == 0 and full.get("STG.E", 0) == 2 + head_dim // 4, full
    # the key loop: the same opcodes, each as often (the epilogue moves the register allocation and, at some
    # configurations, the order of a few instructions)
    assert Counter(x.split()[0] for x in r["loop"]) == Counter(x.split()[0] for x in shipped["loop"])
