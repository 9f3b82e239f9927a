"""File-system calls for a `file://` store that trusts nothing it finds below its root, and never hangs its caller.

A peer with write access to a shared directory can leave anything where an object belongs: a FIFO (opening it
for reading waits for a writer, for ever), a symlink (to a file outside the root, or to itself: ELOOP on every
stat), a socket, a device node, a directory. A network file system can hang a call for as long as its server is
away. So:

- paths are resolved one component at a time from a descriptor of the root (`openat` with O_NOFOLLOW |
  O_DIRECTORY): no symlink below the root is ever followed, so nothing outside it is read or written;
- `scan` never opens an entry it does not descend into: `lstat` tells each entry's kind; only regular files are
  objects, every other entry is returned with its kind (`KINDS`) for the caller to count and log;
- `read` `lstat`s the entry first (a device is never opened), opens it with O_NOFOLLOW | O_NONBLOCK (a FIFO
  swapped in meanwhile cannot block the open), checks with `fstat` that what it opened is a regular file, and
  reads at most max_bytes + 1 bytes, in chunks of CHUNK_BYTES;
- every call runs in a daemon thread under a `Watchdog`: a call that makes no progress (no chunk, no directory
  entry) for `timeout_s` is abandoned and its caller gets `Stalled`; while MAX_HUNG abandoned calls are still
  stuck in the kernel, new calls fail at once instead of leaking more threads.

This module raises `NotRegular` (with the entry's kind), `RootMissing`, `Stalled`, `TooManyHung` and `OSError`s;
the store (objects.py) turns them into its own errors.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import TypeVar

T = TypeVar("T")

TMP_PREFIX = ".tmp-"  # an object being written; renamed into place when complete, never listed
CHUNK_BYTES = 4 << 20  # the most one read or write call moves: slower than this per timeout_s reads as hung
MAX_DEPTH = 32  # folders in a key a listing descends (keys are a few levels deep; this bounds the recursion)
MAX_HUNG = 4  # abandoned calls (each a thread and a descriptor) still stuck before new calls fail at once
REGULAR = "regular"
# the kinds of entries that are not objects: file types, and why an entry could not be looked at
KINDS = ("symlink", "fifo", "socket", "char_device", "block_device", "directory", "other", "unreadable", "too_deep")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_TYPES = (
    (stat.S_ISREG, REGULAR),
    (stat.S_ISDIR, "directory"),
    (stat.S_ISLNK, "symlink"),
    (stat.S_ISFIFO, "fifo"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISCHR, "char_device"),
    (stat.S_ISBLK, "block_device"),
)


class NotRegular(Exception):  # noqa: N818 (reads as a state of the entry)
    """Where a file or folder of the key belongs there is something else; `kind` is one of KINDS."""

    def __init__(self, kind: str, where: str) -> None:
        super().__init__(f"{where} is a {kind.replace('_', ' ')}, not a regular file")
        self.kind, self.where = kind, where


class RootMissing(OSError):  # noqa: N818 (reads as a state)
    """The store's root directory is not there (an unmounted file system must not look like an empty store)."""


class Stalled(TimeoutError):  # noqa: N818 (reads as a state)
    """A call made no progress for `timeout_s`: abandoned."""


class TooManyHung(Stalled):
    """MAX_HUNG abandoned calls are still stuck: the file system as a whole is not answering."""


class _Abandoned(Exception):  # noqa: N818
    """Raised inside an abandoned call at its next beat, so it stops and closes what it opened."""


class Beat:
    """Progress of one watched call: `beat()` after each step; it raises once the watchdog gave up on the call."""

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.abandoned = False

    def __call__(self) -> None:
        if self.abandoned:
            raise _Abandoned
        self.last = time.monotonic()


class Watchdog:
    """Runs blocking calls in daemon threads; gives up on one that shows no progress for `timeout_s` seconds.

    A thread blocked in the kernel cannot be interrupted, only left behind: the caller goes on (with `Stalled`),
    the thread ends when its call returns. Daemon threads do not hold up the interpreter's exit."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._hung: list[threading.Thread] = []
        self._lock = threading.Lock()

    def run(self, what: str, fn: Callable[[Beat], T]) -> T:
        with self._lock:
            self._hung = [t for t in self._hung if t.is_alive()]
            if len(self._hung) >= MAX_HUNG:
                raise TooManyHung(f"{what}: {len(self._hung)} earlier calls are still stuck in the file system")
        beat, done, box = Beat(), threading.Event(), {}

        def work() -> None:
            try:
                box["value"] = fn(beat)
            except BaseException as err:  # handed to the caller's thread, re-raised there
                box["error"] = err
            finally:
                done.set()

        thread = threading.Thread(target=work, name=f"store {what}"[:60], daemon=True)
        thread.start()
        while not done.wait(max(0.0, beat.last + self.timeout_s - time.monotonic())):
            if time.monotonic() - beat.last >= self.timeout_s:
                beat.abandoned = True
                with self._lock:
                    self._hung.append(thread)
                raise Stalled(f"{what}: no progress for {self.timeout_s:g} s")
        if "error" in box:
            raise box["error"]
        return box["value"]


def kind_of(mode: int) -> str:
    """REGULAR, or the kind (KINDS) of a file mode from `lstat`."""
    return next((name for test, name in _TYPES if test(mode)), "other")


@contextmanager
def _root(root: str) -> Iterator[int]:
    """A descriptor of the root (the configured path may itself go through symlinks: a person chose it)."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError) as err:
        raise RootMissing(err.errno, f"{root} is not there (file system unmounted?)") from None
    try:
        yield fd
    finally:
        os.close(fd)


def _open_dir(parent: int, name: str, where: str) -> int:
    """openat(parent, name) as a folder, following no symlink; NotRegular names what is there instead."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as err:
        if err.errno == errno.EACCES:
            raise NotRegular("unreadable", where) from None
        if err.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
    kind = kind_of(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
    if kind == REGULAR:  # a file where a folder belongs: no object under that key
        raise NotADirectoryError(errno.ENOTDIR, f"{where} is a file, not a folder")
    raise NotRegular(kind, where)


@contextmanager
def _folder(root_fd: int, parts: list[str], create: bool = False) -> Iterator[int]:
    """A descriptor of the folder root/parts[0]/parts[1]/..., created when `create`."""
    fd = os.dup(root_fd)
    try:
        for depth, name in enumerate(parts):
            if create:
                with suppress(FileExistsError):
                    os.mkdir(name, 0o777, dir_fd=fd)
            child = _open_dir(fd, name, "/".join(parts[: depth + 1]))
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def read(root: str, key: str, max_bytes: int, beat: Beat) -> bytes:
    """The bytes of the regular file root/key, at most max_bytes + 1 of them (see the module docstring)."""
    *folder, name = key.split("/")
    with _root(root) as root_fd, _folder(root_fd, folder) as dir_fd:
        try:
            seen = kind_of(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except PermissionError:
            raise NotRegular("unreadable", key) from None
        if seen != REGULAR:
            raise NotRegular(seen, key)
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
        except OSError as err:  # replaced since the lstat: a symlink (ELOOP), a socket (ENXIO), or no access
            kinds = {errno.ELOOP: "symlink", errno.ENXIO: "socket", errno.EACCES: "unreadable"}
            if err.errno in kinds:
                raise NotRegular(kinds[err.errno], key) from None
            raise
        try:
            opened = os.fstat(fd)
            if kind_of(opened.st_mode) != REGULAR:  # a FIFO or device swapped in since the lstat: never read
                raise NotRegular(kind_of(opened.st_mode), key)
            chunks, got, want = [], 0, max_bytes + 1
            while got < want:
                # ask for what fstat promised, +1 to meet the end in the same call: an object of up to CHUNK_BYTES
                # is one allocation and no copy (join returns a lone chunk itself); a file that grew still ends
                chunk = os.read(fd, min(want - got, CHUNK_BYTES, max(opened.st_size + 1 - got, 1 << 16)))
                beat()
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)


def write(root: str, key: str, data: bytes, beat: Beat) -> None:
    """Write root/key atomically: a hidden temporary name in the same folder, renamed into place when complete."""
    *folder, name = key.split("/")
    with _root(root) as root_fd, _folder(root_fd, folder, create=True) as dir_fd:
        tmp = f"{TMP_PREFIX}{secrets.token_hex(6)}-{name}"
        fd = os.open(tmp, _WRITE_FLAGS, 0o666, dir_fd=dir_fd)
        try:
            try:
                with memoryview(data) as view:
                    done = 0
                    while done < len(view):
                        done += os.write(fd, view[done : done + CHUNK_BYTES])
                        beat()
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except IsADirectoryError:
            raise NotRegular("directory", key) from None
        finally:
            with suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dir_fd)  # still there only if the rename did not happen


def remove(root: str, key: str, beat: Beat) -> None:
    """Unlink root/key (a symlink, FIFO or socket is unlinked, never opened); a folder is refused."""
    *folder, name = key.split("/")
    with _root(root) as root_fd, _folder(root_fd, folder) as dir_fd:
        beat()
        try:
            os.unlink(name, dir_fd=dir_fd)
        except IsADirectoryError:
            raise NotRegular("directory", key) from None


def scan(root: str, prefix: str, beat: Beat) -> tuple[list[tuple[str, int]], list[tuple[str, str]]]:
    """(key, size) of every regular file whose key starts with `prefix`, and (key, kind) of every other entry
    there (folders are descended, not reported). Temporary names are left out; nothing is opened but folders."""
    files: list[tuple[str, int]] = []
    skipped: list[tuple[str, str]] = []
    folder = prefix.rpartition("/")[0]
    with _root(root) as root_fd:
        try:
            with _folder(root_fd, folder.split("/") if folder else []) as fd:
                _walk(fd, folder, prefix, beat, files, skipped)
        except (FileNotFoundError, NotADirectoryError):
            pass  # no such folder: nothing there
        except NotRegular as err:
            skipped.append((err.where, err.kind))
    return sorted(files), sorted(skipped)


def _walk(
    fd: int,
    path: str,
    prefix: str,
    beat: Beat,
    files: list[tuple[str, int]],
    skipped: list[tuple[str, str]],
) -> None:
    with os.scandir(fd) as entries:
        for entry in entries:
            beat()
            key = f"{path}/{entry.name}" if path else entry.name
            inside = key.startswith(prefix)
            if not inside and not prefix.startswith(key + "/"):
                continue
            try:
                info = entry.stat(follow_symlinks=False)  # an lstat: never follows, never opens
                kind = kind_of(info.st_mode)
                if kind == REGULAR and inside and not entry.name.startswith(TMP_PREFIX):
                    files.append((key, info.st_size))
                elif kind == "directory" and key.count("/") >= MAX_DEPTH:
                    skipped.append((key, "too_deep"))
                elif kind == "directory":
                    child = _open_dir(fd, entry.name, key)
                    try:
                        _walk(child, key, prefix, beat, files, skipped)
                    finally:
                        os.close(child)
                elif kind != REGULAR and inside:
                    skipped.append((key, kind))
            except (FileNotFoundError, NotADirectoryError):
                continue  # removed (or replaced by a file) while we looked
            except NotRegular as err:  # a folder we may not open, or one replaced since the listing
                skipped.append((err.where, err.kind))
