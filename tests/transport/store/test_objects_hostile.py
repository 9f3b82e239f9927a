"""A `file://` store on a hostile or broken file system, and the bounded reads of both backends.

A peer that can write into the shared directory puts a FIFO, a symlink loop, a symlink out of the root, a UNIX
socket, device nodes and a folder where rollout objects belong: listings report each with its kind without
opening it, `get` refuses each with `ObjectNotRegular` within a bounded time, and the regular object beside them is
still read. A hung file system (a read blocked in the kernel) costs its caller `timeout_s`, not the run."""

from __future__ import annotations

import os
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heterorl.config import StoreConfig
from heterorl.transport.store import localfs
from heterorl.transport.store.objects import (
    FsspecStore,
    MemoryStore,
    ObjectMissing,
    ObjectNotRegular,
    ObjectStore,
    ObjectTimeout,
    Skipped,
    StoreUnavailable,
)
from heterorl.transport.tcp_relay import TcpRelay
from transport.store.conftest import MOTO_ENV, make_bucket

FAST_S = 0.5  # a refusal must come at once: no wait for a writer, no timeout, no retry
AS_ROOT = os.geteuid() == 0
GROUP = b"a real group's bytes" * 100


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def store(root: Path) -> FsspecStore:
    objects = FsspecStore(StoreConfig(url=root.as_uri(), timeout_s=1.0))
    objects.check("up/", None)
    return objects


def unix_socket_at(path: Path) -> socket.socket:
    """A bound UNIX socket at `path` (bound under a short name first: socket paths are limited to 107 bytes)."""
    short = tempfile.mkdtemp(prefix="hrl-", dir="/tmp")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(f"{short}/s")
    os.rename(f"{short}/s", path)
    os.rmdir(short)
    return sock


@pytest.fixture
def hostile(root: Path, store: FsspecStore, tmp_path: Path) -> Iterator[dict[str, str]]:
    """Every kind of entry a peer can leave where a rollout object belongs, beside one real object; key -> kind."""
    folder = root / "up" / "s1" / "b00t"
    folder.mkdir(parents=True)
    store.put("up/s1/b00t/1.up", GROUP)
    secret = tmp_path / "secret.txt"  # outside the store's root
    secret.write_bytes(b"not for the learner")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "9.up").write_bytes(GROUP)
    kinds = {}
    os.mkfifo(folder / "2.up")
    kinds["up/s1/b00t/2.up"] = "fifo"
    os.symlink("3.up", folder / "3.up")  # a loop: ELOOP on every stat that follows it
    kinds["up/s1/b00t/3.up"] = "symlink"
    os.symlink(secret, folder / "4.up")
    kinds["up/s1/b00t/4.up"] = "symlink"
    sock = unix_socket_at(folder / "5.up")
    kinds["up/s1/b00t/5.up"] = "socket"
    os.symlink(outside, root / "up" / "s2")  # a whole sampler folder pointing out of the root
    kinds["up/s2"] = "symlink"
    if AS_ROOT:
        os.mknod(folder / "6.up", stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's numbers
        kinds["up/s1/b00t/6.up"] = "char_device"
        os.mknod(folder / "7.up", stat.S_IFBLK | 0o600, os.makedev(7, 0))  # a loop device's numbers
        kinds["up/s1/b00t/7.up"] = "block_device"
    yield kinds
    sock.close()


def timed(fn, *args):
    start = time.monotonic()
    try:
        return fn(*args), time.monotonic() - start
    except Exception as err:
        return err, time.monotonic() - start


def test_a_listing_holds_regular_files_only_and_reports_every_other_entry_with_its_kind(store, hostile) -> None:
    listing, took = timed(store.list, "up/")
    assert took < FAST_S
    assert [(o.key, o.size) for o in listing] == [("up/s1/b00t/1.up", len(GROUP))]
    assert sorted(listing.skipped, key=lambda s: s.key) == [Skipped(k, v) for k, v in sorted(hostile.items())]
    narrower = store.list("up/s1/b00t/2")  # a prefix that is not a folder
    assert narrower == []
    assert narrower.skipped == [Skipped("up/s1/b00t/2.up", "fifo")]


def test_get_refuses_each_hostile_entry_with_its_kind_at_once_and_still_reads_the_regular_one(store, hostile) -> None:
    for key, kind in hostile.items():
        err, took = timed(store.get, key, 2**20)
        assert isinstance(err, ObjectNotRegular), (key, err)
        assert (err.key, err.kind) == (key, kind)
        assert took < FAST_S, (key, took)
    assert store.get("up/s1/b00t/1.up", 2**20) == GROUP
    # through the symlinked sampler folder: the file out there exists, but nothing below the root is followed
    err, _ = timed(store.get, "up/s2/9.up", 2**20)
    assert isinstance(err, ObjectNotRegular)
    assert err.kind == "symlink"


def test_a_folder_where_an_object_belongs_is_refused_and_not_deleted(store, root) -> None:
    (root / "up" / "s1" / "7.up").mkdir(parents=True)
    err, _ = timed(store.get, "up/s1/7.up", 100)
    assert isinstance(err, ObjectNotRegular)
    assert err.kind == "directory"
    with pytest.raises(ObjectNotRegular):
        store.delete("up/s1/7.up")
    assert (root / "up" / "s1" / "7.up").is_dir()


def test_hostile_entries_are_deleted_without_being_opened_and_a_regular_object_then_reads(store, hostile) -> None:
    for key in hostile:
        store.delete(key)
        store.put(key, b"now a regular object")
        assert store.get(key, 100) == b"now a regular object"
    listing = store.list("up/")
    assert listing.skipped == []
    assert len(listing) == len(hostile) + 1


def test_nothing_is_written_through_a_symlink_out_of_the_root(store, root, tmp_path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    os.symlink(outside, root / "up")
    with pytest.raises(ObjectNotRegular) as err:
        store.put("up/s1/1.up", b"x")
    assert err.value.kind == "symlink"
    assert list(outside.iterdir()) == []


def test_a_listing_stops_descending_at_its_depth_bound(store, root) -> None:
    deep = root / "up" / Path(*["d"] * (localfs.MAX_DEPTH + 2))
    deep.mkdir(parents=True)
    (deep / "x.up").write_bytes(b"x")
    listing = store.list("up/")
    assert listing == []
    # "up" and MAX_DEPTH - 1 folders "d" are descended; the next folder would be a key's MAX_DEPTH + 1st
    assert listing.skipped == [Skipped("up/" + "/".join(["d"] * localfs.MAX_DEPTH), "too_deep")]


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "a//b", "a/./b", "a/", "nul\0byte"])
def test_keys_that_could_leave_the_root_are_invalid(store, key) -> None:
    with pytest.raises(ValueError, match="invalid object key"):
        store.get(key, 10)


def test_a_huge_sparse_object_costs_max_bytes_plus_one(store, root) -> None:
    path = root / "up" / "huge.up"
    path.parent.mkdir(parents=True)
    with open(path, "wb") as f:
        f.truncate(1 << 40)  # 1 TiB, sparse: reading it whole would never end
    assert store.list("up/")[0].size == 1 << 40
    data, took = timed(store.get, "up/huge.up", 1000)
    assert data == bytes(1001)
    assert took < FAST_S


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=3 * 4096), max_bytes=st.integers(0, 4 * 4096), chunk=st.sampled_from([1, 7, 4096]))
def test_get_returns_exactly_the_first_max_bytes_plus_one(tmp_path_factory, data, max_bytes, chunk) -> None:
    """Against the memory store and a directory, with tiny read chunks so that the chunk loop is exercised."""
    root = tmp_path_factory.mktemp("store")
    stores: list[ObjectStore] = [MemoryStore(), FsspecStore(StoreConfig(url=root.as_uri()))]
    old = localfs.CHUNK_BYTES
    localfs.CHUNK_BYTES = chunk
    try:
        for objects in stores:
            objects.put("a/b.bin", data)
            assert objects.get("a/b.bin", max_bytes) == data[: max_bytes + 1]
    finally:
        localfs.CHUNK_BYTES = old


# ------------------------------------------------------------------ a hung file system
@pytest.fixture
def hung_mount(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[list[str], Callable[[], None]]]:
    """(hung, come_back): reads of the keys in `hung` block in the kernel (a read on a pipe nobody writes, as on a
    hard-mounted NFS whose server is away) until `come_back()`; the other keys read normally."""
    hung: list[str] = []
    back = threading.Event()
    r, w = os.pipe()
    real_read = localfs.read

    def read(root: str, key: str, max_bytes: int, beat: localfs.Beat) -> bytes:
        if key in hung and not back.is_set():
            os.read(r, 1)  # blocked in the kernel until the "server" returns
        return real_read(root, key, max_bytes, beat)

    monkeypatch.setattr(localfs, "read", read)

    def come_back() -> None:
        back.set()
        os.write(w, bytes(localfs.MAX_HUNG + 4))  # one byte wakes each stuck reader

    yield hung, come_back
    come_back()
    time.sleep(0.2)  # the woken readers finish
    os.close(w)
    os.close(r)


def test_a_hung_read_times_out_for_that_object_only_and_the_store_recovers(store, hung_mount) -> None:
    hung, come_back = hung_mount
    store.put("up/a.up", b"a")
    store.put("up/b.up", b"b")
    hung.append("up/a.up")
    err, took = timed(store.get, "up/a.up", 10)
    assert isinstance(err, ObjectTimeout)
    assert isinstance(err, StoreUnavailable)
    assert err.key == "up/a.up"
    assert 1.0 <= took < 3.0
    assert store.get("up/b.up", 10) == b"b"  # the caller went on; other objects still read
    for _ in range(localfs.MAX_HUNG - 1):
        assert isinstance(timed(store.get, "up/a.up", 10)[0], ObjectTimeout)
    err, took = timed(store.get, "up/b.up", 10)  # MAX_HUNG threads stuck: the store as a whole fails at once
    assert type(err) is StoreUnavailable
    assert "still stuck" in str(err)
    assert took < FAST_S
    come_back()
    deadline = time.monotonic() + 5
    while isinstance(got := timed(store.get, "up/a.up", 10)[0], StoreUnavailable) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert got == b"a"


def test_the_watchdog_waits_for_a_slow_call_that_keeps_progressing() -> None:
    def slow(beat: localfs.Beat) -> str:
        for _ in range(8):
            time.sleep(0.1)
            beat()
        return "done"

    assert localfs.Watchdog(0.4).run("slow", slow) == "done"  # 0.8 s in all, never 0.4 s without progress


def test_an_abandoned_call_stops_at_its_next_beat() -> None:
    steps: list[int] = []

    def stalls_then_goes_on(beat: localfs.Beat) -> None:
        time.sleep(0.5)
        for i in range(3):
            beat()
            steps.append(i)

    with pytest.raises(localfs.Stalled):
        localfs.Watchdog(0.2).run("stall", stalls_then_goes_on)
    time.sleep(0.5)
    assert steps == []


def test_errors_inside_a_watched_call_reach_the_caller(store) -> None:
    with pytest.raises(ObjectMissing):
        store.get("up/never-written.up", 10)
    assert store.list("nothing/here/") == []


# ------------------------------------------------------------------ S3: bounded reads, timeouts
@pytest.fixture
def s3_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in MOTO_ENV.items():
        monkeypatch.setenv(key, value)


def test_s3_reads_a_huge_object_with_a_range_request(moto_endpoint: str, s3_env) -> None:
    host, port = moto_endpoint.removeprefix("http://").split(":")
    relay = TcpRelay((host, int(port)))
    try:
        url = f"s3://{make_bucket(moto_endpoint)}/r"
        objects = FsspecStore(StoreConfig(url=url, endpoint_url=f"http://{relay.url_host}", timeout_s=5.0))
        big = os.urandom(8 << 20)
        objects.put("up/big.up", big)
        before = relay.sent_downstream
        assert objects.get("up/big.up", 1000) == big[:1001]
        assert relay.sent_downstream - before < 16 << 10  # 1001 bytes and headers, not 8 MiB
        assert objects.list("up/").skipped == []
    finally:
        relay.close()


def test_s3_that_never_answers_is_unavailable_within_its_timeouts(s3_env) -> None:
    silent = socket.create_server(("127.0.0.1", 0))  # accepts connections (the kernel's backlog), never replies
    try:
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        objects = FsspecStore(StoreConfig(url="s3://bucket/r", endpoint_url=endpoint, timeout_s=0.5))
        err, took = timed(objects.get, "up/a.up", 10)
        assert isinstance(err, StoreUnavailable), err
        assert took < 10.0  # botocore: a read timeout of 0.5 s, two attempts
    finally:
        silent.close()
