import pytest
import torch

from ditprof.errors import DitprofError
from ditprof.kernels.key_order import key_order_for_positions, permute_keys, unpermute_keys

# The write-up's order inside every 16-key group: lane L of a quad holds keys 2L, 2L+1, 2L+8, 2L+9.
GROUP_ORDER = [0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15]


def test_matches_write_up_example():
    keys = key_order_for_positions(torch.arange(16)).tolist()
    assert keys[0:4] == [0, 1, 8, 9]  # lane 0's keys land in positions 0..3
    assert keys[4:8] == [2, 3, 10, 11]  # lane 1's keys in positions 4..7
    assert keys == GROUP_ORDER


def test_every_16_key_group_is_permuted_on_its_own():
    keys = key_order_for_positions(torch.arange(64)).tolist()
    assert keys == [g + k for g in (0, 16, 32, 48) for k in GROUP_ORDER]


def test_works_on_python_ints():
    assert [key_order_for_positions(p) for p in range(16, 20)] == [16, 17, 24, 25]


def test_is_a_bijection():
    keys = key_order_for_positions(torch.arange(1024))
    assert torch.equal(keys.sort().values, torch.arange(1024))


def test_agrees_with_the_prep():
    from ditprof.kernels import prep

    positions = torch.arange(96)
    assert torch.equal(key_order_for_positions(positions), prep.key_order_for_positions(positions))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_permute_then_unpermute_is_identity(dim):
    x = torch.randn(32, 48, 64)
    assert torch.equal(unpermute_keys(permute_keys(x, dim), dim), x)
    assert torch.equal(permute_keys(unpermute_keys(x, dim), dim), x)


def test_permute_places_key_order_p_at_position_p():
    x = torch.arange(32.0)[:, None].expand(32, 4)  # row i holds the value i
    out = permute_keys(x, 0)
    assert out[:, 0].tolist() == key_order_for_positions(torch.arange(32)).float().tolist()


def test_permuting_p_columns_and_v_rows_together_leaves_pv_unchanged():
    # integer-valued float64: every sum is exact, so any summation order gives the same bits
    p = torch.randint(-8, 8, (128, 64)).double()
    v = torch.randint(-8, 8, (64, 32)).double()
    assert torch.equal(permute_keys(p, 1) @ permute_keys(v, 0), p @ v)
    # and V alone in the wrong order does change the product (the test can fail)
    assert not torch.equal(p @ permute_keys(v, 0), p @ v)


def test_length_not_a_multiple_of_16_asks_for_padding():
    with pytest.raises(DitprofError, match="pad keys to a multiple of 32"):
        permute_keys(torch.zeros(40, 8), 0)
