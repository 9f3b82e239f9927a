"""`heterorl keys`: a learner key pair with safe permissions, a sampler's own token (hashed in the credentials file,
the token itself only in the sampler's file), revocation a running learner sees at once; mistakes are one line."""

from __future__ import annotations

import stat
from pathlib import Path

from typer.testing import CliRunner

from heterorl.cli import app
from heterorl.transport.identity import CredentialRegistry
from heterorl.weights.signing import Authority, Signer, load_private_key, load_public_key


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def test_keys_new_makes_a_working_pair_once(tmp_path: Path) -> None:
    result = run("keys", "new", str(tmp_path / "k"))
    assert result.exit_code == 0, result.output
    private, public = tmp_path / "k" / "learner.key", tmp_path / "k" / "learner.pub"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    Authority(load_public_key(public)).verify_manifest(b"x", Signer(load_private_key(private)).sign_manifest(b"x"))
    again = run("keys", "new", str(tmp_path / "k"))
    assert again.exit_code == 1
    assert "refusing to overwrite" in again.output


def test_a_sampler_token_works_until_it_is_revoked(tmp_path: Path) -> None:
    creds, token_file = tmp_path / "credentials.yaml", tmp_path / "s0.token"
    assert run("keys", "sampler", "s0", "--credentials", str(creds), "--out", str(token_file)).exit_code == 0
    assert run("keys", "sampler", "s1", "--credentials", str(creds), "--out", str(tmp_path / "s1.token")).exit_code == 0
    token = token_file.read_text().strip()
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert token not in creds.read_text()
    registry = CredentialRegistry(creds)  # the learner, running
    assert registry.check_token("s0", token).ok
    assert run("keys", "revoke", "s0", "--credentials", str(creds)).exit_code == 0
    assert registry.check_token("s0", token).reason == "revoked"
    assert registry.check_token("s1", (tmp_path / "s1.token").read_text().strip()).ok
    missing = run("keys", "revoke", "nobody", "--credentials", str(creds))
    assert missing.exit_code == 1
    assert "no sampler 'nobody'" in missing.output
    bad = run("keys", "sampler", "bad name", "--credentials", str(creds), "--out", str(tmp_path / "x"))
    assert bad.exit_code == 1
    assert "not a cluster.samplers name" in bad.output


def test_a_sampler_key_signs_store_uploads_the_learner_accepts(tmp_path: Path) -> None:
    from heterorl.transport.identity import sign_upload

    creds, key_file = tmp_path / "credentials.yaml", tmp_path / "s0.key"
    result = run("keys", "sampler", "s0", "--credentials", str(creds), "--out", str(key_file), "--ed25519")
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = load_private_key(key_file, "trust.sampler_private_key")  # what a sampler loads
    registry = CredentialRegistry(creds)
    who, upload = registry.open_upload("s0", "boot", 7, sign_upload(key, "s0", "boot", 7, b"an upload"))
    assert who.ok
    assert upload == b"an upload"
    assert registry.open_upload("s0", "boot", 8, sign_upload(key, "s0", "boot", 7, b"an upload"))[0].reason == (
        "unauthorized"
    )
