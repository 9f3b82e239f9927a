"""Learner egress per weight version: HTTP fan-out versus an object store, for N samplers.

Over HTTP the learner serves every sampler itself, so it sends each version N times; through a store it uploads
each version once and the samplers download from the store. Two measurements, one table:

- simulated: the simulated cluster (real training, real PULSE objects, virtual time) with N samplers, `transport.
  weights` http or store; egress = the learner's weight bytes sent (summary `weight_bytes_sent`) per version;
- loopback: a real learner (one `LearnerLoop`, real steps on generated groups) and N real pullers on 127.0.0.1 --
  over HTTP the learner's aiohttp service and N `LearnerClient`s, through the store s3fs to moto's S3 server and N
  `StoreWeightSource`s; egress = the bytes the learner's sockets sent (HTTP headers included), counted by a TCP
  relay in front of the learner (HTTP) or in front of the store as the learner sees it (S3).

    PYTHONPATH=src python benchmarks/egress.py                  # N = 1, 4, 16; ~3.5 M parameters; ~4 min on 2 cores
    PYTHONPATH=src python benchmarks/egress.py --samplers 1 4 --hidden 128 --versions 3

Needs the `store` extra (s3fs, moto). Each row: bytes per version after the first (the first is a snapshot for
everyone), mean over the versions.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import logging
import os
import random
import tempfile
import time
from pathlib import Path

from aiohttp import web

from heterorl.config import ModelConfig, RunConfig, load_config
from heterorl.eventlog import EventLog
from heterorl.live.learner_node import LiveLearner, open_learner
from heterorl.loop.intake import body_digest
from heterorl.policy import Policy, SamplingParams
from heterorl.rollout_codec import encode_group
from heterorl.run.run_dir import prepare_run_dir
from heterorl.sampler import Sampler
from heterorl.simulated.run import build_simulated
from heterorl.tasks import make_task
from heterorl.transport.backoff import Backoff
from heterorl.transport.http.client import LearnerClient
from heterorl.transport.http.service import build_app
from heterorl.transport.store.objects import FsspecStore
from heterorl.transport.store.publisher import StorePublisher
from heterorl.transport.store.source import StoreWeightSource
from heterorl.transport.tcp_relay import TcpRelay
from heterorl.weights import WeightReceiver, merge_patches
from heterorl.weights.envelope import decode_update

TOKEN = "egress-benchmark-token-" + "x" * 16
B = 16  # groups per step


def base_overrides(model_dir: Path, versions: int) -> list[str]:
    return [
        f"model.path={model_dir}",
        "task.name=addition",
        "task.digits=1",
        "task.eval_size=4",
        "sampler.group_size=2",
        "sampler.max_new_tokens=3",
        f"learner.steps={versions}",
        f"learner.groups_per_step={B}",
        "learner.lr=1e-4",
        "eval.every=1000",
        "weights.codec=pulse",
        "live.fsync=false",
    ]


# --- simulated
def simulated(model_dir: Path, n: int, transport: str, versions: int, tmp: Path) -> float:
    nodes = ", ".join("{tokens_per_second: 1000}" for _ in range(n))
    overrides = [*base_overrides(model_dir, versions), f"cluster.samplers=[{nodes}]", "cluster.mode=sync"]
    cfg = load_config(None, [*overrides, f"transport.weights={transport}"])
    run = tmp / f"sim-{transport}-{n}"
    run.mkdir()
    cluster = build_simulated(cfg, run, str(model_dir))
    first: list[int] = []
    on_step = cluster.loop.recorder.on_step
    cluster.loop.recorder.on_step = lambda r: (first.append(int(r["sync/bytes"])), on_step(r))[1]
    cluster.run()
    cluster.loop.publisher.close()
    total = cluster.loop.traffic.total_bytes
    return (total - first[0]) / versions  # versions 1.. (the first record holds version 0's snapshots)


# --- loopback
class Harness:
    """A real learner loop stepping on pre-generated groups (so every version is a real optimizer step)."""

    def __init__(self, cfg: RunConfig, model_dir: Path, run: Path) -> None:
        run = prepare_run_dir(cfg, run)
        self.live: LiveLearner = open_learner(cfg, run, str(model_dir), events=EventLog(io.StringIO()))
        params = SamplingParams.from_config(cfg.sampler)
        sampler = Sampler.from_policy("g", Policy.load(model_dir), make_task(cfg.task), params, 2, 0)
        sampler.load_weights(0, self.live.loop.learner.export_weights())
        self.bodies = [encode_group(g) for g in sampler.generate_groups(B * cfg.learner.steps)]

    def step(self) -> None:
        loop = self.live.loop
        for body in self.bodies[:B]:
            assert loop.offer(body, body_digest(body)).outcome == "accepted"
        del self.bodies[:B]
        taken = loop.take()
        assert taken is not None
        loop.commit(loop.train(taken), busy_seconds=0.0)
        loop.publisher.result()


async def pull_all(pullers: list, receivers: list[WeightReceiver], version: int) -> None:
    async def one(puller, receiver: WeightReceiver) -> None:
        while receiver.version != version:
            if isinstance(puller, LearnerClient):
                got = await puller.pull(receiver.held(), 0.0, 0.5, 0)
            else:
                got = await puller.pull(*receiver.held(), 0.0, 0.5, 0)
            if isinstance(got, bytes):
                assert receiver.apply(decode_update(got)), receiver.last_error

    await asyncio.gather(*(one(p, r) for p, r in zip(pullers, receivers, strict=True)))


def loopback_http(model_dir: Path, n: int, versions: int, tmp: Path) -> float:
    cfg = load_config(None, [*base_overrides(model_dir, versions), "live.poll_seconds=0"])
    harness = Harness(cfg, model_dir, tmp / f"http-{n}")
    harness.live.loop.start()

    async def run() -> float:
        runner = web.AppRunner(build_app(harness.live, TOKEN), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        relay = TcpRelay(("127.0.0.1", runner.addresses[0][1]))
        clients = [
            LearnerClient(
                f"http://{relay.url_host}",
                TOKEN,
                cfg.live,
                f"s{i}",
                "egress",
                random.Random(i),
                EventLog(io.StringIO()),
            )
            for i in range(n)
        ]
        for c in clients:
            await c.__aenter__()
        receivers = [WeightReceiver() for _ in range(n)]
        await pull_all(clients, receivers, 0)
        before = relay.sent_downstream
        for v in range(1, versions + 1):
            await asyncio.to_thread(harness.step)
            await pull_all(clients, receivers, v)
        sent = relay.sent_downstream - before
        for c in clients:
            await c.__aexit__(None, None, None)
        relay.close()
        await runner.cleanup()
        return sent / versions

    return asyncio.run(run())


def loopback_store(model_dir: Path, n: int, versions: int, tmp: Path, endpoint: str, bucket: str) -> float:
    cfg = load_config(None, base_overrides(model_dir, versions))
    harness = Harness(cfg, model_dir, tmp / f"store-{n}")
    host, port = endpoint.removeprefix("http://").split(":")
    relay = TcpRelay((host, int(port)))  # the store as the learner sees it: counts what the learner uploads
    store_cfg = cfg.transport.store.model_copy(update={"url": f"s3://{bucket}/n{n}", "poll_seconds": 0.01})
    learner_side = FsspecStore(store_cfg.model_copy(update={"endpoint_url": f"http://{relay.url_host}"}))
    publisher = StorePublisher(learner_side, harness.live.loop.store, store_cfg, resume=False)
    harness.live.loop.publisher.on_published.append(publisher.published)
    harness.live.loop.start()
    harness.live.loop.publisher.result()
    publisher.drain()
    readers = FsspecStore(store_cfg.model_copy(update={"endpoint_url": endpoint}))
    merge = lambda patches: merge_patches(patches)  # noqa: E731
    sources = [
        StoreWeightSource(
            readers, store_cfg, cfg.live, f"s{i}", Backoff(0.01, 0.05, random.Random(i)), EventLog(io.StringIO()), merge
        )
        for i in range(n)
    ]
    receivers = [WeightReceiver() for _ in range(n)]
    asyncio.run(pull_all(sources, receivers, 0))
    before = relay.sent_upstream
    for v in range(1, versions + 1):
        harness.step()
        publisher.drain()
        asyncio.run(pull_all(sources, receivers, v))
    sent = relay.sent_upstream - before
    relay.close()
    return sent / versions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samplers", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--versions", type=int, default=4)
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    for key, value in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"}.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{server._server.server_port}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="egress")
    tmp = Path(tempfile.mkdtemp(prefix="heterorl-egress-"))
    model = ModelConfig(
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=2 * args.hidden,
    )
    policy = Policy.from_config(model, seed=0)
    params = sum(p.numel() for p in policy.model.parameters())
    policy.save(tmp / "model")
    print(
        f"model: {params / 1e6:.2f} M parameters (bf16 {2 * params / 1e6:.1f} MB); {args.versions} versions; "
        "learner bytes sent per version"
    )
    print("| samplers | HTTP simulated | store simulated | HTTP loopback | store loopback (S3, moto) |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    began = time.monotonic()
    for n in args.samplers:
        row = [
            simulated(tmp / "model", n, "http", args.versions, tmp),
            simulated(tmp / "model", n, "store", args.versions, tmp),
            loopback_http(tmp / "model", n, args.versions, tmp),
            loopback_store(tmp / "model", n, args.versions, tmp, endpoint, "egress"),
        ]
        print(f"| {n} | " + " | ".join(f"{x / 1e3:,.1f} kB" for x in row) + " |", flush=True)
    print(f"({time.monotonic() - began:.0f} s)")
    server.stop()


if __name__ == "__main__":
    main()
