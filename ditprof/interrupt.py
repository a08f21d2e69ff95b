"""Ctrl-C that works even inside a long torch op.

Python runs its SIGINT handler only between bytecodes, so a KeyboardInterrupt waits for a running aten op (a
minute-long attention call on a CPU) to return. ``install`` keeps the normal KeyboardInterrupt (the CLI turns it
into one line and exit code 130, and ``atomic.staged_dir`` removes the half-written run) and adds a watchdog: the
C-level signal handler writes to a wakeup pipe at once, a thread reading it gives the main thread ``GRACE_S``
seconds, then removes the staging folders still open and exits 130 itself.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import threading
from pathlib import Path

GRACE_S = 3.0
_staging: set[Path] = set()  # run folders being written (atomic.staged_dir registers them)
_lock = threading.Lock()
_finished = threading.Event()  # the main thread has reported the interrupt itself


def register_staging(path: Path) -> None:
    with _lock:
        _staging.add(Path(path))


def unregister_staging(path: Path) -> None:
    with _lock:
        _staging.discard(Path(path))


def report_interrupt() -> None:
    """The one line for an interrupt (once, from whichever thread gets there first)."""
    with _lock:
        if _finished.is_set():
            return
        _finished.set()
    sys.stderr.write("ditprof: interrupted\n")
    sys.stderr.flush()


def _hard_exit() -> None:
    with _lock:
        folders = list(_staging)
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    report_interrupt()
    os._exit(130)


def _watch(fd: int) -> None:
    while True:
        try:
            data = os.read(fd, 64)
        except OSError:
            return
        if not data:
            return
        if signal.SIGINT in data:
            if not _finished.wait(GRACE_S):  # the main thread did not get out in time: a long op holds it
                _hard_exit()
            return


def install() -> bool:
    """Arm the watchdog (main thread only; a no-op elsewhere or when already armed). Returns whether armed."""
    if threading.current_thread() is not threading.main_thread() or getattr(install, "armed", False):
        return False
    try:
        r, w = os.pipe()
        os.set_blocking(w, False)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except (ValueError, OSError):
        return False
    threading.Thread(target=_watch, args=(r,), name="ditprof-interrupt", daemon=True).start()
    install.armed = True  # type: ignore[attr-defined]
    return True


@contextlib.contextmanager
def deferred():
    """Hold a Ctrl-C back until the block ends, then raise it (main thread; elsewhere a plain block).

    For importing torch: a KeyboardInterrupt raised in Python code that an extension module's initialisation
    calls (numpy's, torch's operator registration through pybind11) can abort the process ("terminate called after
    throwing ... error_already_set") or leave a half-initialised module behind, so that the next import fails
    ("cannot load module more than once per process") and the run ends with a traceback instead of one line. The
    watchdog still sees the signal: an import that outlasts ``GRACE_S`` after it ends the process as usual."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pending:
        raise KeyboardInterrupt
