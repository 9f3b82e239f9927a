"""BackgroundPublisher: versions published in order in a worker thread that yields a busy core to training."""

from __future__ import annotations

import os
import sys
import threading

import pytest
import torch

from heterorl.config import WeightsConfig
from heterorl.loop.publisher import BackgroundPublisher


def _weights(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(64, 33, generator=gen), "b": torch.randn(33, generator=gen)}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
@pytest.mark.parametrize("nice", [0, 7])
def test_the_publish_thread_runs_at_the_configured_lower_priority(nice):
    publisher = BackgroundPublisher(WeightsConfig(publish_nice=nice))
    seen: list[tuple[int, int]] = []
    publisher.on_published.append(
        lambda p: seen.append((threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
    )
    main = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    for version in range(3):
        publisher.submit(version, _weights(version))
    assert publisher.result().version == 2
    publisher.close()
    assert [tid for tid, _ in seen] == [seen[0][0]] * 3
    assert seen[0][0] != threading.get_native_id()
    assert all(priority == min(19, main + nice) for _, priority in seen)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main  # the caller's thread is unchanged
