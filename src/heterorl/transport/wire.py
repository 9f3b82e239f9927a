"""The conversation's bytes (`loop.protocol`), the same over every transport: HTTP bodies, store objects, and the
simulated link (which sends these bytes, so their size is what a live link would carry).

    upload: magic b"HRU1" | u32 header length | JSON header | the groups' bytes, back to back
            header: sampler, session, seq, version, wanted, used, returned, idle, failed, sizes [n], digests [n],
                    fingerprint {setting: hash}
    reply:  magic b"HRR1" | u32 header length | JSON header (no body)
            header: seq, verdicts [[outcome, group_id, detail]], granted, voided, version, finished,
                    retry_after, refused, detail, learner, handled

Both come from peers that may be buggy or hostile: `decode_upload` and `decode_reply` check every field's type
and bound, and raise `WireError` (a ValueError) with what is wrong, never anything else.
"""

from __future__ import annotations

import re
from typing import Any

from heterorl.framing import MAX_HEADER_INT, frame, non_negative_int, unframe
from heterorl.loop.protocol import GroupVerdict, Reply, Upload

UPLOAD_MAGIC = b"HRU1"
REPLY_MAGIC = b"HRR1"
MAX_GROUPS = 4096  # groups in one upload (the config's groups_per_upload is far below)
MAX_HEADER_BYTES = 1 << 17  # an upload's header lists ~50 bytes per group: room for thousands
NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
SESSION = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
DIGEST = re.compile(r"^[0-9a-f]{32}$")
OUTCOME = re.compile(r"^[a-z_]{1,32}$")
MAX_DETAIL = 300
MAX_SETTINGS = 256
SETTING = re.compile(r"^[a-z_][a-z0-9_.]{0,80}$")
SETTING_HASH = re.compile(r"^[0-9a-f]{8}$")
MAX_GROUP_ID = 200


class WireError(ValueError):
    """An upload or reply that does not parse or breaks a bound."""


def encode_upload(upload: Upload) -> bytes:
    header = {
        "sampler": upload.sampler,
        "session": upload.session,
        "seq": upload.seq,
        "version": upload.version,
        "wanted": upload.wanted,
        "used": upload.used,
        "returned": upload.returned,
        "idle": upload.idle,
        "failed": upload.weights_failed,
        "sizes": [len(g) for g in upload.groups],
        "digests": list(upload.digests),
        "fingerprint": upload.fingerprint,
    }
    return frame(UPLOAD_MAGIC, header, b"".join(upload.groups))


def decode_upload(data: bytes, max_groups: int = MAX_GROUPS) -> Upload:
    """An upload from its bytes, every field checked; the groups' own bytes are checked by the intake."""
    header, offset = unframe(data, UPLOAD_MAGIC, MAX_HEADER_BYTES, WireError)
    sampler = _match(header, "sampler", NAME)
    session = _match(header, "session", SESSION)
    seq = non_negative_int(header, "seq", WireError)
    version = _int(header, "version", -1)
    wanted = non_negative_int(header, "wanted", WireError)
    used = non_negative_int(header, "used", WireError)
    returned = non_negative_int(header, "returned", WireError)
    failed = non_negative_int(header, "failed", WireError)
    idle = header.get("idle")
    if idle is not None and (isinstance(idle, bool) or not isinstance(idle, int | float) or not 0.0 <= idle <= 1.0):
        raise WireError(f"idle must be a share in [0, 1], got {str(idle)[:40]!r}")
    sizes, digests = header.get("sizes"), header.get("digests")
    if not isinstance(sizes, list) or not isinstance(digests, list) or len(sizes) != len(digests):
        raise WireError("sizes and digests must be lists of one entry per group")
    if len(sizes) > max_groups:
        raise WireError(f"{len(sizes)} groups in one upload (at most {max_groups})")
    groups = []
    for size, digest in zip(sizes, digests, strict=True):
        if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= len(data) - offset:
            raise WireError(f"a group size of {str(size)[:20]} does not fit the upload")
        if not isinstance(digest, str) or not DIGEST.match(digest):
            raise WireError("a group digest is not 32 hex characters")
        groups.append(bytes(data[offset : offset + size]))
        offset += size
    if offset != len(data):
        raise WireError(f"{len(data) - offset} bytes after the last group")
    fingerprint = header.get("fingerprint", {})
    if not isinstance(fingerprint, dict) or len(fingerprint) > MAX_SETTINGS:
        raise WireError(f"the fingerprint must map at most {MAX_SETTINGS} settings to hashes")
    for key, value in fingerprint.items():
        if not SETTING.match(key) or not isinstance(value, str) or not SETTING_HASH.match(value):
            raise WireError(f"a fingerprint entry is not a setting and its 8-hex hash: {str(key)[:40]!r}")
    return Upload(
        sampler=sampler,
        session=session,
        seq=seq,
        version=version,
        wanted=wanted,
        used=used,
        returned=returned,
        idle=None if idle is None else float(idle),
        weights_failed=failed,
        groups=tuple(groups),
        digests=tuple(digests),
        fingerprint=fingerprint,
    )


def encode_reply(reply: Reply) -> bytes:
    header = {
        "seq": reply.seq,
        "verdicts": [[v.outcome, v.group_id, v.detail] for v in reply.verdicts],
        "granted": reply.granted,
        "voided": reply.voided,
        "version": reply.version,
        "finished": reply.finished,
        "retry_after": reply.retry_after,
        "refused": reply.refused,
        "detail": reply.detail,
        "learner": reply.learner,
        "handled": reply.handled,
    }
    return frame(REPLY_MAGIC, header)


def decode_reply(data: bytes, expected_groups: int | None = None) -> Reply:
    """A reply from its bytes, every field checked (`expected_groups`: the upload it answers had that many)."""
    header, offset = unframe(data, REPLY_MAGIC, MAX_HEADER_BYTES, WireError)
    if offset != len(data):
        raise WireError("a reply has no body")
    raw = header.get("verdicts")
    if not isinstance(raw, list) or len(raw) > MAX_GROUPS:
        raise WireError("verdicts must be a list")
    verdicts = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 3):
            raise WireError("a verdict is [outcome, group_id, detail]")
        outcome, group_id, detail = item
        if not isinstance(outcome, str) or not OUTCOME.match(outcome):
            raise WireError("a verdict's outcome is not a reason name")
        if group_id is not None and (not isinstance(group_id, str) or len(group_id) > MAX_GROUP_ID):
            raise WireError("a verdict's group id is not a short string")
        verdicts.append(GroupVerdict(outcome, group_id, _text(detail)))
    refused = header.get("refused", "")
    if not isinstance(refused, str) or (refused and not OUTCOME.match(refused)):
        raise WireError("refused must be a reason name")
    if expected_groups is not None and not refused and len(verdicts) != expected_groups:
        raise WireError(f"{len(verdicts)} verdicts for {expected_groups} groups")
    retry = _seconds(header, "retry_after")
    finished = header.get("finished", False)
    if not isinstance(finished, bool):
        raise WireError("finished must be true or false")
    learner = header.get("learner", "")
    if not isinstance(learner, str) or (learner and not SESSION.match(learner)):
        raise WireError("learner must be a boot id")
    handled = _seconds(header, "handled")
    return Reply(
        seq=non_negative_int(header, "seq", WireError),
        verdicts=tuple(verdicts),
        granted=non_negative_int(header, "granted", WireError),
        voided=non_negative_int(header, "voided", WireError),
        version=_int(header, "version", -1),
        finished=finished,
        retry_after=retry,
        refused=refused,
        detail=_text(header.get("detail", "")),
        learner=learner,
        handled=handled,
    )


def _seconds(header: dict[str, Any], key: str, most: float = 3600.0) -> float:
    """A finite duration in [0, most] seconds (0 when absent)."""
    value = header.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= most:
        raise WireError(f"{key} must be seconds in [0, {most:g}]")
    return float(value)


def _int(header: dict[str, Any], key: str, low: int) -> int:
    value = header.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= MAX_HEADER_INT:
        raise WireError(f"{key} must be an integer >= {low}, got {str(value)[:40]!r}")
    return value


def _match(header: dict[str, Any], key: str, pattern: re.Pattern[str]) -> str:
    value = header.get(key)
    if not isinstance(value, str) or not pattern.match(value):
        raise WireError(f"{key} must match {pattern.pattern}")
    return value


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise WireError("a detail must be a string")
    return value[:MAX_DETAIL]
