"""``kernels.launch_graphs.LaunchGraphs`` on the CPU, with a fake capture: when a call's launches are made directly,
captured or replayed, the LRU, the stop when graphs are dropped unreplayed, and a capture that fails."""

from __future__ import annotations

import pytest

from ditprof.errors import DitprofError
from ditprof.kernels import launch_graphs as LG
from ditprof.kernels.fp8_config import Fp8Options
from ditprof.kernels.launch_choice import check_options


class FakeGraph:
    """Records the launches made during its capture; replay makes them again (into the shared log)."""

    def __init__(self, launch, log):
        self.log = log
        self.made = []
        launch_log_start = len(log)
        launch("side")  # a capture records the launches: they must not count as run
        self.made = log[launch_log_start:]
        del log[launch_log_start:]

    def replay(self):
        self.log.extend(self.made)


def _cache(log, **kw):
    return LG.LaunchGraphs(lambda launch, stream: FakeGraph(launch, log), **kw)


def _launcher(log, tag):
    return lambda stream: log.append((tag, stream))


def test_first_call_direct_second_captures_then_replays():
    log = []
    c = _cache(log)
    for _ in range(4):
        c.run("a", _launcher(log, "a"))
    # direct on the current stream, then the capture's launches (made on the side stream) replayed twice more
    assert log == [("a", None), ("a", "side"), ("a", "side"), ("a", "side")]
    assert c.summary() == {"graphs": 1, "replays": 2, "captures": 1, "direct_calls": 1, "wasted": 0,
                           "capturing": True, "capture_failure": None}


def test_keys_are_told_apart_and_each_call_runs_once():
    log = []
    c = _cache(log)
    order = ["a", "b", "a", "b", "c", "a", "b", "c", "c"]
    for key in order:
        c.run(key, _launcher(log, key))
    assert [tag for tag, _ in log] == order  # every call's launches exactly once, in order
    assert c.captures == 3 and c.hits == 3 and c.direct == 3


def test_lru_drops_the_least_recently_replayed():
    log = []
    c = _cache(log, slots=2)
    for key in ["a", "a", "b", "b", "a", "c", "c"]:  # capture a, b; replay a; capture c: b goes
        c.run(key, _launcher(log, key))
    assert list(c.graphs) == ["a", "c"]
    assert c.wasted == 1  # b was never replayed
    c.run("b", _launcher(log, "b"))  # b's next call: seen again from scratch, made directly
    assert log[-1] == ("b", None)


def test_record_stops_capturing_when_graphs_go_unreplayed():
    log = []
    c = _cache(log, slots=2)
    keys = [f"k{i}" for i in range(LG.THRASH_WASTED + 3)]
    for key in keys:  # each key twice in a row: captured, then pushed out before its next call
        c.run(key, _launcher(log, key))
        c.run(key, _launcher(log, key))
    assert not c.capturing
    assert c.wasted == LG.THRASH_WASTED
    n = c.captures
    c.run("new", _launcher(log, "new"))
    c.run("new", _launcher(log, "new"))
    assert c.captures == n and log[-1] == ("new", None)  # direct now
    assert [tag for tag, _ in log].count("new") == 2


def test_a_failed_capture_launches_directly_for_good():
    log = []

    def capture(launch, stream):
        raise RuntimeError("operation not permitted when stream is capturing")

    c = LG.LaunchGraphs(capture)
    for _ in range(3):
        c.run("a", _launcher(log, "a"))
    assert log == [("a", None)] * 3
    assert not c.capturing and "not permitted" in c.failure


@pytest.mark.parametrize("field, bad, message", [("check", "later", "Fp8Options.check must be one of defer, sync"),
                                                 ("qk_format", "fp4", "unknown fp8 Q/K format 'fp4'")])
def test_options_with_a_value_no_call_runs_are_one_line_errors(field, bad, message):
    """Graph replay and the prep branch are ``Fp8Options.graphs`` / ``.branch`` (booleans, no parsing); the options
    a record is built from are checked once, with one-line errors."""
    check_options(Fp8Options(graphs=False, branch=False))
    with pytest.raises(DitprofError, match=message):
        check_options(Fp8Options(**{field: bad}))


class _FakePlan:
    def __init__(self, log):
        self.log = log

    def launch(self, q, k, v, ws, stream, key_lens=None, branch=None, pro=None):
        self.log.append(("prep", stream, branch))


@pytest.mark.parametrize("captured, reuse, enabled, branches", [
    (False, True, True, False), (True, True, True, True), (False, False, True, True), (True, False, True, True),
    (True, True, False, False), (False, False, False, False)])
def test_the_prep_branches_when_captured_or_without_a_reused_workspace(monkeypatch, captured, reuse, enabled,
                                                                       branches):
    """``Fp8Launch._launch_all``'s rule: V's quantize on the branch stream when the launches are captured (a
    replay pays nothing for the fork and join) or the problem is too large to reuse a workspace; a direct call of a
    small problem keeps the one-stream chain (its host cost); ``Fp8Options(branch=False)`` (``enabled`` False) keeps the
    chain always."""
    from ditprof.kernels import launch_record as L

    log = []
    rec = object.__new__(L.Fp8Launch)  # the fields _launch_all reads; building one needs a GPU
    rec.plan, rec.reuse, rec.device, rec.branch = _FakePlan(log), reuse, "cuda:0", enabled
    rec._launch_kernel = lambda ws, q, out, lse, key_lens, scale, stream: log.append(("kernel", stream))
    monkeypatch.setattr(L, "branch_stream", lambda device: f"branch of {device}")
    rec._launch_all({}, "q", "k", "v", "out", None, None, 0.1, 7, captured)
    assert log == [("prep", 7, "branch of cuda:0" if branches else None), ("kernel", 7)]


class _FakeStream:
    def __init__(self, name, log, handle):
        self.name, self.log, self.cuda_stream = name, log, handle

    def wait_stream(self, other):
        self.log.append(("wait", self.name, other.name))


@pytest.mark.parametrize("handle", [0, 0x7F00])
def test_a_branched_prep_forks_after_the_stats_and_joins_before_returning(monkeypatch, handle):
    """``PrepPlan.launch(branch=...)``: the stats on the call's stream, the branch waits for them, Q/K's quantize on
    the call's stream and V's on the branch, the call's stream waits for the branch. The call's stream is a torch
    Stream of the raw handle: the default stream for handle 0 (``torch.cuda.ExternalStream(0)`` would be a new pool
    stream, whose events order nothing: the fork and join would be lost)."""
    import ditprof.kernels.prep_triton as PT

    log = []
    made = []

    def default_stream(device):
        made.append(("default", device))
        return _FakeStream("main", log, 0)

    def external(h, device=None):
        made.append(("external", h))
        return _FakeStream("main", log, h)

    monkeypatch.setattr(PT.torch.cuda, "default_stream", default_stream)
    monkeypatch.setattr(PT.torch.cuda, "ExternalStream", external)
    plan = object.__new__(PT.PrepPlan)
    plan._arguments = lambda q, k, v, bufs, key_lens, pro=None: ("stats args", "quant args")
    plan.stats = lambda args, stream: log.append(("stats", stream))
    plan.quants = [lambda args, stream: log.append(("quant qk", stream)),
                   lambda args, stream: log.append(("quant v", stream))]
    branch = _FakeStream("branch", log, 0xB0)
    branch.device = "cuda:0"
    plan.launch("q", "k", "v", {}, handle, branch=branch)
    assert log == [("stats", handle), ("wait", "branch", "main"), ("quant qk", handle), ("quant v", 0xB0),
                   ("wait", "main", "branch")]
    assert made == ([("default", "cuda:0")] if handle == 0 else [("external", handle)])


def test_raw_stream_handles_become_streams_in_one_place():
    """``torch.cuda.ExternalStream(0)`` is a new pool stream, not the default stream (the session-23 race: a prep
    branch forked and joined on a stream nothing ran on). Raw handles become torch Streams only in
    ``prep_triton.stream_of_handle``, which sends 0 to ``default_stream``."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "ditprof"
    calls = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                calls += [(str(path.relative_to(root)), fn.name) for node in ast.walk(fn)
                          if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "ExternalStream"]
    assert calls == [("kernels/prep_triton.py", "stream_of_handle")], calls
