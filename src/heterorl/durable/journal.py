"""The learner's write-ahead journal of accepted rollout groups: what makes an acknowledged group durable.

The service acknowledges a group (HTTP 200) only after its encoded bytes are appended here (and, with
`live.fsync`, flushed to disk), so a learner killed at any instant loses no acknowledged group: on resume it
replays the journal on top of its last checkpoint. The journal is cut into numbered segments; a checkpoint
takes its snapshot of the queue and starts a new segment under the same lock, so the checkpoint plus the
segments from its number on hold every accepted group exactly once. Older segments are deleted once a newer
checkpoint is safely on disk.

Record layout: u32 length N | 16-byte xxh3-128 digest of the payload | N payload bytes (an `encode_group`
message). A crash mid-append leaves a torn last record; it was never acknowledged, and replay stops there.

An append that fails (disk full, I/O error) raises OSError after cutting the segment back to its last whole
record, so the group is not in the journal and the caller answers it as not acknowledged (507). If even the cut
fails, the next append starts a new segment: nothing is ever appended after a torn record, where replay would
not reach it. Writes are unbuffered, so no failed record lingers in a buffer to be flushed later.
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import xxhash

_HEAD = struct.Struct("<I16s")
_SEGMENT_DIGITS = 8


def _segment_name(index: int) -> str:
    return f"{index:0{_SEGMENT_DIGITS}d}.journal"


def segment_indices(directory: Path) -> list[int]:
    """Indices of the journal segments present, ascending."""
    if not directory.is_dir():
        return []
    out = []
    for p in directory.glob("*.journal"):
        stem = p.name.removesuffix(".journal")
        if stem.isdigit():
            out.append(int(stem))
    return sorted(out)


def frame(payload: bytes) -> bytes:
    """One record: length, checksum, payload."""
    return _HEAD.pack(len(payload), xxhash.xxh3_128_digest(payload)) + payload


def parse_records(data: bytes) -> tuple[list[bytes], int]:
    """The intact records at the start of `data` and the offset where they end (a torn tail is left over)."""
    out, offset = [], 0
    while offset + _HEAD.size <= len(data):
        length, digest = _HEAD.unpack_from(data, offset)
        payload = data[offset + _HEAD.size : offset + _HEAD.size + length]
        if len(payload) != length or xxhash.xxh3_128_digest(payload) != digest:
            break
        out.append(payload)
        offset += _HEAD.size + length
    return out, offset


def read_segment(path: Path) -> list[bytes]:
    """The complete, intact records of one segment, in order (stops at a torn or damaged tail)."""
    return parse_records(path.read_bytes())[0]


class Journal:
    """Append-only segments in `directory`; `append` is durable when it returns (with `fsync`)."""

    def __init__(self, directory: str | Path, *, fsync: bool = True, start_segment: int | None = None) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        existing = segment_indices(self.directory)
        # never append to a segment a crash may have left torn: always open a fresh one
        self.segment = max([*existing, -1]) + 1 if start_segment is None else start_segment
        self._file: BinaryIO = self._open(self.segment)
        self._size = self._file.tell()  # bytes of whole records in the open segment
        self._torn = False  # a failed append could not be cut back: the open segment ends in a torn record

    def _open(self, index: int) -> BinaryIO:
        f = (self.directory / _segment_name(index)).open("ab", buffering=0)
        if self.fsync:
            fsync_path(self.directory)
        return f

    def append(self, payload: bytes) -> None:
        """Append one record; with `fsync` it is on disk when this returns. Raises OSError (and leaves no part of
        the record behind) when the disk refuses it."""
        if self._torn:
            self.rotate()
        record = memoryview(frame(payload))
        try:
            while record:
                written = self._file.write(record)
                if not written:
                    raise OSError(errno.EIO, "the journal accepted no bytes")
                record = record[written:]
            if self.fsync:
                os.fsync(self._file.fileno())
        except OSError:
            self._cut()
            raise
        self._size = self._file.tell()

    def _cut(self) -> None:
        try:
            self._file.truncate(self._size)
        except OSError:
            self._torn = True

    def rotate(self) -> int:
        """Start a new segment; returns its index (records appended from now on go there). The new segment is
        opened before the current one is closed, so a failure (OSError) leaves the journal as it was."""
        new = self._open(self.segment + 1)
        self._file.close()
        self._file, self.segment, self._size, self._torn = new, self.segment + 1, new.tell(), False
        return self.segment

    def replay(self, from_segment: int) -> Iterator[bytes]:
        """Every intact record of the segments numbered `from_segment` or higher, in append order."""
        for index in segment_indices(self.directory):
            if index >= from_segment and index != self.segment:
                yield from read_segment(self.directory / _segment_name(index))

    def prune(self, below_segment: int) -> None:
        """Delete the segments numbered below `below_segment` (covered by a checkpoint on disk)."""
        for index in segment_indices(self.directory):
            if index < below_segment:
                (self.directory / _segment_name(index)).unlink(missing_ok=True)

    def close(self) -> None:
        self._file.close()


def fsync_path(path: Path) -> None:
    """Flush a file, or a directory's entries (a new or renamed name is durable only then, on POSIX), to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
