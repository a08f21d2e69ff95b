"""N blocks called one after the other, each block's outputs the next one's inputs (``Chain``), resident or
streamed from host copies into one working block (``Streamer``), and one timed pass over them (``run_chain``)."""

from __future__ import annotations

import torch

from ditprof.harness.run.session import Clock


class Chain:
    """Calls blocks one after the other, feeding each block's outputs to the next, like the model does: the
    family's ``BlockPlan.outputs`` names the inputs the returned values become."""

    def __init__(self, inputs, plan):
        self.inputs = inputs
        self.carried = plan.outputs

    def start(self) -> tuple[torch.Tensor, ...]:
        return tuple(self.inputs.kwargs[n] for n in self.carried)

    def step(self, module, *carried):
        kwargs = dict(self.inputs.kwargs)
        kwargs.update(zip(self.carried, carried))
        out = module(*self.inputs.args, **kwargs)
        return (out,) if len(self.carried) == 1 else tuple(out)

    def hidden(self, carried) -> torch.Tensor:
        return carried[self.carried.index("hidden_states")]


class Streamer:
    """Host copies of every block's weights; ``load(i)`` copies block i into the working block."""

    def __init__(self, working: torch.nn.Module):
        self.working = working
        self.targets = dict(working.state_dict())
        self.host: list[dict[str, torch.Tensor]] = []
        self.pinned: bool | None = None

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        if t.device.type == "cpu":
            return t.detach().clone()
        if self.pinned is not False:
            try:
                h = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                self.pinned = True
                return h.copy_(t)
            except RuntimeError:  # locked-memory limit: pageable copies (only copies get slower; untimed)
                self.pinned = False
        return t.to("cpu")

    def add(self, state: dict[str, torch.Tensor]) -> None:
        self.host.append(state)

    def load(self, i: int) -> None:
        for k, t in self.targets.items():
            t.copy_(self.host[i][k], non_blocking=True)


def run_chain(chain: Chain, modules: list[torch.nn.Module] | None, clock: Clock, *,
              streamer: Streamer | None = None, n: int) -> tuple[float, list[float], torch.Tensor]:
    """One pass over N blocks. Returns (chain ms, per-block ms, final hidden states).

    Resident: marks at every block boundary (no sync in between), chain = first to last mark.
    Streamed: the weights of block i are copied into the working block before its start mark, so the
    per-block times hold compute only; chain = their sum.
    """
    carried = chain.start()
    per: list[float] = []
    if streamer is None:
        marks = [clock.mark()]
        for m in modules:
            carried = chain.step(m, *carried)
            marks.append(clock.mark())
        clock.wait(marks[-1])
        per = [clock.elapsed(a, b) for a, b in zip(marks, marks[1:])]
        return clock.elapsed(marks[0], marks[-1]), per, chain.hidden(carried)
    pairs = []
    for i in range(n):
        streamer.load(i)
        a = clock.mark()
        carried = chain.step(streamer.working, *carried)
        pairs.append((a, clock.mark()))
    clock.wait(pairs[-1][1])
    per = [clock.elapsed(a, b) for a, b in pairs]
    return sum(per), per, chain.hidden(carried)
