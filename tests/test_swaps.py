"""The swap abstraction (harness.swaps): a swap installs itself on a block and undoes itself exactly; swaps compose
in a list (installed in order, undone in reverse); compare measures the baseline against any list of swaps, here
with a test-only swap the runner knows nothing about."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ditprof.harness.run import runner
from ditprof.harness.swaps.attention import AttentionSwap
from ditprof.harness.swaps.base import Installed, Swap, applied_all, label
from ditprof.kernels import registry

from tiny_blocks import cog_block, wan_block


def _snapshot(block: torch.nn.Module) -> dict:
    """Everything a swap may touch: each module's processor, its dispatcher backend, an instance forward."""
    out = {}
    for name, mod in block.named_modules():
        proc = getattr(mod, "processor", None)
        out[name] = (id(proc), getattr(proc, "_attention_backend", None), mod.__dict__.get("forward"))
    out["F.sdpa"] = torch.nn.functional.scaled_dot_product_attention
    return out


class Scale(Swap):
    """Test-only swap: multiplies the block output by ``factor`` through a forward hook; logs install/undo."""

    def __init__(self, factor: float, log: list):
        self.name, self.factor, self.log = f"scale-{factor}", factor, log

    def install(self, block):
        self.log.append(("install", self.name))
        handle = block.register_forward_hook(lambda mod, args, out: out * self.factor)
        log, name = self.log, self.name

        class Done(Installed):
            calls = 0

            def undo(self):
                log.append(("undo", name))
                handle.remove()

            def start_measuring(self):
                log.append(("start", name))

            def record(self):
                return {"scale_factor": self.factor_}

        done = Done()
        done.factor_ = self.factor
        return done


@pytest.mark.parametrize("make", [wan_block, cog_block], ids=["dispatcher", "processor"])
def test_attention_swap_undo_restores_the_block_exactly(make):
    blk = make()[0]
    before = _snapshot(blk)
    swap = AttentionSwap(registry.get("fp8-emulated"), head_dim=32)
    with swap.applied(blk) as inst:
        assert _snapshot(blk) != before
        rec = inst.record()
        assert rec["attention_backend"] == "fp8-emulated" and rec["route"] in ("dispatcher", "processor")
        assert rec["qk_format"] == registry.get("fp8-emulated").qk_format(32)
        assert "qk_format" not in AttentionSwap(registry.get("sdpa"), head_dim=32).record(inst)
    assert _snapshot(blk) == before


def test_swaps_compose_in_list_order_and_undo_in_reverse():
    blk = torch.nn.Linear(4, 4)
    log: list = []
    x = torch.randn(2, 4)
    ref = blk(x)
    swaps = [Scale(2.0, log), Scale(3.0, log)]
    with applied_all(blk, swaps) as installed:
        assert torch.allclose(blk(x), ref * 6.0)
        assert [i.record()["scale_factor"] for i in installed] == [2.0, 3.0]
    assert log == [("install", "scale-2.0"), ("install", "scale-3.0"), ("undo", "scale-3.0"), ("undo", "scale-2.0")]
    assert torch.equal(blk(x), ref) and not blk._forward_hooks
    assert label(swaps) == "scale-2.0 + scale-3.0" and label([]) == "unchanged"


def test_a_failed_install_undoes_the_swaps_before_it():
    blk = torch.nn.Linear(4, 4)
    log: list = []

    class Broken(Swap):
        name = "broken"

        def install(self, block):
            raise RuntimeError("no")

    with pytest.raises(RuntimeError), applied_all(blk, [Scale(2.0, log), Broken()]):
        pass
    assert log == [("install", "scale-2.0"), ("undo", "scale-2.0")] and not blk._forward_hooks


def test_compare_measures_a_list_of_swaps_the_runner_does_not_know(one_thread, tmp_path):
    args = dict(preset="wan-tiny", checkpoint=None, block=0, device="cpu", baseline=None, attention="sdpa",
                tokens=None, height=None, width=None, frames=None, blocks=None, steps=None, cfg=False,
                gpu_memory=None, out=str(tmp_path / "run"), warmup=0, iters=1, seed=0)
    spec = runner.spec_from_args(SimpleNamespace(**args), "compare")
    log: list = []
    rep, out = runner.execute(spec, extra_swaps=[Scale(2.0, log)])
    base, sw = rep["baseline"], rep["swapped"]
    assert base["attention_backend"] == "sdpa" and sw["attention_backend"] == "sdpa"
    assert sw["scale_factor"] == 2.0 and "scale_factor" not in base
    assert sw["swaps"][-1] == "scale-2.0" and len(sw["swaps"]) == 2 and len(base["swaps"]) == 1
    # same attention, output doubled: the accuracy section sees exactly the test swap
    assert rep["accuracy"]["block_output_rel_rms"] == pytest.approx(1.0, rel=1e-2)
    assert ("start", "scale-2.0") in log and log[-1] == ("undo", "scale-2.0")
    assert (out / "report.json").exists()
