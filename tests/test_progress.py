"""Progress when stdout is not a terminal: a line per phase and at most one every 10 s, with elapsed and ETA."""

from rich.console import Console

from ditprof import progress as P


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


def test_human_units():
    assert [P.human_duration(s) for s in (0.00042, 0.137, 13.7, 13.74, 200, 9000)] == [
        "0.42 ms", "137 ms", "13.7 s", "13.7 s", "3.3 min", "2.5 h"]
    assert [P.human_bytes(n) for n in (512, 3 * 1024, 24.5 * 2**20, 1.83 * 2**30)] == [
        "512 B", "3 KiB", "24.5 MiB", "1.83 GiB"]


def test_heartbeat_prints_a_running_phase_every_10_s():
    """A phase whose steps take longer than EVERY_S still prints a line at least every EVERY_S (the heartbeat's
    tick), with its elapsed time; a finished task prints nothing more."""
    import io

    buf = io.StringIO()
    clock = _Clock()
    prog = P.LineProgress(Console(file=buf, width=200), clock=clock, heartbeat=False)
    t = prog.add_task("timing", total=5)
    for _ in range(4):  # 25 s of ticks once a second, no step ends
        for _ in range(25):
            clock.t += 1
            prog.tick()
    lines = buf.getvalue().splitlines()
    assert lines[0] == "[   0.0 s] timing 0/5"
    stamps = [float(line[1:9].split()[0]) for line in lines]
    assert all(b - a <= P.EVERY_S for a, b in zip(stamps, stamps[1:])) and stamps[-1] >= 90
    assert lines[1] == "[  10.0 s] timing 0/5, running 10.0 s"
    prog.update(t, completed=5)
    n = len(buf.getvalue().splitlines())
    clock.t += 30
    prog.tick()
    assert len(buf.getvalue().splitlines()) == n
    assert buf.getvalue().splitlines()[-1].endswith("timing 5/5, done in 100.0 s")


def test_heartbeat_thread_runs_inside_the_context(monkeypatch):
    import io
    import time as _time

    monkeypatch.setattr(P, "EVERY_S", 0.2)
    buf = io.StringIO()
    with P.LineProgress(Console(file=buf, width=200)) as prog:
        prog.add_task("slow step", total=1)
        _time.sleep(1.0)
    assert buf.getvalue().count("slow step 0/1, running") >= 2


def test_a_phase_reported_first_at_its_end_is_dated_from_its_start():
    import io

    buf = io.StringIO()
    clock = _Clock()
    prog = P.LineProgress(Console(file=buf, width=200), clock=clock, heartbeat=False)
    start = clock.t
    clock.t += 6
    t = prog.add_task("warm-up", total=1, start=start)
    prog.update(t, completed=1)
    assert buf.getvalue().splitlines()[-1].endswith("warm-up 1/1, done in 6.0 s")


def test_bytes_unit_lines():
    import io

    buf = io.StringIO()
    clock = _Clock()
    prog = P.LineProgress(Console(file=buf, width=200), clock=clock, heartbeat=False)
    t = prog.add_task("writing flux checkpoint", total=3 * 2**30, unit="bytes")
    clock.t += 12
    prog.advance(t, 2**30)
    assert buf.getvalue().splitlines()[-1] == "[  12.0 s] writing flux checkpoint 1 GiB/3 GiB, ETA 24.0 s"


def test_quiet_task_prints_nothing_when_quick_and_beats_when_slow():
    lines = []

    class Sink:
        def print(self, text, **_):
            lines.append(text)

    now = [0.0]
    p = P.LineProgress(Sink(), clock=lambda: now[0], heartbeat=False, quiet_s=2.0)
    quick = p.add_task("quick step", total=3)
    now[0] = 1.0
    p.update(quick, completed=3)
    assert lines == []
    slow = p.add_task("slow step", total=4)
    now[0] = 1.0 + P.EVERY_S + 0.5
    p.update(slow, completed=1)
    p.tick()
    assert lines and all("slow step" in line for line in lines)
