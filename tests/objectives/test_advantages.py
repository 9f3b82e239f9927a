import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from heterorl.objectives import group_advantages

# Unequal group sizes (3, 3, 1, 2), non-contiguous and negative ids, members interleaved.
REWARDS = [1.0, 0.0, 3.0, 5.0, 2.0, 2.0, 7.0, 4.0, 1.0]
GROUPS = [10, 3, 10, 10, 3, -4, 3, 99, 99]


def test_centred_by_hand():
    adv = group_advantages(torch.tensor(REWARDS, dtype=torch.float64), torch.tensor(GROUPS), normalize=False)
    # group 10: r = 1, 3, 5 (mean 3); group 3: r = 0, 2, 7 (mean 3); group -4: r = 2; group 99: r = 4, 1 (mean 2.5)
    expected = [-2.0, -3.0, 0.0, 2.0, -1.0, 0.0, 4.0, 1.5, -1.5]
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float64))


def test_normalized_by_hand_uses_unbiased_std():
    adv = group_advantages(torch.tensor(REWARDS, dtype=torch.float64), torch.tensor(GROUPS), normalize=True)
    std_10 = math.sqrt((4 + 0 + 4) / 2)  # unbiased: divisor n - 1
    std_3 = math.sqrt((9 + 1 + 16) / 2)
    std_99 = math.sqrt((1.5**2 + 1.5**2) / 1)
    e = 1e-4
    expected = [
        -2 / (std_10 + e),
        -3 / (std_3 + e),
        0.0,
        2 / (std_10 + e),
        -1 / (std_3 + e),
        0.0,  # a group of one has advantage 0
        4 / (std_3 + e),
        1.5 / (std_99 + e),
        -1.5 / (std_99 + e),
    ]
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float64))


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("value", [0.0, 0.1, 0.7, 1e6 + 0.3])
def test_equal_rewards_give_exactly_zero(normalize: bool, value: float):
    rewards = torch.full((6,), value, dtype=torch.float32)
    adv = group_advantages(rewards, torch.tensor([0, 0, 0, 5, 5, 5]), normalize=normalize)
    assert torch.equal(adv, torch.zeros(6))


def test_integer_rewards_are_promoted():
    adv = group_advantages(torch.tensor([1, 0, 0, 1]), torch.tensor([0, 0, 1, 1]), normalize=False)
    assert adv.dtype == torch.get_default_dtype()
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, -0.5, 0.5]))


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="rewards and group_index"):
        group_advantages(torch.zeros(3), torch.zeros(4, dtype=torch.long), normalize=False)


def loop_reference(rewards: list[float], groups: list[int], normalize: bool) -> list[float]:
    """Plain Python: one pass per group."""
    out = [0.0] * len(rewards)
    for g in set(groups):
        members = [i for i, gi in enumerate(groups) if gi == g]
        rs = [rewards[i] for i in members]
        mean = sum(rs) / len(rs)
        std = math.sqrt(sum((r - mean) ** 2 for r in rs) / (len(rs) - 1)) if len(rs) > 1 else 0.0
        for i in members:
            out[i] = (rewards[i] - mean) / (std + 1e-4) if normalize else rewards[i] - mean
    return out


@settings(max_examples=60, deadline=None)
@given(
    data=st.lists(
        st.tuples(st.integers(-3, 1000), st.floats(-10, 10, allow_nan=False, allow_infinity=False)),
        min_size=1,
        max_size=24,
    ),
    normalize=st.booleans(),
)
def test_vectorised_equals_loop(data: list[tuple[int, float]], normalize: bool):
    groups = [g % 7 if g >= 0 else g for g, _ in data]  # few distinct ids, so groups have several members
    rewards = [r for _, r in data]
    adv = group_advantages(torch.tensor(rewards, dtype=torch.float64), torch.tensor(groups), normalize=normalize)
    expected = torch.tensor(loop_reference(rewards, groups, normalize), dtype=torch.float64)
    torch.testing.assert_close(adv, expected, rtol=1e-7, atol=1e-7)
