"""The NaN/Inf check of q, k, v without a host sync per call.

A descale is non-finite exactly when its input held NaN/Inf; the prep's finalize kernel then sets a sticky flag for
q, k or v in the launch record's workspace. Every ``CHECK_EVERY`` calls of a workspace (every call when it is not
reused) the record copies the flags to a slot of its pinned ``Ring``, with an event, and zeroes them; every later
call polls this thread's queue (``event.query``, no wait) and raises ``DitprofError("q contains NaN or Inf")`` (or
k, v) once a copy that holds a flag has landed. ``finish_finite_checks()`` reads the flags of every call made so far
and waits (the harness and ``interface.deferred_finite_checks`` call it): a NaN input is reported at the latest
there, never silently. ``Fp8Options.check="sync"`` reads and waits at every call instead (the error then comes from
the call).
"""

from __future__ import annotations

import collections
import threading

import torch

from ditprof.errors import DitprofError

RING_DEPTH = 16
CHECK_EVERY = 8  # calls of one reused workspace between two reads of its non-finite flags


class Check(tuple):
    """(pinned host copy of the q, k, v flags (int32 x 3), event after the copy) plus the ring slot to give back
    once read."""

    def __new__(cls, host, event, ring=None, slot=None):
        self = super().__new__(cls, (host, event))
        self.ring, self.slot = ring, slot
        return self


def raise_for(flags: list) -> None:
    """DitprofError naming the first of q, k, v whose flag is set."""
    for name, flag in zip(("q", "k", "v"), flags):
        if flag:
            raise DitprofError(f"{name} contains NaN or Inf")


def finish_check(item) -> None:
    """Wait for one check's copy (no-op for None), free its ring slot, raise on a non-finite input."""
    if item is None:
        return
    try:
        item[1].synchronize()
        raise_for(item[0].tolist())
    finally:
        ring = getattr(item, "ring", None)
        if ring is not None:
            ring.busy[item.slot] = False


_STATE = threading.local()


def pending_queue() -> collections.deque:
    """This thread's checks not read yet, in call order."""
    q = getattr(_STATE, "queue", None)
    if q is None:
        q = _STATE.queue = collections.deque()
    return q


def drain(queue, wait: bool) -> None:
    """Read the queued checks in call order: those whose copy has landed (``event.query()``, no wait), or all of
    them with ``wait``. Raises for the first non-finite one (which is then out of the queue)."""
    while queue and (wait or queue[0][1].query()):
        finish_check(queue.popleft() if isinstance(queue, collections.deque) else queue.pop(0))


# reused workspaces whose flags have not been read since their last calls: id -> (record, workspace, stream)
UNCHECKED: dict = {}


def finish_finite_checks() -> None:
    """Read the flags of every call made so far and wait for every pending check of this thread;
    ``DitprofError`` for the first NaN/Inf input."""
    queue = pending_queue()
    for rec, ws, stream in list(UNCHECKED.values()):
        with torch.cuda.stream(stream):
            rec.check(ws, stream, queue)
    drain(queue, wait=True)


class Ring:
    """Pinned host slots for one configuration's non-finite flags, and an event per slot."""

    def __init__(self):
        with torch.inference_mode(False):  # normal tensors: written in place inside and outside inference mode
            self.host = torch.empty((RING_DEPTH, 3), dtype=torch.int32, pin_memory=True)
        self.events = [torch.cuda.Event() for _ in range(RING_DEPTH)]
        self.busy = [False] * RING_DEPTH
        self.next = 0

    def start(self, flags: torch.Tensor, stream: torch.cuda.Stream, zero: bool) -> Check:
        """Copy ``flags`` to a free slot on ``stream`` (the current stream), then zero them there if ``zero``."""
        i = self.next
        queue = pending_queue()
        while self.busy[i]:  # the host is RING_DEPTH checks of this configuration ahead: wait for the oldest
            drain(queue, wait=False)
            if self.busy[i]:
                finish_check(queue.popleft())
        self.next = (i + 1) % RING_DEPTH
        self.busy[i] = True
        host = self.host[i]
        host.copy_(flags, non_blocking=True)
        self.events[i].record(stream)
        if zero:
            flags.zero_()
        return Check(host, self.events[i], self, i)


__all__ = ["CHECK_EVERY", "Check", "RING_DEPTH", "Ring", "drain", "finish_check", "finish_finite_checks",
           "pending_queue"]
