"""fp8_attention's NaN/Inf check of q, k, v without a host sync per call (``kernels.finite_checks``).

CPU: the queue logic with stand-in events (read in call order, only landed copies without ``wait``, everything at a
``deferred_finite_checks`` exit). GPU (marked ``gpu``): a NaN input raises the one-line error by the next call /
``finish_finite_checks()`` at the latest, at the call itself with ``Fp8Options(check="sync")``; the pinned ring wraps.
"""

import pytest
import torch

from ditprof.errors import DitprofError
from ditprof.kernels import interface as I
from ditprof.kernels import finite_checks as L
from ditprof.kernels.fp8_config import Fp8Options
from ditprof.kernels.launch_record import record_for


class _Event:
    def __init__(self, done: bool):
        self.done = done
        self.waited = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited = True
        self.done = True


def _pending(q_ok=True, done=True):
    host = torch.tensor([0 if q_ok else 1, 0, 0], dtype=torch.int32)  # the sticky non-finite flags of q, k, v
    return L.Check(host, _Event(done))


def test_drain_finishes_landed_checks_in_order():
    first, second, third = _pending(done=True), _pending(done=False), _pending(done=True)
    queue = [first, second, third]
    L.drain(queue, wait=False)
    assert queue == [second, third]  # stops at the first copy not landed: order kept
    L.drain(queue, wait=True)
    assert queue == [] and second[1].waited


def test_drain_raises_on_non_finite_and_names_the_input():
    queue = [_pending(), _pending(q_ok=False)]
    with pytest.raises(DitprofError, match="^q contains NaN or Inf$"):
        L.drain(queue, wait=False)
    assert queue == []
    host = torch.tensor([0, 1, 1], dtype=torch.int32)  # k and v flagged: the first is named
    with pytest.raises(DitprofError, match="^k contains NaN or Inf$"):
        L.finish_check(L.Check(host, _Event(True)))


def test_context_finishes_every_pending_check_at_exit():
    L.pending_queue().clear()
    with pytest.raises(DitprofError, match="^v contains NaN or Inf$"):
        with I.deferred_finite_checks():
            host = torch.tensor([0, 0, 1], dtype=torch.int32)
            L.pending_queue().append(L.Check(host, _Event(False)))  # as an fp8 call would queue it, copy not landed
    assert len(L.pending_queue()) == 0


@pytest.mark.gpu
def test_fp8_attention_nan_raises_without_a_sync_per_call(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    L.finish_finite_checks()
    q, k, v = (torch.randn(1, 256, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    q[0, 5, 1, 7] = float("nan")
    with pytest.raises(DitprofError, match="^q contains NaN or Inf$"):
        I.fp8_attention(q, k, v)  # queued, read by a later call or here at the latest
        L.finish_finite_checks()
    with pytest.raises(DitprofError, match="^q contains NaN or Inf$"):
        I.fp8_attention(q, k, v, options=Fp8Options(check="sync"))  # at the call itself
    with pytest.raises(DitprofError, match="^q contains NaN or Inf$"):
        with I.deferred_finite_checks():
            I.fp8_attention(q, k, v)
    q[0, 5, 1, 7] = 0.0
    with I.deferred_finite_checks():
        outs = [I.fp8_attention(q, k, v) for _ in range(L.RING_DEPTH + 3)]  # the ring wraps
    assert len(L.pending_queue()) == 0
    rec = record_for(q, k, v, False)
    assert not any(rec.ring.busy)
    assert all(torch.isfinite(o).all() for o in outs)


# --------------------------------------------------------------------------- a block output with NaN/Inf

def test_first_nonfinite_names_the_module_where_inf_appears():
    """Finite weights whose product overflows: the first module (in execution order) with a non-finite output
    is named, not its parents; NaN weights and inputs are named as such."""
    from ditprof.harness.run.finite import check_inputs, first_nonfinite

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU()))
    with torch.no_grad():
        net[1][0].weight.fill_(3e38)  # finite, but x @ W overflows
    x = torch.randn(2, 4) + 5
    assert torch.isfinite(torch.stack([p.abs().max() for p in net.parameters()])).all()
    where = first_nonfinite(net, lambda: net(x))
    assert where == "NaN/Inf first appears in the output of 1.0 (Linear)"
    with torch.no_grad():
        net[0].bias[1] = float("nan")
    assert first_nonfinite(net, lambda: net(x)) == ("the block's weight 0.bias holds NaN/Inf (as loaded from the "
                                                    "checkpoint)")
    with pytest.raises(DitprofError, match="block input temb holds NaN/Inf"):
        check_inputs({"hidden_states": x, "temb": (x, torch.tensor([float("inf")]))})
    check_inputs({"hidden_states": x, "mask": torch.ones(2, dtype=torch.bool)})  # finite: no error


@pytest.mark.parametrize("command", ["profile", "compare"])
def test_nan_weight_checkpoint_is_one_line_in_profile_and_compare(tmp_path, capsys, command):
    """A diffusers-saved checkpoint with one NaN weight: profile (which used to write a normal report) and compare
    both stop with one line naming the tensor, and leave no run folder."""
    from ditprof.cli import main
    from ditprof.model_blocks import get_family, get_preset

    preset = get_preset("wan-tiny")
    torch.manual_seed(0)
    model = get_family(preset.family).model_class.from_config(preset.config).eval()
    with torch.no_grad():
        model.blocks[1].ffn.net[0].proj.weight[3, 2] = float("nan")
    model.save_pretrained(tmp_path / "ckpt", max_shard_size="8KB")
    out = tmp_path / "run"
    rc = main([command, "--checkpoint", str(tmp_path / "ckpt"), "--block", "1", "--device", "cpu", "--tokens",
               "48", "--iters", "1", "--warmup", "1", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "the block output holds NaN/Inf" in err[0] and "weight ffn.net.0.proj.weight" in err[0]
    assert not out.exists()
