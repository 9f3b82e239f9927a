"""Checks shared by the live processes before they start: options, addresses, node indices."""

from __future__ import annotations

from urllib.parse import urlsplit

from heterorl.config import RunConfig


class LiveSetupError(RuntimeError):
    """The live cluster cannot start as asked (the message says why and what to do)."""


def check_live_config(cfg: RunConfig) -> None:
    """Options the live cluster cannot honour are errors, never silently ignored."""
    if cfg.cluster.modelled is not None:
        raise LiveSetupError(
            f"cluster.modelled ({cfg.cluster.modelled.label()}) is a simulator plan: a live cluster sends the real "
            "model's bytes; remove the section to run live"
        )
    if cfg.live.emulate_links:
        return
    kinds = ("drop", "duplicate", "reorder", "corrupt")
    for i, node in enumerate(cfg.cluster.samplers):
        link = node.link
        if any(getattr(f, k) > 0 for f in (link.weights_faults, link.rollout_faults) for k in kinds):
            raise LiveSetupError(
                f"cluster.samplers.{i}.link sets faults, which a live cluster injects only with "
                "live.emulate_links: true (the real network brings its own otherwise)"
            )


def parse_listen(listen: str) -> tuple[str, int]:
    """'HOST:PORT' (IPv6 as '[::1]:PORT'; port 0 = any free port) -> (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise LiveSetupError(f"--listen {listen!r} must look like HOST:PORT, e.g. 127.0.0.1:8470")
    return host.removeprefix("[").removesuffix("]"), int(port)


def check_node_index(cfg: RunConfig, index: int) -> None:
    """`--index` must name one of the config's sampler nodes."""
    if not 0 <= index < len(cfg.cluster.samplers):
        raise LiveSetupError(f"--index {index}: the config has {len(cfg.cluster.samplers)} sampler nodes")


def check_url(url: str) -> str:
    """`--connect` must be the learner's http(s) URL (a path prefix is allowed, behind a proxy)."""
    parts = urlsplit(url)
    try:
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise LiveSetupError(f"--connect {url!r} must be the learner's URL, e.g. http://learner.example:8470")
    return url
