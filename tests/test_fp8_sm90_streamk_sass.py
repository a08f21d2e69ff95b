"""Compile-only checks of fp8-sm90's stream-K grid (``fp8_fwd_sm90_streamk``; sm_90a, INT8 and e4m3, head_dim 128
and 64; a CPU is enough): no local memory, two key-tile loops (whole tiles and tail segments), each within 10
instructions of the plain kernel's loop (every key-loop instruction is the plain ``attend``'s; the register
allocation moves a few), and the launch spec that asks for it compiles it."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest

pytest.importorskip("cutlass")

from ditprof.kernels import fp8_fwd_sm90 as K  # noqa: E402
from ditprof.kernels import fp8_fwd_sm90_streamk as SK  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "experimental"))
from sass_helpers import compile_sass, key_tile_loops  # noqa: E402


@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("qk_int8", [True, False], ids=["int8", "e4m3"])
def test_streamk_sass(tmp_path_factory, qk_int8, head_dim):
    tile_n = K.config_for("sm_90a", head_dim).tile_n
    r = compile_sass(tmp_path_factory, f"streamk_{qk_int8}_{head_dim}",
                     lambda extra: SK.compile_streamk(head_dim, "bfloat16", fake=True, qk_int8=qk_int8,
                                                      options_extra=extra))
    plain = compile_sass(tmp_path_factory, f"plain_{qk_int8}_{head_dim}",
                         lambda extra: functools.partial(K.compile_sm90, qk_int8=qk_int8)(
                             head_dim, "bfloat16", fake=True, options_extra=extra))
    res = r["res"]
    assert res["stack_frame_bytes"] == 0 and res["stack_bytes"] == 0, res
    wgmma = rf"[QI]GMMA\.64x{tile_n}"
    loops = sorted(len(x) for x in key_tile_loops(r["sass"], wgmma))
    (ship,) = [len(x) for x in key_tile_loops(plain["sass"], wgmma)]
    print(f"key loops: stream-K {loops}, plain {ship}")
    assert len(loops) == 2 and all(abs(n - ship) <= 20 for n in loops), (loops, ship)
    assert min(loops) - ship <= 10


def test_the_streamk_spec_compiles_the_streamk_kernel():
    from ditprof.kernels.compile_cache import KernelSpec, compile_spec

    spec = KernelSpec("fp8-sm90", "sm_90a", 128, "bfloat16", True, False, False, True, streamk=True)
    fn = compile_spec(spec, fake=True)
    assert fn is not None
    with pytest.raises(ValueError, match="no key_lens mode"):
        compile_spec(KernelSpec("fp8-sm90", "sm_90a", 128, "bfloat16", True, True, False, True, streamk=True),
                     fake=True)
    with pytest.raises(ValueError, match="plain grid"):
        compile_spec(KernelSpec("fp8-sm120", "sm_120a", 128, "bfloat16", True, False, False, False, streamk=True),
                     fake=True)


def test_inspect_reports_the_streamk_build(capsys):
    """``ditprof kernels inspect --kernel fp8-sm90 --arch sm_90a --grid stream-K``: native FP8 / INT8 wgmma, no
    spills, the shared memory of the second Q box; key_lens and fp8-sm120 have no stream-K build (one-line errors)."""
    import json

    from ditprof.cli import main
    from ditprof.errors import DitprofError
    from ditprof.kernels.inspect_sass import find_nvdisasm, inspect_kernel

    try:
        find_nvdisasm()
    except DitprofError as exc:
        pytest.skip(str(exc))
    assert main(["kernels", "inspect", "--kernel", "fp8-sm90", "--arch", "sm_90a", "--grid", "stream-K",
                 "--qk-format", "int8", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["grid"] == "stream-K" and r["spill_bytes"] == 0 and r["stack_frame_bytes"] == 0
    assert r["instructions"]["IGMMA"] > 0 and r["instructions"]["QGMMA"] > 0
    assert (r["smem_dynamic_bytes"] == SK.streamk_smem_bytes(128, qk_int8=True)
            == K.smem_bytes(128, qk_int8=True) + 192 * 128)
    with pytest.raises(DitprofError, match="no key_lens variant"):
        inspect_kernel("fp8-sm90", "sm_90a", key_lens=True, grid="stream-K")
    with pytest.raises(DitprofError, match="plain grid only"):
        inspect_kernel("fp8-sm120", "sm_120a", grid="stream-K")
    with pytest.raises(DitprofError, match="unknown grid"):
        inspect_kernel("fp8-sm90", "sm_90a", grid="split-KV")
