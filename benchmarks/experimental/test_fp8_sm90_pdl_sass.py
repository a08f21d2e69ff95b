"""CPU check of the PDL build of fp8-sm90 (``fp8_fwd_sm90_pdl.py``): its SASS is the shipped kernel's plus the
grid-dependency wait (one more instruction, ahead of the first global load), no local memory.

    python -m pytest -q benchmarks/experimental/test_fp8_sm90_pdl_sass.py
"""

from __future__ import annotations

import functools
import re
from collections import Counter

import pytest

pytest.importorskip("cutlass")

import fp8_fwd_sm90_pdl as PDL
from sass_helpers import compile_sass

from ditprof.kernels import fp8_fwd_sm90 as K


def _ops(sass: str) -> list[str]:
    return [m.group(1).split()[0] for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", sass)]


@pytest.mark.parametrize("qk_int8", [True, False], ids=["int8", "e4m3"])
def test_pdl_build_is_the_shipped_kernel_plus_the_wait(tmp_path_factory, qk_int8):
    a = compile_sass(tmp_path_factory, f"pdl_{qk_int8}", lambda extra: PDL.compile_pdl(
        128, "bfloat16", fake=True, qk_int8=qk_int8, options_extra=extra))
    b = compile_sass(tmp_path_factory, f"shipped_{qk_int8}", lambda extra: functools.partial(
        K.compile_sm90, qk_int8=qk_int8)(128, "bfloat16", fake=True, options_extra=extra))
    assert a["res"]["stack_frame_bytes"] == 0 and a["res"]["stack_bytes"] == 0
    ops_a, ops_b = _ops(a["sass"]), _ops(b["sass"])
    extra, missing = Counter(ops_a) - Counter(ops_b), Counter(ops_b) - Counter(ops_a)
    assert extra == Counter({"ACQBULK": 1}), extra  # griddepcontrol.wait
    assert set(missing) <= {"NOP"}, missing  # alignment padding only
    wait = ops_a.index("ACQBULK")
    first_read = min(i for i, op in enumerate(ops_a) if op.startswith(("LDG", "UTMALDG")))
    assert wait < first_read, (wait, first_read)
