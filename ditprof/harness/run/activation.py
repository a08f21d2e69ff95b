"""The activation peak of one block's forward, estimated on the meta device (a dispatch mode counting the bytes
of live tensors): what the run plan and ``validate``'s memory plan budget for."""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ditprof import dispatch
from ditprof.model_blocks.memory import tensor_bytes



class _LiveBytes(TorchDispatchMode):
    """Tracks the bytes of live tensors created inside the mode (by storage) and their peak."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, int] = {}
        self.current = 0
        self.peak = 0

    def _free(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                key = t.untyped_storage()._cdata
                if key in self.live:
                    continue
                self.live[key] = t.untyped_storage().nbytes()
                self.current += self.live[key]
                self.peak = max(self.peak, self.current)
                weakref.finalize(t, self._free, key)
        return out


def estimate_forward_bytes(family, config: dict, kind: str, *, preset=None, dtype: torch.dtype = torch.bfloat16,
                           **input_args) -> dict:
    """Inputs and peak activation bytes of one forward, traced on the meta device (no memory, no compute).

    Every tensor the block creates is tracked while it is alive; attention is replaced by a stand-in that
    only allocates its output (a flash-style kernel: no S x S scores). An estimate: the CUDA caching
    allocator's rounding and a kernel's workspace are not in it.
    """
    from ditprof.model_blocks import LoadedBlock, make_inputs
    from ditprof.model_blocks.presets import block_on_meta

    module = block_on_meta(family, config, kind)
    for n, p in list(module.named_parameters()):
        p.data = p.data.to(family.tensor_dtype(n, dtype))
    heads, head_dim = family.heads(config)
    meta = LoadedBlock(module=module, family=family, kind=kind, index=0, n_blocks=family.n_blocks(config, kind),
                       config=config, source="meta", params=0, bytes=0, heads=heads, head_dim=head_dim, load_s=0.0,
                       device=torch.device("meta"), dtype=dtype, preset=preset)
    inputs = make_inputs(meta, device="meta", dtype=dtype, **input_args)

    attention_flops = [0]

    def flash_stand_in(q, k, v, *, scale=None, attn_mask=None):
        b, sq, h, d = q.shape  # (B, S, H, D): QK^T and PV, 2 FLOPs a multiply-add each
        attention_flops[0] += 4 * b * h * sq * k.shape[1] * d
        return torch.empty_like(q)

    from torch.utils.flop_counter import FlopCounterMode

    mode = _LiveBytes()
    flops = FlopCounterMode(display=False)
    with torch.inference_mode(), dispatch.swapped(module, "meta-estimate", flash_stand_in,
                                              uses_dispatcher=family.uses_dispatcher):
        with flops, mode:
            out = inputs.run(module)
        del out
    with torch.device("meta"):  # the parent model's modules the inputs come from stay loaded beside the block
        parents = family.input_modules(config, kind)
    parent_bytes = sum(t.numel() * (torch.finfo(family.tensor_dtype(f"{n}.{k}", dtype) or t.dtype).bits // 8)
                       for n, m in parents.items() for k, t in m.state_dict().items())
    return {"input_bytes": tensor_bytes(inputs.args) + tensor_bytes(inputs.kwargs), "activation_bytes": int(mode.peak),
            "input_module_bytes": int(parent_bytes), "attention_flops": int(attention_flops[0]),
            "gemm_flops": int(flops.get_total_flops()), "grid": inputs.grid.describe(),
            "mask_note": inputs.mask_note,
            "tokens": inputs.tokens, "text_tokens": inputs.text_tokens,
            "method": "meta-device trace of live tensors, attention as a flash-style kernel (output only)"}


