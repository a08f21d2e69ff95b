"""Memory of one block: parameters, bytes, and (CUDA) peak memory of load + one forward."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from .inputs import BlockInputs, make_inputs
from .loading import LoadedBlock, load_block, module_bytes


@dataclass
class MemoryReport:
    params: int
    bytes: int  # parameters + buffers as loaded (fp32-kept tensors counted at 4 bytes)
    device: str
    peak_load_bytes: int | None = None  # CUDA: peak allocated during load (None elsewhere)
    peak_forward_bytes: int | None = None  # CUDA: peak allocated during one forward
    input_bytes: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def tensor_bytes(obj) -> int:
    """Bytes of every tensor in a nest of tuples/lists/dicts (numel x element size: meta tensors count too)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (tuple, list)):
        return sum(tensor_bytes(o) for o in obj)
    if isinstance(obj, dict):
        return sum(tensor_bytes(o) for o in obj.values())
    return 0


def block_memory(loaded: LoadedBlock) -> MemoryReport:
    params, nbytes = module_bytes(loaded.module)
    return MemoryReport(params=params, bytes=nbytes, device=str(loaded.device))


def measure_load_and_forward(
    source: str,
    block: int = 0,
    *,
    kind: str | None = None,
    device: str | torch.device = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    progress: bool = False,
    **input_args,
) -> tuple[MemoryReport, LoadedBlock, BlockInputs]:
    """Load the block and run it once, recording CUDA peaks of each phase (bytes above baseline)."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    loaded = load_block(source, block, kind=kind, device=device, dtype=dtype, progress=progress)
    report = block_memory(loaded)
    if cuda:
        torch.cuda.synchronize(device)
        report.peak_load_bytes = torch.cuda.max_memory_allocated(device) - base
    inputs = make_inputs(loaded, device=device, **input_args)
    report.input_bytes = tensor_bytes(inputs.args) + tensor_bytes(inputs.kwargs)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    with torch.inference_mode():
        inputs.run(loaded.module)
    if cuda:
        torch.cuda.synchronize(device)
        report.peak_forward_bytes = torch.cuda.max_memory_allocated(device) - base
    return report, loaded, inputs
