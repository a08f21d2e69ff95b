"""ditprof.report_stdout: while a --json command runs, stdout writes (Python's and C code's) go to stderr."""

from __future__ import annotations

import os
import sys

from ditprof.report_stdout import stdout_to_stderr


def test_python_and_descriptor_writes_go_to_stderr_inside_only(capfd):
    print("before")
    with stdout_to_stderr():
        print("python inside")
        sys.stdout.flush()
        os.write(1, b"descriptor inside\n")
    print("after")
    cap = capfd.readouterr()
    assert cap.out == "before\nafter\n"
    assert "python inside" in cap.err and "descriptor inside" in cap.err


def test_disabled_changes_nothing(capfd):
    with stdout_to_stderr(False):
        print("kept")
        sys.stdout.flush()
        os.write(1, b"kept too\n")
    cap = capfd.readouterr()
    assert cap.out == "kept\nkept too\n" and cap.err == ""


def test_stdout_without_a_descriptor(capsys):
    """A stdout with no file descriptor (pytest's capsys, an io.StringIO): the Python-level switch alone."""
    with stdout_to_stderr():
        print("inside")
    print("outside")
    cap = capsys.readouterr()
    assert cap.out == "outside\n" and cap.err == "inside\n"
