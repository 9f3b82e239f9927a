"""Network models: delays, rates, faults, cuts, traces and transfer costs of the links between learner and samplers.

Pure objects, no I/O (a `link.trace` file is read once, when its `Link` is built): every random draw goes through
a `numpy.random.Generator` handed in or owned by a `Link`, so the same config and seed give the same delays bit
for bit. The simulated cluster turns these numbers into virtual time; the WAN lab (`heterorl.lab`) applies the
same `LinkConfig` to real packets; the live cluster may use them to inject artificial delay and loss into a
real transport (`live.emulate_links`).

- `delays`:     delay models by `kind` (fixed, uniform, exponential, lognormal, weibull, empirical)
- `faults`:     per-message drop, duplicate, reorder, corrupt
- `outages`:    cuts on a schedule, [start, end) windows
- `trace`:      a measured link replayed over time (delays, rates, loss, cuts; JSON lines or CSV)
- `conditions`: one direction of a link at time t, from the config or the trace
- `transfer`:   transfer models by `model`: simple (delay + bytes / rate) and, in `tcp`, a TCP-like one
- `link`:       a sampler's link: its seeded streams and all of the above per direction
"""

from heterorl.network.conditions import LinkPath, PathConditions
from heterorl.network.delays import (
    BandDelay,
    DelayModel,
    Empirical,
    Exponential,
    Fixed,
    LogNormal,
    Uniform,
    Weibull,
    make_delay,
    register_delay,
)
from heterorl.network.faults import Delivery, FaultInjector, flip_byte
from heterorl.network.link import PATHS, Link, bandwidth_seconds, link_rng
from heterorl.network.outages import Outages
from heterorl.network.tcp import TcpPath
from heterorl.network.trace import LinkTrace, TraceError, parse_trace, read_trace
from heterorl.network.transfer import PathTransfer, SimplePath, Transfer, make_transfer, register_transfer

__all__ = [
    "PATHS",
    "BandDelay",
    "DelayModel",
    "Delivery",
    "Empirical",
    "Exponential",
    "FaultInjector",
    "Fixed",
    "Link",
    "LinkPath",
    "LinkTrace",
    "LogNormal",
    "Outages",
    "PathConditions",
    "PathTransfer",
    "SimplePath",
    "TcpPath",
    "TraceError",
    "Transfer",
    "Uniform",
    "Weibull",
    "bandwidth_seconds",
    "flip_byte",
    "link_rng",
    "make_delay",
    "make_transfer",
    "parse_trace",
    "read_trace",
    "register_delay",
    "register_transfer",
]
