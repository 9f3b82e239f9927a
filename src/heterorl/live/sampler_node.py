"""`heterorl sampler`: one sampler process on the wall clock -- its session (`loop.session`) carried out by the same
`node.SamplerNode` the simulator runs, on a `WallRuntime` (an asyncio loop, a generation thread, a thread for
weight updates), through the configured transport (HTTP to the learner, or an object store; `transport.registry`).

Several uploads and a weight long-poll are in flight at once; generation goes on meanwhile. The session ids its
groups `<sampler>:<n>@<boot>`: the random boot id is the session, unique across restarts of the process. It stops
when the learner says the run is finished (410, or the store's `finished` marker), or when the learner keeps
refusing what it sends (`SamplerStoppedError`, one line saying why). With `stop_on_signals`, SIGTERM and SIGINT end
it in order wherever it is (starting, retrying, sampling): its threads and connections are closed, then
`run_sampler` raises KeyboardInterrupt, as Ctrl-C would; a second signal stops it at once.
"""

from __future__ import annotations

import asyncio
import functools
import os
import secrets
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from heterorl.config import RunConfig
from heterorl.eventlog import EventLog
from heterorl.live.loop_signals import loop_signals
from heterorl.live.preflight import LiveSetupError, check_live_config, check_node_index, check_url
from heterorl.live.runtime import WallRuntime
from heterorl.live.transports import check_transport_config, open_sampler_side, sampler_needs_http
from heterorl.loop.session import SamplerSession
from heterorl.loop.worker import SamplerWorker
from heterorl.node.sampler import SamplerNode
from heterorl.run.build import build_sampler, configure_torch
from heterorl.transport.http.auth import configured_token

SETTLE_AFTER_FINISH_S = 5.0  # how long a finished sampler waits for the answers to uploads already sent


class SamplerStoppedError(RuntimeError):
    """The learner refused what this sampler sends again and again (a config that does not match, a revoked
    credential): the message says why."""


class SamplerInterruptedError(RuntimeError):
    """A signal ended the session (`stop_on_signals`), after its threads and connections were closed. An ordinary
    exception inside the loop: a KeyboardInterrupt raised by a task would leave that task's exception unretrieved."""


async def serve_sampler(
    cfg: RunConfig,
    worker: SamplerWorker,
    url: str | None = None,
    token: str | None = None,
    events: EventLog | None = None,
    stop_on_signals: bool = False,
) -> dict[str, Any]:
    """Run one sampler session until the run is finished (in the running asyncio loop); returns its figures.
    Raises SamplerStoppedError when the learner kept refusing what it sent, SamplerInterruptedError after a signal
    ended it (`stop_on_signals`)."""
    boot = secrets.token_hex(6)
    events = events if events is not None else EventLog(sampler=worker.name, boot=boot)
    with _signals_cancel(stop_on_signals) as signalled:
        try:
            return await _session(cfg, worker, url, token, events, boot)
        except asyncio.CancelledError:
            if not signalled:
                raise
            events.emit("interrupted", signal=signalled[0])
            raise SamplerInterruptedError(f"{signalled[0]} ended sampler {worker.name}") from None


async def _session(
    cfg: RunConfig, worker: SamplerWorker, url: str | None, token: str | None, events: EventLog, boot: str
) -> dict[str, Any]:
    runtime = WallRuntime()
    session = SamplerSession(cfg, worker.index, worker.name, boot, worker.sampler.engine.chunks_in_flight)
    try:
        async with open_sampler_side(cfg, worker, url, token, boot, events, session) as (side, learner):
            if learner is not None and learner.get("finished"):
                events.emit("started", url=url, learner_version=learner.get("version"), finished=True, pid=os.getpid())
                return {"sampler": worker.name, "boot": boot, "version": None, "outcomes": {}}
            version = None if learner is None else learner.get("version")
            store = cfg.transport.store.url
            events.emit("started", url=url, store=store, learner_version=version, finished=False, pid=os.getpid())
            over = asyncio.get_running_loop().create_future()
            node = SamplerNode(
                session,
                worker,
                side,
                runtime,
                cfg.live.poll_seconds,
                emit=events.emit,
                on_done=lambda: over.set_result(None),
            )
            node.start()
            waiters = [over, runtime.failed, side.failed]
            done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for future in done:
                future.result()  # re-raise a thread's or the transport's error (unreachable, credential refused)
            await side.settle(SETTLE_AFTER_FINISH_S)  # answers already on their way still count
            # the threads first: an update still being applied (the last version can arrive as the run ends) is
            # counted in the figures as in the events
            await asyncio.get_running_loop().run_in_executor(None, runtime.close)
            result = {"boot": boot, **node.summary(), "transport": dict(side.counts)}
    finally:
        await asyncio.get_running_loop().run_in_executor(None, runtime.close)  # (again: a no-op after the above)
    events.emit("finished", **result)
    if session.stopped:
        raise SamplerStoppedError(f"sampler {worker.name} stopped: {session.stopped}")
    return result


@contextmanager
def _signals_cancel(enabled: bool) -> Iterator[list[str]]:
    """While inside, SIGTERM and SIGINT cancel the current task (the session then closes in order, at whatever await
    it is on) and are listed in the value given; the first one puts the previous handlers back, so a second signal
    acts at once. On the loop (`loop_signals`): a Python-level handler raising in the middle of a callback could
    leave the session's state half-updated and its threads waiting on it."""
    signalled: list[str] = []
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield signalled
        return
    task = asyncio.current_task()
    assert task is not None

    def received(sig: signal.Signals) -> None:
        signalled.append(sig.name)
        restore()
        task.cancel()

    with loop_signals({sig: functools.partial(received, sig) for sig in (signal.SIGTERM, signal.SIGINT)}) as restore:
        yield signalled


def run_sampler(cfg: RunConfig, connect: str | None, index: int = 0, stop_on_signals: bool = False) -> dict[str, Any]:
    """Run sampler node `index` of `cfg` until the run is finished: against the learner at `connect` and/or the
    configured store (`connect` may be None when nothing travels over HTTP). `stop_on_signals`: see the module."""
    check_live_config(cfg)
    check_node_index(cfg, index)
    check_transport_config(cfg)
    why = sampler_needs_http(cfg)
    token = None
    if why is not None:
        if not connect:
            raise LiveSetupError(f"the sampler needs the learner's URL (--connect) because {why}")
        check_url(connect)
        token = configured_token(cfg.live)
        if token is None:
            raise LiveSetupError(f"no token: set ${cfg.live.token_env} (or live.token_file) to the learner's token")
    configure_torch(cfg)
    sampler = build_sampler(cfg, index, base=None)
    try:
        url = connect if why is not None else None
        worker = SamplerWorker(cfg, index, sampler)
        return asyncio.run(serve_sampler(cfg, worker, url, token, stop_on_signals=stop_on_signals))
    except SamplerInterruptedError:
        raise KeyboardInterrupt from None  # the caller's Ctrl-C handling says what was kept
    finally:
        sampler.engine.close()
