"""Run one test of a test file again in a subprocess under the Triton interpreter (CPU checks of the Triton
kernels): TRITON_INTERPRET must be set before triton is imported, so it cannot be switched on in this process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
INNER_FLAG = "DITPROF_PREP_INTERP_INNER"  # set in the subprocess: the inner tests run only there


def inner_only():
    """Marks a test that only the subprocess runs."""
    return pytest.mark.skipif(os.environ.get(INNER_FLAG) != "1", reason="run by the interpreter test")


def run_under_interpreter(test_file: str, test_name: str) -> None:
    """Run ``test_file::test_name`` with TRITON_INTERPRET=1; fails with the subprocess's output tail unless it
    passed without skips. Skipped here where CUDA is present (the GPU tests run the compiled kernels)."""
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the gpu tests run the compiled kernels")
    env = dict(os.environ, TRITON_INTERPRET="1", **{INNER_FLAG: "1"})
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    path = Path(test_file).resolve()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", f"{path}::{test_name}",
           "-k", test_name]
    r = subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    tail = (r.stdout + r.stderr)[-4000:]
    assert r.returncode == 0, tail
    assert " passed" in r.stdout and " skipped" not in r.stdout, tail
