"""Truncated completions and DAPO's soft overlong penalty, by hand."""

import pytest
import torch

from heterorl.objectives.overlong import overlong_penalty, truncated_completions

EOS, PAD = 2, 2  # tokenizers without a pad token pad with the end-of-sequence id


def test_truncated_means_no_eos_inside_the_mask():
    ids = torch.tensor([[5, 6, EOS, PAD], [5, 6, 7, 8], [5, 6, 7, PAD], [EOS, PAD, PAD, PAD]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0]])
    # row 2 ends in padding that carries the eos id, but outside its mask: still truncated
    assert truncated_completions(ids, mask, EOS).tolist() == [False, True, True, False]


@pytest.mark.parametrize(
    ("length", "expected"),
    [(0, 0.0), (12, 0.0), (13, -1 / 4), (14, -2 / 4), (16, -1.0), (17, -1.0), (40, -1.0)],
)
def test_penalty_by_hand(length: int, expected: float):
    # max_len 16, cache 4: free up to 12 tokens, a linear ramp to -1 at 16, -1 beyond
    assert overlong_penalty(torch.tensor([length]), 16, 4).item() == pytest.approx(expected)
    assert overlong_penalty(torch.tensor([length]), 16, 4, factor=0.5).item() == pytest.approx(0.5 * expected)


def test_penalty_is_one_tensor_operation():
    lengths = torch.tensor([3, 13, 16])
    torch.testing.assert_close(overlong_penalty(lengths, 16, 16), torch.tensor([-3 / 16, -13 / 16, -1.0]))


@pytest.mark.parametrize("cache", [0, 17])
def test_penalty_rejects_a_cache_outside_the_limit(cache: int):
    with pytest.raises(ValueError, match="overlong cache"):
        overlong_penalty(torch.tensor([1]), 16, cache)
