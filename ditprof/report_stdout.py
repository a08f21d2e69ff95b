"""``--json`` commands: stdout carries the report alone.

While the command runs, whatever else would reach stdout goes to stderr instead: Python writes (``print``, a rich
console made for stdout, a progress bar) through ``sys.stdout``, and writes from C and C++ code (CUDA libraries,
compilers) and from child processes through descriptor 1, pointed at descriptor 2's file meanwhile. The report
is written after that, onto the real stdout. Every layer may use it (it imports nothing of ditprof).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from typing import Iterator


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _flush_c_stdio() -> None:
    """Flush the C library's stdio buffers, so that text C code buffered for stdout is not written after the
    descriptor is given back."""
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):  # no C library to load (an unusual platform): nothing buffered there
        pass


@contextlib.contextmanager
def stdout_to_stderr(enabled: bool = True) -> Iterator[None]:
    """Inside: stdout writes go to stderr (``enabled=False``: nothing changes). Outside again, stdout is stdout."""
    if not enabled:
        yield
        return
    out, err = sys.stdout, sys.stderr
    out.flush()
    saved = None
    if _is_open(1) and _is_open(2):  # C code writes to descriptor 1 whatever sys.stdout is
        _flush_c_stdio()
        saved = os.dup(1)
        os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(err):
            yield
    finally:
        err.flush()
        if saved is not None:
            _flush_c_stdio()
            os.dup2(saved, 1)
            os.close(saved)
