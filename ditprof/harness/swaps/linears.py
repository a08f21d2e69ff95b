"""``LinearsSwap``: the block's ``nn.Linear``\\ s run in FP8 -- torchao's dynamic float8 on a GPU with FP8 tensor
cores, its numerics emulated elsewhere (``kernels.fp8_linear``; labelled numerics only, never a silent bf16).

Which linears are swapped is the family's word (``BlockFamily.fp8_keep_linears``: modulation projections of the
timestep embedding stay bf16) and torchao's (sizes not multiples of 16, weights the model keeps in fp32); every
kept linear is listed in the report with its reason. Each swapped linear is replaced in its parent by a new module
built from it; the original modules are put back by ``undo``, untouched.
"""

from __future__ import annotations

import fnmatch
import types
from typing import Sequence

import torch

from ditprof.errors import DitprofError
from ditprof.harness.swaps.base import Installed, Swap
from ditprof.kernels import fp8_linear
from ditprof.kernels.fp8_linear import Fp8LinearConfig


class LinearsInstalled(Installed):
    """The replaced linears of one block: (parent, attribute, original module) each, and the record."""

    def __init__(self, replaced: list[tuple[torch.nn.Module, str, torch.nn.Module]], section: dict):
        self.replaced = replaced
        self.section = section

    def undo(self) -> None:
        for parent, attr, original in reversed(self.replaced):
            setattr(parent, attr, original)
        self.replaced = []

    def record(self) -> dict:
        return {"linears": self.section}


class CompiledAlone(torch.nn.Module):
    """``module`` compiled as a frame of its own. Dynamo keeps its compiled graphs per code object, at most
    ``recompile_limit`` (8) each; ``torch.compile(module)`` compiles ``nn.Module``'s call, which every module in the
    process shares, so a block's ninth linear shape (or a second block's linears) fails a fullgraph compile. Here
    each instance calls ``module`` from a fresh copy of one small function, so its cache holds only its own graph and
    dies with it. ``weight``/``bias`` read through to ``module`` for code that inspects them."""

    def __init__(self, module: torch.nn.Module, tag: str, *, backend: str = "inductor"):
        super().__init__()
        self.module = module

        def call(x):
            return module(x)

        own = types.FunctionType(call.__code__.replace(co_name=f"fp8_linear_{tag}"), call.__globals__,
                                 call.__name__, None, call.__closure__)
        self._compiled = torch.compile(own, fullgraph=True, dynamic=False, backend=backend)

    @property
    def weight(self):
        return self.module.weight

    @property
    def bias(self):
        return self.module.bias

    def forward(self, x):
        return self._compiled(x)


def _parent(block: torch.nn.Module, name: str) -> tuple[torch.nn.Module, str]:
    owner, _, attr = name.rpartition(".")
    return (block.get_submodule(owner) if owner else block), attr


class LinearsSwap(Swap):
    """Every linear of the block that may run in FP8 does (``config``: the scale granularity). ``keep``: the
    family's (pattern over module names, why) pairs for linears that stay bf16; ``device``: where the block runs
    (FP8 tensor cores: torchao; else the emulation)."""

    def __init__(self, config: Fp8LinearConfig, device: torch.device, *,
                 keep: Sequence[tuple[str, str]] = (), compile_each: bool = False):
        self.config = config
        self.name = config.name
        self.keep = tuple(keep)
        self.device = torch.device(device)
        self.emulated = not fp8_linear.fp8_tensor_cores(self.device)
        self.numerics_only = self.emulated
        # an eager block: torchao's activation quantization is half a dozen elementwise kernels per call (abs, amax,
        # div, clamp, cast) unless inductor fuses them; each swapped linear compiled alone gets that fusion while
        # the rest of the block stays eager (the emulation is never compiled: it is numerics, not speed)
        self.compile_each = compile_each and not self.emulated
        if not self.emulated and fp8_linear.torchao_version() is None:
            raise DitprofError(f"--linears {config.granularity} on {self._device_name()} needs "
                               f"{fp8_linear.TORCHAO_PIN}: pip install 'ditprof[fp8-linears]'")

    def _device_name(self) -> str:
        if self.device.type != "cuda":
            return self.device.type
        major, minor = torch.cuda.get_device_capability(self.device)
        return f"{torch.cuda.get_device_name(self.device)} (sm_{major}{minor})"

    def path(self) -> str:
        """How the swapped linears run, as the report says it."""
        if self.emulated:
            return (f"emulation of torchao's float8 numerics (numerics only: {self._device_name()} has no FP8 "
                    f"tensor cores)")
        return f"torchao {fp8_linear.torchao_version()} Float8DynamicActivationFloat8WeightConfig"

    def describe(self) -> str:
        return f"linears in FP8, {self.config.granularity} scales ({self.path()})"

    def kept_reason(self, name: str, linear: torch.nn.Linear) -> str | None:
        for pattern, why in self.keep:
            if fnmatch.fnmatchcase(name, pattern):
                return why
        return fp8_linear.unsupported_reason(linear)

    def execution(self) -> str:
        """How the swapped linears execute, as the report says it."""
        if self.emulated:
            return "emulated"
        if self.compile_each:
            return "each linear compiled (torch.compile; inductor fuses torchao's activation quantization)"
        return "as the block runs (eager: torchao's activation quantization unfused; --compile: fused in the block)"

    def _replacement(self, name: str, linear: torch.nn.Linear) -> torch.nn.Module:
        if self.emulated:
            return fp8_linear.EmulatedFp8Linear(linear, self.config)
        fp8 = fp8_linear.torchao_linear(linear, self.config)
        return CompiledAlone(fp8, name.replace(".", "_")) if self.compile_each else fp8

    def install(self, block: torch.nn.Module) -> LinearsInstalled:
        linears = [(n, m) for n, m in block.named_modules() if isinstance(m, torch.nn.Linear)]
        replaced: list[tuple[torch.nn.Module, str, torch.nn.Module]] = []
        swapped, kept, params = [], {}, 0
        installed = LinearsInstalled(replaced, {})
        try:
            for name, linear in linears:
                why = self.kept_reason(name, linear)
                if why:
                    kept[name] = why
                    continue
                parent, attr = _parent(block, name)
                new = self._replacement(name, linear)
                setattr(parent, attr, new)
                replaced.append((parent, attr, linear))
                swapped.append(name)
                params += linear.weight.numel()
        except BaseException:
            installed.undo()
            raise
        total = sum(m.weight.numel() for _, m in linears)
        installed.section = {
            "config": self.config.name, "granularity": self.config.granularity, "path": self.path(),
            "execution": self.execution(),
            "numerics_only": self.numerics_only, "swapped": swapped, "kept": kept,
            "swapped_weight_share": params / total if total else 0.0,
        }
        return installed


def linears_swaps(granularity: str | None, device: torch.device, family=None, *,
                  compile_each: bool = False) -> list[Swap]:
    """``--linears``: the block's linears in FP8 (the family's ``fp8_keep_linears`` kept), as a swap list to compose
    after an attention swap; [] without a granularity. Raises the one-line error where it cannot run."""
    if not granularity:
        return []
    return [LinearsSwap(Fp8LinearConfig(granularity), device, keep=getattr(family, "fp8_keep_linears", ()),
                        compile_each=compile_each)]


__all__ = ["LinearsInstalled", "LinearsSwap", "linears_swaps"]
