"""Progress for long work, for every layer (model_blocks writes checkpoints with it, the harness measures with it):
a rich bar on a terminal; elsewhere (a log file, CI, a pipe) plain lines -- one when a phase starts or ends, and
while a phase runs one at least every ``EVERY_S`` seconds (a heartbeat thread prints the line even when no step
ended in between), each with the elapsed time and an ETA, in human units."""

from __future__ import annotations

import threading
import time
from typing import Any

EVERY_S = 10.0


def human_duration(seconds: float) -> str:
    """``0.42 ms``, ``137 ms``, ``13.7 s``, ``3.3 min``, ``1.2 h``: three significant figures at most."""
    if seconds < 1.0:
        ms = seconds * 1e3
        return f"{ms:.3g} ms" if ms >= 1 else f"{ms:.2g} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _stamp(seconds: float) -> str:
    """The elapsed-time column: ``12.3 s`` up to two minutes, then as ``human_duration``."""
    return f"{seconds:.1f} s" if seconds < 120 else human_duration(seconds)


def human_bytes(n: float) -> str:
    """``512 B``, ``3.0 KiB``, ``24.5 MiB``, ``1.83 GiB``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


QUIET_S = 2.0  # off a terminal, loading and checkpoint writing stay silent when done sooner


def progress_console(enabled: bool = True):
    """The console progress of loading and writing goes to: stderr (stdout may carry ``--json``); None: silent."""
    if not enabled:
        return None
    from rich.console import Console

    return Console(stderr=True)


def make_progress(console, unit: str | None = None, quiet_s: float = 0.0) -> Any:
    """A ``rich.progress.Progress`` (transient) on a terminal, else a ``LineProgress`` with the same methods
    (silent for ``console=None``). ``unit="bytes"``: the bar counts bytes. ``quiet_s``: off a terminal, a task
    prints nothing until it has run that long (a step that is usually quick stays silent when it is)."""
    if console is not None and console.is_terminal:
        from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, SpinnerColumn,
                                   TextColumn, TimeElapsedColumn, TimeRemainingColumn)

        count = (DownloadColumn(), TimeRemainingColumn()) if unit == "bytes" else (MofNCompleteColumn(),
                                                                                  TimeElapsedColumn())
        return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), *count, console=console,
                        transient=True)
    return LineProgress(console, quiet_s=quiet_s)


class LineProgress:
    """The subset of rich's Progress the commands use, as plain lines. ``add_task(..., unit="bytes")`` counts in
    bytes; ``start=`` dates a task from an earlier moment and ``completed=`` starts it part done (a phase whose
    first report comes at its end: one line, "done in")."""

    def __init__(self, console, clock=time.monotonic, heartbeat: bool = True, quiet_s: float = 0.0):
        self.console, self.clock = console, clock
        self.quiet_s = quiet_s
        self.t0 = clock()
        self.tasks: dict[int, dict] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        self._heartbeat = heartbeat

    def __enter__(self):
        if self._heartbeat and self._thread is None:
            self._thread = threading.Thread(target=self._beat, name="ditprof-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
        return False

    def _beat(self) -> None:
        while not self._stop.wait(min(1.0, EVERY_S / 4)):
            self.tick()

    def tick(self) -> None:
        """Print the line of every unfinished task that printed nothing for ``EVERY_S`` (the heartbeat)."""
        with self._lock:
            for task in self.tasks.values():
                if not (task["total"] and task["completed"] >= task["total"]):
                    self._line(task, force=False)

    def _count(self, task: dict, n: float) -> str:
        return human_bytes(n) if task["unit"] == "bytes" else f"{n:g}"

    def _line(self, task: dict, force: bool) -> None:
        now = self.clock()
        if now - task["start"] < self.quiet_s:
            return
        if not force and now - task["printed"] < EVERY_S:
            return
        task["printed"] = now
        done, total = task["completed"], task["total"]
        count = f" {self._count(task, done)}/{self._count(task, total)}" if total else ""
        eta = ""
        if total and 0 < done < total:
            eta = f", ETA {human_duration((now - task['start']) / done * (total - done))}"
        elif total and done >= total:
            eta = f", done in {human_duration(now - task['start'])}"
        elif not total or done == 0:
            eta = f", running {human_duration(now - task['start'])}" if now - task["start"] >= EVERY_S else ""
        text = f"[{_stamp(now - self.t0):>8}] {task['description']}{count}{eta}"
        if self.console is not None:
            self.console.print(text, highlight=False, markup=False, soft_wrap=True)

    def add_task(self, description: str, total: float | None = None, start: float | None = None,
                 unit: str | None = None, completed: float = 0, **_: Any) -> int:
        with self._lock:
            tid = len(self.tasks)
            now = self.clock()
            self.tasks[tid] = {"description": description, "total": total or 0, "completed": completed,
                               "start": now if start is None else start, "printed": now, "unit": unit}
            self._line(self.tasks[tid], force=True)
        return tid

    def update(self, task_id: int, *, completed: float | None = None, total: float | None = None,
               description: str | None = None, advance: float | None = None, **_: Any) -> None:
        with self._lock:
            t = self.tasks[task_id]
            force = description is not None and description != t["description"]
            if description is not None:
                t["description"] = description
            if total is not None:
                t["total"] = total
            before = t["completed"]
            if completed is not None:
                t["completed"] = completed
            if advance:
                t["completed"] += advance
            finished = t["total"] and t["completed"] >= t["total"] > before
            self._line(t, force=force or bool(finished))

    def advance(self, task_id: int, advance: float = 1) -> None:
        self.update(task_id, advance=advance)
