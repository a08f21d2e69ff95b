"""Ctrl-C at several points of a real `ditprof` process: within a few seconds, exit code 130, one line, and no
run folder (nor a staging folder) left behind -- also inside a long torch op that Python cannot interrupt."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = str(Path(__file__).resolve().parents[1])


def _start(tmp_path, *argv):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    return subprocess.Popen([sys.executable, "-m", "ditprof", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)


def _interrupt(proc, after_s: float) -> tuple[int, float, str]:
    time.sleep(after_s)
    assert proc.poll() is None, "the run ended before the interrupt: " + proc.stderr.read()[-2000:]
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("Ctrl-C did not stop the run within 30 s") from None
    return proc.returncode, time.monotonic() - t0, err


def _wait_for(proc, marker: str, timeout: float = 120.0) -> None:
    t0 = time.monotonic()
    for line in proc.stdout:
        if marker in line:
            return
        if time.monotonic() - t0 > timeout:
            break
    raise AssertionError(f"never saw {marker!r}: " + proc.stderr.read()[-2000:])


def _no_run_left(tmp_path: Path, out: Path) -> None:
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.staging-")]


def test_interrupt_during_import(tmp_path):
    """The first second is spent importing torch and diffusers: no KeyboardInterrupt traceback."""
    out = tmp_path / "run"
    proc = _start(tmp_path, "profile", "--preset", "wan-tiny", "--device", "cpu", "--out", str(out))
    rc, took, err = _interrupt(proc, 0.8)
    assert rc == 130 and err.strip().splitlines() == ["ditprof: interrupted"], err[-2000:]
    assert took < 10
    _no_run_left(tmp_path, out)


def test_deferred_holds_ctrl_c_until_the_block_ends():
    """interrupt.deferred: a SIGINT inside the block raises nothing there, KeyboardInterrupt at its end, and the
    previous handler is back; without a signal the block ends normally. In a child process (no watchdog here)."""
    code = (
        "import os, signal, time\n"
        "from ditprof import interrupt\n"
        "before = signal.getsignal(signal.SIGINT)\n"
        "with interrupt.deferred():\n"
        "    pass\n"
        "steps = []\n"
        "try:\n"
        "    with interrupt.deferred():\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        time.sleep(0.2)\n"
        "        steps.append('inside')\n"
        "except KeyboardInterrupt:\n"
        "    steps.append('raised at the end')\n"
        "assert signal.getsignal(signal.SIGINT) is before, 'handler not restored'\n"
        "print(steps)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "['inside', 'raised at the end']"


@pytest.mark.parametrize("after_plan_s", [0.0, 4.0])
def test_interrupt_inside_a_long_torch_op(tmp_path, after_plan_s):
    """A wan-tiny block at 120k tokens: each call is one long SDPA op (seconds on a CPU) that Python cannot
    interrupt; the watchdog ends the process a few seconds after Ctrl-C, removing the staging folder. Sent right
    after the plan (loading) and a little later (inside the warm-up call)."""
    out = tmp_path / "run"
    proc = _start(tmp_path, "profile", "--preset", "wan-tiny", "--device", "cpu", "--tokens", "120000", "--yes",
                  "--warmup", "1", "--iters", "1", "--out", str(out))
    _wait_for(proc, "plan: ~")
    rc, took, err = _interrupt(proc, after_plan_s)
    assert rc == 130, err[-2000:]
    assert err.strip().splitlines()[-1] == "ditprof: interrupted" and "Traceback" not in err, err[-2000:]
    assert took < 3.0 + 5.0  # the grace period plus slack for a loaded CI box
    _no_run_left(tmp_path, out)


def test_interrupt_while_profiling_a_short_block(tmp_path):
    """Many short calls (the profiling loop): the KeyboardInterrupt lands between ops, the staged run is removed.
    float32: on a CPU without AVX-512 bf16 support torch's bf16 matmul runs at ~1 GFLOP/s, and the plan would
    refuse the run as hours long. --yes: on a slow or loaded CI box even float32 is estimated over the 15 min limit
    (the run is interrupted after seconds anyway)."""
    out = tmp_path / "run"
    proc = _start(tmp_path, "compare", "--preset", "h3-mini", "--device", "cpu", "--dtype", "float32", "--iters",
                  "200", "--warmup", "1", "--yes", "--out", str(out))
    _wait_for(proc, "plan: ~")
    rc, took, err = _interrupt(proc, 6.0)
    assert rc == 130 and "Traceback" not in err, err[-2000:]
    assert took < 8.0
    _no_run_left(tmp_path, out)
