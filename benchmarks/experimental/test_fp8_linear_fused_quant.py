"""fp8_linear_fused_quant's activation quantize kernel against torchao's numerics (``kernels.fp8_linear``), under the
Triton interpreter in a subprocess (TRITON_INTERPRET must be set before triton is imported)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_quantize_kernel_matches_torchao_numerics_under_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, str(HERE / "fp8_linear_fused_quant.py"), "--check-only"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "116408 elements bit for bit" in proc.stdout, proc.stdout
