"""Signed weights: the learner signs every blob it publishes (snapshots and patches), samplers holding its public key
apply nothing else.

What is signed is the blob's BLAKE2b-256 digest, under a domain tag and the learner's *epoch* (its life: 0, then
+1 at each resume):

    statement = b"heterorl/weights/v1\\0" | u64 epoch | blake2b-256(blob)        signature = Ed25519(statement)

A blob carries its own header (kind, base and result versions, base and result state hashes, checksum-verified),
so signing its bytes signs all of them; the state hashes are xxh3 (fast, not cryptographic) and would not be
enough alone: whoever can make bytes whose xxh3 collides could swap weights under a signed hash. A patch applies
only to the base whose hash it names, and a sampler's base came from signed blobs, so every version it holds is
one the learner published.

Freshness: a receiver keeps the newest (epoch, version) it applied and refuses an update that ends older
(`replayed`): an old, correctly signed update replayed by whoever sits on the path cannot roll a sampler back.
A resumed learner signs with a higher epoch, so its samplers follow it even where it republishes lower versions.
One key pair per run: the key is the run's identity (a blob signed for another run with the same key would pass).

The store signs its manifest too (`sign_manifest`): a manifest nobody signed, e.g. one with a huge epoch written
to pin samplers on an old version, is never adopted.

Key files: PEM, the private key PKCS#8 unencrypted and readable by its owner only (`write_keypair` makes both with
safe permissions; `load_private_key` refuses a key others can read, as ssh does).
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import xxhash
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from heterorl.errors import PathNotFoundError, SetupError
from heterorl.weights.format import PatchError

BLOB_DOMAIN = b"heterorl/weights/v1\x00"
MANIFEST_DOMAIN = b"heterorl/manifest/v1\x00"
SIGNATURE_HEX = 128  # an Ed25519 signature is 64 bytes
PRIVATE_NAME, PUBLIC_NAME = "learner.key", "learner.pub"


class SignatureError(PatchError):
    """An update or manifest that is not signed by the learner's key (a PatchError: the receiver refuses it and its
    weights stay as they were). `reason`: unsigned | bad_signature | replayed."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class KeyFileError(SetupError, ValueError):
    """A key file that cannot be used (unreadable, not an Ed25519 PEM key, a private key others can read)."""


@dataclass(frozen=True)
class Signatures:
    """The learner's signatures of an update's blobs, in the update's order (snapshot first, then patch), all made
    in learner epoch `epoch`."""

    epoch: int
    blobs: tuple[str, ...]  # hex, one per blob


def blob_statement(blob: bytes | memoryview, epoch: int) -> bytes:
    """What the learner signs for one blob (see the module docstring)."""
    return BLOB_DOMAIN + struct.pack("<Q", epoch) + hashlib.blake2b(blob, digest_size=32).digest()


def manifest_statement(body: bytes) -> bytes:
    """What the learner signs for a manifest: its canonical bytes without the signature (`Manifest.to_bytes`)."""
    return MANIFEST_DOMAIN + hashlib.blake2b(body, digest_size=32).digest()


# ---------------------------------------------------------------- keys
def write_keypair(directory: str | Path) -> tuple[Path, Path]:
    """A new Ed25519 key pair as `directory`/learner.key (mode 600) and learner.pub (644); the directory is created
    with mode 700. Existing key files are never overwritten."""
    root = Path(directory)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    private_path, public_path = root / PRIVATE_NAME, root / PUBLIC_NAME
    for path in (private_path, public_path):
        if path.exists():
            raise KeyFileError(
                f"{path} exists; refusing to overwrite a key (remove it first, or use another directory)"
            )
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    fd = os.open(
        private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600
    )  # never readable by others, not even briefly
    with os.fdopen(fd, "wb") as f:
        f.write(private_pem)
    fd = os.open(public_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(public_pem)
    return private_path, public_path


def _read(path: str | Path, what: str) -> bytes:
    p = Path(path)
    if not p.is_file():
        raise PathNotFoundError(f"{what}: {p} is not a file")
    return p.read_bytes()


def load_private_key(path: str | Path, setting: str = "trust.learner_private_key") -> Ed25519PrivateKey:
    """A signing key (the learner's, or a sampler's: `setting` names it in errors); refused when group or others
    may read it (chmod 600)."""
    mode = stat.S_IMODE(Path(path).stat().st_mode) if Path(path).is_file() else 0
    if mode & 0o077:
        raise KeyFileError(f"{setting}: {path} is readable by others (mode {mode:o}); chmod 600 it")
    try:
        key = serialization.load_pem_private_key(_read(path, setting), password=None)
    except (ValueError, TypeError) as err:
        raise KeyFileError(f"{setting}: {path} is not an unencrypted PEM private key ({err})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{setting}: {path} holds a {type(key).__name__}, not an Ed25519 key")
    return key


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    """The learner's public key, as samplers hold it."""
    try:
        key = serialization.load_pem_public_key(_read(path, "trust.learner_public_key"))
    except ValueError as err:
        raise KeyFileError(f"trust.learner_public_key: {path} is not a PEM public key ({err})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"trust.learner_public_key: {path} holds a {type(key).__name__}, not an Ed25519 key")
    return key


def signing_key_from(
    private_key_path: str | Path | None, setting: str = "trust.learner_private_key"
) -> Ed25519PrivateKey | None:
    """A key from its setting's path (None when the setting is not set)."""
    return None if private_key_path is None else load_private_key(private_key_path, setting)


def signer_from(private_key_path: str | Path | None, epoch: int) -> Signer | None:
    """The learner's signer from `trust.learner_private_key` (None: weights go unsigned, as before)."""
    return None if private_key_path is None else Signer(load_private_key(private_key_path), epoch)


def authority_from(public_key_path: str | Path | None) -> Authority | None:
    """A sampler's authority from `trust.learner_public_key` (None: it checks hashes only, as before)."""
    return None if public_key_path is None else Authority(load_public_key(public_key_path))


# ---------------------------------------------------------------- learner side
class Signer:
    """The learner's signing key in one epoch. Signing a blob costs a BLAKE2b pass over it (~1 GB/s) and ~50 us;
    the last `cache` signatures are kept by (size, xxh3-128) of the blob, since the same snapshot and merged patches
    are served to every sampler."""

    def __init__(self, key: Ed25519PrivateKey, epoch: int = 0, cache: int = 64) -> None:
        assert epoch >= 0, f"epoch must be >= 0, got {epoch}"
        self.key, self.epoch, self.cache = key, epoch, cache
        self._signed: OrderedDict[tuple[int, bytes], str] = OrderedDict()

    def sign_blob(self, blob: bytes | memoryview) -> str:
        """The hex signature of one blob in this epoch."""
        key = (len(blob), xxhash.xxh3_128(blob).digest())
        sig = self._signed.get(key)
        if sig is None:
            sig = self.key.sign(blob_statement(blob, self.epoch)).hex()
            self._signed[key] = sig
            while len(self._signed) > self.cache:
                self._signed.popitem(last=False)
        else:
            self._signed.move_to_end(key)
        return sig

    def sign_blobs(self, *blobs: bytes | None) -> Signatures:
        """Signatures of an update's blobs (None entries are skipped), in order."""
        return Signatures(self.epoch, tuple(self.sign_blob(b) for b in blobs if b is not None))

    def sign_manifest(self, body: bytes) -> str:
        return self.key.sign(manifest_statement(body)).hex()

    @property
    def public_key(self) -> Ed25519PublicKey:
        return self.key.public_key()


# ---------------------------------------------------------------- sampler side
class Authority:
    """The learner's public key, as a sampler checks what it is sent with it."""

    def __init__(self, key: Ed25519PublicKey) -> None:
        self.key = key

    def _verify(self, sig_hex: object, statement: bytes, what: str) -> None:
        if not isinstance(sig_hex, str) or len(sig_hex) != SIGNATURE_HEX:
            raise SignatureError("bad_signature", f"{what}: a signature must be {SIGNATURE_HEX} hex digits")
        try:
            self.key.verify(bytes.fromhex(sig_hex), statement)
        except (ValueError, InvalidSignature):
            raise SignatureError("bad_signature", f"{what} is not signed by the learner's key") from None

    def verify_blobs(self, blobs: list[bytes | memoryview], signatures: Signatures | None) -> None:
        """Every blob signed by the learner in `signatures.epoch`; raises SignatureError (unsigned, bad_signature)."""
        if signatures is None:
            raise SignatureError("unsigned", "the update carries no signature")
        if len(signatures.blobs) != len(blobs):
            raise SignatureError("unsigned", f"{len(blobs)} blobs but {len(signatures.blobs)} signatures")
        for i, (blob, sig) in enumerate(zip(blobs, signatures.blobs, strict=True)):
            self._verify(sig, blob_statement(blob, signatures.epoch), f"blob {i}")

    def verify_manifest(self, body: bytes, sig_hex: str | None) -> None:
        """A manifest's canonical bytes signed by the learner; raises SignatureError."""
        if sig_hex is None:
            raise SignatureError("unsigned", "the manifest carries no signature")
        self._verify(sig_hex, manifest_statement(body), "manifest")
