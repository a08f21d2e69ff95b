"""Compile-only checks of the FP8 mma.sync attention kernel (CPU is enough: CuTe DSL compiles for any arch)."""

import os
import re
import tempfile

import pytest

pytest.importorskip("cutlass")

from ditprof.errors import DitprofError  # noqa: E402
from ditprof.kernels.inspect_sass import KNOWN_KERNELS, inspect_kernel, sass_opcodes  # noqa: E402

_CACHE = {}


def _inspect(arch):
    if arch not in _CACHE:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "k.sass")
            r = inspect_kernel("fp8-sm120", arch, keep_sass=path, qk_format="e4m3")
            r["sass"] = open(path).read()
        _CACHE[arch] = r
    return _CACHE[arch]


def _qmma_accumulators(sass: str) -> list:
    """The C operand (accumulator input) of every QMMA in the SASS: ``RZ`` or a register."""
    return re.findall(r"QMMA\.[\w.]+\s+R\d+,\s*R\d+[\w.]*,\s*R\d+[\w.]*,\s*(R\w+)", sass)


@pytest.mark.parametrize("arch", ["sm_120a", "sm_89"])
def test_native_qmma_no_spills(arch):
    r = _inspect(arch)
    assert r["kernel"] == "fp8-sm120" and r["arch"] == arch
    ins = r["instructions"]
    # 2 strip bodies (steady state + masked tail) x (QK: 2 m x 4 n x 4 k + PV: 2 m x 16 n)
    assert ins["QMMA"] == 128, ins
    assert ins["HMMA"] == 0
    assert r["spill_bytes"] == 0
    assert ins["STL"] == 0 and ins["LDL"] == 0
    assert r["stack_frame_bytes"] == 0
    assert 0 < r["registers"] <= 255
    assert ins["LDSM"] > 0 and ins["LDGSTS"] > 0
    assert r["smem_bytes"] >= 32768
    for key in ("registers", "spill_bytes", "smem_bytes", "compile_s", "instructions"):
        assert key in r


@pytest.mark.parametrize("arch", ["sm_120a", "sm_89"])
def test_pv_mma_starts_from_zero(arch):
    """Two-level accumulation (issue 18): no P V QMMA accumulates into O (on sm_89 / sm_120 its f32 accumulator keeps
    ~13 mantissa bits); each reads RZ as C and its products are added to O in FP32.  The RZ count: 2 strip bodies x
    (32 P V mmas + the first k-step of S, 2 m x 4 n); only those 16 read RZ with O accumulated in the mma."""
    acc = _qmma_accumulators(_inspect(arch)["sass"])
    assert len(acc) == 128, acc
    assert acc.count("RZ") == 80, acc


def test_qmma_accumulator_parser():
    text = """
        /*2470*/                   QMMA.16832.F32.E4M3.E4M3 R8, R124, R20, RZ ;
        /*25c0*/                   QMMA.16832.F32.E4M3.E4M3 R16, R128, R20.reuse, R16 ;
        /*26a0*/                   QMMA.16832.F32.E4M3.E4M3 R8, R84.ROW, R18.COL, RZ ;
    """
    assert _qmma_accumulators(text) == ["RZ", "R16", "RZ"]


def test_sm90_is_emulated():
    r = _inspect("sm_90a")
    assert r["instructions"]["QMMA"] == 0
    assert r["instructions"]["HMMA"] > 0


def test_unknown_kernel_and_arch():
    with pytest.raises(DitprofError):
        inspect_kernel("nope", "sm_120a")
    with pytest.raises(DitprofError):
        inspect_kernel("fp8-sm120", "sm_80")
    assert "fp8-sm120" in KNOWN_KERNELS


def test_sass_parser():
    text = """
        /*0000*/                   LDC R1, c[0x0][0x37c] ;
        /*13e0*/                   LDSM.16.M88.4 R176, [R204+UR6] ;
        /*1400*/              @!P0 BRA `(.L_x_0) ;
        /*1410*/                   QMMA.16832.F32.E4M3.E4M3 R4, R8, R12, R4 ;
    """
    base, full = sass_opcodes(text)
    assert base == {"LDC": 1, "LDSM": 1, "BRA": 1, "QMMA": 1}
    assert full["QMMA.16832.F32.E4M3.E4M3"] == 1
