"""The rollout wire format: bit-exact round trip, and every malformed or out-of-bounds message rejected."""

import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from heterorl.rollout import RolloutGroup
from heterorl.rollout_codec import GroupLimits, RolloutError, decode_group, encode_group

LIMITS = GroupLimits(vocab_size=46, current_version=10)


def make_group(G: int = 3, L: int = 4, P: int = 5, version: int = 7, seed: int = 0) -> RolloutGroup:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, L + 1, (G,), generator=gen)
    mask = (torch.arange(L)[None] < lengths[:, None]).long()
    logp = -torch.rand(G, L, generator=gen) * 3
    return RolloutGroup(
        group_id="s0:17",
        sampler_id="s0",
        prompt="12+3=",
        answer="15",
        prompt_ids_P=torch.randint(3, 46, (P,), generator=gen),
        completion_ids_GL=torch.randint(0, 46, (G, L), generator=gen) * mask,
        completion_mask_GL=mask,
        behavior_logp_GL=logp * mask,
        version_GL=torch.full((G, L), version) - (torch.arange(L)[None] < 1).long(),
        rewards_G=torch.rand(G, generator=gen),
        created_at=12.5,
        finished_at=30.25,
    )


def assert_same(a: RolloutGroup, b: RolloutGroup) -> None:
    for name, value in vars(a).items():
        other = getattr(b, name)
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, other), name
        else:
            assert value == other, name


@settings(max_examples=60, deadline=None)
@given(G=st.integers(1, 8), L=st.integers(1, 12), P=st.integers(1, 9), seed=st.integers(0, 10_000))
def test_round_trip_is_exact(G: int, L: int, P: int, seed: int) -> None:
    group = make_group(G, L, P, seed=seed)
    assert_same(decode_group(encode_group(group), LIMITS), group)


def test_every_truncation_is_rejected() -> None:
    data = encode_group(make_group())
    for n in range(len(data)):
        with pytest.raises(RolloutError):
            decode_group(data[:n], LIMITS)
    with pytest.raises(RolloutError):
        decode_group(data + b"\x00", LIMITS)


def test_corruption_never_crashes_and_never_passes_invalid_content() -> None:
    data = encode_group(make_group())
    for i in range(0, len(data), 3):
        corrupted = bytearray(data)
        corrupted[i] ^= 0xFF
        try:
            group = decode_group(bytes(corrupted), LIMITS)
        except RolloutError:
            continue
        # a flip that still decodes must still satisfy every content rule (e.g. a changed reward value)
        assert group.completion_ids_GL.max() < LIMITS.vocab_size


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda g: g.completion_ids_GL.__setitem__((0, 0), 46), "vocabulary"),
        (lambda g: g.prompt_ids_P.__setitem__(0, -1), "vocabulary"),
        (lambda g: g.behavior_logp_GL.__setitem__((0, 0), float("nan")), r"log-probs must be in \[-104, 0\]"),
        (lambda g: g.behavior_logp_GL.__setitem__((0, 0), float("-inf")), r"log-probs must be in \[-104, 0\]"),
        (lambda g: g.behavior_logp_GL.__setitem__((0, 0), -105.0), r"log-probs must be in \[-104, 0\]"),
        (lambda g: g.behavior_logp_GL.__setitem__((0, 0), 0.5), r"log-probs must be in \[-104, 0\]"),
        (lambda g: g.version_GL.__setitem__((0, 0), 11), "not in"),
        (lambda g: g.rewards_G.__setitem__(0, float("inf")), "rewards"),
        (lambda g: g.rewards_G.__setitem__(0, float("nan")), "rewards"),
        (lambda g: g.rewards_G.__setitem__(0, -2e4), "rewards"),
    ],
    ids=[
        "oov-completion",
        "oov-prompt",
        "nan-logp",
        "inf-logp",
        "logp-below-float32-sampling",
        "positive-logp",
        "future-version",
        "inf-reward",
        "nan-reward",
        "reward-out-of-bounds",
    ],
)
def test_invalid_content_is_rejected(mutate, message: str) -> None:
    group = make_group()
    mutate(group)
    with pytest.raises(RolloutError, match=message):
        decode_group(encode_group(group), LIMITS)


@pytest.mark.parametrize("length", [0, -1, 5, 2**31 - 1])
def test_completion_lengths_outside_one_to_l_are_rejected(length: int) -> None:
    """The mask is built from the sent lengths: each must be in [1, L] (L = 4 here), and one bad row is enough."""
    G, L = 3, 4
    data = bytearray(encode_group(make_group(G=G, L=L)))
    at = len(data) - 4 * (G + 2 * G * L + G) + 4  # the second row's length (lengths come after the ids)
    data[at : at + 4] = struct.pack("<i", length)
    with pytest.raises(RolloutError, match=r"completion lengths must be in \[1, 4\]"):
        decode_group(bytes(data), LIMITS)


def test_decoded_mask_is_int64_prefixes_of_the_lengths() -> None:
    group = decode_group(encode_group(make_group(G=3, L=4, seed=2)), LIMITS)
    assert group.completion_mask_GL.dtype == torch.int64
    lengths = group.completion_mask_GL.sum(1)
    assert torch.equal(group.completion_mask_GL, (torch.arange(4)[None] < lengths[:, None]).long())


def test_group_size_and_length_limits() -> None:
    data = encode_group(make_group(G=3))
    with pytest.raises(RolloutError, match="group size 3"):
        decode_group(data, GroupLimits(vocab_size=46, current_version=10, group_size=4))
    with pytest.raises(RolloutError, match="exceed"):
        decode_group(data, GroupLimits(vocab_size=46, current_version=10, max_completion_tokens=2))


def test_framing_errors_are_named() -> None:
    data = encode_group(make_group())
    with pytest.raises(RolloutError, match="magic"):
        decode_group(b"XXXX" + data[4:], LIMITS)
    with pytest.raises(RolloutError, match="JSON"):
        decode_group(struct.pack("<4sI", b"HRG1", 3) + b"{x}" + data[-8:], LIMITS)
    head = b'{"group_id":"a","sampler_id":"s","prompt":"p","answer":"a","P":-1,"G":1,"L":1}'
    with pytest.raises(RolloutError, match="'P'"):
        decode_group(struct.pack("<4sI", b"HRG1", len(head)) + head, LIMITS)


@pytest.mark.parametrize("seed", range(4))
def test_row_bytes_are_each_masked_row_as_torch_indexes_it(seed):
    """The bytes the trust checks hash (content keys, duplicate fingerprints), masks with holes included."""
    group = make_group(G=5, L=7, seed=seed)
    group.completion_mask_GL[1, 0] = 0  # a hole before sampled tokens
    group.completion_mask_GL[2] = 0  # an empty row
    mask = group.completion_mask_GL.bool()
    for values in (group.completion_ids_GL, group.behavior_logp_GL, group.version_GL):
        want = [values[g][mask[g]].numpy().tobytes() for g in range(group.size)]
        assert group.row_bytes(values) == want
    sent = make_group(G=5, L=7, seed=seed)  # the wire carries prefix masks only
    again = decode_group(encode_group(sent), LIMITS)
    assert again.row_bytes(again.completion_ids_GL) == sent.row_bytes(sent.completion_ids_GL)


def _pack_reference(groups: list[RolloutGroup], pad_id: int) -> dict[str, torch.Tensor]:
    """pack_groups as torch ops (what it computed before it filled numpy arrays)."""
    P = max(g.prompt_ids_P.shape[0] for g in groups)
    L = max(g.completion_ids_GL.shape[1] for g in groups)
    pad = torch.nn.functional.pad
    out: dict[str, list[torch.Tensor]] = {k: [] for k in ("prompt", "pmask", "comp", "cmask", "logp", "version")}
    for g in groups:
        G, n, pad_l = g.size, g.prompt_ids_P.shape[0], L - g.completion_ids_GL.shape[1]
        out["prompt"].append(pad(g.prompt_ids_P, (P - n, 0), value=pad_id).expand(G, P))
        out["pmask"].append(torch.cat([torch.zeros(P - n, dtype=torch.long), torch.ones(n, dtype=torch.long)]))
        out["pmask"][-1] = out["pmask"][-1].expand(G, P)
        out["comp"].append(pad(g.completion_ids_GL, (0, pad_l), value=pad_id))
        out["cmask"].append(pad(g.completion_mask_GL, (0, pad_l), value=0))
        out["logp"].append(pad(g.behavior_logp_GL, (0, pad_l), value=0.0))
        out["version"].append(pad(g.version_GL, (0, pad_l), value=int(g.version_GL.max())))
    return {k: torch.cat(v) for k, v in out.items()}


@settings(max_examples=40, deadline=None)
@given(shapes=st.lists(st.tuples(st.integers(1, 5), st.integers(1, 7), st.integers(1, 6)), min_size=1, max_size=5))
def test_pack_groups_is_the_torch_padding_of_every_group(shapes) -> None:
    """Prompts left-padded, completions right-padded, each row's versions padded with its group's newest, in the
    groups' dtypes, rows in group order."""
    from heterorl.rollout import pack_groups

    groups = [make_group(G, L, P, version=3 + i, seed=i) for i, (G, L, P) in enumerate(shapes)]
    for i, g in enumerate(groups):
        g.version_GL = g.version_GL + (torch.arange(g.version_GL.shape[1]) % 2) * i  # versions that vary in a row
    batch = pack_groups(groups, pad_id=2)
    want = _pack_reference(groups, pad_id=2)
    got = {
        "prompt": batch.prompt_ids_BP,
        "pmask": batch.prompt_mask_BP,
        "comp": batch.completion_ids_BL,
        "cmask": batch.completion_mask_BL,
        "logp": batch.behavior_logp_BL,
        "version": batch.version_BL,
    }
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype, name
        assert torch.equal(got[name], tensor), name
    assert torch.equal(batch.rewards_B, torch.cat([g.rewards_G for g in groups]))
    assert batch.group_index_B.tolist() == [i for i, g in enumerate(groups) for _ in range(g.size)]
