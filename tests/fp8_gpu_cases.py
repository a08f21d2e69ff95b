"""Shapes, bounds and helpers shared by the GPU tests of both FP8 kernels (fp8-sm120 and fp8-sm90)."""

import contextlib

import torch

# (B, H, Sq, Sk, D): issue 4's required GPU shapes
SHAPES = [
    (1, 56, 30272, 30272, 128),  # H3 self-attention
    (2, 3, 77, 77, 128),  # batch > 1, ragged length
    (1, 1, 1, 1, 128),  # one query, one key
    (1, 8, 4096, 512, 128),  # cross-attention: 4096 queries x 512 keys
]
IDS = ["h3", "b2h3s77", "s1", "cross4096x512"]
GAUSSIAN_REL_RMS = 0.055  # issue 4's goal for Gaussian inputs (the seed reports 5.4% vs cuDNN BF16)


def rel_rms(x, ref):
    x, ref = x.double(), ref.double()
    return ((x - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-30)).item()


def gaussian_inputs(B, H, Sq, Sk, D, dtype=torch.bfloat16, seed=0):
    """Fresh (B, S, H, D) q, k, v on the GPU, drawn in fp32 from a seeded generator."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn((B, Sq, H, D), generator=g, device="cuda", dtype=torch.float32).to(dtype)
    k = torch.randn((B, Sk, H, D), generator=g, device="cuda", dtype=torch.float32).to(dtype)
    v = torch.randn((B, Sk, H, D), generator=g, device="cuda", dtype=torch.float32).to(dtype)
    return q, k, v


def biased_v_inputs(B, H, Sq, Sk, D, seed=7):
    """q, k ~ 0.5 N(0,1) (fairly flat attention) and v ~ 4 + N(0,1), (B, S, H, D) bf16 on the GPU.

    Over a long key range |O| grows far above each key tile's P V term; a kernel that accumulates O inside a
    tensor-core accumulator with a short alignment loses those terms (Hopper's FP8 wgmma: 53 % rel-RMS at 32768
    keys before the fix). P quantization noise averages out over many keys, so a correct kernel stays < 1 %."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = (0.5 * torch.randn((B, Sq, H, D), generator=g, device="cuda")).to(torch.bfloat16)
    k = (0.5 * torch.randn((B, Sk, H, D), generator=g, device="cuda")).to(torch.bfloat16)
    v = (4.0 + torch.randn((B, Sk, H, D), generator=g, device="cuda")).to(torch.bfloat16)
    return q, k, v


@contextlib.contextmanager
def poisoned_outputs(*targets):
    """Every ``torch.empty`` / ``torch.empty_like`` of one of the ``(shape, dtype)`` targets (the output's, the
    LSE's) made inside comes back filled with NaN, so an element the kernel does not write stays NaN. Yields a
    counter of the poisoned allocations."""
    real_empty, real_empty_like = torch.empty, torch.empty_like
    targets = {(tuple(shape), dtype) for shape, dtype in targets}
    hits = {"n": 0}

    def poison(t):
        if (tuple(t.shape), t.dtype) in targets:
            hits["n"] += 1
            t.fill_(float("nan"))
        return t

    def empty(*args, **kwargs):
        return poison(real_empty(*args, **kwargs))

    def empty_like(*args, **kwargs):
        return poison(real_empty_like(*args, **kwargs))

    torch.empty, torch.empty_like = empty, empty_like
    try:
        yield hits
    finally:
        torch.empty, torch.empty_like = real_empty, real_empty_like
