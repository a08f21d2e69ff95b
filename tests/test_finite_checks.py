"""``deferred_finite_checks``: fp8_attention's NaN/Inf check of q/k/v without a host sync per call.

CPU: the queue logic with stand-in events (finished in call order, only landed copies without ``wait``, all at the
context's exit, nested contexts restore the outer queue). GPU (marked ``gpu``): a NaN input inside the context
does not raise at the call but at the exit, with the same message as outside.
"""

import pytest
import torch

from ditprof.errors import DitprofError
from ditprof.kernels import interface as I


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
    host = torch.tensor([[1.0 if q_ok else float("nan"), 1.0, 1.0]])  # (B*H, 3) descales of q, k, v
    return host, _Event(done)


def test_drain_finishes_landed_checks_in_order():
    first, second, third = _pending(done=True), _pending(done=False), _pending(done=True)
    queue = [first, second, third]
    I._drain(queue, wait=False)
    assert queue == [second, third]  # stops at the first copy not landed: order kept
    I._drain(queue, wait=True)
    assert queue == [] and second[1].waited


def test_drain_raises_on_non_finite():
    queue = [_pending(), _pending(q_ok=False)]
    with pytest.raises(DitprofError, match="q contains NaN or Inf"):
        I._drain(queue, wait=False)


def test_context_drains_at_exit_and_restores_the_outer_queue():
    assert getattr(I._DEFERRED, "queue", None) is None
    with pytest.raises(DitprofError, match="q contains NaN or Inf"):
        with I.deferred_finite_checks():
            outer = I._DEFERRED.queue
            with I.deferred_finite_checks():
                assert I._DEFERRED.queue is not outer
            assert I._DEFERRED.queue is outer
            outer.append(_pending(q_ok=False, done=False))  # as fp8_attention would queue it
    assert getattr(I._DEFERRED, "queue", None) is None


@pytest.mark.gpu
def test_fp8_attention_nan_raises_at_context_exit():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    q, k, v = (torch.randn(1, 256, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    q[0, 5, 1, 7] = float("nan")
    with pytest.raises(DitprofError, match="q contains NaN or Inf"):
        I.fp8_attention(q, k, v)  # outside: at the call
    # inside: at the call if its copy has landed by the time the call polls, else at the exit; never silently
    with pytest.raises(DitprofError, match="q contains NaN or Inf"):
        with I.deferred_finite_checks():
            I.fp8_attention(q, k, v)
    q[0, 5, 1, 7] = 0.0
    with I.deferred_finite_checks():
        out = I.fp8_attention(q, k, v)
        assert I._DEFERRED.queue is not None
    assert torch.isfinite(out).all()


# --------------------------------------------------------------------------- a block output with NaN/Inf

def test_first_nonfinite_names_the_module_where_inf_appears():
    """Finite weights whose product overflows: the first module (in execution order) with a non-finite output
    is named, not its parents; NaN weights and inputs are named as such."""
    from ditprof.harness.finite import check_inputs, first_nonfinite

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
    from ditprof.model_blocks import get_preset

    preset = get_preset("wan-tiny")
    torch.manual_seed(0)
    model = preset.adapter.model_class.from_config(preset.config).eval()
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
