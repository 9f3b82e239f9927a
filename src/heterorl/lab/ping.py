"""`heterorl lab ping`: each link's round trip and rates measured through real TCP, beside its config.

`start_probe_server` and `run_plan` drive `heterorl.lab.probe` inside a lab (the tests use them too);
`measure_link` runs one link's measurement: round trips of 1-byte pings on an open connection, then a bulk
upload (sampler -> learner, the rollout direction) and a bulk download (the weights direction), each sized to
last about `seconds` at the configured rate. The steady rate is taken over the second half of the bytes (after
slow start), in payload megabits per second (a 1500-byte packet carries 1448 payload bytes).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from heterorl.config import LinkConfig
from heterorl.lab.lab import Node, WanLab
from heterorl.lab.netns import LabError, readline
from heterorl.network import make_delay

PROBE_PORT = 9000
UNLIMITED_PROBE_BYTES = 50_000_000  # the bulk size on a link without a rate


def start_probe_server(lab: WanLab, port: int = PROBE_PORT) -> subprocess.Popen[str]:
    """The probe server in the learner's namespace (the lab stops it); returns once it listens."""
    server = lab.popen(
        "learner",
        [sys.executable, "-m", "heterorl.lab.probe", "server", "--listen", f"{lab.learner_ip}:{port}"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    if not readline(server.stdout, 120.0, "the probe server"):
        raise LabError(f"the probe server did not start (status {server.wait()})")
    return server


def run_plan(
    lab: WanLab, node: Node, plan: list[dict[str, Any]], timeout: float = 120.0, port: int = PROBE_PORT
) -> dict[str, Any]:
    """Run a probe client's plan in a node's namespace against the probe server; its JSON result."""
    done = lab.exec(node, [*_client(lab, port), "--plan", json.dumps(plan)], timeout=timeout)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise LabError(f"the probe client on node {node} failed: {tail}")
    return json.loads(done.stdout)


def run_plans(
    lab: WanLab, plans: dict[int, list[dict[str, Any]]], timeout: float = 120.0, port: int = PROBE_PORT
) -> dict[int, dict[str, Any]]:
    """`run_plan` on several samplers at once (their links are independent); each one's JSON result."""
    procs = {
        node: lab.popen(node, [*_client(lab, port), "--plan", json.dumps(plan)], stdout=subprocess.PIPE, text=True)
        for node, plan in plans.items()
    }
    results = {}
    for node, proc in procs.items():
        out, _ = proc.communicate(timeout=timeout)
        if proc.returncode != 0:
            raise LabError(f"the probe client on node {node} failed (status {proc.returncode}); its error is above")
        results[node] = json.loads(out)
    return results


def _client(lab: WanLab, port: int) -> list[str]:
    return [sys.executable, "-m", "heterorl.lab.probe", "client", "--connect", f"{lab.learner_ip}:{port}"]


def configured_rtt(link: LinkConfig, n: int = 20_000, seed: int = 0) -> tuple[float, float]:
    """Median and 90th percentile of weights_delay + rollout_delay drawn from the link's models (s)."""
    rng = np.random.default_rng(seed)
    rtt = make_delay(link.weights_delay).sample_many(n, rng) + make_delay(link.rollout_delay).sample_many(n, rng)
    return float(np.median(rtt)), float(np.quantile(rtt, 0.9))


@dataclass(frozen=True)
class LinkMeasurement:
    """One link measured: round trips (s) and steady payload rates (Mbit/s) of each direction."""

    rtt_median: float
    rtt_p90: float
    connect_s: float
    upload_mbps: float
    download_mbps: float
    retransmitted: int


def steady_mbps(step: dict[str, Any]) -> float:
    """Payload Mbit/s over the second half of an upload's or download's bytes (after slow start)."""
    return step["after_half"] * 8 / (step["last_at"] - step["half_at"]) / 1e6


def _bulk_bytes(mbps: float | None, seconds: float) -> int:
    return UNLIMITED_PROBE_BYTES if mbps is None else max(200_000, int(mbps * 1e6 / 8 * seconds))


def measure_link(lab: WanLab, index: int, seconds: float = 3.0, pings: int = 20) -> LinkMeasurement:
    """Ping, upload and download through sampler `index`'s link (the probe server must be running)."""
    link = lab.links[index]
    up, down = _bulk_bytes(link.bandwidth_of("rollout"), seconds), _bulk_bytes(link.bandwidth_of("weights"), seconds)
    rtt_guess = sum(configured_rtt(link, n=1000))
    plan = [
        {"op": "connect"},
        {"op": "ping", "count": pings, "interval": 0.01},
        {"op": "upload", "size": up},
        {"op": "download", "size": down},
    ]
    out = run_plan(lab, index, plan, timeout=60.0 + 4 * seconds + 30 * rtt_guess)
    connect, ping, upload, download = out["steps"]
    rtts = np.asarray(ping["rtts"])
    return LinkMeasurement(
        rtt_median=float(np.median(rtts)),
        rtt_p90=float(np.quantile(rtts, 0.9)),
        connect_s=connect["seconds"],
        upload_mbps=steady_mbps(upload),
        download_mbps=steady_mbps(download),
        retransmitted=int(out["retransmitted"]),
    )
