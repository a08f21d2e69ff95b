"""``validate``'s accuracy: the run's configuration (its swaps) against the reference (the model's own attention,
bf16 linears) on the same N blocks and the same inputs, block by block down the chain.

One untimed pass, both configurations in lockstep: block i runs the reference's carried states with the
reference swaps in, then the configuration's carried states with the run's swaps in (each installed for that one
call and undone), so only two sets of carried states are alive and a streamed chain loads each block once. Block
0's output is the one-block accuracy (what ``compare`` reports); the last block's is the chain's, the error the
N blocks hand to the rest of the model (the whole-step estimate's block part). A fused-prologue run adds a third
chain, the unfused FP8 blocks, so the report also says what the fusion itself changes.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ditprof.harness.run.metrics import accuracy
from ditprof.harness.swaps.base import Swap, applied_all, label
from ditprof.harness.validate.chain import Chain, Streamer


def _fields(acc: dict) -> dict:
    return {"rel_rms": acc["block_output_rel_rms"], "cosine": acc["block_output_cosine"],
            "max_abs_diff": acc["block_output_max_abs_diff"], "finite": acc["finite"]}


def _step(chain: Chain, module: torch.nn.Module, swaps: Sequence[Swap], carried: tuple) -> tuple:
    with applied_all(module, swaps):
        return chain.step(module, *carried)


def _summary(per_block: list[dict]) -> dict:
    return {"block": per_block[0], "chain": per_block[-1], "per_block_rel_rms": [b["rel_rms"] for b in per_block]}


def chain_accuracy(chain: Chain, modules: Sequence[torch.nn.Module], reference: Sequence[Swap],
                   swaps: Sequence[Swap], *, streamer: Streamer | None = None, n: int,
                   unfused: Sequence[Swap] | None = None) -> dict:
    """The hidden states after each of the N blocks with ``swaps`` against those with ``reference``, both chains
    started from the same inputs. ``modules``: the resident blocks (ignored when streamed). ``unfused`` (a fused
    prologue run: the same swaps with the unfused FP8 attention): a third chain in the same lockstep, and
    ``vs_unfused`` holds ``swaps`` against it."""
    ref, run = chain.start(), chain.start()
    plain = chain.start() if unfused is not None else None
    per_block: list[dict] = []
    per_unfused: list[dict] = []
    unfused_vs_ref: list[float] = []
    for i in range(n):
        if streamer is not None:
            streamer.load(i)
        module = streamer.working if streamer is not None else modules[i]
        ref = _step(chain, module, reference, ref)
        run = _step(chain, module, swaps, run)
        per_block.append(_fields(accuracy(chain.hidden(ref), chain.hidden(run))))
        if unfused is not None:
            plain = _step(chain, module, unfused, plain)
            per_unfused.append(_fields(accuracy(chain.hidden(plain), chain.hidden(run))))
            unfused_vs_ref.append(_fields(accuracy(chain.hidden(ref), chain.hidden(plain)))["rel_rms"])
    out = {"reference": label(reference), "configuration": label(swaps), **_summary(per_block),
           "note": (f"hidden states of {label(swaps)} against {label(reference)} on the same {n} blocks and inputs: "
                    f"'block' after block 0 (one block), 'chain' after all {n}; rel-RMS = ||run - ref|| / ||ref||, "
                    f"accumulated in float64")}
    if unfused is not None:
        out["vs_unfused"] = {"reference": label(unfused), **_summary(per_unfused),
                             "unfused_vs_reference_rel_rms": unfused_vs_ref,
                             "note": f"the fused prologue against the same blocks' unfused FP8 attention "
                                     f"({label(unfused)}): what the fusion changes, the same metrics; "
                                     f"unfused_vs_reference_rel_rms: {label(unfused)} against {label(reference)} "
                                     f"per block"}
    return out


__all__ = ["chain_accuracy"]
