"""ditprof: profile one DiT block, split its time, swap its attention for an FP8 kernel."""

__version__ = "0.1.0"


def register_diffusers_backends(names=("fp8", "fp8-emulated")) -> list[str]:
    """Register ditprof's attention backends with diffusers' dispatcher (``ditprof_fp8``, ``ditprof_fp8_emulated``):
    then ``model.set_attention_backend("ditprof_fp8")`` or ``attention_backend("ditprof_fp8")`` in your own
    pipeline. See ``ditprof.diffusers`` (imported here, not at ``import ditprof``: the CLI starts without torch)."""
    from ditprof.diffusers import register_diffusers_backends as register

    return register(names)
