"""Key-padding masks: every form diffusers' processors pass reduces to one key subset per batch item, and the FP8
numerics emulation attends to exactly those keys (float64 reference on fresh random inputs, random lengths per
batch item, a fully masked tail strip, padded keys poisoned)."""

from __future__ import annotations

import math

import pytest
import torch

from ditprof.errors import DitprofError
from ditprof.kernels.fp8_emulation import fp8_attention_emulated
from ditprof.kernels.masks import key_mask
from ditprof.kernels.reference import attention_reference


def _keys(gen, B, Sk):
    lengths = torch.randint(1, Sk, (B,), generator=gen)
    return torch.arange(Sk)[None, :] < lengths[:, None], lengths


def test_every_mask_form_gives_the_key_subset():
    gen = torch.Generator().manual_seed(0)
    B, H, Sq, Sk = 3, 2, 5, 70
    keys, lengths = _keys(gen, B, Sk)
    forms = [keys, keys[:, None, None, :], keys.long(),
             torch.where(keys, 0.0, float("-inf"))[:, None, None, :],
             torch.where(keys, 0.0, torch.finfo(torch.bfloat16).min).to(torch.bfloat16)[:, None, None, :],
             torch.where(keys, 0.0, -10000.0)[:, None, :].unsqueeze(1),  # LTX: (B, 1, 1, Sk) from (B, 1, Sk)
             keys[:, None, None, :].expand(B, 1, Sq, Sk)]
    for m in forms:
        assert torch.equal(key_mask(m, B, H, Sq, Sk), keys), m.dtype
    # HunyuanVideo-1.5's joint mask m_i & m_j over one sequence: padded query rows attend to nothing
    joint = keys[:, None, :, None] & keys[:, None, None, :]
    assert torch.equal(key_mask(joint, B, H, Sk, Sk), keys)
    shuffled = keys[:, torch.randperm(Sk, generator=gen)]
    assert torch.equal(key_mask(shuffled, B, H, Sq, Sk), shuffled)


def test_compact_keys_moves_any_subset_to_a_prefix():
    """The CUDA path's mask handling (masks.compact_keys, pure torch): each item's kept keys first, in order, the
    dropped ones zeroed, the counts as int32; attention over the kept keys is unchanged (float64)."""
    from ditprof.kernels.masks import compact_keys
    from ditprof.kernels.reference import attention_reference

    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,)).item()))
    B, Sq, Sk, H, D = 3, 9, 75, 2, 16
    keep = torch.rand(B, Sk, generator=gen) < 0.6
    keep[2] = False
    keep[2, [0, 40, 74]] = True  # a sparse item
    k, v, q = (torch.randn(B, s, H, D, generator=gen, dtype=torch.float64) for s in (Sk, Sk, Sq))
    k2, v2, lens = compact_keys(k, v, keep)
    assert lens.dtype == torch.int32 and lens.tolist() == keep.sum(1).tolist()
    for b in range(B):
        n = int(lens[b])
        assert torch.equal(k2[b, :n], k[b, keep[b]]) and torch.equal(v2[b, :n], v[b, keep[b]])
        assert not k2[b, n:].any() and not v2[b, n:].any()
        want = attention_reference(q[b:b + 1], k[b:b + 1, keep[b]], v[b:b + 1, keep[b]])
        got = attention_reference(q[b:b + 1], k2[b:b + 1, :n], v2[b:b + 1, :n])
        assert torch.allclose(got, want, rtol=0, atol=1e-12)


def test_masks_that_are_not_key_padding_are_one_line():
    B, H, Sq, Sk = 2, 2, 4, 8
    soft = torch.randn(B, 1, Sq, Sk)
    with pytest.raises(DitprofError, match="soft additive bias"):
        key_mask(soft, B, H, Sq, Sk)
    per_row = torch.ones(B, 1, Sq, Sk, dtype=torch.bool)
    per_row[0, 0, 1, 3] = False
    with pytest.raises(DitprofError, match="differs between query rows"):
        key_mask(per_row, B, H, Sq, Sk)
    per_head = torch.ones(B, H, 1, Sk, dtype=torch.bool)
    per_head[1, 1, 0, 0] = False
    with pytest.raises(DitprofError, match="differs between heads"):
        key_mask(per_head, B, H, Sq, Sk)
    empty = torch.ones(B, Sk, dtype=torch.bool)
    empty[1] = False
    with pytest.raises(DitprofError, match="masks every key"):
        key_mask(empty, B, H, Sq, Sk)


def _rel(a, b):
    return float((a.double() - b).norm() / b.norm())


@pytest.mark.parametrize("Sk", [77, 130])
def test_emulation_attends_to_the_masked_keys_only(Sk):
    """Per batch item a random length; 130 keys with a length <= 96 leave the last 32-key strip fully masked."""
    gen = torch.Generator().manual_seed(Sk)
    B, Sq, H, D = 3, 40, 2, 64
    q, k, v = (torch.randn(B, s, H, D, generator=gen).to(torch.bfloat16) for s in (Sq, Sk, Sk))
    keys, lengths = _keys(gen, B, Sk)
    if Sk == 130:
        keys[0] = torch.arange(Sk) < 90  # the 96..129 strip holds no attended key
    k_poison, v_poison = k.clone(), v.clone()
    k_poison[~keys] = float("nan")  # padded rows of a prompt can hold anything
    v_poison[~keys] = 1e4
    out = torch.full_like(q, float("nan"))  # poisoned, then every element checked written
    out.copy_(fp8_attention_emulated(q, k_poison, v_poison, key_mask=keys))
    assert torch.isfinite(out).all()
    for b in range(B):
        ref = attention_reference(q[b:b + 1], k[b:b + 1, keys[b]], v[b:b + 1, keys[b]])
        assert _rel(out[b:b + 1], ref) <= 0.055  # the emulation's Gaussian bound
        unmasked = attention_reference(q[b:b + 1], k[b:b + 1], v[b:b + 1])
        if not bool(keys[b].all()):
            assert _rel(out[b:b + 1], unmasked) > 0.1  # a kernel ignoring the mask would fail the bound above
    again, lse = fp8_attention_emulated(q, k_poison, v_poison, key_mask=keys, return_lse=True)
    assert torch.equal(again, out) and torch.isfinite(lse).all()
    ref_lse = attention_reference(q[:1], k[:1, keys[0]], v[:1, keys[0]], return_lse=True)[1]
    assert float((lse[:1].double() - ref_lse).abs().max()) < 0.05 * math.log(Sk)


def test_emulation_key_mask_bad_input():
    q = k = v = torch.randn(1, 8, 1, 64)
    with pytest.raises(DitprofError, match="key_mask must be bool"):
        fp8_attention_emulated(q, k, v, key_mask=torch.ones(1, 8))
    with pytest.raises(DitprofError, match="masks every key"):
        fp8_attention_emulated(q, k, v, key_mask=torch.zeros(1, 8, dtype=torch.bool))


def test_attended_keys_is_key_mask_without_the_checks():
    """The no-sync form the harness uses in timed calls gives key_mask's answer, a batch-1 mask broadcast to B."""
    from ditprof.kernels.masks import attended_keys

    gen = torch.Generator().manual_seed(4)
    B, H, Sq, Sk = 3, 2, 5, 40
    keys, _ = _keys(gen, B, Sk)
    for m in (keys, keys.long(), torch.where(keys, 0.0, -10000.0)[:, None, None, :],
              keys[:, None, :, None] & keys[:, None, None, :]):
        sq = m.shape[2] if m.dim() == 4 and m.shape[2] > 1 else Sq
        assert torch.equal(attended_keys(m, B, H, sq, Sk), key_mask(m, B, H, sq, Sk))
    one = keys[:1, None, None, :]
    assert torch.equal(attended_keys(one, B, H, Sq, Sk), keys[:1].expand(B, Sk))
    assert torch.equal(attended_keys(one, B, H, Sq, Sk), key_mask(one, B, H, Sq, Sk))
