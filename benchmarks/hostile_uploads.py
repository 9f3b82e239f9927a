"""A hostile (or buggy) peer against a real learner process on loopback: every attack of issue 15, the answer
it gets, whether `/v1/status` counted it, and whether the learner is still up and training afterwards.

The learner trains a tiny random model (full fine-tuning, async, 3 steps). The attacker holds the token (a peer
or a buggy sampler), except for the unauthenticated rows. Groups are genuine ones from a sampler with the
learner's version-0 weights, then altered. Prints a markdown table, then the memory, connection and disk rows.

    python benchmarks/hostile_uploads.py
    python benchmarks/hostile_uploads.py --disk-full     # also fill a small tmpfs under the run (needs root)
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import torch

from heterorl.config import ModelConfig, config_to_yaml, load_config
from heterorl.loop.intake import body_digest
from heterorl.loop.protocol import Upload
from heterorl.policy import Policy
from heterorl.rollout import RolloutGroup
from heterorl.rollout_codec import MAGIC, encode_group
from heterorl.run.build import build_sampler
from heterorl.transport.wire import REPLY_MAGIC, decode_reply, encode_upload

TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64}
TOKEN = "hostile-benchmark-token-" + "h" * 16


def status(url: str) -> dict:
    try:
        with urllib.request.urlopen(url + "/v1/status", timeout=5) as r:
            return json.loads(r.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return {}


def counted(before: dict, after: dict) -> dict[str, int]:
    keys = set(before.get("rejected", {})) | set(after.get("rejected", {}))
    out = {k: after["rejected"].get(k, 0) - before["rejected"].get(k, 0) for k in keys}
    out = {k: v for k, v in out.items() if v}
    if after.get("busy", 0) > before.get("busy", 0):
        out["busy"] = after["busy"] - before["busy"]
    return out


def raw(addr: tuple[str, int], request: bytes, timeout: float = 10.0) -> tuple[int, str]:
    """Send raw bytes; (status, outcome) of the answer (0, "closed" when the connection was closed)."""
    with socket.create_connection(addr, timeout=timeout) as s:
        s.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                return 0, "closed"
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            (int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length")), 0
        )
        while len(body) < length:
            chunk = s.recv(65536)
            if not chunk:
                break
            body += chunk
    if body.startswith(REPLY_MAGIC):  # the learner's reply: the refusal of the upload, or its group's verdict
        reply = decode_reply(body)
        outcome = reply.refused or (reply.verdicts[0].outcome if reply.verdicts else "")
        return int(head.split(b" ")[1]), outcome
    try:
        outcome = json.loads(body).get("outcome", "")
    except (json.JSONDecodeError, UnicodeDecodeError):
        outcome = body[:40].decode("latin-1")
    return int(head.split(b" ")[1]), outcome


SEQ = itertools.count()


def post(
    addr: tuple[str, int], group: bytes, token: bytes = TOKEN.encode(), digest: str | None = None, wrap: bool = True
) -> tuple[int, str]:
    """POST one group in an upload of sampler `a` (with its digest, unless `digest` lies); `wrap=False` sends the
    bytes as the whole body."""
    body = group
    if wrap:
        upload = Upload("a", "hostile", next(SEQ), 0, groups=(group,), digests=(digest or body_digest(group),))
        body = encode_upload(upload)
    head = (
        b"POST /v1/exchange HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token + b"\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n"
    )
    return raw(addr, head + body)


def altered(group: RolloutGroup, change: Callable[[RolloutGroup], None], tag: str) -> bytes:
    bad = copy.deepcopy(group)
    bad.group_id += f"-{tag}"
    change(bad)
    return encode_group(bad)


def with_header(group: RolloutGroup, text: bytes) -> bytes:
    """A genuine group's message with its JSON header replaced by `text`."""
    data = encode_group(group)
    n = int.from_bytes(data[4:8], "little")
    return MAGIC + len(text).to_bytes(4, "little") + text + data[8 + n :]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--disk-full", action="store_true", help="also fill a tmpfs mounted over the run (root)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="hostile-"))
    model = work / "model"
    Policy.from_config(ModelConfig(**TINY), seed=0).save(model)
    run = work / "run"
    mounted = False
    if args.disk_full:
        (run / "live").mkdir(parents=True)
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(run / "live")]).returncode == 0
    cfg = load_config(
        None,
        [
            f"model.path={model}",
            "task.name=addition",
            "task.digits=1",
            "sampler.group_size=4",
            "sampler.max_new_tokens=3",
            "learner.steps=3",
            "learner.groups_per_step=4",
            "learner.lr=1e-3",
            "cluster.mode=async",
            "cluster.samplers=[{name: a}]",
            "live.header_timeout_s=2",
            "live.checkpoint_every=1",
            "eval.every=100",
            "task.eval_size=8",
        ],
    )
    config = work / "config.yaml"
    config.write_text(config_to_yaml(cfg))
    env = {**os.environ, "HETERORL_TOKEN": TOKEN, "OMP_NUM_THREADS": "1"}
    log = (work / "learner.log").open("wb")
    argv_ = [sys.executable, "-m", "heterorl.live.node", "learner", str(config), "--run-dir", str(run)]
    learner = subprocess.Popen(argv_, stdout=log, stderr=subprocess.STDOUT, env=env)
    rows: list[tuple[str, int, str, str, str]] = []
    try:
        address = run / "live" / "learner.json"
        deadline = time.monotonic() + 120
        while not address.is_file() and time.monotonic() < deadline:
            time.sleep(0.1)
        url = json.loads(address.read_text())["url"]
        host, port = url.removeprefix("http://").split(":")
        addr = (host, int(port))
        while status(url).get("version") is None:
            time.sleep(0.1)
        sampler = build_sampler(cfg, 0, base=str(model))
        sampler.load_weights(0, dict(Policy.load(model).model.named_parameters()))
        groups = sampler.generate_groups(24)
        pool = iter(groups)
        vocab = Policy.load(model).model.config.vocab_size

        def row(what: str, send: Callable[[], tuple[int, str]]) -> None:
            before = status(url)
            code, outcome = send()
            after = status(url)
            alive = "yes" if learner.poll() is None and after else "NO"
            rows.append((what, code, outcome, json.dumps(counted(before, after)) or "-", alive))

        def set_logp(value: float, everywhere: bool = False) -> Callable[[RolloutGroup], None]:
            def change(g: RolloutGroup) -> None:
                if everywhere:
                    g.behavior_logp_GL[g.completion_mask_GL.bool()] = value
                else:
                    g.behavior_logp_GL[0, 0] = value

            return change

        def set_reward(value: float) -> Callable[[RolloutGroup], None]:
            def change(g: RolloutGroup) -> None:
                g.rewards_G[0] = value

            return change

        def set_attr(name: str, value: object) -> Callable[[RolloutGroup], None]:
            def change(g: RolloutGroup) -> None:
                setattr(g, name, value)

            return change

        g = next(pool)
        row("one behaviour log-prob at -1e4", lambda: post(addr, altered(g, set_logp(-1e4), "a")))
        row("every log-prob at -3e38", lambda: post(addr, altered(g, set_logp(-3e38, True), "b")))
        row("a reward of +3e38", lambda: post(addr, altered(g, set_reward(3e38), "c")))
        row("a reward of -3e38", lambda: post(addr, altered(g, set_reward(-3e38), "d")))
        row("a NaN reward", lambda: post(addr, altered(g, set_reward(float("nan")), "e")))
        row(
            "token id outside the vocabulary",
            lambda: post(addr, altered(g, lambda x: x.completion_ids_GL.__setitem__((0, 0), vocab), "f")),
        )
        row("a version from the future", lambda: post(addr, altered(g, lambda x: x.version_GL.fill_(7), "g")))
        long_prompt = "1+2=" * 15 + "123"
        text = sampler.text
        row(
            "prompt + completion over the context",
            lambda: post(
                addr,
                altered(
                    g,
                    lambda x: (
                        setattr(x, "prompt", long_prompt),
                        setattr(x, "prompt_ids_P", torch.tensor(text.prompt_ids(long_prompt))),
                    ),
                    "h",
                ),
            ),
        )
        row("a 60 KiB prompt string", lambda: post(addr, altered(g, set_attr("prompt", "1" * 60_000), "i")))
        row("a 60 KiB answer string", lambda: post(addr, altered(g, set_attr("answer", "7" * 60_000), "j")))
        row("an empty group id", lambda: post(addr, _with_id(g, "")))
        row(
            "made-up info counts",
            lambda: post(addr, altered(g, set_attr("info", {f"k{i}": 0 for i in range(16)}), "k")),
        )
        row("a 5000-digit integer in the header", lambda: post(addr, with_header(g, b'{"P": ' + b"9" * 5000 + b"}")))
        row("header JSON nested 20,000 deep", lambda: post(addr, with_header(g, b"[" * 20_000 + b"]" * 20_000)))
        row("header with NaN", lambda: post(addr, with_header(g, b'{"created_at": NaN}')))
        row(
            "body differs from its digest",
            lambda: post(addr, encode_group(g), digest=body_digest(b"x")),
        )
        row("a body larger than any valid upload", lambda: post(addr, b"z" * 2_000_000, wrap=False))
        row("no token", lambda: post(addr, encode_group(g), token=b""))
        row("a token that is not UTF-8", lambda: post(addr, encode_group(g), token=b"\xff\xfe\xc3("))
        row(
            "Content-Length: abc",
            lambda: raw(addr, b"POST /v1/exchange HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n"),
        )
        row(
            "a chunk size that is not hex",
            lambda: raw(
                addr,
                b"POST /v1/exchange HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
            ),
        )
        row(
            "Transfer-Encoding with Content-Length",
            lambda: raw(
                addr,
                b"POST /v1/exchange HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                b"Content-Length: 5\r\n\r\n0\r\n\r\n",
            ),
        )
        row(
            "a 20,000-byte request line",
            lambda: raw(addr, b"GET /v1/status?" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"),
        )
        genuine = encode_group(next(pool))
        row("a genuine group", lambda: post(addr, genuine))
        row("the same group again (a retry)", lambda: post(addr, genuine))
        impostor = _from(genuine)
        impostor.rewards_G[0] = 0.5
        row("its id with other content", lambda: post(addr, encode_group(impostor)))
        poisoned = altered(next(pool), set_logp(-103.5), "p")  # a log-prob float32 sampling can emit
        row("log-prob -103.5 (accepted; its step is skipped)", lambda: post(addr, poisoned))
        for _ in range(2):
            post(addr, encode_group(next(pool)))
        time.sleep(3)
        skipped = status(url).get("skipped_steps")
        names_before = len(status(url).get("samplers", {}))
        auth = f"Host: x\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
        for i in range(200):
            raw(addr, f"GET /v1/weights?sampler=intruder-{i}&wait=0 HTTP/1.1\r\n{auth}".encode())
        names_after = len(status(url).get("samplers", {}))

        print("| what | status | outcome | counted in /v1/status | learner alive |")
        print("| --- | --- | --- | --- | --- |")
        for what, code, outcome, count, alive in rows:
            print(f"| {what} | {code} | {outcome} | {count} | {alive} |")
        print(f"\nskipped steps after the -103.5 group: {skipped}; learner version {status(url).get('version')}")
        print(f"sampler names in /v1/status after 200 made-up names: {names_before} -> {names_after}")

        # memory: 20 concurrent uploads of the largest size the learner reads (and 20 of 16 MiB, refused unread)
        rss0 = rss_mb(learner.pid)
        asyncio.run(concurrent_uploads(addr, 20, 16 * 2**20))
        asyncio.run(concurrent_uploads(addr, 20, 60_000))
        rss1 = rss_mb(learner.pid)
        print(f"learner RSS {rss0:.0f} MB -> {rss1:.0f} MB after 20 concurrent 16 MiB uploads and 20 of 60 KB")
        before = status(url)
        asyncio.run(slow_and_idle(addr))
        after = status(url)
        print(
            f"slow loris + 300 idle sockets: counted {counted(before, after)}, learner alive {learner.poll() is None}"
        )
        if mounted:
            disk_full(addr, run, pool, url)
    finally:
        learner.send_signal(signal.SIGTERM)
        try:
            learner.wait(timeout=60)
        except subprocess.TimeoutExpired:
            learner.kill()
        log.close()
        if mounted:
            subprocess.run(["umount", str(run / "live")])
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _from(body: bytes) -> RolloutGroup:
    from heterorl.rollout_codec import GroupLimits, decode_group

    return decode_group(body, GroupLimits(vocab_size=2**31 - 1, current_version=2**31 - 1))


def _with_id(group: RolloutGroup, gid: str) -> bytes:
    bad = copy.deepcopy(group)
    bad.group_id = gid
    return encode_group(bad)


async def concurrent_uploads(addr: tuple[str, int], n: int, size: int) -> None:
    async def one() -> None:
        try:
            reader, writer = await asyncio.open_connection(*addr)
            auth = f"Authorization: Bearer {TOKEN}\r\n"
            head = f"POST /v1/exchange HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: {size}\r\n\r\n"
            writer.write(head.encode())
            chunk = b"z" * 65536
            for _ in range(size // len(chunk)):
                if reader.at_eof():
                    break
                writer.write(chunk)
                await writer.drain()
            await asyncio.wait_for(reader.read(), 30)
            writer.close()
        except (ConnectionError, asyncio.TimeoutError):
            pass

    await asyncio.gather(*(one() for _ in range(n)))


async def slow_and_idle(addr: tuple[str, int]) -> None:
    async def loris() -> None:
        reader, writer = await asyncio.open_connection(*addr)
        try:
            for byte in b"POST /v1/exchange HTTP/1.1\r\nHost: x\r\n" + b"X" * 100:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(1.0)
                if reader.at_eof():
                    break
        except ConnectionError:
            pass
        writer.close()

    began = time.monotonic()
    await loris()
    print(f"slow loris (1 byte/s) held its connection {time.monotonic() - began:.1f} s")
    idle = []
    for _ in range(300):
        try:
            idle.append(await asyncio.open_connection(*addr))
        except OSError:
            break
    began = time.monotonic()
    for reader, writer in idle:
        await asyncio.wait_for(reader.read(), 10)
        writer.close()
    print(f"300 idle sockets: all closed by the learner within {time.monotonic() - began:.1f} s")


def disk_full(addr: tuple[str, int], run: Path, pool, url: str) -> None:
    filler = run / "live" / "filler"
    with filler.open("wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass
    answers = [post(addr, encode_group(next(pool))) for _ in range(3)]
    alive = bool(status(url))
    filler.unlink()
    after = [post(addr, encode_group(next(pool))) for _ in range(1)]
    full = status(url)["rejected"].get("disk_full")
    print(f"disk full (tmpfs under live/): {answers} counted {full}, alive {alive}; space back: {after}")


if __name__ == "__main__":
    sys.exit(main())
