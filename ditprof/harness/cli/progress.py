"""Progress for long work: a rich bar on a terminal; elsewhere (a log file, CI, a pipe) one line per phase and at
most one every ``EVERY_S`` seconds, each with the elapsed time and an ETA."""

from __future__ import annotations

import time
from typing import Any

EVERY_S = 10.0


def make_progress(console) -> Any:
    """A ``rich.progress.Progress`` (transient) on a terminal, else a ``LineProgress`` with the same methods."""
    if console is not None and console.is_terminal:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console, transient=True)
    return LineProgress(console)


def _dur(s: float) -> str:
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"


class LineProgress:
    """The subset of rich's Progress the commands use, as plain lines."""

    def __init__(self, console, clock=time.monotonic):
        self.console, self.clock = console, clock
        self.t0 = clock()
        self.tasks: dict[int, dict] = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def _line(self, task: dict, force: bool) -> None:
        now = self.clock()
        if not force and now - task["printed"] < EVERY_S:
            return
        task["printed"] = now
        done, total = task["completed"], task["total"]
        count = f" {done:g}/{total:g}" if total else ""
        eta = ""
        if total and 0 < done < total:
            eta = f", ETA {_dur((now - task['start']) / done * (total - done))}"
        elif total and done >= total:
            eta = f", done in {_dur(now - task['start'])}"
        text = f"[{_dur(now - self.t0):>8}] {task['description']}{count}{eta}"
        if self.console is not None:
            self.console.print(text, highlight=False, markup=False)

    def add_task(self, description: str, total: float | None = None, **_: Any) -> int:
        tid = len(self.tasks)
        now = self.clock()
        self.tasks[tid] = {"description": description, "total": total or 0, "completed": 0, "start": now,
                           "printed": now}
        self._line(self.tasks[tid], force=True)
        return tid

    def update(self, task_id: int, *, completed: float | None = None, total: float | None = None,
               description: str | None = None, advance: float | None = None, **_: Any) -> None:
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
