"""Help texts are built from the lists the commands run, so they cannot drift from what a run does."""

from __future__ import annotations

import subprocess
import sys


def _help(*argv: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "ditprof.cli", *argv, "--help"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return " ".join(proc.stdout.split())  # argparse wraps lines; compare on single spaces


def test_kernels_accuracy_help_names_the_families_it_runs():
    from ditprof.kernels import accuracy

    text = _help("kernels")
    assert f"{len(accuracy.FAMILIES)} input families" in text
    for family in accuracy.FAMILIES:
        assert family in text
    shapes = _help("kernels", "accuracy")
    for device in ("cpu", "cuda"):
        assert f"{','.join(map(str, accuracy.DEFAULT_SHAPE[device]))} on {device}" in shapes


def test_backends_says_no_for_cuda_without_cuda():
    import torch

    from ditprof.harness.swaps import backends

    if torch.cuda.is_available():
        import pytest

        pytest.skip("this machine has CUDA")
    for name in ("sdpa", "fp8-emulated", "sdpa-math"):
        ok, reason = backends.availability(name, "cuda")
        assert not ok and "CUDA is not available" in reason, reason
    assert backends.availability("sdpa", "cpu")[0]
    from ditprof.kernels import registry

    for name in ("sdpa", "fp8-emulated"):  # the kernels' own list (`ditprof kernels list`) says the same
        assert not registry.available(name, "cuda")[0]
