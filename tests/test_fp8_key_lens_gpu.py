"""Key-padding masks in the FP8 kernels on a GPU, both kernels (``fp8-sm120``, emulated on Hopper, and ``fp8-sm90``):

- per-batch key counts read on the device (``launch_record.fp8_call(..., key_lens)``): batch item b attends to its
  first ``key_lens[b]`` keys, the keys after them are ordinary random data that must be ignored;
- the op with a bool ``key_mask`` that is not a prefix (a random subset of keys per batch item);
- a CUDA graph captured once and replayed after the lengths changed in place (they are read on the device).

Each against a float64 reference over exactly the attended keys, with the output poisoned with NaN before the run.
Marked ``gpu`` (skipped without CUDA).
"""

from __future__ import annotations

import math

import pytest
import torch

from ditprof.kernels.fp8_config import Fp8Options
from fp8_gpu_cases import GAUSSIAN_REL_RMS, gaussian_inputs, poisoned_outputs, rel_rms

pytestmark = pytest.mark.gpu

KERNELS = ["fp8-sm120", "fp8-sm90"]
B, SQ, SK, H = 3, 200, 480, 4
# 480: all keys; 301: the last 160-key tile (keys 320..479) of fp8-sm90 holds no valid key, and the 32-key strip
# 288..319 of fp8-sm120 is partial; 97: one valid key in its last 32-key strip, every later strip and tile masked
LENGTHS = [480, 301, 97]


def _cuda(kernel: str):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if kernel == "fp8-sm90" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("fp8-sm90 needs an sm_90a GPU (H100/H200)")


def _check_items(o, q, k, v, keys_of, scale, lengths_note, lse=None):
    """o (B,Sq,H,D) vs the float64 reference of each batch item over its attended keys ``keys_of(b)`` (an index
    tensor); where at least a fifth of the keys are masked, also checks that attending to every key would have
    been clearly wrong (the relative change is about sqrt(masked fraction)). ``lse`` (B,H,Sq): vs the reference's
    log-sum-exp too."""
    from ditprof.kernels.reference import attention_reference

    for b in range(o.shape[0]):
        keys = keys_of(b)
        if keys.numel() == 0:
            continue  # a fully masked item: NaN rows allowed (as SDPA's)
        ob = o[b:b + 1]
        assert torch.isfinite(ob).all(), f"item {b} ({lengths_note}): output not fully written or non-finite"
        ref, ref_lse = attention_reference(q[b:b + 1], k[b:b + 1, keys], v[b:b + 1, keys], scale=scale,
                                           return_lse=True)
        err = rel_rms(ob, ref)
        print(f"item {b}: {keys.numel()} of {k.shape[1]} keys ({lengths_note}): rel-RMS vs float64 {err:.4%}")
        assert err <= GAUSSIAN_REL_RMS, (b, keys.numel(), err)
        if lse is not None:
            # the kernel's LSE is the numerics model's (the emulation over the same keys) up to the tiling; the
            # model's own worst row vs float64 is bounded separately: with e4m3 Q/K at head_dim 64 a peaked row's
            # LSE moves by up to ~0.06 (the error of its largest score), which a max over B*H*Sq rows does reach
            from ditprof.kernels.fp8_emulation import fp8_attention_emulated

            assert torch.isfinite(lse[b]).all(), f"item {b}: LSE not fully written"
            _, emu_lse = fp8_attention_emulated(q[b:b + 1, :], k[b:b + 1, keys], v[b:b + 1, keys], scale=scale,
                                                return_lse=True)
            kernel_vs_model = (lse[b:b + 1] - emu_lse).abs().max().item()
            model_vs_f64 = (emu_lse.double() - ref_lse).abs().max().item()
            print(f"item {b}: LSE max |kernel - model| {kernel_vs_model:.2e}, |model - float64| {model_vs_f64:.3f}")
            # the kernel's l is the sum of the e4m3-rounded P8 (the model sums unrounded P): each term off by up to
            # 2^-4 relative, so the gap shrinks like 1/sqrt(keys); H200, INT8 Q/K: 6.5e-3 / 7.5e-3 / 1.2e-2 at
            # 480 / 301 / 97 keys (max over 800 rows), i.e. 0.12-0.14 / sqrt(keys)
            bound = 0.2 / math.sqrt(keys.numel())
            assert kernel_vs_model < bound, (b, keys.numel(), kernel_vs_model, bound)
            assert model_vs_f64 < 0.1, (b, model_vs_f64)
        if keys.numel() <= 0.8 * k.shape[1]:
            unmasked = rel_rms(ob, attention_reference(q[b:b + 1], k[b:b + 1], v[b:b + 1], scale=scale))
            assert unmasked > 4 * GAUSSIAN_REL_RMS, (b, unmasked)  # the masked keys would have shown


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("D", [128, 64])
@pytest.mark.parametrize("case", ["fixed", "random"])
def test_key_lens_vs_float64(kernel, D, case):
    _cuda(kernel)
    from ditprof.kernels.launch_record import fp8_call

    seed = {"fixed": 11, "random": 12}[case] + D
    q, k, v = gaussian_inputs(B, H, SQ, SK, D, seed=seed)
    if case == "fixed":
        lengths = torch.tensor(LENGTHS, dtype=torch.int32)
    else:
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(1, SK + 1, (B,), generator=g, dtype=torch.int32)
        lengths[int(torch.randint(0, B, (1,), generator=g))] = int(torch.randint(1, 321, (1,), generator=g))
    lens = lengths.cuda()
    scale = 1.0 / math.sqrt(D)
    return_lse = case == "fixed"  # fp8-sm120 is compiled with and without its LSE store: both variants
    with poisoned_outputs(((B, SQ, H, D), q.dtype), ((B, H, SQ), torch.float32)) as hits:
        res = fp8_call(q, k, v, scale, lens, return_lse=return_lse, options=Fp8Options(kernel=kernel))
        torch.cuda.synchronize()
    o, lse = res if return_lse else (res, None)
    assert hits["n"] >= 1, "the output allocation was not poisoned (update fp8_gpu_cases.poisoned_outputs)"
    assert o.shape == (B, SQ, H, D) and o.dtype == q.dtype
    _check_items(o, q, k, v, lambda b: torch.arange(int(lengths[b]), device="cuda"), scale,
                 f"{kernel}, lengths {lengths.tolist()}", lse=lse)


@pytest.mark.parametrize("kernel", KERNELS)
def test_key_lens_zero_and_over_length(kernel):
    """An item with no key does not hang or disturb the others (its rows may be NaN); a length over Sk is Sk."""
    _cuda(kernel)
    from ditprof.kernels.launch_record import fp8_call

    q, k, v = gaussian_inputs(B, H, SQ, SK, 128, seed=21)
    lengths = [0, SK + 1000, 33]
    with poisoned_outputs(((B, SQ, H, 128), q.dtype)):
        o = fp8_call(q, k, v, 1.0 / math.sqrt(128), torch.tensor(lengths, dtype=torch.int32, device="cuda"),
                     options=Fp8Options(kernel=kernel))
        torch.cuda.synchronize()
    _check_items(o, q, k, v, lambda b: torch.arange(min(max(lengths[b], 0), SK), device="cuda"),
                 1.0 / math.sqrt(128), f"{kernel}, lengths {lengths}")


@pytest.mark.parametrize("kernel", KERNELS)
def test_op_non_prefix_key_mask_vs_float64(kernel):
    _cuda(kernel)
    from ditprof.kernels.op import options_key  # importing op registers torch.ops.ditprof.fp8_attention

    forced = options_key(Fp8Options(kernel=kernel))  # the op picks its kernel by arch unless forced

    q, k, v = gaussian_inputs(B, H, SQ, SK, 128, seed=31)
    g = torch.Generator(device="cuda").manual_seed(32)
    keep = torch.rand(B, SK, device="cuda", generator=g) < torch.tensor([0.9, 0.5, 0.15], device="cuda")[:, None]
    keep[2, 300:] = False  # item 2: nothing in the last 160-key tile / 32-key strips (nor in most of the rest)
    keep[:, 0] = False  # not a prefix, whatever the draw
    scale = 0.1
    with poisoned_outputs(((B, SQ, H, 128), q.dtype)) as hits:
        o = torch.ops.ditprof.fp8_attention(q, k, v, scale, keep, forced)
        torch.cuda.synchronize()
    assert hits["n"] >= 1, "the output allocation was not poisoned (update fp8_gpu_cases.poisoned_outputs)"
    _check_items(o, q, k, v, lambda b: keep[b].nonzero().flatten(), scale, f"{kernel}, mask (op)")


@pytest.mark.parametrize("kernel", KERNELS)
def test_key_lens_read_on_the_device_in_a_cuda_graph(kernel):
    """Captured once; the mask changes in place between replays and each replay follows it (nothing about the
    key counts is baked into the graph). The static output is poisoned before each replay."""
    _cuda(kernel)
    from ditprof.kernels.op import options_key

    forced = options_key(Fp8Options(kernel=kernel))

    q, k, v = gaussian_inputs(B, H, SQ, SK, 128, seed=41)
    keep = torch.arange(SK, device="cuda")[None, :] < torch.tensor(LENGTHS, device="cuda")[:, None]
    scale = 1.0 / math.sqrt(128)
    torch.ops.ditprof.fp8_attention(q, k, v, scale, keep, forced)  # compile, build the launch record
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.ditprof.fp8_attention(q, k, v, scale, keep, forced)
    for lengths in (LENGTHS, [97, 480, 1], [33, 320, 321]):
        keep.copy_(torch.arange(SK, device="cuda")[None, :] < torch.tensor(lengths, device="cuda")[:, None])
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check_items(out, q, k, v, lambda b: torch.arange(lengths[b], device="cuda"), scale,
                     f"{kernel}, graph replay, lengths {lengths}")
