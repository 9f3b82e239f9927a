"""Checks shared by the live processes before they start: options, addresses, node names."""

from __future__ import annotations

from heterorl.config import RunConfig


class LiveSetupError(RuntimeError):
    """The live cluster cannot start as asked (the message says why and what to do)."""


def check_live_config(cfg: RunConfig) -> None:
    """Options the live cluster does not implement are errors, not silently ignored."""
    if cfg.cluster.eta is not None:
        raise LiveSetupError(
            "cluster.eta (AReaL's admission rule) is not implemented in live mode; bound staleness with "
            "cluster.max_staleness, and the queue with live.max_queued_groups"
        )


def parse_listen(listen: str) -> tuple[str, int]:
    """'HOST:PORT' (IPv6 as '[::1]:PORT'; port 0 = any free port) -> (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise LiveSetupError(f"--listen {listen!r} must look like HOST:PORT, e.g. 127.0.0.1:8470")
    return host.removeprefix("[").removesuffix("]"), int(port)


def node_name(cfg: RunConfig, index: int) -> str:
    """The name of sampler node `index` (as the simulated cluster names it)."""
    if not 0 <= index < len(cfg.cluster.samplers):
        raise LiveSetupError(f"--index {index}: the config has {len(cfg.cluster.samplers)} sampler nodes")
    return cfg.cluster.samplers[index].name or f"sampler-{index}"
