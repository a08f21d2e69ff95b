"""FP8 linears: torchao's dynamic float8 (``Float8DynamicActivationFloat8WeightConfig``) where the GPU has FP8
tensor cores, and its numerics in plain torch where it has not (the CPU, GPUs below sm_89).

torchao's recipe, which the emulation follows step by step (torchao 0.18, the torch quantize path of
``Float8Tensor.from_hp`` and the ``_scaled_mm`` matmul):

1. Scales, per row (``rowwise``: one per token of the activation, one per output channel of the weight) or one for
   the whole tensor (``tensorwise``): ``scale = fp32(amax|X| / 448)`` with the amax and the division in X's own
   dtype (bf16 rounds the scale). An all-zero row has scale 0 and gives NaN, as torchao's does.
2. ``X8 = e4m3(clamp(fp32(X) / scale, +-448))``, round to nearest even; the weight once at install, the
   activation at every call.
3. ``Y = (X8 @ W8^T) * scale_x * scale_w^T (+ bias)`` with fp32 accumulation, rounded once to X's dtype. The
   emulation runs that matmul in fp32 on the e4m3 values (exact products); only the summation order differs from
   the tensor core's.
"""

from __future__ import annotations

import torch

from ditprof.errors import DitprofError
from ditprof.kernels.fp8_linear_config import GRANULARITIES, TORCHAO_PIN, Fp8LinearConfig  # noqa: F401

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
# torchao's float8 linear needs both dimensions divisible by 16 (the FP8 tensor-core tile of _scaled_mm)
DIM_MULTIPLE = 16


def fp8_tensor_cores(device: torch.device) -> bool:
    """Whether ``device`` has FP8 tensor cores (CUDA sm_89 and newer)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def torchao_version() -> str | None:
    """The installed torchao's version, or None without torchao."""
    try:
        import torchao
    except ImportError:
        return None
    return str(getattr(torchao, "__version__", "unknown"))


def unsupported_reason(linear: torch.nn.Linear) -> str | None:
    """Why torchao's float8 linear cannot take ``linear`` (its sizes, its dtype), or None."""
    if linear.weight.dtype not in (torch.bfloat16, torch.float16):
        return f"weight is {str(linear.weight.dtype).removeprefix('torch.')} (kept so by the model)"
    bad = [f"{n} {v}" for n, v in (("in_features", linear.in_features), ("out_features", linear.out_features))
           if v % DIM_MULTIPLE]
    if bad:
        return f"{' and '.join(bad)} not a multiple of {DIM_MULTIPLE}"
    return None


def fp8_scale(x: torch.Tensor, granularity: str) -> torch.Tensor:
    """fp32 scale of ``x`` (step 1): shape (..., 1) per row over the last dim, or a 0-d tensor per tensor."""
    amax = x.abs().amax(dim=-1, keepdim=True) if granularity == "rowwise" else x.abs().amax()
    return (amax / FP8_MAX).to(torch.float32)


def quantize_e4m3(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Step 2: ``e4m3(clamp(fp32(x) / scale, +-448))``."""
    return (x.to(torch.float32) / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def emulated_linear(x: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None,
                    granularity: str) -> torch.Tensor:
    """Step 3 for activation ``x`` (..., K) and a quantized weight ``w8`` (N, K) with its fp32 scale: (..., N) in
    x's dtype."""
    x_scale = fp8_scale(x, granularity)
    x8 = quantize_e4m3(x, x_scale)
    y = (x8.to(torch.float32) @ w8.to(torch.float32).t()) * x_scale * w_scale.reshape(-1)
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype)


class EmulatedFp8Linear(torch.nn.Module):
    """A linear with torchao's FP8 numerics in plain torch (numerics only: not a speed). Built from the bf16
    ``linear``, whose weight is quantized once; the original module is not changed."""

    def __init__(self, linear: torch.nn.Linear, config: Fp8LinearConfig):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.granularity = config.granularity
        w = linear.weight.detach()
        scale = fp8_scale(w, config.granularity)
        self.register_buffer("weight_fp8", quantize_e4m3(w, scale))
        self.register_buffer("weight_scale", scale)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return emulated_linear(x, self.weight_fp8, self.weight_scale, self.bias, self.granularity)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8 {self.granularity} (emulated)"


def torchao_linear(linear: torch.nn.Linear, config: Fp8LinearConfig) -> torch.nn.Linear:
    """A new ``nn.Linear`` sharing ``linear``'s bias whose weight is torchao's float8 tensor (quantized once from
    ``linear``'s weight, which stays as it was). torchao's own inductor settings are left alone
    (``set_inductor_config=False``): a swap changes the block, not the process."""
    try:
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, PerTensor, quantize_
    except ImportError as exc:
        raise DitprofError(f"FP8 linears on this GPU need {TORCHAO_PIN} (pip install 'ditprof[fp8-linears]'): "
                           f"{exc}") from None
    granularity = PerRow() if config.granularity == "rowwise" else PerTensor()
    with torch.device("meta"):
        fresh = torch.nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None)
    fresh.weight = torch.nn.Parameter(linear.weight.detach(), requires_grad=False)
    fresh.bias = linear.bias
    quantize_(fresh, Float8DynamicActivationFloat8WeightConfig(granularity=granularity, set_inductor_config=False))
    return fresh


__all__ = ["DIM_MULTIPLE", "EmulatedFp8Linear", "Fp8LinearConfig", "GRANULARITIES", "TORCHAO_PIN",
           "emulated_linear", "fp8_scale", "fp8_tensor_cores", "quantize_e4m3", "torchao_linear", "torchao_version",
           "unsupported_reason"]
