"""Sampler credentials: one per sampler, bound to its name, hashed at rest, reloaded when the file changes or on
SIGHUP; revoking one refuses that sampler at once and nobody else."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from heterorl.transport.identity import (
    CredentialRegistry,
    CredentialsError,
    add_sampler,
    hash_token,
    revoke_sampler,
)


@pytest.fixture
def creds(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    path = tmp_path / "credentials.yaml"
    tokens = {name: add_sampler(path, name) for name in ("s0", "s1", "s2")}
    return path, tokens  # type: ignore[return-value]


def test_each_sampler_has_its_own_token_stored_hashed(creds) -> None:
    path, tokens = creds
    text = path.read_text()
    assert len(set(tokens.values())) == 3
    assert all(t not in text and hash_token(t) in text for t in tokens.values())  # only hashes at rest
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    registry = CredentialRegistry(path)
    assert registry.check_token("s0", tokens["s0"]).ok
    assert registry.identify(tokens["s1"]).name == "s1"


def test_a_sampler_cannot_act_under_another_name(creds) -> None:
    path, tokens = creds
    registry = CredentialRegistry(path)
    assert registry.check_token("s1", tokens["s0"]).reason == "unauthorized"  # s0's token under s1's name
    assert registry.check_token("s0", None).reason == "unauthorized"
    assert registry.check_token("s0", "").reason == "unauthorized"
    assert registry.check_token("s9", tokens["s0"]).reason == "unknown_sampler"
    assert registry.identify("not-a-token").reason == "unauthorized"
    assert registry.identify(None).reason == "unauthorized"


def test_revoking_one_sampler_refuses_it_at_once_and_nobody_else(creds) -> None:
    path, tokens = creds
    registry = CredentialRegistry(path)
    assert all(registry.check_token(n, t).ok for n, t in tokens.items())
    revoke_sampler(path, "s1")  # the learner keeps running: no restart, same registry
    assert registry.check_token("s1", tokens["s1"]).reason == "revoked"
    assert registry.identify(tokens["s1"]).reason == "revoked"
    assert registry.check_token("s0", tokens["s0"]).ok
    assert registry.check_token("s2", tokens["s2"]).ok
    new = add_sampler(path, "s1")  # a new credential for s1: the old token stays refused
    assert registry.check_token("s1", tokens["s1"]).reason == "unauthorized"
    assert registry.check_token("s1", new).ok
    assert registry.reloads == 2


def test_a_removed_sampler_is_unknown_and_an_added_one_is_known(creds) -> None:
    path, tokens = creds
    registry = CredentialRegistry(path)
    raw = yaml.safe_load(path.read_text())
    del raw["samplers"]["s2"]
    path.write_text(yaml.safe_dump(raw))
    assert registry.check_token("s2", tokens["s2"]).reason == "unknown_sampler"
    token = add_sampler(path, "late")
    assert registry.check_token("late", token).ok


def test_a_broken_edit_keeps_the_credentials_in_force_until_it_is_fixed(creds) -> None:
    path, tokens = creds
    registry = CredentialRegistry(path)
    good = path.read_text()
    path.write_text(good.replace("token_sha256", "tokn_sha256", 1))
    assert registry.check_token("s0", tokens["s0"]).ok  # the previous file is still in force
    assert registry.failed_reloads == 1
    assert "expected token_sha256" in (registry.last_error or "")
    assert registry.check_token("s0", tokens["s0"]).ok
    assert registry.failed_reloads == 1  # the same broken file is not parsed again and again
    path.write_text(good + "\n")
    assert registry.check_token("s0", tokens["s0"]).ok
    assert registry.last_error is None


def test_sighup_forces_a_reload_that_file_metadata_would_miss(creds) -> None:
    path, tokens = creds
    registry = CredentialRegistry(path)
    st = path.stat()
    text = path.read_text()
    revoked = text.replace(hash_token(tokens["s0"]), hash_token(tokens["s0"])[::-1])  # same size, same inode
    with open(path, "r+") as f:  # rewritten in place, mtime put back: (inode, size, mtime) are unchanged
        f.write(revoked)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert registry.check_token("s0", tokens["s0"]).ok  # not noticed
    registry.request_reload()  # what the learner's SIGHUP handler does (live/learner_node.py)
    assert registry.check_token("s0", tokens["s0"]).reason == "unauthorized"


def test_a_sampler_with_a_key_pair_signs_and_another_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    assert add_sampler(path, "s0", key=key) is None
    registry = CredentialRegistry(path)
    message = b"upload s0/boot/7 digest"
    assert registry.check_signature("s0", message, key.sign(message).hex()).ok
    assert registry.check_signature("s0", message, other.sign(message).hex()).reason == "unauthorized"
    assert registry.check_signature("s0", message + b"!", key.sign(message).hex()).reason == "unauthorized"
    assert registry.check_signature("s0", message, "zz").reason == "unauthorized"
    assert registry.check_token("s0", "anything").reason == "unauthorized"  # a key credential has no token


@pytest.mark.parametrize(
    "text",
    [
        "samplers: [s0]",
        "samplers: {s0: {token_sha256: abc}}",
        "samplers: {'bad name': {token_sha256: " + "a" * 64 + "}}",
        "samplers: {s0: {revoked: true}}",
        "other: 1",
        "samplers: {s0: {token_sha256: " + "a" * 64 + ", revoked: 'yes'}}",
    ],
)
def test_a_malformed_file_is_refused_at_start_with_the_entry_named(tmp_path: Path, text: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(CredentialsError):
        CredentialRegistry(path)
