"""Progress when stdout is not a terminal: a line per phase and at most one every 10 s, with elapsed and ETA."""

from rich.console import Console

from ditprof.harness.cli import progress as P


class _Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_line_progress_prints_phases_eta_and_throttles():
    import io

    buf = io.StringIO()
    clock = _Clock()
    prog = P.LineProgress(Console(file=buf, width=200), clock=clock)
    assert not isinstance(P.make_progress(Console(file=io.StringIO())), type(None))
    t = prog.add_task("accuracy table", total=4)
    clock.t += 3
    prog.advance(t)  # 3 s after the last line: not printed
    clock.t += 9
    prog.advance(t)  # 12 s since the last line: printed with an ETA from the rate so far (6 s a step)
    prog.update(t, description="accuracy table: wan, 4096 tokens")  # a new phase: printed at once
    clock.t += 12
    prog.advance(t, 2)  # done
    lines = buf.getvalue().splitlines()
    assert lines == ["[   0.0 s] accuracy table 0/4",
                     "[  12.0 s] accuracy table 2/4, ETA 12.0 s",
                     "[  12.0 s] accuracy table: wan, 4096 tokens 2/4, ETA 12.0 s",
                     "[  24.0 s] accuracy table: wan, 4096 tokens 4/4, done in 24.0 s"]


def test_terminal_gets_a_rich_bar():
    from rich.progress import Progress

    assert isinstance(P.make_progress(Console(force_terminal=True)), Progress)
    assert isinstance(P.make_progress(Console(force_terminal=False)), P.LineProgress)
