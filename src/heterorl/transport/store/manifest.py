"""The store's layout and its manifest: which immutable weight objects exist, and the cheapest way to the newest.

Layout under the run's URL (one prefix per run):

    weights/manifest.json                       the manifest, rewritten after every version (always written last)
    weights/objects/<name>.bin                  snapshots and patches; immutable, named by version and content hash
    finished.json                               written once the learner's last step is done
    samplers/<name>.json                        each sampler's heartbeat (session, held version, idle, failed updates)
    up/<sampler>/<session>/<seq>-<digest>.up    a sampler's uploads (`transport.wire`): groups and admission totals
    down/<sampler>/<session>/<seq>.reply        the learner's reply to each upload (verdicts, slots granted)

Manifest (JSON, sorted keys): `format`, `run` (id of the run), `epoch` (learner life: +1 at each resume),
`seq` (manifests written in this life), `versions` ([version, state hash] pairs, oldest first) and `objects`
(each: key, kind "snapshot" | "patch", base version (null for a snapshot), version, nbytes, xxh3-128 digest).
A manifest is ordered by (epoch, seq); a reader ignores one older than the newest it has seen (stale).

Everything read from a store is untrusted: `Manifest.parse` bounds the size, checks every field's type and range,
and refuses anything else with `ManifestError`; objects are checked against nbytes and digest before use.
"""

from __future__ import annotations

import heapq
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

import xxhash

FORMAT = "heterorl.store.v1"
MANIFEST_KEY = "weights/manifest.json"
OBJECTS = "weights/objects/"
FINISHED_KEY = "finished.json"
SAMPLERS = "samplers/"
UPLOADS = "up/"
REPLIES = "down/"
MAX_VERSIONS = 100_000
MAX_OBJECTS = 100_000
MAX_VERSION = 2**53 - 1
MAX_OBJECT_BYTES = 2**44
_HEX = re.compile(r"^[0-9a-f]{1,128}$")
_DIGEST = re.compile(r"^[0-9a-f]{32}$")
_KEY = re.compile(r"^weights/objects/[A-Za-z0-9._-]{1,200}$")
_RUN = re.compile(r"^[0-9a-f]{8,64}$")


class ManifestError(ValueError):
    """A manifest that is not one (malformed, over its limits, inconsistent)."""


def digest(data: bytes) -> str:
    """Content hash of a store object (xxh3-128, hex): catches torn and corrupted objects."""
    return xxhash.xxh3_128_hexdigest(data)


@dataclass(frozen=True)
class ObjectRef:
    """One immutable weight object: a snapshot (of `version`) or a patch `base` -> `version`."""

    key: str
    kind: Literal["snapshot", "patch"]
    base: int | None
    version: int
    nbytes: int
    digest: str

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("key", "kind", "base", "version", "nbytes", "digest")}


def object_key(kind: str, base: int | None, version: int, content_digest: str) -> str:
    span = f"v{version:012d}" if base is None else f"v{base:012d}-v{version:012d}"
    return f"{OBJECTS}{span}-{kind}-{content_digest}.bin"


@dataclass(frozen=True)
class Manifest:
    run: str
    epoch: int
    seq: int
    versions: tuple[tuple[int, str], ...]  # (version, state hash), oldest first
    objects: tuple[ObjectRef, ...]

    @property
    def order(self) -> tuple[int, int]:
        return self.epoch, self.seq

    @property
    def latest(self) -> tuple[int, str]:
        return self.versions[-1]

    def to_bytes(self) -> bytes:
        body = {
            "format": FORMAT,
            "run": self.run,
            "epoch": self.epoch,
            "seq": self.seq,
            "versions": [list(v) for v in self.versions],
            "objects": [o.to_json() for o in self.objects],
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def parse(cls, data: bytes, max_bytes: int) -> Manifest:
        """Validate untrusted bytes into a manifest (ManifestError says what is wrong)."""
        if len(data) > max_bytes:
            raise ManifestError(f"manifest of {len(data)} bytes is over the limit of {max_bytes}")
        try:
            raw = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
            raise ManifestError(f"manifest is not JSON: {err}") from None
        if not isinstance(raw, dict) or set(raw) != {"format", "run", "epoch", "seq", "versions", "objects"}:
            raise ManifestError("manifest must be an object with exactly format, run, epoch, seq, versions, objects")
        if raw["format"] != FORMAT:
            raise ManifestError(f"unknown manifest format {str(raw['format'])[:40]!r} (expected {FORMAT})")
        if not isinstance(raw["run"], str) or not _RUN.match(raw["run"]):
            raise ManifestError("manifest 'run' must be a hex id")
        versions = _versions(raw["versions"])
        known = dict(versions)
        objects = _objects(raw["objects"], known)
        return cls(raw["run"], _int(raw["epoch"], "epoch"), _int(raw["seq"], "seq"), versions, objects)

    def hash_of(self, version: int | None) -> str | None:
        return None if version is None else dict(self.versions).get(version)


def _int(value: Any, what: str, low: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= MAX_VERSION:
        raise ManifestError(f"manifest field {what} must be an integer in [{low}, 2^53), got {str(value)[:40]}")
    return value


def _versions(raw: Any) -> tuple[tuple[int, str], ...]:
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_VERSIONS:
        raise ManifestError(f"manifest 'versions' must be a list of 1..{MAX_VERSIONS} pairs")
    out: list[tuple[int, str]] = []
    for item in raw:
        if not isinstance(item, list) or len(item) != 2 or not isinstance(item[1], str) or not _HEX.match(item[1]):
            raise ManifestError("each manifest version must be [version, hex state hash]")
        version = _int(item[0], "version")
        if out and version <= out[-1][0]:
            raise ManifestError("manifest versions must increase")
        out.append((version, item[1]))
    return tuple(out)


def _objects(raw: Any, known: dict[int, str]) -> tuple[ObjectRef, ...]:
    if not isinstance(raw, list) or len(raw) > MAX_OBJECTS:
        raise ManifestError(f"manifest 'objects' must be a list of at most {MAX_OBJECTS}")
    out = []
    for item in raw:
        if not isinstance(item, dict) or set(item) != {"key", "kind", "base", "version", "nbytes", "digest"}:
            raise ManifestError("each manifest object needs exactly key, kind, base, version, nbytes, digest")
        key, kind, base = item["key"], item["kind"], item["base"]
        if not isinstance(key, str) or not _KEY.match(key):
            raise ManifestError(f"object key {str(key)[:80]!r} is not under {OBJECTS}")
        if kind not in ("snapshot", "patch") or (base is None) != (kind == "snapshot"):
            raise ManifestError(f"object {key}: kind {str(kind)[:20]!r} and base {base!r} disagree")
        version = _int(item["version"], "object version")
        if base is not None and _int(base, "object base") >= version:
            raise ManifestError(f"object {key}: base {base} is not older than version {version}")
        if version not in known or (base is not None and base not in known):
            raise ManifestError(f"object {key} refers to a version the manifest does not list")
        nbytes = _int(item["nbytes"], "nbytes", low=1)
        if nbytes > MAX_OBJECT_BYTES or not isinstance(item["digest"], str) or not _DIGEST.match(item["digest"]):
            raise ManifestError(f"object {key}: bad nbytes or digest")
        out.append(ObjectRef(key, kind, base, version, nbytes, item["digest"]))
    return tuple(out)


def plan(manifest: Manifest, held_version: int | None, held_hash: str | None) -> list[ObjectRef] | None:
    """The fewest bytes (then fewest objects) from what the receiver holds to the newest version: [] when current,
    None when no path exists. A held version counts only with the manifest's hash for it; a snapshot is usable
    from anywhere. Dijkstra over versions; edges are the manifest's patches and snapshots."""
    latest, latest_hash = manifest.latest
    held = held_version if held_hash is not None and manifest.hash_of(held_version) == held_hash else None
    if held == latest and held_hash == latest_hash:
        return []
    start = -1 if held is None else held  # -1: holds nothing usable
    by_base: dict[int, list[ObjectRef]] = {}
    for ref in manifest.objects:
        by_base.setdefault(start if ref.base is None else ref.base, []).append(ref)
    best: dict[int, tuple[int, int]] = {start: (0, 0)}
    came: dict[int, ObjectRef] = {}
    heap: list[tuple[int, int, int]] = [(0, 0, start)]
    while heap:
        cost, count, node = heapq.heappop(heap)
        if (cost, count) > best.get(node, (cost, count)):
            continue
        if node == latest:
            break
        for ref in by_base.get(node, []):
            nxt = (cost + ref.nbytes, count + 1)
            if nxt < best.get(ref.version, (2**63, 0)):
                best[ref.version] = nxt
                came[ref.version] = ref
                heapq.heappush(heap, (*nxt, ref.version))
    if latest not in came:
        return None
    path, node = [], latest
    while node != start:
        ref = came[node]
        path.append(ref)
        node = start if ref.base is None else ref.base
    return path[::-1]
