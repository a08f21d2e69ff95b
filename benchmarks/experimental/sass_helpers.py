"""What the compile-only (CPU) SASS tests of the fp8-sm90 variants share: compile a kernel with ``--keep-cubin`` into a
fresh tmp dir, disassemble the newest cubin with nvdisasm, count its opcodes and read its resources; and find the
key-tile loop in the SASS. (The experimental ``conftest.py`` puts this folder on ``sys.path``.)"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import time

import pytest

from ditprof.errors import DitprofError
from ditprof.kernels.inspect_sass import cubin_resources, find_nvdisasm, loop_bodies, sass_opcodes


def nvdisasm_or_skip() -> str:
    """nvdisasm's path; the test is skipped without it."""
    try:
        return find_nvdisasm()
    except DitprofError as exc:
        pytest.skip(str(exc))


def compile_sass(tmp_path_factory, dirname: str, compile_call, nvdisasm: str | None = None) -> dict:
    """``compile_call(options_extra)`` compiles the kernel with the given extra options (``--keep-cubin --dump-dir
    D``, D a fresh tmp dir named after ``dirname``); the newest cubin there, disassembled. nvdisasm: found (or the
    test skipped) before compiling unless given. {"sass", "base" and "full" (``sass_opcodes``), "res"
    (``cubin_resources``), "compile_s"}."""
    nvdisasm = nvdisasm or nvdisasm_or_skip()
    d = str(tmp_path_factory.mktemp(dirname))
    t0 = time.perf_counter()
    compile_call(f"--keep-cubin --dump-dir {d}")
    dt = time.perf_counter() - t0
    cubins = glob.glob(os.path.join(d, "*.cubin"))
    assert cubins, "no cubin written"
    cubin = max(cubins, key=os.path.getmtime)
    sass = subprocess.run([nvdisasm, "-c", cubin], capture_output=True, text=True, check=True).stdout
    base, full = sass_opcodes(sass)
    return {"sass": sass, "base": base, "full": full, "res": cubin_resources(cubin), "compile_s": dt}


def key_tile_loops(sass: str, qk_wgmma: str = r"[QI]GMMA\.64x160") -> list[list[str]]:
    """Every key-tile loop: a backward-branch range holding a Q K^T wgmma (an instruction matching the regex
    ``qk_wgmma``), >= 80 exps (one 160-key tile's) and no global store (the work-tile loop and the mbarrier retry
    branches hold more)."""
    return [body for body in loop_bodies(sass)
            if any(re.search(qk_wgmma, x) for x in body) and sum("MUFU.EX2" in x for x in body) >= 80
            and not any("STG" in x for x in body)]


def key_tile_loop(sass: str, qk_wgmma: str = r"[QI]GMMA\.64x160") -> list[str]:
    """The instructions of the key-tile loop: the smallest of ``key_tile_loops``."""
    loops = key_tile_loops(sass, qk_wgmma)
    assert loops, "no key-tile loop found"
    return min(loops, key=len)
