"""The WAN lab through real kernel TCP between network namespaces (`-m wanlab`, root): round trips match the
configured delays, throughput the rates, a cut stops traffic and TCP recovers after it, loss makes TCP
retransmit, and nothing is left behind, also after an error, a Ctrl-C or a kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from heterorl.config import LinkConfig
from heterorl.lab import LabError, WanLab
from heterorl.lab.netns import ALLOWED_CC, lab_namespaces, remove_stale
from heterorl.lab.ping import run_plan, start_probe_server, steady_mbps
from heterorl.network import Link, TcpPath

pytestmark = pytest.mark.wanlab
PAYLOAD = 1448 / 1500  # payload share of a full 1500-byte packet (IPv4 + TCP with timestamps: 52 bytes)


def fixed(seconds: float) -> dict:
    return {"kind": "fixed", "seconds": seconds}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_round_trips_and_rates_match_the_config() -> None:
    links = [
        LinkConfig(weights_delay=fixed(0.03), rollout_delay=fixed(0.02), bandwidth_mbps=20.0),
        LinkConfig(
            weights_delay=fixed(0.01), rollout_delay=fixed(0.01), weights_bandwidth_mbps=16, rollout_bandwidth_mbps=4
        ),
    ]
    with WanLab(links) as lab:
        start_probe_server(lab)
        plan = [{"op": "connect"}, {"op": "ping", "count": 20, "interval": 0.01}]
        out = run_plan(lab, 0, [*plan, {"op": "upload", "size": 5_000_000}, {"op": "download", "size": 5_000_000}])
        connect, ping, up, down = out["steps"]
        rtts = np.asarray(ping["rtts"])
        print(
            f"link 0: RTT 50 ms configured, measured median {np.median(rtts) * 1e3:.2f} ms, max {rtts.max() * 1e3:.2f}"
        )
        assert 0.050 <= np.median(rtts) < 0.054  # (the median: a loaded machine delays the probe processes)
        assert connect["seconds"] >= 0.050  # SYN out, SYN-ACK back
        for name, step in (("upload", up), ("download", down)):
            print(f"link 0 {name}: {steady_mbps(step):.2f} Mbit/s payload, {20 * PAYLOAD:.2f} expected")
            assert steady_mbps(step) == pytest.approx(20 * PAYLOAD, rel=0.03)
        out = run_plan(lab, 1, [*plan, {"op": "upload", "size": 1_000_000}, {"op": "download", "size": 4_000_000}])
        _, ping, up, down = out["steps"]
        assert 0.020 <= np.median(ping["rtts"]) < 0.024
        print(f"link 1: up {steady_mbps(up):.2f} Mbit/s (4 set), down {steady_mbps(down):.2f} (16 set)")
        assert steady_mbps(up) == pytest.approx(4 * PAYLOAD, rel=0.03)
        assert steady_mbps(down) == pytest.approx(16 * PAYLOAD, rel=0.03)


def test_a_cut_stops_traffic_and_tcp_recovers_with_backoff() -> None:
    cut = (10.0, 13.0)  # late enough for the probes to be running on a loaded machine
    link = LinkConfig(
        weights_delay=fixed(0.01),
        rollout_delay=fixed(0.01),
        bandwidth_mbps=10.0,
        outages=[{"start": cut[0], "end": cut[1]}],
        transfer={"model": "tcp"},
    )
    with WanLab([link]) as lab:
        start_probe_server(lab)
        seconds = cut[1] + 2.0 - lab.elapsed()
        assert lab.elapsed() < cut[0] - 2.0, "the machine took too long to start the probes before the cut"
        out = run_plan(lab, 0, [{"op": "connect"}, {"op": "stream", "size": 1000, "seconds": seconds}], timeout=60)
        stats = lab.stats()
        starts = np.asarray(out["steps"][1]["starts"]) - lab.t0
        arrivals = np.asarray(out["steps"][1]["arrivals"]) - lab.t0
    # every upload the client finished was acknowledged by the server: none lost to the cut
    assert len(arrivals) == len(starts) > 50
    assert starts[0] < cut[0] - 1.0, "the probe client started too late to see the cut"
    assert not np.any((arrivals > cut[0] + 0.02) & (arrivals < cut[1]))
    assert stats["links"][0]["rollout"]["cut"] > 0
    resumed = arrivals[arrivals >= cut[1]]
    assert len(resumed) > 10, "traffic came back after the cut"
    # the model: what was in flight when the link went down, the last request before the cut or its answer,
    # waits for the backed-off retransmission timer, RTO = SRTT + 200 ms, where SRTT is a request's round trip
    # as TCP measures it (the answer is the acknowledgement)
    last = int(np.flatnonzero(starts < cut[0])[-1])
    srtt = float(np.median(np.diff(starts[: last + 1])))
    model = Link(link, seed=0)
    request_lost = arrivals[last] > cut[0] + 0.05  # (the server reads what arrived just before the cut late)
    path = model.transfers["rollout" if request_lost else "weights"]
    assert isinstance(path, TcpPath)
    sent = starts[last] if request_lost else arrivals[last]
    path.established, path.srtt, path.rttvar, path.last_sent = True, srtt, 0.2, sent
    predicted = model.transfer("rollout" if request_lost else "weights", float(sent), 1000).arrival
    if not request_lost:  # the answer's retransmission reaches the client, whose next request crosses the link
        predicted += 0.01
    measured = arrivals[last] if request_lost else arrivals[last + 1]
    lost = "request" if request_lost else "answer"
    print(f"cut {cut}: {lost} sent at {sent:.3f} s lost, SRTT {srtt * 1e3:.1f} ms; ", end="")
    print(f"traffic back at {measured:.3f} s, model {predicted:.3f} s")
    assert measured == pytest.approx(predicted, abs=0.2)  # the kernel rounds long timers up (docs/wan-lab.md)


def test_loss_makes_tcp_retransmit() -> None:
    lossy = LinkConfig(
        weights_delay=fixed(0.005),
        rollout_delay=fixed(0.005),
        bandwidth_mbps=20.0,
        rollout_faults={"packet_loss": 0.02},
    )
    with WanLab([lossy]) as lab:
        start_probe_server(lab)
        out = run_plan(lab, 0, [{"op": "connect"}, {"op": "upload", "size": 3_000_000}])
        counts = lab.stats()["links"][0]["rollout"]
    share = counts["loss"] / counts["packets"]
    print(f"loss: {counts['loss']} of {counts['packets']} packets ({share:.3%}), {out['retransmitted']} retransmitted")
    assert share == pytest.approx(0.02, abs=5 * np.sqrt(0.02 * 0.98 / counts["packets"]))
    # every lost data segment is sent again (lost acknowledgements of the other direction need no resend)
    assert out["retransmitted"] >= 0.9 * counts["loss"]


def fail_inside_a_lab(seen: dict) -> None:
    """Open a lab, start a process in it, note what exists, then fail."""
    link = LinkConfig(weights_delay=fixed(0.001))
    with WanLab([link, link]) as lab:
        seen["lab"] = lab
        seen["names"] = [lab.namespace(n) for n in lab.nodes]
        assert set(seen["names"]) <= set(lab_namespaces())
        seen["sleeper"] = lab.popen(0, ["sleep", "60"])
        seen["allowed_inside"] = ALLOWED_CC.read_text()
        cc = lab.exec(0, ["sysctl", "-n", "net.ipv4.tcp_congestion_control"]).stdout.strip()
        assert cc == "cubic"
        assert lab._router is not None
        seen["router"] = lab._router.pid
        raise RuntimeError("boom")


def test_the_lab_leaves_nothing_behind_after_an_error() -> None:
    seen: dict = {}
    allowed = ALLOWED_CC.read_text()
    with pytest.raises(RuntimeError, match="boom"):
        fail_inside_a_lab(seen)
    assert seen["allowed_inside"] == allowed == ALLOWED_CC.read_text()  # the host's list, back at once
    assert not set(seen["names"]) & set(lab_namespaces())
    assert seen["sleeper"].poll() is not None
    assert not alive(seen["router"])
    assert "hrl" not in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    with pytest.raises(LabError, match="not running"):
        seen["lab"].stats()


SCRIPT = """
import faulthandler, signal, sys, time
faulthandler.register(signal.SIGUSR1)  # the test asks for every thread's stack if the clean-up hangs
from heterorl.config import LinkConfig
from heterorl.lab import WanLab
with WanLab([LinkConfig()]) as lab:
    lab.popen(0, ["sleep", "60"])
    print(lab.namespace("learner"), lab.namespace(0), flush=True)
    time.sleep(60)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_a_ctrl_c_cleans_up_and_a_kill_is_cleaned_by_the_next_lab(sig: signal.Signals, tmp_path: Path) -> None:
    stderr = tmp_path / "stderr.log"  # a file, not a pipe: a full pipe would block the script itself
    with stderr.open("w") as errors:
        proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(SCRIPT)], stdout=subprocess.PIPE, stderr=errors, text=True
        )
    assert proc.stdout is not None
    names = proc.stdout.readline().split()
    assert len(names) == 2

    def in_namespaces() -> list[int]:
        return [
            int(p)
            for n in names
            for p in subprocess.run(["ip", "netns", "pids", n], capture_output=True, text=True).stdout.split()
        ]

    deadline = time.monotonic() + 10  # `ip netns exec` enters the namespace after Popen returns: a moment later
    while not (sleepers := in_namespaces()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sleepers
    proc.send_signal(sig)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:  # once in CI after the Ray tier (not reproduced): show where it hangs
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1)
        proc.kill()
        proc.wait()
        pytest.fail(f"the lab did not exit within 60 s of signal {sig}; its stacks:\n{stderr.read_text()[-6000:]}")
    if sig == signal.SIGKILL:
        assert set(names) <= set(lab_namespaces())  # killed outright: its namespaces stay ...
        assert sorted(set(remove_stale()) & set(names)) == sorted(names)  # ... until the next lab removes them
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(alive(p) for p in sleepers):
        time.sleep(0.05)
    assert not set(names) & set(lab_namespaces())
    assert not any(alive(p) for p in sleepers)
