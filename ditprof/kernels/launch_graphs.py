"""A launch record's calls replayed as one CUDA graph when their arguments repeat.

One FP8 attention call is four or five launches (the prep's two or three Triton kernels, our kernel, the stream-K
merge), each a few microseconds of host time: most of the call's host cost (benchmarks/host_overhead.py). A DiT's eager
forward calls attention with the same sizes every block and step, and PyTorch's caching allocator hands the same
addresses back in that steady state, so the call's launches repeat argument for argument. ``LaunchGraphs`` keeps,
per launch record, a small LRU of CUDA graphs keyed on everything a call's launches read that is not fixed by the
record (stream, the q/k/v/out/key_lens addresses, the scale): a key's second call captures its launches once
(cudaStreamBeginCapture on a side stream, thread-local mode) and every later call replays them with one
cudaGraphLaunch. The kernels, their arguments and so their bits are the same as the direct launches'.

Nothing that differs between calls hides inside a graph: the workspace (prep buffers, the non-finite flags read
every few calls, outside the graph) is the record's, one per stream. A record whose graphs leave the LRU without
ever being replayed (addresses that do not come back, or more of them than it keeps) stops capturing after
``THRASH_WASTED`` of them; ``Fp8Options(graphs=False)`` launches directly always. Calls made while the caller itself
captures a graph (``torch.cuda.graph``, torch.compile's cudagraphs) launch directly into the caller's graph.
"""

from __future__ import annotations

import collections
from typing import Callable, Hashable, Optional

GRAPH_SLOTS = 64  # graphs kept per launch record (least recently replayed dropped first; a few KB each)
SEEN_SLOTS = 128  # keys remembered after one call (the second call of a key captures it)
THRASH_WASTED = 8  # graphs dropped unreplayed after which a record stops capturing


class LaunchGraphs:
    """The graph cache of one launch record. ``capture(launch, stream)`` returns an object with ``replay()`` whose
    replay makes the launches ``launch(handle)`` made during the capture, ordered on ``stream`` (the caller's;
    ``capture_graph`` on CUDA, tests pass fakes)."""

    def __init__(self, capture: Callable, slots: int = GRAPH_SLOTS, seen: int = SEEN_SLOTS):
        self._capture = capture
        self.slots, self.seen_slots = slots, seen
        self.graphs: collections.OrderedDict = collections.OrderedDict()
        self.seen: collections.OrderedDict = collections.OrderedDict()
        self.hits = self.captures = self.direct = self.wasted = 0
        self.capturing = True  # False once the record thrashes or a capture failed
        self.failure: Optional[str] = None

    def run(self, key: Hashable, launch: Callable[[Optional[int]], None], stream=None) -> None:
        """Make one call's launches on ``stream`` (the current one): replay ``key``'s graph, capture it on the key's
        second call, else ``launch(None)`` (None: on the current stream)."""
        entry = self.graphs.get(key)
        if entry is not None:
            self.graphs.move_to_end(key)
            self.hits += 1
            entry[1] += 1
            entry[0].replay()
            return
        if not self.capturing or key not in self.seen:
            self._remember(key)
            self.direct += 1
            launch(None)
            return
        del self.seen[key]
        try:
            graph = self._capture(launch, stream)
        except Exception as exc:  # noqa: BLE001 -- a launch path that cannot be captured: launch directly for good
            self.capturing = False
            self.failure = f"{type(exc).__name__}: {exc}"[:300]
            self.direct += 1
            launch(None)
            return
        self.captures += 1
        self.graphs[key] = [graph, 0]  # [graph, replays]
        if len(self.graphs) > self.slots and self.graphs.popitem(last=False)[1][1] == 0:
            self.wasted += 1
            if self.wasted >= THRASH_WASTED:
                self.capturing = False
        graph.replay()  # a capture records the launches without running them

    def _remember(self, key: Hashable) -> None:
        self.seen[key] = None
        self.seen.move_to_end(key)
        if len(self.seen) > self.seen_slots:
            self.seen.popitem(last=False)

    def summary(self) -> dict:
        return {"graphs": len(self.graphs), "replays": self.hits, "captures": self.captures,
                "direct_calls": self.direct, "wasted": self.wasted, "capturing": self.capturing,
                "capture_failure": self.failure}


_SIDE_STREAMS: dict = {}


def side_stream(device, role: str):
    """The side stream of ``device`` for ``role`` ("capture": graphs are captured on it; "branch": a captured
    prep's V quantize runs on it), made once per (device, role)."""
    import torch

    stream = _SIDE_STREAMS.get((device, role))
    if stream is None:
        stream = _SIDE_STREAMS[(device, role)] = torch.cuda.Stream(device=device)
    return stream


def capture_graph(launch: Callable[[Optional[int]], None], stream):
    """``launch(side stream handle)``'s launches captured into a ``torch.cuda.CUDAGraph`` on a side stream of
    ``stream``'s device (ordered after ``stream``, a torch.cuda.Stream, and ``stream`` after it). Thread-local
    capture mode: other threads' CUDA calls stay legal meanwhile."""
    import torch

    device = stream.device
    side = side_stream(device, "capture")
    side.wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            launch(side.cuda_stream)
        except BaseException:
            try:
                graph.capture_end()
            except Exception:  # noqa: BLE001 -- the launch's error is the one to report
                pass
            raise
        graph.capture_end()
    stream.wait_stream(side)
    return graph


__all__ = ["LaunchGraphs", "capture_graph", "side_stream", "GRAPH_SLOTS", "SEEN_SLOTS", "THRASH_WASTED"]
