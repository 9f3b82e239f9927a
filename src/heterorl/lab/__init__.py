"""The WAN lab: real processes in Linux network namespaces joined by links shaped packet by packet.

`WanLab` (docs/wan-lab.md) runs a learner and samplers on one machine with each sampler's `LinkConfig` applied
to the real kernel TCP connections between them, by a userspace router that holds every namespace's TUN device.
It needs root, network namespaces and /dev/net/tun; it uses no qdisc (this project's CI kernels have no
sch_netem), so the same numbers shape the links wherever it runs.
"""

from heterorl.lab.lab import Node, WanLab
from heterorl.lab.netns import LabError

__all__ = ["LabError", "Node", "WanLab"]
