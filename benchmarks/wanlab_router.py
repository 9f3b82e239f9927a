"""What the WAN lab's Python router costs and how fast it can go, in one invocation (root).

Three bulk uploads through real TCP (`heterorl.lab.probe`), each measured as payload Mbit/s over the second
half of its bytes, with the router's CPU seconds (its own getrusage) over the transfer:

- baseline: the probe client and server in one namespace over loopback, no router (what the probes can do);
- unlimited: through the router with 1 ms delays and no rate limit (the router's ceiling);
- shaped: through the router on a 100 Mbit/s, 25 ms + 25 ms link (a WAN the lab is built for).

    .venv/bin/python benchmarks/wanlab_router.py --megabytes 200
"""

from __future__ import annotations

import argparse
import os

from heterorl.config import LinkConfig
from heterorl.lab import WanLab
from heterorl.lab.ping import run_plan, start_probe_server, steady_mbps


def fixed(seconds: float) -> dict:
    return {"kind": "fixed", "seconds": seconds}


def through_router(lab: WanLab, index: int, size: int) -> dict:
    before = lab.stats()
    out = run_plan(lab, index, [{"op": "connect"}, {"op": "upload", "size": size}], timeout=600)
    after = lab.stats()
    up = out["steps"][1]
    packets = sum(
        after["links"][index][p].get("packets", 0) - before["links"][index][p].get("packets", 0)
        for p in ("weights", "rollout")
    )
    cpu = after["cpu_s"] - before["cpu_s"]
    return {
        "mbps": steady_mbps(up),
        "seconds": up["seconds"],
        "router_cpu_s": cpu,
        "packets": packets,
        "us_per_packet": 1e6 * cpu / max(packets, 1),
        "cpu_share": cpu / up["seconds"],
        "packets_per_s": packets / up["seconds"],
        "retransmitted": out["retransmitted"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=200.0, help="Size of the unlimited and baseline uploads.")
    parser.add_argument("--shaped-seconds", type=float, default=8.0, help="Length of the 100 Mbit/s upload.")
    args = parser.parse_args()
    size = int(args.megabytes * 1e6)
    links = [
        LinkConfig(weights_delay=fixed(0.001), rollout_delay=fixed(0.001)),
        LinkConfig(weights_delay=fixed(0.025), rollout_delay=fixed(0.025), bandwidth_mbps=100.0),
    ]
    print(f"load average before: {os.getloadavg()}, cpus: {os.cpu_count()}")
    with WanLab(links) as lab:
        print(f"router scheduling: {lab.scheduling}")
        start_probe_server(lab)
        # the baseline: a client in the learner's own namespace (its own address goes through loopback)
        out = run_plan(lab, "learner", [{"op": "connect"}, {"op": "upload", "size": size}], timeout=600)
        base = steady_mbps(out["steps"][1])
        unlimited = through_router(lab, 0, size)
        shaped = through_router(lab, 1, int(100e6 / 8 * args.shaped_seconds))
    print(f"baseline (loopback, no router): {base:8.1f} Mbit/s")
    for name, r in (("unlimited (router, 1 ms)", unlimited), ("shaped (100 Mbit/s, 50 ms RTT)", shaped)):
        print(
            f"{name}: {r['mbps']:8.1f} Mbit/s ({r['mbps'] / base:.2f}x baseline), {r['packets_per_s']:7.0f} packets/s, "
            f"router {r['router_cpu_s']:.2f} CPU s over {r['seconds']:.1f} s ({r['cpu_share']:.0%} of a core), "
            f"{r['us_per_packet']:.1f} us/packet, {r['retransmitted']} retransmitted"
        )
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
